/*
 * NVMe-oF control path over TCP on blocking sockets (see fabric.h).
 *
 * One command at a time per connection: the caller (or the controller's
 * mutex) serialises, so a connection never has more than one command or one
 * R2T outstanding and the PDU stream can be parsed strictly in order.  Every
 * length that comes off the wire passes fx_tcp_pdu_check() and the
 * command's own bounds before it sizes a read, and data lands directly in
 * the caller's buffer (one copy, socket -> buffer).
 *
 * Sockets stay in blocking mode for their later users (transport/tcp.c);
 * here every send/recv is MSG_DONTWAIT behind poll() so each step honours a
 * deadline.  After a stream error (-EPROTO, -ETIMEDOUT, -ECONNRESET) the
 * socket is shut down, so later calls fail at once instead of parsing a
 * stream that is out of step.
 */
#ifndef _GNU_SOURCE /* tests/c/Makefile passes -D_GNU_SOURCE */
#define _GNU_SOURCE
#endif
#include "fabric.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "fx100io.h"
#include "tcp_pdu.h"

#define DEFAULT_TIMEOUT_MS 30000
/* Admin queue depth as the Linux host uses it (32 entries, 0's based). */
#define ADMIN_SQSIZE 31
/* NVMe/TCP: the admin queue takes up to 8 KiB of in-capsule data. */
#define ADMIN_INCAPSULE_MAX 8192
#define CONNECT_DATA_LEN 1024
#define IO_SQSIZE_DEFAULT 127
/* A discovery log larger than this is taken as garbage, not allocated. */
#define DISC_MAX_RECORDS 4096
#define DISC_RETRIES 8
/* Close must not hang on a dead target for a full command timeout. */
#define CLOSE_TIMEOUT_MS 2000
#define KA_TICK_MS 20
/* Largest header incl. digest we ever read on the host side. */
#define RX_HDR_MAX 160

struct rsp_pdu {
	struct nvme_tcp_hdr hdr;
	struct nvme_cqe cqe;
} FX_PACKED;
_Static_assert(sizeof(struct rsp_pdu) == 24, "CapsuleResp");

struct cmd_pdu {
	struct nvme_tcp_hdr hdr;
	struct nvme_sqe sqe;
} FX_PACKED;
_Static_assert(sizeof(struct cmd_pdu) == 72, "CapsuleCmd");

/* A received header (plus header digest), typed views over the bytes. */
union rx_hdr {
	struct nvme_tcp_hdr ch;
	struct nvme_tcp_icresp_pdu icresp;
	struct nvme_tcp_term_pdu term;
	struct nvme_tcp_data_pdu data;
	struct nvme_tcp_r2t_pdu r2t;
	struct rsp_pdu rsp;
	uint8_t raw[RX_HDR_MAX];
};

static const uint8_t zero_pad[256];

static void plog(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void plog(const char *fmt, ...)
{
	va_list ap;
	char line[512];

	va_start(ap, fmt);
	vsnprintf(line, sizeof(line), fmt, ap);
	va_end(ap);
	fprintf(stderr, "fx100io: nvmf: %s\n", line);
}

static int64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int64_t deadline_in(int timeout_ms)
{
	return now_ms() + (timeout_ms > 0 ? timeout_ms : DEFAULT_TIMEOUT_MS);
}

/* The calling thread's cancel eventfd (fx_nvmf_set_cancel_fd), -1: none.
 * Per thread, so a connector thread's blocking connect can be cut short
 * while the keep-alive threads and every other caller are unaffected. */
static _Thread_local int cancel_fd = -1;

void fx_nvmf_set_cancel_fd(int fd)
{
	cancel_fd = fd;
}

/* Sleep ms; -ECANCELED at once when the thread's cancel fd fires. */
static int sleep_ms(int ms)
{
	if (cancel_fd >= 0) {
		struct pollfd p = {.fd = cancel_fd, .events = POLLIN};
		int64_t until = now_ms() + ms;

		for (;;) {
			int64_t left = until - now_ms();

			if (left <= 0)
				return 0;
			int r = poll(&p, 1, (int)left);

			if (r > 0)
				return -ECANCELED;
			if (r < 0 && errno != EINTR)
				return 0;
		}
	}
	struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000};

	while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
		;
	return 0;
}

static uint16_t le16_at(const uint8_t *p)
{
	return (uint16_t)(p[0] | p[1] << 8);
}

static uint32_t le32_at(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t le64_at(const uint8_t *p)
{
	return (uint64_t)le32_at(p) | (uint64_t)le32_at(p + 4) << 32;
}

/* --------------------------------------------------------- socket I/O */

/* Wait for ev on fd until the deadline.  POLLERR/POLLHUP count as ready:
 * the following send/recv reports the real error.  -ECANCELED when the
 * thread's cancel fd fires first. */
static int wait_fd(int fd, short ev, int64_t deadline)
{
	for (;;) {
		int64_t left = deadline - now_ms();

		if (left <= 0)
			return -ETIMEDOUT;
		struct pollfd p[2] = {{.fd = fd, .events = ev}, {.fd = cancel_fd, .events = POLLIN}};
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

/* Send every byte of iov[0..cnt) (iov is consumed). */
static int send_iov(int fd, struct iovec *iov, int cnt, int64_t deadline)
{
	while (cnt > 0) {
		if (iov->iov_len == 0) {
			iov++;
			cnt--;
			continue;
		}
		struct msghdr m = {.msg_iov = iov, .msg_iovlen = (size_t)cnt};
		/* MSG_NOSIGNAL: a peer that went away is -ECONNRESET, not
		 * SIGPIPE killing the process. */
		ssize_t n = sendmsg(fd, &m, MSG_NOSIGNAL | MSG_DONTWAIT);

		if (n < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EAGAIN || errno == EWOULDBLOCK) {
				int r = wait_fd(fd, POLLOUT, deadline);

				if (r)
					return r;
				continue;
			}
			return errno == EPIPE ? -ECONNRESET : -errno;
		}
		size_t done = (size_t)n;

		while (cnt > 0 && done >= iov->iov_len) {
			done -= iov->iov_len;
			iov++;
			cnt--;
		}
		if (cnt > 0) {
			iov->iov_base = (char *)iov->iov_base + done;
			iov->iov_len -= done;
		}
	}
	return 0;
}

static int recv_full(int fd, void *buf, size_t len, int64_t deadline)
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
			return -ECONNRESET; /* orderly close mid-PDU or mid-command */
		if (errno == EINTR)
			continue;
		if (errno == EAGAIN || errno == EWOULDBLOCK) {
			int r = wait_fd(fd, POLLIN, deadline);

			if (r)
				return r;
			continue;
		}
		return -errno;
	}
	return 0;
}

