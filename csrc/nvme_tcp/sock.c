/*
 * Socket I/O for NVMe/TCP PDUs with deadlines (see sock.h).
 */
#ifndef _GNU_SOURCE /* tests/c/Makefile passes -D_GNU_SOURCE */
#define _GNU_SOURCE
#endif
#include "nvme_tcp/sock.h"

#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <sys/socket.h>
#include <time.h>

int64_t fx_tcp_now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int fx_tcp_wait(int fd, short ev, int64_t deadline, int cancel_fd)
{
	for (;;) {
		int64_t left = deadline - fx_tcp_now_ms();

		if (left <= 0)
			return -ETIMEDOUT;
		struct pollfd p[2] = {{.fd = fd, .events = ev},
				      {.fd = cancel_fd, .events = POLLIN}};
		int r = poll(p, cancel_fd >= 0 ? 2 : 1, left > INT_MAX ? INT_MAX : (int)left);

		if (r < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		if (r == 0)
			return -ETIMEDOUT;
		if (cancel_fd >= 0 && p[1].revents)
			return -ECANCELED;
		if (p[0].revents & POLLNVAL)
			return -EBADF;
		return 0;
	}
}

struct iovec *fx_iov_consume(struct iovec *iov, int *cnt, size_t n)
{
	while (*cnt > 0 && (n || !iov->iov_len)) {
		size_t k = iov->iov_len < n ? iov->iov_len : n;

		iov->iov_base = (uint8_t *)iov->iov_base + k;
		iov->iov_len -= k;
		n -= k;
		if (!iov->iov_len) {
			iov++;
			(*cnt)--;
		}
	}
	return iov;
}

int fx_tcp_sendv(int fd, struct iovec *iov, int cnt, int flags, int64_t deadline, int cancel_fd,
		 size_t *sent)
{
	size_t total = 0;
	int ret = 0;

	while (cnt > 0) {
		if (iov->iov_len == 0) {
			iov++;
			cnt--;
			continue;
		}
		struct msghdr m = {.msg_iov = iov, .msg_iovlen = (size_t)cnt};
		ssize_t n = sendmsg(fd, &m, flags | MSG_NOSIGNAL);

		if (n < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EAGAIN || errno == EWOULDBLOCK) {
				if (deadline == FX_TCP_NO_DEADLINE) {
					ret = -EAGAIN;
					break;
				}
				ret = fx_tcp_wait(fd, POLLOUT, deadline, cancel_fd);
				if (ret)
					break;
				continue;
			}
			ret = -errno;
			break;
		}
		size_t done = (size_t)n;

		total += done;
		iov = fx_iov_consume(iov, &cnt, done);
	}
	if (sent)
		*sent = total;
	return ret;
}

int fx_tcp_recv_full(int fd, void *buf, size_t len, int64_t deadline, int cancel_fd)
{
	char *p = buf;

	while (len) {
		ssize_t n = recv(fd, p, len, MSG_DONTWAIT);

		if (n > 0) {
			p += n;
			len -= (size_t)n;
			continue;
		}
		if (n == 0)
			return -ECONNRESET; /* orderly close mid-PDU */
		if (errno == EINTR)
			continue;
		if (errno == EAGAIN || errno == EWOULDBLOCK) {
			int r = fx_tcp_wait(fd, POLLIN, deadline, cancel_fd);

			if (r)
				return r;
			continue;
		}
		return -errno;
	}
	return 0;
}

int fx_tcp_recv_discard(int fd, size_t len, int64_t deadline, int cancel_fd)
{
	uint8_t sink[256];

	while (len) {
		size_t k = len < sizeof(sink) ? len : sizeof(sink);
		int r = fx_tcp_recv_full(fd, sink, k, deadline, cancel_fd);

		if (r)
			return r;
		len -= k;
	}
	return 0;
}
