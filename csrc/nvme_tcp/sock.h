/*
 * Socket I/O for NVMe/TCP PDUs: send every byte of a PDU's iovecs, receive
 * exactly n bytes, each bounded by a deadline where the caller keeps one.
 *
 * The host control path (transport/tcp_ctrl.c) keeps its sockets blocking
 * for the data path and sends and receives here with MSG_DONTWAIT behind
 * poll(), until a deadline (on CLOCK_MONOTONIC, in ms, the clock of
 * fx_nvmf_now_ms()) or until a cancel fd fires.  Our target (target/conn.c)
 * sends here too, on a socket whose SO_SNDTIMEO is its stall limit: with no
 * deadline a send that would block returns -EAGAIN for the caller to judge.
 * The target's receive is its own: its deadline runs per PDU from the PDU's
 * first byte and it interleaves its disk engine (target/conn.c).
 */
#ifndef FX100IO_NVME_TCP_SOCK_H
#define FX100IO_NVME_TCP_SOCK_H

#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

/* No deadline: the socket's own timeouts (SO_SNDTIMEO) bound the call. */
#define FX_TCP_NO_DEADLINE INT64_MAX

/* Milliseconds on CLOCK_MONOTONIC (the deadlines' clock). */
int64_t fx_tcp_now_ms(void);

/*
 * Wait until fd is ready for ev (POLLIN/POLLOUT) or the deadline passes.
 * POLLERR/POLLHUP count as ready: the next send/recv reports the real
 * error.  cancel_fd (-1: none) readable first: -ECANCELED.  0, -ETIMEDOUT,
 * -EBADF, or another -errno of poll().
 */
int fx_tcp_wait(int fd, short ev, int64_t deadline, int cancel_fd);

/*
 * Send every byte of iov[0..cnt) (the iovecs are consumed) with sendmsg
 * flags (MSG_NOSIGNAL is always added: a peer that went away is an error,
 * not SIGPIPE).  When a send would block: with a deadline, wait for room
 * until it (fx_tcp_wait); without one (FX_TCP_NO_DEADLINE), -EAGAIN.
 * Returns 0 or a negative errno as sendmsg gave it (-EPIPE stays -EPIPE);
 * *sent (may be NULL) gets the bytes sent before it returned.
 */
/* Drop n bytes from the front of iov[0..*cnt) (n <= what they hold):
 * returns the first iovec left, *cnt those left, spent and empty ones
 * skipped.  The iovecs are changed in place (spent ones left empty): pass
 * an array the caller may spend.  (Every scatter-gather loop of the core
 * moves on with this.) */
struct iovec *fx_iov_consume(struct iovec *iov, int *cnt, size_t n);

int fx_tcp_sendv(int fd, struct iovec *iov, int cnt, int flags, int64_t deadline, int cancel_fd,
		 size_t *sent);

/*
 * Receive exactly len bytes into buf before the deadline (MSG_DONTWAIT
 * behind poll; the socket may be blocking).  0; -ECONNRESET on an orderly
 * close before all arrived; -ETIMEDOUT, -ECANCELED or another -errno.
 */
int fx_tcp_recv_full(int fd, void *buf, size_t len, int64_t deadline, int cancel_fd);

/* Receive and drop len bytes (padding, or the rest of a PDU we refuse). */
int fx_tcp_recv_discard(int fd, size_t len, int64_t deadline, int cancel_fd);

#endif