static int recv_discard(int fd, size_t len, int64_t deadline)
{
	uint8_t sink[256];

	while (len) {
		size_t k = len < sizeof(sink) ? len : sizeof(sink);
		int r = recv_full(fd, sink, k, deadline);

		if (r)
			return r;
		len -= k;
	}
	return 0;
}

/* Stream errors leave the PDU stream out of step: make the socket unusable
 * (but keep the fd, which its owner closes) so the next call fails fast. */
static int conn_fail(struct fx_nvmf_conn *c, int err)
{
	if (c->fd >= 0 && (err == -EPROTO || err == -ETIMEDOUT || err == -ECONNRESET ||
			   err == -EPIPE || err == -ECANCELED))
		shutdown(c->fd, SHUT_RDWR);
	return err;
}

/* Tell the controller why we drop the connection (best effort), then fail
 * with -EPROTO.  hdr/hlen: the offending header, sent back as the spec asks
 * (at most 152 bytes). */
static int proto_fail(struct fx_nvmf_conn *c, uint16_t fes, uint32_t fei, const void *hdr,
		      unsigned hlen)
{
	struct nvme_tcp_term_pdu t;
	unsigned n = hlen > 152 ? 152 : hlen;

	fx_tcp_hdr_init(&t.hdr, NVME_TCP_H2C_TERM, 0, 0, 0, 0);
	t.hdr.plen = sizeof(t) + n;
	t.fes = fes;
	t.feil = (uint16_t)fei;
	t.feiu = (uint16_t)(fei >> 16);
	memset(t.rsvd, 0, sizeof(t.rsvd));
	struct iovec iov[2] = {{&t, sizeof(t)}, {(void *)hdr, n}};

	if (c->fd >= 0)
		(void)send_iov(c->fd, iov, hdr ? 2 : 1, now_ms() + 100);
	return conn_fail(c, -EPROTO);
}

static const char *fes_str(uint16_t fes)
{
	switch (fes) {
	case NVME_TCP_FES_INVALID_PDU_HDR:
		return "invalid PDU header field";
	case NVME_TCP_FES_PDU_SEQ_ERR:
		return "PDU sequence error";
	case NVME_TCP_FES_HDR_DIGEST_ERR:
		return "header digest error";
	case NVME_TCP_FES_DATA_OUT_OF_RANGE:
		return "data transfer out of range";
	case NVME_TCP_FES_DATA_LIMIT_EXCEEDED:
		return "R2T/data transfer limit exceeded";
	case NVME_TCP_FES_UNSUPPORTED_PARAM:
		return "unsupported parameter";
	default:
		return "unknown fatal error";
	}
}

/*
 * Receive and check the next PDU header (and header digest) into *h.
 * A C2HTermReq is consumed here: the controller found a fatal error in what
 * we sent (FES 1..6 -> -EPROTO) or gave some other reason (-ECONNRESET); it
 * closes the connection either way.
 */
static int recv_hdr(struct fx_nvmf_conn *c, union rx_hdr *h, uint32_t max_plen,
		    int64_t deadline)
{
	int r = recv_full(c->fd, &h->ch, sizeof(h->ch), deadline);

	if (r)
		return conn_fail(c, r);
	int n = fx_tcp_pdu_check(&h->ch, 1, c->hdgst, c->ddgst, max_plen);

	if (n < 0) {
		plog("qid %u: malformed PDU header (type 0x%02x flags 0x%02x hlen %u pdo %u "
		     "plen %u)",
		     c->qid, h->ch.type, h->ch.flags, h->ch.hlen, h->ch.pdo, h->ch.plen);
		return proto_fail(c, NVME_TCP_FES_INVALID_PDU_HDR, 0, &h->ch, sizeof(h->ch));
	}
	if ((unsigned)n > sizeof(*h))
		return proto_fail(c, NVME_TCP_FES_INVALID_PDU_HDR, 0, &h->ch, sizeof(h->ch));
	r = recv_full(c->fd, h->raw + sizeof(h->ch), (size_t)n - sizeof(h->ch), deadline);
	if (r)
		return conn_fail(c, r);

	if (h->ch.type == NVME_TCP_C2H_TERM) {
		uint16_t fes = h->term.fes;
		uint32_t fei = h->term.feil | (uint32_t)h->term.feiu << 16;

		(void)recv_discard(c->fd, h->ch.plen - (uint32_t)n, now_ms() + 100);
		plog("qid %u: controller terminated the connection: FES 0x%x (%s), FEI 0x%x",
		     c->qid, fes, fes_str(fes), fei);
		shutdown(c->fd, SHUT_RDWR);
		return (fes >= NVME_TCP_FES_INVALID_PDU_HDR && fes <= NVME_TCP_FES_UNSUPPORTED_PARAM)
			       ? -EPROTO
			       : -ECONNRESET;
	}

	unsigned hlen = h->ch.hlen;

	if ((unsigned)n > hlen) { /* header digest present */
		uint32_t want = fx_tcp_hdgst(h->raw, hlen), got;

		memcpy(&got, h->raw + hlen, sizeof(got));
		if (got != want) {
			plog("qid %u: header digest mismatch on PDU type 0x%02x", c->qid,
			     h->ch.type);
			return proto_fail(c, NVME_TCP_FES_HDR_DIGEST_ERR, 0, h->raw, hlen);
		}
	}
	return n;
}

/* ------------------------------------------------------------ commands */

static uint16_t status_field(const struct nvme_cqe *cqe)
{
	return NVME_STATUS_FIELD(cqe->status);
}

