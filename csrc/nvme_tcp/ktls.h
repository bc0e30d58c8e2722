/*
 * The NVMe/TCP secure channel on the kernel's record layer (kTLS): after
 * our userspace handshake (nvme_tcp/tls.c), where the kernel has the `tls`
 * ULP, the socket is handed the traffic keys and sequence numbers and from
 * then on reads and writes clear PDUs, the kernel sealing and opening the
 * records; the data path is the clear-text one.
 *
 * What stays ours: records that are not application data.  A plain recv
 * (and io_uring's) fails with -EIO when the next record is one; then
 * fx_ktls_record() takes it with recvmsg and a control buffer and does
 * what our record layer does with it (the rules are tls.c's:
 * fx_tls_post_handshake, fx_tls_alert): a NewSessionTicket is dropped, a
 * KeyUpdate moves the kernel's receive key on where the kernel can take a
 * new one (Linux 6.14 and later; before, a clear error), an alert ends the
 * connection.
 *
 * Functions return 0 (or a count) or -errno; *why / fx_ktls_why() give a
 * static sentence for the log.
 */
#ifndef FX100IO_NVME_TCP_KTLS_H
#define FX100IO_NVME_TCP_KTLS_H

#include <stddef.h>
#include <stdint.h>

#include "nvme_tcp/tls.h"

/* A kTLS connection's own state: enough to follow a KeyUpdate, and room
 * for one record that is not application data.  A connection may receive
 * on one thread and send on another (our target does): each side's reason
 * is its own field, written and read by that side only; what the send
 * side learns from the receive side is rx_err alone, atomically. */
struct fx_ktls {
	uint8_t hash;
	uint8_t rx_secret[FX_TLS_PSK_MAX];
	const char *rx_why; /* the receive side's (fx_ktls_why) */
	const char *tx_why; /* the send side's (fx_ktls_send_why) */
	/* the kernel's refusal of a record from the peer (EBADMSG, EMSGSIZE,
	 * EINVAL: positive), set by fx_ktls_recv_error; 0 while none */
	_Atomic int rx_err;
	uint8_t rec[FX_TLS_MAX_PLAINTEXT];
};

/*
 * Move the secure channel t (just past its handshake: nothing decrypted
 * and not handed out) onto the kernel's record layer of socket fd.
 * 0: done, *out holds the state (fx_ktls_free), t is no longer needed.
 * -ENOPROTOOPT: the kernel has no `tls` ULP or refused our keys before
 * taking any (*why says which): the socket is as it was, t still carries
 * the channel.  Another -errno: the socket is unusable (the kernel took
 * the send key and refused the receive key), close it.
 */
int fx_ktls_start(int fd, struct fx_tls *t, struct fx_ktls **out, const char **why);
void fx_ktls_free(struct fx_ktls *k);
/* The receive side's reason (fx_ktls_record, fx_ktls_recv_error,
 * fx_ktls_recv_full); "" while none.  Read it on the receiving thread. */
const char *fx_ktls_why(const struct fx_ktls *k);
/* The send side's reason (fx_ktls_send_error); "" while none. */
const char *fx_ktls_send_why(const struct fx_ktls *k);

/*
 * A recv on a kTLS socket failed with -EIO: take the record that caused it
 * (it is whole and next: the kernel had decrypted it) and act on it.
 * 0: dropped or acted on (a ticket, a key update), receive again;
 * > 0: application data after all, that many bytes at k->rec; -errno with
 * fx_ktls_why(): -ECONNRESET (close_notify), -EPROTO (an alert, a
 * KeyUpdate the kernel cannot follow, anything else).
 */
int fx_ktls_record(struct fx_ktls *k, int fd);

/*
 * What a failed recv on a kTLS socket means for the caller, once
 * fx_ktls_record() has had -EIO: -EBADMSG (a record failed its tag) stays
 * and -ECONNRESET stays; the kernel's refusals of a record (-EMSGSIZE too
 * large, -EINVAL a bad header, -EKEYEXPIRED, -EIO) are -EPROTO; anything
 * else (a socket error) is returned as it is.  Sets fx_ktls_why() for
 * those it names.
 */
int fx_ktls_recv_error(struct fx_ktls *k, int err);
/* The same for a failed send, with fx_ktls_send_why().  The kernel may
 * fail a send on a socket whose receive side it aborted with that
 * receive's error (-EBADMSG, -EMSGSIZE): once fx_ktls_recv_error() has
 * seen the kernel refuse a record that way (rx_err), mapped and explained
 * as it was there; otherwise (nothing refused, or the receive ended for
 * another reason: a close_notify, an alert, a socket error) -ECONNRESET
 * with a reason that claims no tampering (kernels before 6.13 say -EBADMSG
 * for any TCP send error).  Anything else is returned as it is (the send
 * reason untouched).  Safe to call while another thread receives. */
int fx_ktls_send_error(struct fx_ktls *k, int err);

/*
 * Send one record of TLS content type `type` that is not application data
 * (an alert, a handshake message), sealed by the kernel with the socket's
 * keys: one sendmsg with a TLS_SET_RECORD_TYPE cmsg (the kernel first
 * closes a data record that MSG_MORE left open).  Blocking within the
 * socket's SO_SNDTIMEO.  0, -EAGAIN (the send timed out), -EIO (sent only
 * in part: the stream is broken), or the send's -errno (for
 * fx_ktls_send_error).  Our target's test fault (--fault-tls-record) uses
 * it; nothing on the data path does.
 */
int fx_ktls_send_record(int fd, uint8_t type, const void *buf, size_t len);

/* fx_tcp_recv_full (nvme_tcp/sock.h) on a kTLS socket: records that are
 * not application data are taken as fx_ktls_record() says, and errors
 * mapped by fx_ktls_recv_error(). */
int fx_ktls_recv_full(struct fx_ktls *k, int fd, void *buf, size_t len, int64_t deadline,
		      int cancel_fd);

#endif