/* Send CapsuleCmd with incap bytes of data (0 or len) in the capsule. */
static int send_capsule(struct fx_nvmf_conn *c, const struct nvme_sqe *sqe, const void *data,
			uint32_t incap, int64_t deadline)
{
	struct cmd_pdu pdu;
	uint32_t hd, dd;
	struct iovec iov[6];
	int k = 0;

	unsigned pdo = fx_tcp_hdr_init(&pdu.hdr, NVME_TCP_CMD, incap, c->hdgst, c->ddgst, c->cpda);

	pdu.sqe = *sqe;
	iov[k++] = (struct iovec){&pdu, sizeof(pdu)};
	if (c->hdgst) {
		hd = fx_tcp_hdgst(&pdu, sizeof(pdu));
		iov[k++] = (struct iovec){&hd, sizeof(hd)};
	}
	if (incap) {
		unsigned hdr_end = sizeof(pdu) + (c->hdgst ? NVME_TCP_DIGEST_LEN : 0);

		iov[k++] = (struct iovec){(void *)zero_pad, pdo - hdr_end};
		iov[k++] = (struct iovec){(void *)data, incap};
		if (c->ddgst) {
			dd = fx_crc32c(0, data, incap);
			iov[k++] = (struct iovec){&dd, sizeof(dd)};
		}
	}
	return send_iov(c->fd, iov, k, deadline);
}

/* Answer an R2T: H2CData PDUs of at most maxh2cdata covering
 * [r2to, r2to + r2tl) of data, the last one flagged LAST_PDU. */
static int send_h2c(struct fx_nvmf_conn *c, uint16_t cid, uint16_t ttag, const uint8_t *data,
		    uint32_t r2to, uint32_t r2tl, int64_t deadline)
{
	uint32_t off = r2to, end = r2to + r2tl;
	uint32_t maxd = c->maxh2cdata ? c->maxh2cdata : end - r2to;

	while (off < end) {
		uint32_t n = end - off < maxd ? end - off : maxd;
		struct nvme_tcp_data_pdu p;
		uint32_t hd, dd;
		struct iovec iov[5];
		int k = 0;
		unsigned pdo = fx_tcp_hdr_init(&p.hdr, NVME_TCP_H2C_DATA, n, c->hdgst, c->ddgst,
					       c->cpda);
		unsigned hdr_end = sizeof(p) + (c->hdgst ? NVME_TCP_DIGEST_LEN : 0);

		p.cccid = cid;
		p.ttag = ttag;
		p.datao = off;
		p.datal = n;
		memset(p.rsvd, 0, sizeof(p.rsvd));
		if (off + n == end)
			p.hdr.flags |= NVME_TCP_F_DATA_LAST;
		iov[k++] = (struct iovec){&p, sizeof(p)};
		if (c->hdgst) {
			hd = fx_tcp_hdgst(&p, sizeof(p));
			iov[k++] = (struct iovec){&hd, sizeof(hd)};
		}
		iov[k++] = (struct iovec){(void *)zero_pad, pdo - hdr_end};
		iov[k++] = (struct iovec){(void *)(data + off), n};
		if (c->ddgst) {
			dd = fx_crc32c(0, data + off, n);
			iov[k++] = (struct iovec){&dd, sizeof(dd)};
		}
		int r = send_iov(c->fd, iov, k, deadline);

		if (r)
			return conn_fail(c, r);
		off += n;
	}
	return 0;
}

/*
 * The whole exchange for one command.  incap_max: the most write data that
 * may travel in the capsule on this queue (larger writes wait for R2T).
 */
static int exec_cmd(struct fx_nvmf_conn *c, struct nvme_sqe *sqe, void *data, uint32_t len,
		    int write, uint32_t incap_max, struct nvme_cqe *cqe)
{
	uint8_t *buf = data;

	memset(cqe, 0, sizeof(*cqe));
	if (c->fd < 0)
		return -ENOTCONN;
	if (len && !data)
		return -EINVAL;

	int64_t deadline = deadline_in(c->timeout_ms);
	uint16_t cid = c->next_cid++;
	uint32_t incap = (write && len && len <= incap_max) ? len : 0;

	sqe->cid = cid;
	/* PSDT 01b: fabrics commands describe data with SGLs; keep FUSE. */
	sqe->flags = (uint8_t)((sqe->flags & 0x3f) | NVME_CMD_SGL_METABUF);
	memset(&sqe->dptr, 0, sizeof(sqe->dptr));
	sqe->dptr.length = len;
	/* In-capsule data sits at offset 0 of the capsule's data area
	 * (ICDOFF 0 is all NVMe/TCP targets report); everything else, even
	 * "no data", is a transport SGL the PDUs fill in. */
	sqe->dptr.type = incap ? NVME_SGL_DATA_BLOCK_OFFSET : NVME_SGL_TRANSPORT_DATA_BLOCK;

	int r = send_capsule(c, sqe, data, incap, deadline);

	if (r)
		return conn_fail(c, r);

	/* Largest PDU this command can legally bring: a data PDU with all
	 * of len, header, digests and the widest padding pdo allows. */
	uint32_t max_plen = len > UINT32_MAX - 512 ? UINT32_MAX : len + 512;
	struct fx_tcp_xfer x;
	int ddgst_bad = 0;
	union rx_hdr h;

	fx_tcp_xfer_init(&x, len, write, incap != 0);
	for (;;) {
		int n = recv_hdr(c, &h, max_plen, deadline);

		if (n < 0)
			return n;

		switch (h.ch.type) {
		case NVME_TCP_C2H_DATA: {
			uint32_t dd = (h.ch.flags & NVME_TCP_F_DDGST) ? NVME_TCP_DIGEST_LEN : 0;
			uint32_t payload = h.ch.plen - h.ch.pdo - dd;

			if (h.data.cccid != cid) {
				plog("qid %u: C2HData for cid %u, waiting for %u", c->qid,
				     h.data.cccid, cid);
				return proto_fail(c, NVME_TCP_FES_PDU_SEQ_ERR, 0, h.raw,
						  h.ch.hlen);
			}
			/* In order and inside the buffer (tcp_pdu.c's rule), so
			 * success means every byte was written exactly once. */
			if (fx_tcp_xfer_c2h(&x, &h.data, dd != 0) < 0) {
				plog("qid %u: cid %u: %s (datao %u datal %u, payload %u, %u of %u "
				     "bytes so far)",
				     c->qid, cid, x.why, h.data.datao, h.data.datal, payload,
				     x.received, len);
				return proto_fail(c, x.fes, x.fei, h.raw, h.ch.hlen);
			}
			uint32_t at = x.received;

			r = recv_discard(c->fd, h.ch.pdo - (uint32_t)n, deadline);
			if (!r)
				r = recv_full(c->fd, buf + at, payload, deadline);
			if (r)
				return conn_fail(c, r);
			if (dd) {
				uint32_t got;

				r = recv_full(c->fd, &got, sizeof(got), deadline);
				if (r)
					return conn_fail(c, r);
				if (got != fx_crc32c(0, buf + at, payload)) {
					/* The stream is intact; only this data is bad.
					 * Finish the command, then fail it like Linux
					 * does (Data Transfer Error). */
					plog("qid %u: data digest mismatch (cid %u datao %u "
					     "datal %u)",
					     c->qid, cid, at, payload);
					ddgst_bad = 1;
				}
			}
			if (fx_tcp_xfer_c2h_done(&x, &h.data)) {
				/* SUCCESS: no CapsuleResp follows. */
				cqe->cid = cid;
				cqe->sqid = c->qid;
				if (ddgst_bad) {
					cqe->status = NVME_SC_DATA_XFER_ERROR << 1;
					return -EIO;
				}
				return 0;
			}
			break;
		}
		case NVME_TCP_R2T:
			if (h.r2t.cccid != cid ||
			    fx_tcp_xfer_r2t(&x, h.r2t.r2to, h.r2t.r2tl) < 0) {
				plog("qid %u: bad R2T (cccid %u cid %u r2to %u r2tl %u, %s of %u "
				     "bytes%s): %s",
				     c->qid, h.r2t.cccid, cid, h.r2t.r2to, h.r2t.r2tl,
				     write ? "write" : "read", len,
				     incap ? " sent in-capsule" : "",
				     h.r2t.cccid != cid ? "unknown command" : x.why);
				if (h.r2t.cccid != cid)
					return proto_fail(c, NVME_TCP_FES_PDU_SEQ_ERR, 0, h.raw,
							  h.ch.hlen);
				return proto_fail(c, x.fes, x.fei, h.raw, h.ch.hlen);
			}
			r = send_h2c(c, cid, h.r2t.ttag, buf, h.r2t.r2to, h.r2t.r2tl, deadline);
			if (r)
				return r;
			fx_tcp_xfer_r2t_sent(&x);
			break;
		case NVME_TCP_RSP:
			*cqe = h.rsp.cqe;
			if (cqe->cid != cid) {
				plog("qid %u: CapsuleResp for cid %u, waiting for %u", c->qid,
				     cqe->cid, cid);
				return proto_fail(c, NVME_TCP_FES_PDU_SEQ_ERR, 0, h.raw,
						  h.ch.hlen);
			}
			/* Success must mean the whole transfer happened:
			 * otherwise the caller would trust stale bytes. */
			if (fx_tcp_xfer_rsp(&x, status_field(cqe)) < 0) {
				plog("qid %u: cid %u: %s (%u of %u bytes)", c->qid, cid, x.why,
				     write ? x.sent : x.received, len);
				return conn_fail(c, -EPROTO);
			}
			if (status_field(cqe))
				return -EIO;
			if (ddgst_bad) {
				cqe->status = NVME_SC_DATA_XFER_ERROR << 1;
				return -EIO;
			}
			return 0;
		default:
			plog("qid %u: unexpected PDU type 0x%02x during a command", c->qid,
			     h.ch.type);
			return proto_fail(c, NVME_TCP_FES_PDU_SEQ_ERR, 0, h.raw, h.ch.hlen);
		}
	}
}

int fx_nvmf_exec(struct fx_nvmf_conn *c, struct nvme_sqe *sqe, void *data, uint32_t len,
		 int write, struct nvme_cqe *cqe)
{
	return exec_cmd(c, sqe, data, len, write, c->incap_max, cqe);
}

int fx_nvmf_prop_get(struct fx_nvmf_conn *c, uint32_t off, int size8, uint64_t *val)
{
	struct nvmf_property_cmd pc;
	struct nvme_sqe sqe;
	struct nvme_cqe cqe;

	memset(&pc, 0, sizeof(pc));
	pc.opcode = NVME_FABRICS_OPCODE;
	pc.fctype = NVMF_FCTYPE_PROP_GET;
	pc.attrib = size8 ? 1 : 0;
	pc.offset = off;
	memcpy(&sqe, &pc, sizeof(sqe));
	int r = fx_nvmf_exec(c, &sqe, NULL, 0, 0, &cqe);

	if (r)
		return r;
	*val = size8 ? (uint64_t)cqe.dw0 | (uint64_t)cqe.dw1 << 32 : cqe.dw0;
	return 0;
}

int fx_nvmf_prop_set(struct fx_nvmf_conn *c, uint32_t off, int size8, uint64_t val)
{
	struct nvmf_property_cmd pc;
	struct nvme_sqe sqe;
	struct nvme_cqe cqe;

	memset(&pc, 0, sizeof(pc));
	pc.opcode = NVME_FABRICS_OPCODE;
	pc.fctype = NVMF_FCTYPE_PROP_SET;
	pc.attrib = size8 ? 1 : 0;
	pc.offset = off;
	pc.value = size8 ? val : (uint32_t)val;
	memcpy(&sqe, &pc, sizeof(sqe));
	return fx_nvmf_exec(c, &sqe, NULL, 0, 0, &cqe);
}

/* ------------------------------------------------------- connection */

/* Numeric host first, as tests and URIs give it; a name is resolved only
 * when the string is not a literal. */
static int tcp_open(const struct fx_nvmf_addr *a, int64_t deadline, int *out)
{
	struct addrinfo hints = {
		.ai_family = AF_UNSPEC,
		.ai_socktype = SOCK_STREAM,
		.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV,
	};
	struct addrinfo *res = NULL;
	int rc = getaddrinfo(a->host, a->port, &hints, &res);

	if (rc == EAI_NONAME) {
		hints.ai_flags = AI_ADDRCONFIG;
		rc = getaddrinfo(a->host, a->port, &hints, &res);
	}
	if (rc) {
		if (rc == EAI_MEMORY)
			return -ENOMEM;
		if (rc == EAI_AGAIN)
			return -EAGAIN;
		if (rc == EAI_SYSTEM && errno)
			return -errno;
		return -EINVAL; /* not an address/port we can use */
	}

	int err = -EHOSTUNREACH;

	for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
		int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK,
				ai->ai_protocol);

		if (fd < 0) {
			err = -errno;
			continue;
		}
		/* Non-blocking connect so the deadline holds. */
		if (connect(fd, ai->ai_addr, ai->ai_addrlen) < 0) {
			if (errno != EINPROGRESS) {
				err = -errno;
				close(fd);
				continue;
			}
			int r = wait_fd(fd, POLLOUT, deadline), soerr = 0;
			socklen_t sl = sizeof(soerr);

			if (!r && getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) < 0)
				r = -errno;
			if (!r && soerr)
				r = -soerr;
			if (r) {
				err = r;
				close(fd);
				continue;
			}
		}
		int one = 1;
		int fl = fcntl(fd, F_GETFL);

		/* Small PDUs (capsules, R2T answers) must not wait for Nagle. */
		if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) < 0 || fl < 0 ||
		    fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) < 0) {
			err = -errno;
			close(fd);
			continue;
		}
		freeaddrinfo(res);
		*out = fd;
		return 0;
	}
	freeaddrinfo(res);
	return err;
}

static int ic_exchange(struct fx_nvmf_conn *c, int want_hdgst, int want_ddgst, int64_t deadline)
{
	struct nvme_tcp_icreq_pdu req;
	uint8_t asked = (uint8_t)((want_hdgst ? NVME_TCP_HDGST_ENABLE : 0) |
				  (want_ddgst ? NVME_TCP_DDGST_ENABLE : 0));

	memset(&req, 0, sizeof(req));
	fx_tcp_hdr_init(&req.hdr, NVME_TCP_ICREQ, 0, 0, 0, 0);
	req.pfv = 0;
	req.hpda = 0;   /* we take C2H data at any dword offset */
	req.digest = asked;
	req.maxr2t = 0; /* one R2T at a time: we run one command at a time */
	struct iovec iov = {&req, sizeof(req)};
	int r = send_iov(c->fd, &iov, 1, deadline);

	if (r)
		return r;

	union rx_hdr h;
	/* digests are off until ICResp has been read */
	c->hdgst = c->ddgst = 0;
	/* room for a C2HTermReq refusing us instead */
	r = recv_hdr(c, &h, sizeof(struct nvme_tcp_term_pdu) + 152, deadline);
	if (r < 0)
		return r;
	if (h.ch.type != NVME_TCP_ICRESP) {
		plog("expected ICResp, got PDU type 0x%02x", h.ch.type);
		return proto_fail(c, NVME_TCP_FES_PDU_SEQ_ERR, 0, h.raw, h.ch.hlen);
	}
	const struct nvme_tcp_icresp_pdu *ic = &h.icresp;

	if (ic->pfv != 0 || ic->maxdata < 4096 || ic->cpda > 31 || (ic->digest & ~asked)) {
		plog("unusable ICResp: pfv %u maxh2cdata %u cpda %u digests 0x%x (asked 0x%x)",
		     ic->pfv, ic->maxdata, ic->cpda, ic->digest, asked);
		uint32_t fei = ic->pfv ? offsetof(struct nvme_tcp_icresp_pdu, pfv)
			       : ic->maxdata < 4096 ? offsetof(struct nvme_tcp_icresp_pdu, maxdata)
			       : ic->cpda > 31	    ? offsetof(struct nvme_tcp_icresp_pdu, cpda)
						    : offsetof(struct nvme_tcp_icresp_pdu, digest);
		return proto_fail(c, ic->pfv ? NVME_TCP_FES_UNSUPPORTED_PARAM
					     : NVME_TCP_FES_INVALID_PDU_HDR,
				  fei, h.raw, h.ch.hlen);
	}
	/* The controller may grant fewer digests than asked; it decides. */
	c->hdgst = !!(ic->digest & NVME_TCP_HDGST_ENABLE);
	c->ddgst = !!(ic->digest & NVME_TCP_DDGST_ENABLE);
	c->cpda = ic->cpda;
	c->maxh2cdata = ic->maxdata;
	return 0;
}

/* Errno for a failed Connect, per fabric.h. */
static int connect_errno(uint16_t sf)
{
	if (NVME_SCT(sf) == 1 && NVME_SC(sf) == NVME_SC_CONNECT_INVALID_HOST)
		return -EACCES;
	if (NVME_SCT(sf) == 1 && NVME_SC(sf) == NVME_SC_CONNECT_INVALID_PARAM)
		return -ENOENT;
	return -EIO;
}

static int nqn_ok(const char *nqn)
{
	size_t n = strnlen(nqn, NVMF_NQN_SIZE);

	return n > 0 && n < NVMF_NQN_SIZE;
}

int fx_nvmf_tcp_connect(const struct fx_nvmf_addr *a, const struct fx_nvmf_params *p,
			uint16_t qid, uint16_t sqsize, uint16_t cntlid, struct fx_nvmf_conn *out,
			uint16_t *status)
{
	if (status)
		*status = 0;
	memset(out, 0, sizeof(*out));
	out->fd = -1;
	if (!nqn_ok(p->hostnqn) || !nqn_ok(p->subnqn) ||
	    strnlen(a->host, sizeof(a->host)) == sizeof(a->host) ||
	    strnlen(a->port, sizeof(a->port)) == sizeof(a->port))
		return -EINVAL;

	int64_t deadline = deadline_in(p->timeout_ms);
	int r = tcp_open(a, deadline, &out->fd);

	if (r)
		return r;
	out->timeout_ms = p->timeout_ms;
	out->qid = qid;
	out->sqsize = sqsize;
	/* Admin: NVMe/TCP's 8 KiB.  I/O: unknown here (IOCCSZ comes from
	 * Identify); the caller sets it, see fabric.h. */
	out->incap_max = qid == 0 ? ADMIN_INCAPSULE_MAX : 0;
	r = ic_exchange(out, p->hdgst, p->ddgst, deadline);
	if (r)
		goto fail;

	struct nvmf_connect_data cd;
	struct nvmf_connect_cmd cc;
	struct nvme_sqe sqe;
	struct nvme_cqe cqe;

	memset(&cd, 0, sizeof(cd));
	memcpy(cd.hostid, p->hostid, sizeof(cd.hostid));
	cd.cntlid = qid ? cntlid : 0xFFFF; /* admin: any (dynamic) controller */
	memcpy(cd.subsysnqn, p->subnqn, strlen(p->subnqn));
	memcpy(cd.hostnqn, p->hostnqn, strlen(p->hostnqn));

	memset(&cc, 0, sizeof(cc));
	cc.opcode = NVME_FABRICS_OPCODE;
	cc.fctype = NVMF_FCTYPE_CONNECT;
	cc.recfmt = 0;
	cc.qid = qid;
	cc.sqsize = sqsize;
	/* KATO belongs to the controller, so only the admin Connect sets it. */
	cc.kato = qid ? 0 : p->kato_ms;
	memcpy(&sqe, &cc, sizeof(sqe));
	/* The 1024 bytes of Connect data always travel in-capsule, on any
	 * queue (IOCCSZ is not known before Connect). */
	r = exec_cmd(out, &sqe, &cd, sizeof(cd), 1, sizeof(cd), &cqe);
	if (r == -EIO) {
		uint16_t sf = status_field(&cqe);

		if (status)
			*status = sf;
		r = connect_errno(sf);
		goto fail;
	}
	if (r)
		goto fail;
	out->cntlid = qid ? cntlid : (uint16_t)(cqe.dw0 & 0xffff);
	return 0;
fail:
	fx_nvmf_conn_close(out);
	return r;
}

void fx_nvmf_conn_close(struct fx_nvmf_conn *c)
{
	if (c->fd >= 0)
		close(c->fd);
	c->fd = -1;
}

/* ------------------------------------------------------- controller */

static int admin_exec(struct fx_nvmf_ctrl *c, struct nvme_sqe *sqe, void *data, uint32_t len,
		      int write, struct nvme_cqe *cqe)
{
	if (__atomic_load_n(&c->ka_failed, __ATOMIC_ACQUIRE))
		return -ECONNRESET;
	return fx_nvmf_exec(&c->admin, sqe, data, len, write, cqe);
}

static int identify(struct fx_nvmf_ctrl *c, uint8_t cns, uint32_t nsid, void *buf,
		    uint16_t *status)
{
	struct nvme_sqe sqe;
	struct nvme_cqe cqe;

	memset(&sqe, 0, sizeof(sqe));
	sqe.opcode = NVME_ADMIN_IDENTIFY;
	sqe.nsid = nsid;
	sqe.cdw10 = cns;
	int r = admin_exec(c, &sqe, buf, 4096, 0, &cqe);

	if (r == -EIO && status)
		*status = status_field(&cqe);
	return r;
}

static int get_log(struct fx_nvmf_ctrl *c, uint8_t lid, uint64_t off, void *buf, uint32_t len,
		   uint16_t *status)
{
	uint8_t *p = buf;
	/* One command may move at most MDTS; keep chunks dword multiples. */
	uint32_t chunk = c->mdts_bytes ? c->mdts_bytes : len;

	while (len) {
		uint32_t n = len < chunk ? len : chunk;
		uint32_t numd = n / 4 - 1; /* 0's based dwords */
		struct nvme_sqe sqe;
		struct nvme_cqe cqe;

		memset(&sqe, 0, sizeof(sqe));
		sqe.opcode = NVME_ADMIN_GET_LOG_PAGE;
		sqe.nsid = 0;
		sqe.cdw10 = lid | (numd & 0xffff) << 16;
		sqe.cdw11 = numd >> 16;
		sqe.cdw12 = (uint32_t)off;
		sqe.cdw13 = (uint32_t)(off >> 32);
		int r = admin_exec(c, &sqe, p, n, 0, &cqe);

		if (r) {
			if (r == -EIO && status)
				*status = status_field(&cqe);
			return r;
		}
		p += n;
		off += n;
		len -= n;
	}
	return 0;
}

static void *ka_main(void *arg)
{
	struct fx_nvmf_ctrl *c = arg;
	int interval = (int)(c->params.kato_ms / 3);
	int64_t next;

	if (interval < KA_TICK_MS)
		interval = KA_TICK_MS;
	next = now_ms() + interval;
	while (!__atomic_load_n(&c->ka_stop, __ATOMIC_ACQUIRE)) {
		int64_t left = next - now_ms();

		if (left > 0) {
			sleep_ms(left < KA_TICK_MS ? (int)left : KA_TICK_MS);
			continue;
		}
		struct nvme_sqe sqe;
		struct nvme_cqe cqe;

		memset(&sqe, 0, sizeof(sqe));
		sqe.opcode = NVME_ADMIN_KEEP_ALIVE;
		pthread_mutex_lock(&c->lock);
		int r = fx_nvmf_exec(&c->admin, &sqe, NULL, 0, 0, &cqe);

		if (r) {
			/* The controller is gone (or going): say so to
			 * every later admin call, and unblock none of them
			 * into a stream that is out of step. */
			__atomic_store_n(&c->ka_failed, 1, __ATOMIC_RELEASE);
			if (c->admin.fd >= 0)
				shutdown(c->admin.fd, SHUT_RDWR);
		}
		pthread_mutex_unlock(&c->lock);
		if (r) {
			plog("cntlid %u: keep alive failed (%s, status 0x%x); controller lost",
			     c->cntlid, strerror(-r), r == -EIO ? status_field(&cqe) : 0);
			break;
		}
		next = now_ms() + interval;
	}
	return NULL;
}

static int ctrl_enable(struct fx_nvmf_ctrl *c)
{
	/* MPS = MPSMIN; 64-byte SQEs and 16-byte CQEs are what NVMe-oF
	 * requires (Linux's target fails the controller otherwise). */
	uint32_t mps = (uint32_t)((c->cap >> 48) & 0xf);
	uint64_t cc = NVME_CC_CSS_NVM | (mps << 7) | NVME_CC_AMS_RR | NVME_CC_IOSQES |
		      NVME_CC_IOCQES | NVME_CC_ENABLE;
	int r = fx_nvmf_prop_set(&c->admin, NVME_REG_CC, 0, cc);

	if (r)
		return r;

	/* CAP.TO is the worst case in 500 ms units. */
	int64_t to = (int64_t)NVME_CAP_TIMEOUT(c->cap) * 500;
	int64_t deadline = now_ms() + (to < 500 ? 500 : to);

	for (;;) {
		uint64_t csts;

		r = fx_nvmf_prop_get(&c->admin, NVME_REG_CSTS, 0, &csts);
		if (r)
			return r;
		if (csts & NVME_CSTS_CFS) {
			plog("controller fatal status after CC.EN=1 (CC 0x%llx CSTS 0x%llx)",
			     (unsigned long long)cc, (unsigned long long)csts);
			return -EIO;
		}
		if (csts & NVME_CSTS_RDY)
			return 0;
		if (now_ms() >= deadline)
			return -ETIMEDOUT;
		/* CAP.TO can be minutes: a cancelled open must not wait it out. */
		if (sleep_ms(5) < 0)
			return -ECANCELED;
	}
}

static void parse_idctrl(struct fx_nvmf_ctrl *c)
{
	const uint8_t *id = c->idctrl;
	uint8_t mdts = id[NVME_IDC_MDTS];

	if (mdts == 0) {
		c->mdts_bytes = 0;
	} else {
		/* MDTS is a power of two in units of CAP.MPSMIN pages (4 KiB
		 * << 0..15); clamp what no uint32 length could use anyway,
		 * before the shift could leave 64 bits. */
		unsigned shift = 12 + (unsigned)((c->cap >> 48) & 0xf) + mdts;

		c->mdts_bytes = shift >= 31 ? 0x80000000u : (uint32_t)1 << shift;
	}
	/* IOCCSZ is in 16-byte units: a u32 times 16 can leave 32 bits. */
	uint64_t ioccsz = (uint64_t)le32_at(id + NVME_IDC_IOCCSZ) * 16;

	c->ioccsz_bytes = ioccsz > UINT32_MAX ? UINT32_MAX : (uint32_t)ioccsz;
	c->icdoff = le16_at(id + NVME_IDC_ICDOFF);
	c->nn = le32_at(id + NVME_IDC_NN);
}

int fx_nvmf_ctrl_open(const struct fx_nvmf_addr *a, const struct fx_nvmf_params *p,
		      uint16_t want_io_queues, struct fx_nvmf_ctrl **out, uint16_t *status)
{
	struct fx_nvmf_ctrl *c;
	int r;

	*out = NULL;
	if (status)
		*status = 0;
	c = calloc(1, sizeof(*c));
	if (!c)
		return -ENOMEM;
	c->addr = *a;
	c->params = *p;
	c->admin.fd = -1;
	r = pthread_mutex_init(&c->lock, NULL);
	if (r) {
		free(c);
		return -r;
	}

	r = fx_nvmf_tcp_connect(a, p, 0, ADMIN_SQSIZE, 0xFFFF, &c->admin, status);
	if (r)
		goto fail;
	c->cntlid = c->admin.cntlid;

	r = fx_nvmf_prop_get(&c->admin, NVME_REG_CAP, 1, &c->cap);
	if (!r) {
		uint64_t vs;

		r = fx_nvmf_prop_get(&c->admin, NVME_REG_VS, 0, &vs);
		c->vs = (uint32_t)vs;
	}
	if (!r)
		r = ctrl_enable(c);
	if (!r)
		r = identify(c, NVME_ID_CNS_CTRL, 0, c->idctrl, status);
	if (r)
		goto fail;
	parse_idctrl(c);

	uint32_t sq = NVME_CAP_MQES(c->cap);
	uint16_t maxcmd = le16_at(c->idctrl + NVME_IDC_MAXCMD);

	if (sq > IO_SQSIZE_DEFAULT)
		sq = IO_SQSIZE_DEFAULT;
	if (maxcmd && sq > (uint32_t)maxcmd - 1)
		sq = (uint32_t)maxcmd - 1;
	c->io_sqsize = (uint16_t)sq;

	if (want_io_queues) {
		struct nvme_sqe sqe;
		struct nvme_cqe cqe;
		uint32_t n = want_io_queues - 1u; /* 0's based */

		memset(&sqe, 0, sizeof(sqe));
		sqe.opcode = NVME_ADMIN_SET_FEATURES;
		sqe.cdw10 = NVME_FEAT_NUM_QUEUES;
		sqe.cdw11 = n | n << 16;
		r = admin_exec(c, &sqe, NULL, 0, 0, &cqe);
		if (r) {
			if (r == -EIO && status)
				*status = status_field(&cqe);
			goto fail;
		}
		uint32_t nsqa = cqe.dw0 & 0xffff, ncqa = cqe.dw0 >> 16;
		uint32_t got = (nsqa < ncqa ? nsqa : ncqa) + 1;

		c->io_queues = (uint16_t)(got < want_io_queues ? got : want_io_queues);
	}

	if (p->kato_ms) {
		r = pthread_create(&c->ka_thread, NULL, ka_main, c);
		if (r) {
			r = -r;
			goto fail;
		}
		c->ka_running = 1;
	}
	*out = c;
	return 0;
fail:
	fx_nvmf_conn_close(&c->admin);
	pthread_mutex_destroy(&c->lock);
	free(c);
	return r;
}

int fx_nvmf_ctrl_ns_info(struct fx_nvmf_ctrl *c, uint32_t nsid, uint64_t *nsze,
			 uint32_t *lba_size)
{
	uint8_t *id;
	uint16_t sf = 0;
	int r;

	if (nsid == 0 || nsid == 0xffffffffu)
		return -EINVAL;
	id = malloc(4096);
	if (!id)
		return -ENOMEM;
	pthread_mutex_lock(&c->lock);
	r = identify(c, NVME_ID_CNS_NS, nsid, id, &sf);
	pthread_mutex_unlock(&c->lock);
	if (r == -EIO && NVME_SCT(sf) == 0 && NVME_SC(sf) == 0x0b) /* Invalid Namespace */
		r = -ENODEV;
	if (r)
		goto out;

	/* An inactive nsid identifies as all zeroes. */
	uint64_t size = le64_at(id + NVME_IDNS_NSZE);
	unsigned fmt = id[NVME_IDNS_FLBAS] & 0xf;
	unsigned lbads;

	if (size == 0) {
		r = -ENODEV;
		goto out;
	}
	lbads = id[NVME_IDNS_LBAF + 4 * fmt + 2];
	if (fmt > id[NVME_IDNS_NLBAF] || lbads < 9 || lbads > 31) {
		plog("nsid %u: unusable LBA format %u (NLBAF %u, LBADS %u)", nsid, fmt,
		     id[NVME_IDNS_NLBAF], lbads);
		r = -EPROTO;
		goto out;
	}
	/* The byte size must fit the 64 bits everything above counts in. */
	if (size > UINT64_MAX >> lbads) {
		plog("nsid %u: unusable size: %llu blocks of %u bytes overflow 64 bits", nsid,
		     (unsigned long long)size, 1u << lbads);
		r = -EPROTO;
		goto out;
	}
	*nsze = size;
	*lba_size = 1u << lbads;
out:
	free(id);
	return r;
}

void fx_nvmf_ctrl_close(struct fx_nvmf_ctrl *c)
{
	if (!c)
		return;
	if (c->ka_running) {
		__atomic_store_n(&c->ka_stop, 1, __ATOMIC_RELEASE);
		pthread_join(c->ka_thread, NULL);
		c->ka_running = 0;
	}
	pthread_mutex_lock(&c->lock);
	if (c->admin.fd >= 0 && !__atomic_load_n(&c->ka_failed, __ATOMIC_ACQUIRE)) {
		uint64_t cc, csts;

		if (c->admin.timeout_ms <= 0 || c->admin.timeout_ms > CLOSE_TIMEOUT_MS)
			c->admin.timeout_ms = CLOSE_TIMEOUT_MS;
		/* Normal shutdown so the target flushes and frees the
		 * controller now rather than at keep-alive expiry. */
		int r = fx_nvmf_prop_get(&c->admin, NVME_REG_CC, 0, &cc);

		if (!r)
			r = fx_nvmf_prop_set(&c->admin, NVME_REG_CC, 0,
					     (cc & ~(3ULL << 14)) | NVME_CC_SHN_NORMAL);
		int64_t deadline = now_ms() + CLOSE_TIMEOUT_MS;

		while (!r) {
			r = fx_nvmf_prop_get(&c->admin, NVME_REG_CSTS, 0, &csts);
			if (r || (csts & (3u << 2)) == NVME_CSTS_SHST_CMPLT || now_ms() >= deadline)
				break;
			sleep_ms(5);
		}
	}
	fx_nvmf_conn_close(&c->admin);
	pthread_mutex_unlock(&c->lock);
	pthread_mutex_destroy(&c->lock);
	free(c);
}

/* --------------------------------------------------------- discovery */

int fx_nvmf_disc_log_read(fx_nvmf_get_log_fn get_log, void *ctx,
			  struct nvmf_disc_log_entry **entries, uint32_t *n, uint16_t *status,
			  const char **why)
{
	struct nvmf_disc_log_hdr *hdr;
	struct nvmf_disc_log_entry *e = NULL;
	int r;

	*entries = NULL;
	*n = 0;
	if (why)
		*why = NULL;
	hdr = malloc(sizeof(*hdr));
	if (!hdr)
		return -ENOMEM;

	r = -EAGAIN; /* the log kept changing under us */
	for (int tries = 0; tries < DISC_RETRIES; tries++) {
		uint64_t genctr, numrec;
		int rr = get_log(ctx, 0, hdr, sizeof(*hdr), status);

		if (rr) {
			r = rr;
			break;
		}
		genctr = hdr->genctr;
		numrec = hdr->numrec;
		if (hdr->recfmt != 0 || numrec > DISC_MAX_RECORDS) {
			if (why)
				*why = hdr->recfmt ? "record format not 0" : "too many records";
			r = -EPROTO;
			break;
		}
		free(e);
		e = NULL;
		if (numrec) {
			e = calloc(numrec, sizeof(*e));
			if (!e) {
				r = -ENOMEM;
				break;
			}
			rr = get_log(ctx, sizeof(*hdr), e, (uint32_t)(numrec * sizeof(*e)), status);
			if (rr) {
				r = rr;
				break;
			}
			/* Entries are only consistent with the header if the
			 * generation did not move while we read them. */
			rr = get_log(ctx, 0, hdr, sizeof(*hdr), status);
			if (rr) {
				r = rr;
				break;
			}
			if (hdr->genctr != genctr || hdr->numrec != numrec)
				continue;
		}
		*entries = e;
		*n = (uint32_t)numrec;
		e = NULL;
		r = 0;
		break;
	}
	free(e);
	free(hdr);
	return r;
}

static int disc_get_log(void *ctrl, uint64_t off, void *buf, uint32_t len, uint16_t *status)
{
	return get_log(ctrl, NVME_LOG_DISCOVERY, off, buf, len, status);
}

int fx_nvmf_discover(const struct fx_nvmf_addr *a, const struct fx_nvmf_params *p,
		     struct nvmf_disc_log_entry **entries, uint32_t *n, uint16_t *status)
{
	struct fx_nvmf_params dp = *p;
	struct fx_nvmf_ctrl *c;
	const char *why;
	int r;

	*entries = NULL;
	*n = 0;
	if (status)
		*status = 0;
	memset(dp.subnqn, 0, sizeof(dp.subnqn));
	memcpy(dp.subnqn, NVMF_DISCOVERY_NQN, sizeof(NVMF_DISCOVERY_NQN));
	/* One short exchange: no keep-alive needed. */
	dp.kato_ms = 0;
	r = fx_nvmf_ctrl_open(a, &dp, 0, &c, status);
	if (r)
		return r;
	r = fx_nvmf_disc_log_read(disc_get_log, c, entries, n, status, &why);
	if (why)
		plog("discovery log: unusable header (%s)", why);
	fx_nvmf_ctrl_close(c);
	return r;
}
