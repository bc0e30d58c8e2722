/*
 * One NVMe/TCP connection (queue) of the target: a thread reading PDUs in
 * order from a blocking socket and answering each command before reading the
 * next PDU, except writes whose data we fetch with R2T: those wait in a table
 * indexed by the transfer tag while other commands go on, because a host may
 * pipeline more capsules behind a write before our R2T reaches it.
 *
 * Every length from the wire is checked (fx_tcp_pdu_check() for the common
 * header, then the type's own fields) before it sizes a read or a copy; a
 * broken or hostile PDU ends the connection with a C2HTermReq, never with an
 * access outside our buffers.  Data digest errors are not fatal: the data has
 * been consumed, so the stream is still in step, and the command fails with
 * Transient Transport Error for the host to retry.
 *
 * No thread waits forever on a host: a PDU must arrive whole within stall_ms
 * of its first byte (the receive timeout, lowered to what is left of that
 * as the PDU drags on), and the send timeout (stall_ms, set once at accept)
 * ends a connection whose host stops reading; silence between PDUs is legal
 * (the handshake deadline, the controller's KATO, or without a KATO the idle
 * timeout bound it; target.c enforces them).
 *
 * Reads stream: without a data digest the whole transfer is one C2HData PDU
 * whose payload goes from the page cache to the socket with sendfile(); with
 * a digest, FX_TGT_CHUNK pieces are pread, digested and sent.
 *
 * A live I/O queue hands its Reads and Writes (data by R2T) to its engine
 * (io.c), which keeps many in flight and answers each when its disk I/O is
 * done, from a second thread; this thread goes on reading PDUs.  From then
 * on every send holds c->send_lock, so PDUs never interleave on the wire.
 * Without io_uring a queue serves in line as described above.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <netinet/in.h>
#include <linux/tcp.h> /* struct tcp_info with tcpi_snd_wnd (glibc's lacks it) */
#include <unistd.h>

#include "fx100io.h"
#include "nvme_tcp/pdu.h"
#include "nvme_tcp/sock.h"
#include "tgt.h"

/* Room for any header we read or build (nvme_tcp/pdu.h). */
#define HDR_BUF FX_TCP_HEAD_MAX

const char *tgt_conn_state_str(enum tgt_conn_state s)
{
	switch (s) {
	case TGT_CONN_WAIT_ICREQ:
		return "wait-icreq";
	case TGT_CONN_WAIT_CONNECT:
		return "wait-connect";
	case TGT_CONN_LIVE:
		return "live";
	case TGT_CONN_CLOSING:
		return "closing";
	}
	return "?";
}

/* ------------------------------------------------------------ socket I/O */

/* The PDU being received is not complete stall_ms after its first byte. */
static int stalled(struct tgt_conn *c)
{
	tgt_log(c->t,
		"%s qid %u: host stalled in the middle of a PDU (not complete %u ms after "
		"its first byte); closing",
		c->peer, c->qid, c->t->stall_ms);
	c->state = TGT_CONN_CLOSING;
	return -ETIMEDOUT;
}

static void set_rcvtimeo(struct tgt_conn *c, uint32_t ms)
{
	struct timeval tv = {.tv_sec = ms / 1000, .tv_usec = (ms % 1000) * 1000};

	if (setsockopt(c->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) == 0)
		c->rcvtimeo_ms = ms;
}

/*
 * Before a blocking receive inside a PDU: the time left to its deadline
 * bounds the receive.  SO_RCVTIMEO is lowered only when it exceeds what is
 * left by more than a sixteenth of stall_ms (a PDU may thus take up to
 * 17/16 stall_ms), so a PDU that arrives at once costs no system call, and a
 * slow one at most 16.  0, or -ETIMEDOUT past the deadline.
 */
static int pdu_time_left(struct tgt_conn *c)
{
	uint64_t now = tgt_now_ms();
	uint64_t left;

	if (now >= c->pdu_deadline_ms)
		return stalled(c);
	left = c->pdu_deadline_ms - now;
	if (left + c->t->stall_ms / 16u < c->rcvtimeo_ms)
		set_rcvtimeo(c, (uint32_t)(left ? left : 1));
	return 0;
}

/*
 * Between PDUs, with writes waiting for their data: each write's data is
 * due within 2 x stall_ms of its R2T, however the host fills the time
 * (silence, or other commands), so that it cannot hold the buffers and
 * slots of writes it never completes.  Checked at most every stall_ms / 4
 * (and on each receive timeout): 0, or -ETIMEDOUT.
 */
static int data_overdue(struct tgt_conn *c)
{
	uint64_t now, oldest = 0, limit = 2ull * c->t->stall_ms;

	if (!atomic_load(&c->h2c_wait))
		return 0;
	now = tgt_now_ms();
	if (atomic_load(&c->t->iobufs.nwait)) {
		uint64_t last = atomic_load(&c->h2c_last_ms);
		uint32_t squeeze = c->t->stall_ms / 4u < FX_TGT_SQUEEZE_MS ? c->t->stall_ms / 4u
									   : FX_TGT_SQUEEZE_MS;

		/* (tgt.h, FX_TGT_SQUEEZE_MS) */
		if (now >= last && now - last >= squeeze && tgt_iobufs_over_share(c)) {
			tgt_log(c->t,
				"%s qid %u: holds more than its share of the I/O buffers while "
				"others wait, and sent no write data for %u ms; closing",
				c->peer, c->qid, squeeze);
			c->state = TGT_CONN_CLOSING;
			return -ETIMEDOUT;
		}
	}
	if (now < c->data_check_ms)
		return 0;
	c->data_check_ms = now + c->t->stall_ms / 4u;
	if (c->ioq)
		oldest = tgt_ioq_oldest_r2t_ms(c);
	for (unsigned i = 0; i < c->r2t_n; i++)
		if (c->r2t[i].active && (!oldest || c->r2t[i].r2t_ms < oldest))
			oldest = c->r2t[i].r2t_ms;
	if (!oldest || now < oldest || now - oldest < limit)
		return 0;
	tgt_log(c->t,
		"%s qid %u: host sent not all of a write's data within %llu ms of its R2T; "
		"closing",
		c->peer, c->qid, (unsigned long long)limit);
	c->state = TGT_CONN_CLOSING;
	return -ETIMEDOUT;
}

/*
 * The receive timeout between PDUs.  With writes waiting for their data,
 * the receive wakes every FX_TGT_SQUEEZE_POLL_MS, so that data_overdue's
 * squeeze (tgt.h, FX_TGT_SQUEEZE_MS) acts soon after another host starts
 * waiting for room; otherwise stall_ms.  woke: a receive just timed out.
 * Back to stall_ms only once such a wake finds no write waiting, so that a
 * writer's queue, its writes coming and going, costs no system call a PDU.
 */
static void idle_rcvtimeo(struct tgt_conn *c, int woke)
{
	uint32_t stall = c->t->stall_ms;
	uint32_t poll = stall < FX_TGT_SQUEEZE_POLL_MS ? stall : FX_TGT_SQUEEZE_POLL_MS;

	if (atomic_load(&c->h2c_wait)) {
		if (c->rcvtimeo_ms != poll)
			set_rcvtimeo(c, poll);
	} else if (c->rcvtimeo_ms != stall && (woke || c->rcvtimeo_ms != poll)) {
		set_rcvtimeo(c, stall);
	}
}

/*
 * An admin queue with an event eventfd (tgt_conn.evfd) waits for its socket
 * and its events together, up to the receive timeout: an ANA change found
 * with an AER held is answered from here, by this thread, so that only this
 * host's queue ever waits on this host's socket.  0 (the socket may have
 * bytes, or the wait timed out: the caller's non-blocking receive tells), or
 * -errno when the answer's send failed.
 */
static int wait_sock_or_event(struct tgt_conn *c)
{
	struct pollfd p[2] = {{.fd = c->fd, .events = POLLIN}, {.fd = c->evfd, .events = POLLIN}};
	/* (as SO_RCVTIMEO: 0 waits for ever) */
	int ms = !c->rcvtimeo_ms ? -1 : c->rcvtimeo_ms > INT_MAX ? INT_MAX : (int)c->rcvtimeo_ms;
	int n = poll(p, 2, ms);

	if (n > 0 && (p[1].revents & POLLIN)) {
		uint64_t v;

		if (read(c->evfd, &v, sizeof(v)) < 0) {
			/* (EAGAIN: another wake took it) */
		}
		return tgt_ana_deliver(c);
	}
	return 0;
}

/* Whether this caller is the first to say why the connection ends (the
 * engine's sends and our receive may see one break at once). */
static int say_why_first(struct tgt_conn *c)
{
	return atomic_exchange(&c->why_said, 1) == 0;
}

/*
 * A receive on a kTLS socket failed with e (not EAGAIN or EINTR): EIO is a
 * record that is not application data, taken and judged as our record
 * layer judges it (nvme_tcp/ktls.h: a ticket dropped, close_notify and
 * alerts the end); any other error is the kernel's refusal of a record (a
 * bad tag: EBADMSG; one too large: EMSGSIZE) or the socket's.  Returns the
 * bytes of data the record turned out to carry, copied to p (at most n),
 * 0 to receive again, or -errno after a log line (-EPROTO, as a broken
 * record on our layer) or, for close_notify and a socket error, quietly.
 */
static ssize_t ktls_recv_failed(struct tgt_conn *c, uint8_t *p, size_t n, int e)
{
	struct fx_ktls *k = c->ktls;
	int r = e == EIO ? fx_ktls_record(k, c->fd) : fx_ktls_recv_error(k, -e);

	if (r > 0 && (size_t)r <= n) {
		memcpy(p, k->rec, (size_t)r);
		return r;
	}
	if (r > 0) { /* (recv fails only on a record that is not data) */
		if (say_why_first(c))
			tgt_log(c->t,
				"%s qid %u: kTLS: data where a record of another type was; closing",
				c->peer, c->qid);
		return -EPROTO;
	}
	/* decided by what came back, never by a reason a former call left */
	if (r != -EPROTO && r != -EBADMSG)
		return r; /* (close_notify, a reset, a socket error: as on clear text) */
	if (say_why_first(c))
		tgt_log(c->t, "%s qid %u: kTLS: %s; closing", c->peer, c->qid, fx_ktls_why(k));
	return -EPROTO;
}

/*
 * Receive n bytes.  start: they begin a PDU, and silence before its first
 * byte is legal (the handshake deadline, KATO or the idle timeout bound it,
 * in target.c); the receive timeout then only wakes us.  Once the first byte
 * is here, the whole PDU must arrive within stall_ms of it: later receives
 * (start 0) are bounded by that deadline, not by each one's progress, so a
 * host dripping a byte now and then cannot hold the queue inside a PDU.
 */
static int raw_recv_bytes(struct tgt_conn *c, void *buf, size_t n, int start)
{
	uint8_t *p = buf;

	if (start) {
		int ret = data_overdue(c);

		if (ret)
			return ret;
		idle_rcvtimeo(c, 0);
		atomic_store(&c->wait_since_ms, tgt_now_ms());
	}
	while (n) {
		ssize_t r;
		int ret, probe;

		if (!start && (ret = pdu_time_left(c)) != 0)
			return ret;
		/* Disk I/O prepared and not yet handed to the kernel (io.c,
		 * queue_locked) goes before a receive that would wait: first
		 * what is there without waiting. */
		probe = tgt_ioq_unsent(c) > 0;
		if (c->evfd >= 0) {
			/* (then a receive that does not wait: EAGAIN below is
			 * the timeout, or an event that woke us) */
			if ((ret = wait_sock_or_event(c)) != 0)
				return ret;
			r = recv(c->fd, p, n, MSG_DONTWAIT);
		} else {
			/* (at the start, what is there: the first byte starts
			 * the clock) */
			r = recv(c->fd, p, n, probe ? MSG_DONTWAIT : start ? 0 : MSG_WAITALL);
		}
		if (r < 0 && probe && (errno == EAGAIN || errno == EWOULDBLOCK)) {
			tgt_ioq_kick(c);
			continue;
		}
		if (r < 0 && c->ktls && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
			r = ktls_recv_failed(c, p, n, errno);
			if (r < 0)
				return (int)r;
			if (r == 0)
				continue;
		}
		if (r > 0) {
			p += r;
			n -= (size_t)r;
			if (start) {
				uint64_t now = tgt_now_ms();

				c->pdu_deadline_ms = now + c->t->stall_ms;
				atomic_store(&c->wait_since_ms, 0);
				start = 0;
			}
		} else if (r == 0) {
			return -ECONNRESET;
		} else if (errno == EAGAIN || errno == EWOULDBLOCK) {
			/* (inside a PDU: pdu_time_left says whether its deadline
			 * passed; the receive timeout may be the shorter poll) */
			if (!start)
				continue;
			idle_rcvtimeo(c, 1);
			if ((ret = data_overdue(c)) != 0)
				return ret;
		} else if (errno != EINTR) {
			return -errno;
		}
	}
	return 0;
}

/*
 * The same on a secure channel: plaintext already decrypted first, then
 * whole TLS records read with raw_recv_bytes, so the same clocks hold (a
 * record's header read at a PDU's start waits as the PDU's first byte
 * would; the rest of the record is inside the PDU's deadline).  A record
 * is used only once its tag checked (nvme_tcp/tls.c).
 */
static int recv_bytes(struct tgt_conn *c, void *buf, size_t n, int start)
{
	uint8_t *p = buf;
	struct fx_tls *tls = c->tls;
	int ret;

	if (!tls)
		return raw_recv_bytes(c, buf, n, start);
	while (n) {
		size_t have = fx_tls_pending(tls);

		if (have) {
			if (start) {
				/* the PDU's first byte is here already: its clock starts */
				if ((ret = data_overdue(c)) != 0)
					return ret;
				c->pdu_deadline_ms = tgt_now_ms() + c->t->stall_ms;
				atomic_store(&c->wait_since_ms, 0);
				start = 0;
			}
			if (have > n)
				have = n;
			memcpy(p, tls->plain + tls->plain_pos, have);
			tls->plain_pos += have;
			p += have;
			n -= have;
			continue;
		}
		ret = raw_recv_bytes(c, tls->rec, FX_TLS_HEADER, start);
		if (ret)
			return ret;
		start = 0;
		size_t len = (size_t)tls->rec[3] << 8 | tls->rec[4];

		if (len > FX_TLS_MAX_CIPHERTEXT) {
			tgt_log(c->t, "%s qid %u: TLS record of %zu bytes (over 2^14+256); closing",
				c->peer, c->qid, len);
			return -EPROTO;
		}
		ret = raw_recv_bytes(c, tls->rec + FX_TLS_HEADER, len, 0);
		if (ret)
			return ret;
		ret = fx_tls_record_in(tls, tls->rec, FX_TLS_HEADER + len);
		if (ret < 0) {
			if (ret != -ECONNRESET)
				tgt_log(c->t, "%s qid %u: TLS: %s; closing", c->peer, c->qid,
					fx_tls_why(tls));
			return ret == -ECONNRESET ? ret : -EPROTO;
		}
	}
	return 0;
}

static int recv_all(struct tgt_conn *c, void *buf, size_t n)
{
	return recv_bytes(c, buf, n, 0);
}

/* A send said why the connection ends: err, the error it returns.  (The
 * connection's state is its own thread's; the engine shuts the socket
 * instead, and that thread ends without another line.) */
static int send_said_why(struct tgt_conn *c, int err)
{
	if (tgt_ioq_on_engine_thread())
		return -ECONNABORTED; /* (said; see tgt_conn_main) */
	c->state = TGT_CONN_CLOSING;
	return err;
}

/* The send timeout fired: the host has not taken a byte for stall_ms. */
static int send_stalled(struct tgt_conn *c)
{
	c->send_short = 0;
	if (say_why_first(c))
		tgt_log(c->t, "%s qid %u: host stopped reading (nothing sent for %u ms); closing",
			c->peer, c->qid, c->t->stall_ms);
	return send_said_why(c, -ETIMEDOUT);
}

static int discard(struct tgt_conn *c, size_t n)
{
	uint8_t tmp[256];

	while (n) {
		size_t k = n < sizeof(tmp) ? n : sizeof(tmp);
		int ret = recv_all(c, tmp, k);

		if (ret)
			return ret;
		n -= k;
	}
	return 0;
}

/* TCP's state once it ended a connection itself (the kernel's
 * tcp_states.h; not in the uapi headers) */
#define TCP_STATE_CLOSE 7

/* The host stopped reading and then TCP closed the connection itself (its
 * user timeout, or a reset from the host): the socket is closed with the
 * host's window shut.  Our own shutdown, or any other thread's, leaves it
 * in a FIN state; a host that resets while it reads leaves its window
 * open. */
static int closed_on_a_shut_window(int fd)
{
	struct tcp_info ti;
	socklen_t len = sizeof(ti);

	memset(&ti, 0, sizeof(ti));
	if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len) != 0 ||
	    len < offsetof(struct tcp_info, tcpi_snd_wnd) + sizeof(ti.tcpi_snd_wnd))
		return 0; /* (a kernel that does not say: cannot tell) */
	return ti.tcpi_state == TCP_STATE_CLOSE && ti.tcpi_snd_wnd == 0;
}

/* The -errno of a failed send (e: its errno), of either thread.  A send
 * broken by a shutdown we made on purpose is no reason: whoever made it
 * says why (TCP's user timeout is never ours).  A broken pipe right after
 * a send returned short is the one case where the reason is lost (that
 * send took it): when the host had stopped reading, say so (as
 * send_stalled does) instead of closing in silence. */
static int send_errno(struct tgt_conn *c, int e)
{
	int was_short = c->send_short;

	c->send_short = 0;
	if (e != ETIMEDOUT && atomic_load(&c->shut_by_us))
		return -ECONNRESET; /* (a quiet end) */
	if (e != EPIPE || !was_short || !closed_on_a_shut_window(c->fd))
		return -e;
	if (say_why_first(c))
		tgt_log(c->t,
			"%s qid %u: host stopped reading (its window shut), then the connection "
			"ended in the middle of a send (TCP's user timeout, %u ms, or a reset by the "
			"host); closing",
			c->peer, c->qid, tgt_user_timeout_ms(c->t));
	return send_said_why(c, -EPIPE);
}

/* A TLS record could not be sealed (OpenSSL failed, or the sequence
 * number ran out): records already sealed and not sent never leave, and the
 * connection ends, saying so (the send path's only non-network reason). */
static int seal_failed(struct tgt_conn *c)
{
	if (say_why_first(c))
		tgt_log(c->t, "%s qid %u: a TLS record could not be sealed; closing", c->peer,
			c->qid);
	return send_said_why(c, -EPROTO);
}

/* The fault's record (not data) went out on kTLS only in part: a rest
 * sent again would be sealed as data, so the stream is broken; the
 * connection ends, saying so once. */
static int fault_record_cut(struct tgt_conn *c)
{
	if (say_why_first(c))
		tgt_log(c->t,
			"%s qid %u: kTLS: a record that is not data went out in part; closing",
			c->peer, c->qid);
	return send_said_why(c, -EPROTO);
}

/* A send on a kTLS socket failed with EBADMSG or EMSGSIZE (err): the
 * kernel aborted the socket over a record it refused from the host, or
 * (kernels before 6.13) any TCP error; fx_ktls_send_error says which it
 * can tell.  The connection ends, saying so once. */
static int ktls_send_failed(struct tgt_conn *c, int err)
{
	int ret = fx_ktls_send_error(c->ktls, err);

	c->send_short = 0;
	if (atomic_load(&c->shut_by_us))
		return -ECONNRESET; /* (a quiet end: see send_errno) */
	if (say_why_first(c))
		tgt_log(c->t, "%s qid %u: kTLS: %s; closing", c->peer, c->qid,
			fx_ktls_send_why(c->ktls));
	return send_said_why(c, ret == -ECONNRESET ? ret : -EPROTO);
}

/* iov[0..cnt) onto the socket as it is (clear text, records already
 * sealed, or kTLS: the kernel seals them); flags: MSG_MORE or 0.  A send
 * that got some bytes out and then failed returned short (see send_errno). */
static int send_plain(struct tgt_conn *c, struct iovec *iov, int cnt, int flags)
{
	size_t sent = 0;
	int ret = fx_tcp_sendv(c->fd, iov, cnt, flags, FX_TCP_NO_DEADLINE, -1, &sent);

	if (!ret) {
		c->send_short = 0;
		return 0;
	}
	if (sent)
		c->send_short = 1;
	if (ret == -EAGAIN)
		return send_stalled(c);
	if (c->ktls && (ret == -EBADMSG || ret == -EMSGSIZE))
		return ktls_send_failed(c, ret);
	return send_errno(c, -ret);
}

/* Every byte of iov[0..cnt) on the socket, whose SO_SNDTIMEO is stall_ms:
 * a send that would block means the host stopped reading.  more: the PDU
 * goes on (MSG_MORE). */
static int send_iov(struct tgt_conn *c, struct iovec *iov, int cnt, int more)
{
	int ret;

	if (c->tls) {
		/* records under the send lock, like every send; a record cut by a
		 * stall or an error ends the connection anyway */
		ret = fx_tls_sendv(c->tls, c->fd, iov, cnt, FX_TCP_NO_DEADLINE, -1);
		if (!ret)
			return 0;
		if (ret == -EAGAIN)
			return send_stalled(c);
		if (ret == -EIO || ret == -EINVAL || ret == -EPROTO)
			return seal_failed(c);
		return send_errno(c, -ret);
	}
	return send_plain(c, iov, cnt, more ? MSG_MORE : 0);
}

void tgt_send_lock(struct tgt_conn *c)
{
	/* The connection's thread may wait here (for the engine's send, or
	 * in its own): the disk I/O it prepared goes first (io.c). */
	if (!tgt_ioq_on_engine_thread())
		tgt_ioq_kick(c);
	if (c->send_lock)
		pthread_mutex_lock(c->send_lock);
}

void tgt_send_unlock(struct tgt_conn *c)
{
	if (c->send_lock)
		pthread_mutex_unlock(c->send_lock);
}

/* Count a PDU we finished sending; --fault-drop-after ends the connection
 * right after the Nth one, as a crashed or unplugged target would. */
static int pdu_sent(struct tgt_conn *c)
{
	struct fx_target *t = c->t;

	c->pdus_sent++;
	if (t->fault_drop_after && c->pdus_sent >= t->fault_drop_after) {
		tgt_log(t, "%s: fault injection: dropping the connection after %u PDUs", c->peer,
			c->pdus_sent);
		tgt_conn_shut(c);
		return -ECONNABORTED;
	}
	return 0;
}

/* Header digest and zero padding up to pdo after a header built in b
 * (HDR_BUF bytes; padding to any HPDA <= 31 fits). */
static unsigned head_finish(uint8_t *b)
{
	int n = fx_tcp_head_finish(b, HDR_BUF);

	return n < 0 ? 0 : (unsigned)n; /* (cannot fail: HDR_BUF holds any) */
}

/* Build a CapsuleResp into b (HDR_BUF bytes); returns its size. */
static unsigned resp_head(struct tgt_conn *c, uint8_t *b, uint16_t cid, uint16_t sf, uint32_t dw0,
			  uint32_t dw1)
{
	struct nvme_tcp_hdr *h = (struct nvme_tcp_hdr *)b;
	struct nvme_cqe cqe;

	fx_tcp_hdr_init(h, NVME_TCP_RSP, 0, c->hdgst, c->ddgst, c->hpda);
	memset(&cqe, 0, sizeof(cqe));
	cqe.dw0 = dw0;
	cqe.dw1 = dw1;
	cqe.sqhd = __atomic_load_n(&c->sqhd, __ATOMIC_RELAXED);
	cqe.sqid = c->qid;
	cqe.cid = cid;
	cqe.status = (uint16_t)(sf << 1); /* phase tag 0: fabrics have no CQ memory */
	memcpy(b + sizeof(*h), &cqe, sizeof(cqe));
	if (c->t->verbose && sf)
		tgt_log(c->t, "%s qid %u: cid %u status sct %u sc 0x%02x%s", c->peer, c->qid, cid,
			NVME_SCT(sf), NVME_SC(sf), (sf & NVME_DNR) ? " dnr" : "");
	return head_finish(b);
}

static int send_resp(struct tgt_conn *c, uint16_t cid, uint16_t sf, uint32_t dw0, uint32_t dw1)
{
	uint8_t b[HDR_BUF];
	struct iovec iov;
	int ret;

	iov.iov_base = b;
	iov.iov_len = resp_head(c, b, cid, sf, dw0, dw1);
	tgt_send_lock(c);
	ret = send_iov(c, &iov, 1, 0);
	if (!ret)
		ret = pdu_sent(c);
	tgt_send_unlock(c);
	return ret;
}

int tgt_send_resp(struct tgt_conn *c, uint16_t cid, uint16_t sf, uint32_t dw0, uint32_t dw1)
{
	return send_resp(c, cid, sf, dw0, dw1);
}

/* Build a C2HData header for len bytes at datao into b; returns its size. */
static unsigned c2h_head(struct tgt_conn *c, uint8_t *b, uint16_t cid, uint32_t datao, uint32_t len,
			 int last)
{
	struct nvme_tcp_data_pdu *d = (struct nvme_tcp_data_pdu *)b;
	fx_tcp_hdr_init(&d->hdr, NVME_TCP_C2H_DATA, len, c->hdgst, c->ddgst, c->hpda);

	d->cccid = cid;
	d->ttag = 0;
	d->datao = datao;
	d->datal = len;
	memset(d->rsvd, 0, sizeof(d->rsvd));
	if (last)
		d->hdr.flags |= NVME_TCP_F_DATA_LAST;
	return head_finish(b);
}

/* Count a C2HData PDU; --fault-corrupt-ddgst flips the data digest
 * (ddgst, NULL without one) of every Nth. */
static void c2h_count(struct tgt_conn *c, uint32_t *ddgst)
{
	uint32_t n = c->t->fault_corrupt_ddgst;

	c->c2h_sent++;
	if (ddgst && n && c->c2h_sent % n == 0) {
		tgt_log(c->t, "%s: fault injection: corrupting the data digest of C2HData #%u",
			c->peer, c->c2h_sent);
		*ddgst ^= 0xFFFFFFFFu;
	}
}

/* Records already sealed, buf[0..n), onto the socket (send_iov's errors). */
static int send_sealed(struct tgt_conn *c, const uint8_t *buf, size_t n)
{
	struct iovec v = {(void *)buf, n};

	return send_plain(c, &v, 1, 0);
}

/* 16 KiB records of n bytes of read data (--fault-tls-record counts them) */
#define DATA_RECS(n) (((uint64_t)(n) + FX_TLS_MAX_PLAINTEXT - 1) / FX_TLS_MAX_PLAINTEXT)

/*
 * --fault-tls-record (a test knob, off by default, TLS only): once per
 * target, one record that is not application data, sealed with the
 * connection's keys (ours, or the kernel's on kTLS) like any other, inside
 * a C2HData's data: the host meets it between two records of one C2HData,
 * where its receive into the read's buffer is in progress.  A
 * NewSessionTicket must be dropped and the read go on; close_notify and
 * alerts end the stream.
 *
 * Where: every read path asks fault_tls_split() at the start of each
 * C2HData's data, and sends the record at the offset it names.  That is
 * the first 16 KiB boundary of the data at which the connection has sent
 * fault_tls_after records (c->tls_data_recs, 16 KiB of a C2HData's data
 * each), or, once past that, the first 16 KiB boundary of the next
 * C2HData longer than 16 KiB (a shorter one has no two records to put it
 * between).  Returns the offset in (0, len), or 0: not in this one.
 */
static uint32_t fault_tls_split(const struct tgt_conn *c, uint32_t len)
{
	const struct fx_target *t = c->t;
	uint64_t k;

	if (!t->fault_tls_after || (!c->tls && !c->ktls) || atomic_load(&t->fault_tls_fired))
		return 0;
	k = t->fault_tls_after > c->tls_data_recs ? t->fault_tls_after - c->tls_data_recs : 1;
	return k < DATA_RECS(len) ? (uint32_t)(k * FX_TLS_MAX_PLAINTEXT) : 0;
}

/* The fault's record itself (once per target: a connection that lost the
 * race sends nothing), after the connection's record `recs` of read data
 * (for the log). */
static int fault_tls_record(struct tgt_conn *c, uint64_t recs)
{
	/* a NewSessionTicket (RFC 8446 4.6.1): lifetime 3600 s, age_add,
	 * a 1-byte nonce, a 2-byte ticket, no extensions */
	static const uint8_t ticket[] = {4, 0, 0, 16, 0, 0, 0x0e, 0x10, 1, 2,
					 3, 4, 1, 0,  0, 2, 0xaa, 0xbb, 0, 0};
	static const uint8_t close_notify[] = {1, 0}, fatal[] = {2, 80}, warning[] = {1, 90};
	struct fx_target *t = c->t;
	uint8_t rec[FX_TLS_HEADER + sizeof(ticket) + 1 + FX_TLS_TAG];
	struct iovec v;
	uint8_t type = 21; /* alert */
	int expect = 0, n;

	if (!atomic_compare_exchange_strong(&t->fault_tls_fired, &expect, 1))
		return 0;
	switch (t->fault_tls_kind) {
	case FX_TARGET_FAULT_TLS_TICKET:
		type = 22; /* handshake */
		v = (struct iovec){(void *)ticket, sizeof(ticket)};
		break;
	case FX_TARGET_FAULT_TLS_CLOSE_NOTIFY:
		v = (struct iovec){(void *)close_notify, sizeof(close_notify)};
		break;
	case FX_TARGET_FAULT_TLS_FATAL:
		v = (struct iovec){(void *)fatal, sizeof(fatal)};
		break;
	default:
		v = (struct iovec){(void *)warning, sizeof(warning)};
		break;
	}
	tgt_log(t,
		"%s qid %u: fault injection: a TLS record of type %u (%02x %02x) after %llu "
		"records of read data%s",
		c->peer, c->qid, type, ((const uint8_t *)v.iov_base)[0],
		((const uint8_t *)v.iov_base)[1], (unsigned long long)recs,
		c->ktls ? " (kTLS)" : "");
	if (c->ktls) {
		n = fx_ktls_send_record(c->fd, type, v.iov_base, v.iov_len);
		if (n == -EAGAIN)
			return send_stalled(c);
		if (n == -EBADMSG || n == -EMSGSIZE)
			return ktls_send_failed(c, n);
		if (n == -EIO) /* (sent in part: the rest would be data) */
			return fault_record_cut(c);
		return n ? send_errno(c, -n) : 0;
	}
	n = fx_tls_seal_to(c->tls, rec, type, &v, 1, v.iov_len);
	if (n < 0)
		return seal_failed(c);
	return send_sealed(c, rec, (size_t)n);
}

/* send_iov with the fault's record after the first `at` bytes of
 * iov[0..cnt) (cnt <= 4: a PDU's header, data, digest; or a packed read's
 * header, data, response). */
static int send_iov_fault(struct tgt_conn *c, struct iovec *iov, int cnt, int more, size_t at)
{
	struct iovec a[4], b[4];
	uint64_t recs = c->tls_data_recs + at / FX_TLS_MAX_PLAINTEXT;
	int na = 0, nb = 0, ret;

	for (int i = 0; i < cnt && i < 4; i++) {
		size_t l = iov[i].iov_len;

		if (at >= l) {
			a[na++] = iov[i];
			at -= l;
			continue;
		}
		if (at)
			a[na++] = (struct iovec){iov[i].iov_base, at};
		b[nb++] = (struct iovec){(uint8_t *)iov[i].iov_base + at, l - at};
		at = 0;
	}
	ret = send_iov(c, a, na, 1);
	if (!ret)
		ret = fault_tls_record(c, recs);
	return ret ? ret : send_iov(c, b, nb, more);
}

/* One C2HData PDU carrying a buffer. */
static int send_c2h(struct tgt_conn *c, uint16_t cid, uint32_t datao, const void *data,
		    uint32_t len, int last)
{
	uint8_t b[HDR_BUF];
	struct iovec iov[3];
	uint32_t crc = 0;
	int n, ret;

	unsigned hl = c2h_head(c, b, cid, datao, len, last);
	uint32_t at = fault_tls_split(c, len);

	n = fx_tcp_pdu_iov(iov, b, hl, data, len, &crc);
	c2h_count(c, c->ddgst ? &crc : NULL);
	ret = at ? send_iov_fault(c, iov, n, 0, hl + at) : send_iov(c, iov, n, 0);
	if (c->tls || c->ktls)
		c->tls_data_recs += DATA_RECS(len);
	return ret ? ret : pdu_sent(c);
}

/* A Read's data from buf, then its response with status sf: one PDU
 * without a data digest, FX_TGT_CHUNK pieces with one; the whole response
 * under the send lock. */

/* Whether a read's answer goes out in one send (below): on a secure
 * channel without a data digest, and not while --fault-drop-after counts
 * PDUs (its drop must fall between a read's data and its response). */
static int packs_reads(const struct tgt_conn *c)
{
	return c->tls && !c->ddgst && !c->t->fault_drop_after;
}

/* preadv until every byte of iov[0..cnt) is read or the file ends (the
 * iovecs are consumed); the bytes read or -errno with none. */
static ssize_t preadv_full(int fd, struct iovec *iov, int cnt, uint64_t off)
{
	size_t got = 0;

	while (cnt > 0) {
		ssize_t r = preadv(fd, iov, cnt, (off_t)(off + got));

		if (r == 0)
			break; /* the file shrank under us */
		if (r < 0) {
			if (errno == EINTR)
				continue;
			return got ? (ssize_t)got : -errno;
		}
		got += (size_t)r;
		iov = fx_iov_consume(iov, &cnt, (size_t)r);
	}
	return (ssize_t)got;
}

/* One record's room: header, 2^14 bytes of plaintext, inner type, tag;
 * as many as a chunk holds go out in one send. */
#define TLS_SLOT (FX_TLS_HEADER + FX_TLS_MAX_PLAINTEXT + 1 + FX_TLS_TAG)
#define TLS_SLOTS ((int)(FX_TGT_CHUNK / TLS_SLOT))
/* (a chunk without room for a record would never make progress) */
_Static_assert(FX_TGT_CHUNK / TLS_SLOT >= 2, "FX_TGT_CHUNK holds two TLS records at least");

/*
 * send_read_tls from the namespace: the plaintext stream (C2HData header,
 * the data, CapsuleResp) is laid out in records of 2^14 bytes in chunk,
 * the data read straight into them (one preadv per chunk), each record
 * sealed where it is, and the chunk's records sent at once: the data is
 * copied once (page cache to record), encrypted in place and sent, where
 * a separate staging buffer cost another pass over it and a send per 8
 * records.
 */
static int send_read_tls_ns(struct tgt_conn *c, uint8_t *chunk, uint16_t cid, struct tgt_ns *ns,
			    uint64_t off, uint32_t len)
{
	uint8_t hb[HDR_BUF], rb[HDR_BUF];
	size_t hl = c2h_head(c, hb, cid, 0, len, 1);
	size_t dl = hl + len;                               /* where the data ends in the stream */
	size_t total = dl + resp_head(c, rb, cid, 0, 0, 0); /* (its size; built below) */
	size_t pos = 0;
	uint64_t foff = off; /* the file offset the next data byte comes from */
	uint16_t sf = 0;
	int rb_built = 0, first = 1, ret;
	/* --fault-tls-record: after the record that ends at fault_at (a 16
	 * KiB boundary of the stream inside the data; 0: none), so each
	 * chunk ends there at the latest */
	uint32_t at = fault_tls_split(c, len);
	size_t fault_at = at ? (hl + at + FX_TLS_MAX_PLAINTEXT - 1) / FX_TLS_MAX_PLAINTEXT *
					  FX_TLS_MAX_PLAINTEXT
			     : 0;

	if (fault_at >= dl) /* (the data's last record: the boundary before it) */
		fault_at = (hl + at) / FX_TLS_MAX_PLAINTEXT * FX_TLS_MAX_PLAINTEXT;
	c2h_count(c, NULL);
	while (pos < total) {
		struct iovec v[TLS_SLOTS];
		uint8_t *rp[2]; /* where the response's bytes go (it may span two records) */
		size_t rpos[2], rk[2], want = 0, out = 0;
		int nv = 0, nr = 0, nrec = 0;
		size_t plen[TLS_SLOTS];

		for (; nrec < TLS_SLOTS && pos < total && !(fault_at && pos == fault_at); nrec++) {
			uint8_t *p = chunk + (size_t)nrec * TLS_SLOT + FX_TLS_HEADER;
			size_t e = total - pos < FX_TLS_MAX_PLAINTEXT ? total
								      : pos + FX_TLS_MAX_PLAINTEXT;

			plen[nrec] = e - pos;
			if (pos < hl) {
				size_t k = (e < hl ? e : hl) - pos;

				memcpy(p, hb + pos, k);
				p += k;
				pos += k;
			}
			if (pos < dl && pos < e) {
				size_t k = (e < dl ? e : dl) - pos;

				v[nv].iov_base = p;
				v[nv++].iov_len = k;
				want += k;
				p += k;
				pos += k;
			}
			if (pos < e) {
				rp[nr] = p;
				rpos[nr] = pos - dl;
				rk[nr++] = e - pos;
				pos = e;
			}
		}
		if (want) {
			struct iovec z[TLS_SLOTS];
			ssize_t got;

			memcpy(z, v, sizeof(v[0]) * (size_t)nv);
			got = preadv_full(ns->fd, v, nv, foff);
			if (got < (ssize_t)want) {
				/* a short read: zeros for the rest, Unrecovered Read Error */
				size_t skip = got > 0 ? (size_t)got : 0;

				for (int i = 0; i < nv; i++) {
					size_t k = skip < z[i].iov_len ? skip : z[i].iov_len;

					memset((uint8_t *)z[i].iov_base + k, 0, z[i].iov_len - k);
					skip -= k;
				}
				sf = TGT_SF(2, TGT_SC_UNRECOVERED_READ);
			}
			foff += want;
		}
		if (nr && !rb_built) {
			/* every data byte is read by now: the status is known */
			resp_head(c, rb, cid, sf, 0, 0);
			rb_built = 1;
		}
		for (int i = 0; i < nr; i++)
			memcpy(rp[i], rb + rpos[i], rk[i]);
		/* only the stream's last record is short: the sealed records
		 * lie back to back at their slots */
		for (int r = 0; r < nrec; r++) {
			int n = fx_tls_seal_in_place(c->tls, chunk + out, plen[r]);

			if (n < 0)
				return seal_failed(c);
			out += (size_t)n;
		}
		ret = send_sealed(c, chunk, out);
		if (ret)
			return ret;
		if (fault_at && pos == fault_at) {
			ret = fault_tls_record(c,
					       c->tls_data_recs + fault_at / FX_TLS_MAX_PLAINTEXT);
			fault_at = 0;
			if (ret)
				return ret;
		}
		if (first && (ret = pdu_sent(c)) != 0) /* (the C2HData, counted once it is out) */
			return ret;
		first = 0;
	}
	c->tls_data_recs += DATA_RECS(len);
	return pdu_sent(c);
}

/*
 * On a secure channel without a data digest, a read's answer goes out as
 * one stream of records: its C2HData header, data (from data, or read
 * from the namespace into the records: send_read_tls_ns) and CapsuleResp:
 * a small read is one TLS record and one sendmsg instead of three of each
 * (sealing a record and sending it cost more than 4 KiB of AES-GCM), a
 * large one shares its first and last records with them.  With data NULL
 * the data is read from ns at off into chunk; a short read is zero-filled
 * and answered Unrecovered Read Error, as send_read does.
 */
static int send_read_tls(struct tgt_conn *c, uint8_t *chunk, uint16_t cid, const uint8_t *data,
			 struct tgt_ns *ns, uint64_t off, uint32_t len, uint16_t sf)
{
	uint8_t hb[HDR_BUF], rb[HDR_BUF];
	struct iovec iov[3];
	uint32_t at;
	int ret;

	if (!data)
		return send_read_tls_ns(c, chunk, cid, ns, off, len);
	/* the data already in memory (read from the disk): sealed from there */
	iov[0].iov_base = hb;
	iov[0].iov_len = c2h_head(c, hb, cid, 0, len, 1);
	c2h_count(c, NULL);
	iov[1].iov_base = (void *)data;
	iov[1].iov_len = len;
	iov[2].iov_base = rb;
	iov[2].iov_len = resp_head(c, rb, cid, sf, 0, 0);
	at = fault_tls_split(c, len);
	ret = at ? send_iov_fault(c, iov, 3, 0, iov[0].iov_len + at) : send_iov(c, iov, 3, 0);
	c->tls_data_recs += DATA_RECS(len);
	if (!ret)
		ret = pdu_sent(c); /* (the C2HData) */
	return ret ? ret : pdu_sent(c);
}

int tgt_send_data(struct tgt_conn *c, uint16_t cid, const uint8_t *buf, uint32_t len, uint16_t sf)
{
	int ret = 0;

	tgt_send_lock(c);
	if (packs_reads(c) && len) {
		ret = send_read_tls(c, NULL, cid, buf, NULL, 0, len, sf);
		tgt_send_unlock(c);
		return ret;
	}
	if (!c->ddgst)
		ret = send_c2h(c, cid, 0, buf, len, 1);
	else
		for (uint32_t off = 0; off < len && !ret;) {
			uint32_t n = len - off < FX_TGT_CHUNK ? len - off : FX_TGT_CHUNK;

			ret = send_c2h(c, cid, off, buf + off, n, off + n == len);
			off += n;
		}
	if (!ret)
		ret = send_resp(c, cid, sf, 0, 0);
	tgt_send_unlock(c);
	return ret;
}

static int send_c2h_buf(struct tgt_conn *c, uint16_t cid, const uint8_t *data, uint32_t len)
{
	uint32_t off = 0;

	while (off < len) {
		uint32_t n = len - off < FX_TGT_CHUNK ? len - off : FX_TGT_CHUNK;
		int ret = send_c2h(c, cid, off, data + off, n, off + n == len);

		if (ret)
			return ret;
		off += n;
	}
	return 0;
}

static int send_r2t(struct tgt_conn *c, uint16_t cid, uint16_t ttag, uint32_t len)
{
	uint8_t b[HDR_BUF];
	struct nvme_tcp_r2t_pdu *r = (struct nvme_tcp_r2t_pdu *)b;
	struct iovec iov;
	int ret;

	fx_tcp_hdr_init(&r->hdr, NVME_TCP_R2T, 0, c->hdgst, c->ddgst, c->hpda);
	r->cccid = cid;
	r->ttag = ttag;
	r->r2to = 0;
	r->r2tl = len;
	memset(r->rsvd, 0, sizeof(r->rsvd));
	iov.iov_base = b;
	iov.iov_len = head_finish(b);
	tgt_send_lock(c);
	ret = send_iov(c, &iov, 1, 0);
	if (!ret)
		ret = pdu_sent(c);
	tgt_send_unlock(c);
	return ret;
}

int tgt_send_r2t(struct tgt_conn *c, uint16_t cid, uint16_t ttag, uint32_t len)
{
	return send_r2t(c, cid, ttag, len);
}

/*
 * After a C2HTermReq: closing a socket with unread data in it resets the
 * connection, and a reset discards what is still in our send queue (the
 * C2HTermReq itself, behind answers a host that is slow to read has not
 * taken yet).  So: FIN after what was sent, then read and drop what the
 * host still sends, until its close or FX_TGT_TERM_LINGER_MS at most (a
 * host that keeps sending holds the thread no longer than that).
 */
static void linger_after_term(struct tgt_conn *c)
{
	uint64_t end = tgt_now_ms() + FX_TGT_TERM_LINGER_MS;
	uint8_t sink[4096];

	if (shutdown(c->fd, SHUT_WR) < 0)
		return;
	set_rcvtimeo(c, 50);
	while (tgt_now_ms() < end) {
		ssize_t r = recv(c->fd, sink, sizeof(sink), 0);

		if (r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
			break;
	}
}

/*
 * End the connection for a fatal transport error: C2HTermReq with the fatal
 * error status, the field's byte offset (FEI) and up to 152 bytes of the
 * offending header, then the caller closes.  Returns -EPROTO.
 */
static int term(struct tgt_conn *c, const uint8_t *hdr, unsigned hdr_len, uint16_t fes,
		uint32_t fei, const char *why)
{
	uint8_t b[FX_TCP_TERM_MAX];
	struct iovec iov;

	tgt_log(c->t, "%s qid %u: %s; sending C2HTermReq (fes %u) and closing", c->peer, c->qid,
		why, fes);
	iov.iov_base = b;
	iov.iov_len = fx_tcp_term_build(b, NVME_TCP_C2H_TERM, fes, fei, hdr, hdr_len);
	tgt_send_lock(c);
	send_iov(c, &iov, 1, 0);
	tgt_ioq_quiesce(c); /* (nothing may follow the C2HTermReq) */
	tgt_send_unlock(c);
	c->state = TGT_CONN_CLOSING;
	return -EPROTO;
}

/* Which field of a header fx_tcp_pdu_check() refused (FEI: its byte offset). */
static uint32_t bad_field(const struct nvme_tcp_hdr *h, int hdgst)
{
	unsigned hl = fx_tcp_pdu_hlen(h->type);

	if (!hl || h->type == NVME_TCP_ICRESP || h->type == NVME_TCP_C2H_TERM ||
	    h->type == NVME_TCP_RSP || h->type == NVME_TCP_C2H_DATA || h->type == NVME_TCP_R2T)
		return offsetof(struct nvme_tcp_hdr, type);
	if (h->hlen != hl)
		return offsetof(struct nvme_tcp_hdr, hlen);
	if (!!(h->flags & NVME_TCP_F_HDGST) != !!hdgst && h->type != NVME_TCP_ICREQ)
		return offsetof(struct nvme_tcp_hdr, flags);
	if (h->pdo && h->plen > hl && h->pdo < hl)
		return offsetof(struct nvme_tcp_hdr, pdo);
	return offsetof(struct nvme_tcp_hdr, plen);
}

/* ------------------------------------------------------------ file I/O */

static ssize_t pread_full(int fd, void *buf, size_t n, uint64_t off)
{
	size_t got = 0;

	while (got < n) {
		ssize_t r = pread(fd, (uint8_t *)buf + got, n - got, (off_t)(off + got));

		if (r > 0)
			got += (size_t)r;
		else if (r == 0)
			break; /* the file shrank under us */
		else if (errno != EINTR)
			return got ? (ssize_t)got : -errno;
	}
	return (ssize_t)got;
}

static int pwrite_full(int fd, const void *buf, size_t n, uint64_t off)
{
	size_t put = 0;

	while (put < n) {
		ssize_t r = pwrite(fd, (const uint8_t *)buf + put, n - put, (off_t)(off + put));

		if (r > 0)
			put += (size_t)r;
		else if (r == 0)
			return -EIO;
		else if (errno != EINTR)
			return -errno;
	}
	return 0;
}

static int sock_errno(int e)
{
	return e == EPIPE || e == ECONNRESET || e == ENOTCONN || e == ETIMEDOUT || e == EBADF ||
	       e == ESHUTDOWN;
}

/*
 * Send len bytes of ns at byte offset off as C2HData.  Returns the status for
 * the CapsuleResp (0, or Unrecovered Read Error when the file failed us: the
 * data PDUs are then zero-filled so the stream stays well formed), or a
 * negative errno when the connection broke.
 */
static int send_read(struct tgt_conn *c, uint8_t *chunk, uint16_t cid, struct tgt_ns *ns,
		     uint64_t off, uint32_t len)
{
	uint32_t sent = 0;
	uint16_t sf = 0;
	int ret;

	if (!c->ddgst) {
		/* One PDU; the payload goes page cache -> socket (on kTLS
		 * through the kernel's records). */
		uint8_t b[HDR_BUF];
		struct iovec iov;
		off_t o = (off_t)off;
		/* --fault-tls-record's place in the data (0: none): each
		 * piece below ends there at the latest */
		uint32_t at = fault_tls_split(c, len);

		iov.iov_base = b;
		iov.iov_len = c2h_head(c, b, cid, 0, len, 1);
		ret = send_iov(c, &iov, 1, 1);
		if (ret)
			return ret;
		c->c2h_sent++;
		/* (our secure channel encrypts: no sendfile, the pread below) */
		while (!c->tls && sent < len) {
			ssize_t r;

			if (at && sent == at) {
				at = 0;
				ret = fault_tls_record(c, c->tls_data_recs +
								  sent / FX_TLS_MAX_PLAINTEXT);
				if (ret)
					return ret;
			}
			r = sendfile(c->fd, ns->fd, &o, (at > sent ? at : len) - sent);

			if (r > 0) {
				sent += (uint32_t)r;
				c->send_short = sent < len; /* (see send_errno) */
				continue;
			}
			if (r < 0 && errno == EINTR)
				continue;
			if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
				return send_stalled(c);
			if (r < 0 && c->ktls && (errno == EBADMSG || errno == EMSGSIZE))
				return ktls_send_failed(c, -errno);
			if (r < 0 && sock_errno(errno))
				return send_errno(c, errno);
			break; /* EOF, a read error, or no sendfile here: pread below */
		}
		while (sent < len) {
			uint32_t n = len - sent < FX_TGT_CHUNK ? len - sent : FX_TGT_CHUNK;
			ssize_t got;

			if (at && sent == at) {
				at = 0;
				ret = fault_tls_record(c, c->tls_data_recs +
								  sent / FX_TLS_MAX_PLAINTEXT);
				if (ret)
					return ret;
			}
			if (at > sent && at - sent < n)
				n = at - sent;
			got = pread_full(ns->fd, chunk, n, off + sent);
			if (got < (ssize_t)n) {
				memset(chunk + (got > 0 ? got : 0), 0,
				       n - (uint32_t)(got > 0 ? got : 0));
				sf = TGT_SF(2, TGT_SC_UNRECOVERED_READ);
			}
			iov.iov_base = chunk;
			iov.iov_len = n;
			ret = send_iov(c, &iov, 1, sent + n < len);
			if (ret)
				return ret;
			sent += n;
		}
		if (c->tls || c->ktls)
			c->tls_data_recs += DATA_RECS(len);
		ret = pdu_sent(c);
		return ret ? ret : sf;
	}

	while (sent < len) {
		uint32_t n = len - sent < FX_TGT_CHUNK ? len - sent : FX_TGT_CHUNK;
		ssize_t got = pread_full(ns->fd, chunk, n, off + sent);

		if (got < (ssize_t)n) {
			memset(chunk + (got > 0 ? got : 0), 0, n - (uint32_t)(got > 0 ? got : 0));
			sf = TGT_SF(2, TGT_SC_UNRECOVERED_READ);
		}
		ret = send_c2h(c, cid, sent, chunk, n, sent + n == len);
		if (ret)
			return ret;
		sent += n;
	}
	return sf;
}

int tgt_send_read(struct tgt_conn *c, uint8_t *chunk, uint16_t cid, struct tgt_ns *ns, uint64_t off,
		  uint32_t len)
{
	int ret;

	tgt_send_lock(c);
	if (packs_reads(c) && len) {
		ret = send_read_tls(c, chunk, cid, NULL, ns, off, len, 0);
		tgt_send_unlock(c);
		return ret;
	}
	ret = send_read(c, chunk, cid, ns, off, len);
	if (ret >= 0)
		ret = send_resp(c, cid, (uint16_t)ret, 0, 0);
	tgt_send_unlock(c);
	return ret;
}

/* -------------------------------------------------------------- commands */

static struct tgt_ns *find_ns(struct fx_target *t, uint32_t nsid)
{
	return nsid >= 1 && nsid <= t->n_ns ? &t->ns[nsid - 1] : NULL;
}

/* Validate an I/O Read/Write/Write Zeroes range: ns, byte offset, bytes. */
static uint16_t io_range(struct tgt_conn *c, const struct nvme_sqe *sqe, struct tgt_ns **ns,
			 uint64_t *off, uint32_t *len, int data)
{
	struct fx_target *t = c->t;
	uint64_t slba = (uint64_t)sqe->cdw10 | ((uint64_t)sqe->cdw11 << 32);
	uint64_t nlb = (uint64_t)(sqe->cdw12 & 0xFFFF) + 1;

	*ns = find_ns(t, sqe->nsid);
	if (!*ns)
		return TGT_SF_DNR(0, TGT_SC_INVALID_NS);
	if (slba >= (*ns)->nsze || nlb > (*ns)->nsze - slba)
		return TGT_SF_DNR(0, NVME_SC_LBA_RANGE);
	if (data && (nlb << t->lba_shift) > FX_TGT_MAX_XFER)
		return TGT_SF_DNR(0, NVME_SC_INVALID_FIELD);
	*off = slba << t->lba_shift;
	*len = (uint32_t)(nlb << t->lba_shift);
	return 0;
}

static uint16_t flush_ns(struct fx_target *t, uint32_t nsid)
{
	if (nsid == 0xFFFFFFFFu) {
		for (unsigned i = 0; i < t->n_ns; i++)
			if (fdatasync(t->ns[i].fd) < 0 && errno != EINVAL)
				return TGT_SF(2, TGT_SC_WRITE_FAULT);
		return 0;
	}
	struct tgt_ns *ns = find_ns(t, nsid);

	if (!ns)
		return TGT_SF_DNR(0, TGT_SC_INVALID_NS);
	if (fdatasync(ns->fd) < 0 && errno != EINVAL)
		return TGT_SF(2, TGT_SC_WRITE_FAULT);
	return 0;
}

static uint16_t write_zeroes(struct tgt_conn *c, struct tgt_ns *ns, uint64_t off, uint32_t len)
{
	/* Both files and block devices take ZERO_RANGE (KEEP_SIZE is what
	 * a block device insists on); fall back to writing zeros. */
	if (fallocate(ns->fd, FALLOC_FL_ZERO_RANGE | FALLOC_FL_KEEP_SIZE, (off_t)off, (off_t)len) ==
	    0)
		return 0;
	memset(c->chunk, 0, FX_TGT_CHUNK);
	for (uint32_t done = 0; done < len;) {
		uint32_t n = len - done < FX_TGT_CHUNK ? len - done : FX_TGT_CHUNK;

		if (pwrite_full(ns->fd, c->chunk, n, off + done) < 0)
			return TGT_SF(2, TGT_SC_WRITE_FAULT);
		done += n;
	}
	return 0;
}

/* Make room for n transfer tags, keeping those in use.  Before Connect only
 * the Connect's own data may need one; a Connected queue gets one per
 * command it may hold (SQSIZE + 1). */
static int r2t_table(struct tgt_conn *c, unsigned n)
{
	struct tgt_r2t *r;
	uint16_t *f;

	if (n <= c->r2t_n)
		return 0;
	r = calloc(n, sizeof(*r));
	f = calloc(n, sizeof(*f));
	if (!r || !f) {
		free(r);
		free(f);
		return -ENOMEM;
	}
	if (c->r2t_n)
		memcpy(r, c->r2t, c->r2t_n * sizeof(*r));
	c->r2t_nfree = 0;
	for (unsigned i = n; i-- > 0;) /* tag 0 is handed out first */
		if (!r[i].active)
			f[c->r2t_nfree++] = (uint16_t)i;
	free(c->r2t);
	free(c->r2t_free);
	c->r2t = r;
	c->r2t_free = f;
	c->r2t_n = n;
	return 0;
}

static int r2t_alloc(struct tgt_conn *c)
{
	if (!c->r2t_n && r2t_table(c, 1) < 0)
		return -1;
	if (!c->r2t_nfree)
		return -1;
	atomic_fetch_add(&c->r2t_busy, 1);
	tgt_h2c_wait_add(c);
	return c->r2t_free[--c->r2t_nfree];
}

/* Connect succeeded: until the queue has authenticated (when its host
 * must), only the small buffer AUTH_Receive needs.  Then the buffers a live
 * queue needs, and no more handshake deadline: a host that connects and
 * never authenticates is closed like one that never sends Connect.  (Called
 * after each command until then; abuf keeps what the last one wrote.) */
static int go_live(struct tgt_conn *c)
{
	uint8_t *b;

	if (!tgt_auth_done(c)) {
		if (!c->abuf) {
			c->abuf = malloc(FX_TGT_AUTH_BUF);
			c->abuf_len = c->abuf ? FX_TGT_AUTH_BUF : 0;
		}
		if (!c->abuf) {
			tgt_log_must(c->t, c->peer_key, "internal error: out of memory",
				     "%s qid %u: out of memory", c->peer, c->qid);
			return -ENOMEM;
		}
		return 0;
	}
	if (!c->chunk)
		c->chunk = malloc(FX_TGT_CHUNK);
	if (c->abuf_len < FX_TGT_ADMIN_BUF && (b = realloc(c->abuf, FX_TGT_ADMIN_BUF)) != NULL) {
		c->abuf = b;
		c->abuf_len = FX_TGT_ADMIN_BUF;
	}
	if (!c->chunk || c->abuf_len < FX_TGT_ADMIN_BUF || r2t_table(c, c->sqsize + 1u) < 0) {
		tgt_log_must(c->t, c->peer_key, "internal error: out of memory",
			     "%s qid %u: out of memory for the queue's buffers", c->peer, c->qid);
		return -ENOMEM;
	}
	if (tgt_auth_done(c))
		atomic_store(&c->live, 1);
	return 0;
}

/*
 * The part of a collection of len bytes (admin/Fabrics data by R2T) taken
 * from the target's I/O buffer budget.  A Connect's 1024 bytes and an
 * authentication message (at most FX_TGT_AUTH_BUF) are not: a host must be
 * able to connect and authenticate while others fill the budget, and such
 * a buffer is bounded per connection (FX_TGT_R2T_BUFS of them), like abuf,
 * by the connection limit.  Larger admin data, only once the queue is live,
 * comes from the budget.
 */
static size_t r2t_budget_part(uint32_t len)
{
	return len > FX_TGT_AUTH_BUF ? len : 0;
}

static void r2t_budget_give(struct tgt_conn *c, uint32_t len)
{
	if (r2t_budget_part(len))
		tgt_iobufs_give(c, r2t_budget_part(len));
}

static void r2t_release(struct tgt_conn *c, unsigned idx)
{
	struct tgt_r2t *s = &c->r2t[idx];

	if (s->buf) {
		free(s->buf);
		r2t_budget_give(c, s->len);
		c->r2t_bufs--;
	}
	memset(s, 0, sizeof(*s));
	c->r2t_free[c->r2t_nfree++] = (uint16_t)idx;
	atomic_fetch_sub(&c->r2t_busy, 1);
	atomic_fetch_sub(&c->h2c_wait, 1);
}

/* Fetch a command's data with R2T: I/O writes go to ns as they arrive,
 * anything else is collected in a buffer and executed when complete. */
static int start_r2t(struct tgt_conn *c, const struct nvme_sqe *sqe, uint32_t len,
		     struct tgt_ns *ns, uint64_t off)
{
	struct tgt_r2t *s;
	int idx;

	/* Collected data costs memory a host could pile up without ever
	 * sending it: a few at a time (admin commands rarely overlap). */
	if (!ns && c->r2t_bufs >= FX_TGT_R2T_BUFS)
		return send_resp(c, sqe->cid, TGT_SF(0, NVME_SC_INTERNAL), 0, 0);
	idx = r2t_alloc(c);
	if (idx < 0) /* more commands outstanding than any queue may hold */
		return send_resp(c, sqe->cid, TGT_SF(0, NVME_SC_INTERNAL), 0, 0);
	s = &c->r2t[idx];
	s->active = 1;
	s->sqe = *sqe;
	s->len = len;
	s->done = 0;
	s->ns = ns;
	s->off = off;
	s->r2t_ms = tgt_now_ms();
	if (!ns) {
		/* (large ones out of the target's buffer budget, without
		 * waiting: the host retries; r2t_budget_part) */
		if (r2t_budget_part(len) && tgt_iobufs_try(c, r2t_budget_part(len)) < 0) {
			r2t_release(c, (unsigned)idx);
			return send_resp(c, sqe->cid, TGT_SF(0, NVME_SC_INTERNAL), 0, 0);
		}
		s->buf = malloc(len);
		if (!s->buf) {
			r2t_budget_give(c, len);
			r2t_release(c, (unsigned)idx);
			return send_resp(c, sqe->cid, TGT_SF(0, NVME_SC_INTERNAL), 0, 0);
		}
		c->r2t_bufs++;
	}
	return send_r2t(c, sqe->cid, (uint16_t)idx, len);
}

/* Run a Fabrics or admin command whose data (if any) is all here. */
static int run_admin(struct tgt_conn *c, const struct nvme_sqe *sqe, const uint8_t *data,
		     uint32_t data_len)
{
	struct tgt_req r;
	uint16_t sf;
	int ret;

	memset(&r, 0, sizeof(r));
	r.sqe = sqe;
	r.data = data;
	r.data_len = data_len;
	r.sgl_len = sqe->dptr.length;
	r.out = c->abuf;
	r.out_cap = c->abuf_len;
	if (sqe->opcode == NVME_FABRICS_OPCODE)
		sf = tgt_exec_fabrics(c, &r);
	else
		sf = tgt_exec_admin(c, &r);
	if (c->state == TGT_CONN_LIVE && !atomic_load(&c->live)) {
		ret = go_live(c);
		if (ret)
			return ret;
	}
	if (r.hold)
		return 0;
	tgt_send_lock(c);
	ret = 0;
	if (!sf && r.out_len) {
		uint32_t n = r.out_len < r.sgl_len ? r.out_len : r.sgl_len;

		if (n)
			ret = send_c2h_buf(c, sqe->cid, c->abuf, n);
	}
	if (!ret)
		ret = send_resp(c, sqe->cid, sf, r.dw0, r.dw1);
	if (r.close_after)
		tgt_ioq_quiesce(c); /* (the answer to a Disconnect is our last PDU) */
	tgt_send_unlock(c);
	if (ret)
		return ret;
	if (r.close_after) {
		c->state = TGT_CONN_CLOSING;
		return -ECONNABORTED;
	}
	return 0;
}

static int io_cmd(struct tgt_conn *c, const struct nvme_sqe *sqe, const uint8_t *icd,
		  uint32_t icd_len, int incapsule)
{
	struct fx_target *t = c->t;
	uint32_t slen = sqe->dptr.length;
	struct tgt_ns *ns;
	uint64_t off;
	uint32_t len;
	uint16_t sf;
	int ret;

	/* A namespace whose ANA group this port cannot serve now: the
	 * path-related status tells the host to use another path. */
	if (sqe->opcode == NVME_CMD_READ || sqe->opcode == NVME_CMD_WRITE ||
	    sqe->opcode == NVME_CMD_WRITE_ZEROES || sqe->opcode == NVME_CMD_FLUSH) {
		struct tgt_ns *ans = find_ns(t, sqe->nsid);

		sf = ans ? tgt_ana_io_status(c, ans) : 0;
		if (sf)
			return send_resp(c, sqe->cid, sf, 0, 0);
	}
	/* The engine starts with the queue's first Read or Write: a queue that
	 * never moves data costs one thread, not two. */
	if (!c->ioq && !c->ioq_failed && !t->force_inline &&
	    (sqe->opcode == NVME_CMD_READ || (sqe->opcode == NVME_CMD_WRITE && !incapsule)) &&
	    tgt_ioq_start(c) < 0)
		c->ioq_failed = 1; /* (logged; the queue serves in line) */
	switch (sqe->opcode) {
	case NVME_CMD_READ:
		sf = io_range(c, sqe, &ns, &off, &len, 1);
		if (!sf && (incapsule || slen < len))
			sf = TGT_SF_DNR(0, TGT_SC_SGL_INVALID_DATA);
		if (sf)
			return send_resp(c, sqe->cid, sf, 0, 0);
		if (c->ioq)
			return tgt_ioq_read(c, sqe->cid, ns, off, len);
		if (packs_reads(c))
			return send_read_tls(c, c->chunk, sqe->cid, NULL, ns, off, len, 0);
		ret = send_read(c, c->chunk, sqe->cid, ns, off, len);
		if (ret < 0)
			return ret;
		return send_resp(c, sqe->cid, (uint16_t)ret, 0, 0);

	case NVME_CMD_WRITE:
		sf = io_range(c, sqe, &ns, &off, &len, 1);
		if (!sf && slen < len)
			sf = TGT_SF_DNR(0, TGT_SC_SGL_INVALID_DATA);
		if (!sf && incapsule && icd_len < len)
			sf = TGT_SF_DNR(0, TGT_SC_SGL_INVALID_DATA);
		if (sf)
			return send_resp(c, sqe->cid, sf, 0, 0);
		if (!incapsule && c->ioq)
			return tgt_ioq_write(c, sqe, ns, off, len);
		if (!incapsule)
			return start_r2t(c, sqe, len, ns, off);
		if (pwrite_full(ns->fd, icd, len, off) < 0)
			sf = TGT_SF(2, TGT_SC_WRITE_FAULT);
		else if ((sqe->cdw12 & (1u << 30)) && fdatasync(ns->fd) < 0) /* FUA */
			sf = TGT_SF(2, TGT_SC_WRITE_FAULT);
		return send_resp(c, sqe->cid, sf, 0, 0);

	case NVME_CMD_FLUSH:
		return send_resp(c, sqe->cid, flush_ns(t, sqe->nsid), 0, 0);

	case NVME_CMD_WRITE_ZEROES:
		sf = io_range(c, sqe, &ns, &off, &len, 0);
		if (!sf)
			sf = write_zeroes(c, ns, off, len);
		return send_resp(c, sqe->cid, sf, 0, 0);

	default:
		return send_resp(c, sqe->cid, TGT_SF_DNR(0, NVME_SC_INVALID_OPCODE), 0, 0);
	}
}

/* Data direction of a command: opcode bits 1:0 (for Fabrics, fctype's). */
static unsigned xfer_dir(const struct nvme_sqe *sqe)
{
	if (sqe->opcode == NVME_FABRICS_OPCODE)
		return ((const uint8_t *)sqe)[4] & 3;
	return sqe->opcode & 3;
}

static int on_command(struct tgt_conn *c, const struct nvme_sqe *sqe, const uint8_t *icd,
		      uint32_t icd_len, int icd_bad)
{
	struct fx_target *t = c->t;
	const struct nvme_sgl_desc *sgl = &sqe->dptr;
	int fabrics = sqe->opcode == NVME_FABRICS_OPCODE;
	unsigned dir = xfer_dir(sqe);
	const uint8_t *data = NULL;
	uint32_t data_len = 0;
	int incapsule = 0;

	if (t->verbose && fabrics)
		tgt_log(t, "%s qid %u: cid %u fabrics fctype 0x%02x sgl type 0x%02x len %u",
			c->peer, c->qid, sqe->cid, ((const uint8_t *)sqe)[4], sgl->type,
			sgl->length);
	else if (t->verbose)
		tgt_log(t,
			"%s qid %u: cid %u opcode 0x%02x nsid %u cdw10 0x%x sgl type 0x%02x len %u",
			c->peer, c->qid, sqe->cid, sqe->opcode, sqe->nsid, sqe->cdw10, sgl->type,
			sgl->length);
	if (t->fault_delay_ms) {
		tgt_ioq_kick(c);
		usleep(t->fault_delay_ms * 1000u);
	}

	/* Fabrics commands carry SGLs (PSDT 01b); fused operations are not
	 * supported. */
	if ((sqe->flags & 0xC0) != NVME_CMD_SGL_METABUF || (sqe->flags & 0x03))
		return send_resp(c, sqe->cid, TGT_SF_DNR(0, NVME_SC_INVALID_FIELD), 0, 0);
	if (icd_bad)
		return send_resp(c, sqe->cid, TGT_SF(0, TGT_SC_TRANSIENT_TRANSPORT), 0, 0);

	if (sgl->length) {
		if (sgl->type == NVME_SGL_DATA_BLOCK_OFFSET) {
			/* In-capsule data: only host-to-controller, and the
			 * descriptor's offset/length must lie in what came. */
			if (dir != 1)
				return send_resp(c, sqe->cid,
						 TGT_SF_DNR(0, NVME_SC_SGL_INVALID_TYPE), 0, 0);
			if (sgl->addr > icd_len || sgl->length > icd_len - sgl->addr)
				return send_resp(c, sqe->cid,
						 TGT_SF_DNR(0, NVME_SC_SGL_INVALID_OFFSET), 0, 0);
			data = icd + sgl->addr;
			data_len = sgl->length;
			incapsule = 1;
		} else if (sgl->type != NVME_SGL_TRANSPORT_DATA_BLOCK) {
			return send_resp(c, sqe->cid, TGT_SF_DNR(0, NVME_SC_SGL_INVALID_TYPE), 0,
					 0);
		}
	}

	if (c->state == TGT_CONN_WAIT_CONNECT &&
	    !(fabrics && ((const uint8_t *)sqe)[4] == NVMF_FCTYPE_CONNECT))
		return send_resp(c, sqe->cid, TGT_SF_DNR(0, TGT_SC_CMD_SEQ_ERROR), 0, 0);
	/* A Connect's data is exactly 1024 bytes (as nvmet insists): checked
	 * before any of it is fetched, so that a host nobody knows yet cannot
	 * make us allocate and R2T for more.  Such a host is broken or
	 * hostile: it gets the status and the connection ends. */
	if (fabrics && ((const uint8_t *)sqe)[4] == NVMF_FCTYPE_CONNECT &&
	    sgl->length != sizeof(struct nvmf_connect_data)) {
		int ret = send_resp(c, sqe->cid, TGT_SF_DNR(0, TGT_SC_SGL_INVALID_DATA), 0, 0);

		tgt_log(t, "%s: Connect with %u bytes of data (must be %zu); closing", c->peer,
			sgl->length, sizeof(struct nvmf_connect_data));
		c->state = TGT_CONN_CLOSING;
		return ret ? ret : -ECONNABORTED;
	}
	/* Before the queue has authenticated, only what authenticates it
	 * runs (nothing is fetched with R2T for the others). */
	if (!tgt_auth_allows(c, sqe)) {
		/* A queue whose re-authentication failed goes, rather than
		 * answer everything with an error (the host reconnects). */
		if (tgt_auth_must_close(c)) {
			c->state = TGT_CONN_CLOSING;
			return -ECONNABORTED;
		}
		return send_resp(c, sqe->cid,
				 TGT_SF_DNR(FX_NVME_SCT_CMD_SPECIFIC, FX_NVME_SC_AUTH_REQUIRED), 0,
				 0);
	}
	/* Until the queue is live (Connected and, where its host must,
	 * authenticated) the only data a command may bring is an authentication
	 * message (a Connect's is checked above), none longer than FX_TGT_AUTH_BUF: no
	 * 64 KiB collections for a host that has proved nothing. */
	if (!atomic_load(&c->live) && dir == 1 && sgl->length > FX_TGT_AUTH_BUF)
		return send_resp(c, sqe->cid, TGT_SF_DNR(0, TGT_SC_SGL_INVALID_DATA), 0, 0);

	/* A command served here in line may wait (on the disk, or for a DH
	 * slot in authentication): what the engine has prepared goes first
	 * (io.c, queue_locked).  Reads and R2T writes are the engine's. */
	if (c->ioq && (fabrics || (sqe->opcode != NVME_CMD_READ &&
				   (sqe->opcode != NVME_CMD_WRITE || incapsule))))
		tgt_ioq_kick(c);
	if (fabrics || c->qid == 0) {
		/* Data that did not come in the capsule is fetched first. */
		if (dir == 1 && sgl->length && !incapsule) {
			if (sgl->length > FX_TGT_ADMIN_BUF)
				return send_resp(c, sqe->cid,
						 TGT_SF_DNR(0, TGT_SC_SGL_INVALID_DATA), 0, 0);
			return start_r2t(c, sqe, sgl->length, NULL, 0);
		}
		return run_admin(c, sqe, data, data_len);
	}
	return io_cmd(c, sqe, data, data_len, incapsule);
}

/* --------------------------------------------------------------- PDUs */

static int on_icreq(struct tgt_conn *c, uint8_t *hb)
{
	const struct nvme_tcp_icreq_pdu *q = (const struct nvme_tcp_icreq_pdu *)hb;
	struct nvme_tcp_icresp_pdu p;
	struct iovec iov;
	int ret;

	if (q->pfv != 0)
		return term(c, hb, sizeof(*q), NVME_TCP_FES_UNSUPPORTED_PARAM,
			    offsetof(struct nvme_tcp_icreq_pdu, pfv),
			    "ICReq asks for an unknown PDU format");
	if (q->hpda > 31)
		return term(c, hb, sizeof(*q), NVME_TCP_FES_INVALID_PDU_HDR,
			    offsetof(struct nvme_tcp_icreq_pdu, hpda), "ICReq HPDA out of range");
	memset(&p, 0, sizeof(p));
	fx_tcp_hdr_init(&p.hdr, NVME_TCP_ICRESP, 0, 0, 0, 0);
	p.pfv = 0;
	p.cpda = 0; /* we take data at any dword offset */
	p.digest = q->digest & (NVME_TCP_HDGST_ENABLE | NVME_TCP_DDGST_ENABLE);
	p.maxdata = FX_TGT_MAXH2CDATA;
	iov.iov_base = &p;
	iov.iov_len = sizeof(p);
	ret = send_iov(c, &iov, 1, 0);
	if (ret)
		return ret;
	c->hpda = q->hpda;
	c->hdgst = !!(p.digest & NVME_TCP_HDGST_ENABLE);
	c->ddgst = !!(p.digest & NVME_TCP_DDGST_ENABLE);
	c->state = TGT_CONN_WAIT_CONNECT;
	return pdu_sent(c);
}

/* Receive a PDU's data field into buf: skip the pad up to pdo, read datal
 * bytes and check the data digest.  *bad = 1 on a digest mismatch. */
static int recv_data(struct tgt_conn *c, const struct nvme_tcp_hdr *h, unsigned have, uint8_t *buf,
		     uint32_t datal, int *bad)
{
	int ret;

	*bad = 0;
	ret = discard(c, h->pdo - have);
	if (ret)
		return ret;
	ret = recv_all(c, buf, datal);
	if (ret)
		return ret;
	if (h->flags & NVME_TCP_F_DDGST) {
		uint32_t d;

		ret = recv_all(c, &d, sizeof(d));
		if (ret)
			return ret;
		if (d != fx_tcp_ddgst(buf, datal)) {
			*bad = 1;
			tgt_log(c->t, "%s qid %u: data digest error (failing the command)", c->peer,
				c->qid);
		}
	}
	return 0;
}

/* The controller's KATO ran out before this PDU (tgt_ctrl_alive shut its
 * queues and logged why): the connection ends without running anything. */
static int keep_alive_lost(struct tgt_conn *c, int err)
{
	c->state = TGT_CONN_CLOSING;
	return err;
}

static int on_capsule(struct tgt_conn *c, uint8_t *hb, unsigned have)
{
	const struct nvme_tcp_hdr *h = (const struct nvme_tcp_hdr *)hb;
	struct nvme_sqe sqe;
	uint32_t icd_len = 0;
	int bad = 0, ret;

	if (h->plen > have) {
		unsigned dd = (h->flags & NVME_TCP_F_DDGST) ? NVME_TCP_DIGEST_LEN : 0;

		/* fx_tcp_pdu_check() made have <= pdo < plen - dd */
		icd_len = h->plen - h->pdo - dd;
		if (icd_len > FX_TGT_ICD_MAX)
			return term(c, hb, have, NVME_TCP_FES_DATA_LIMIT_EXCEEDED,
				    offsetof(struct nvme_tcp_hdr, plen),
				    "in-capsule data larger than IOCCSZ");
		if (!c->icd && !(c->icd = malloc(FX_TGT_ICD_MAX)))
			return -ENOMEM;
		ret = recv_data(c, h, have, c->icd, icd_len, &bad);
		if (ret)
			return ret;
	}
	memcpy(&sqe, hb + sizeof(*h), sizeof(sqe));
	__atomic_store_n(&c->sqhd,
			 (uint16_t)(c->sqsize ? (c->sqhd + 1u) % (c->sqsize + 1u) : c->sqhd + 1u),
			 __ATOMIC_RELAXED);
	/* Checked now, not at the keep-alive tick: a capsule that waited in
	 * the socket while we were stalled past KATO must not run (nor
	 * refresh the timer for those queued behind it). */
	ret = tgt_ctrl_alive(c);
	if (ret)
		return keep_alive_lost(c, ret);
	return on_command(c, &sqe, c->icd, icd_len, bad);
}

/* A write's data is the controller's activity as a command is: a KATO-0
 * controller whose admin queue saw no command while a host slowly sent a
 * write's data must not be reaped as idle the moment that write ends.  And
 * data read after the KATO ran out is not written: the host may have
 * re-issued that write on another path. */
static int data_keeps_alive(struct tgt_conn *c)
{
	int ret = tgt_ctrl_alive(c);

	return ret ? keep_alive_lost(c, ret) : 0;
}

static int finish_r2t(struct tgt_conn *c, unsigned idx)
{
	struct tgt_r2t *s = &c->r2t[idx];
	struct nvme_sqe sqe = s->sqe;
	uint16_t sf = s->err;
	int ret;

	if (s->ns) {
		if (!sf && (sqe.cdw12 & (1u << 30)) && fdatasync(s->ns->fd) < 0) /* FUA */
			sf = TGT_SF(2, TGT_SC_WRITE_FAULT);
		r2t_release(c, idx);
		return send_resp(c, sqe.cid, sf, 0, 0);
	}
	if (sf) {
		r2t_release(c, idx);
		return send_resp(c, sqe.cid, sf, 0, 0);
	}
	/* Admin/Fabrics data: run the command on the collected buffer. */
	uint8_t *buf = s->buf;
	uint32_t len = s->len;

	s->buf = NULL;
	c->r2t_bufs--;
	r2t_release(c, idx);
	ret = run_admin(c, &sqe, buf, len);
	free(buf);
	r2t_budget_give(c, len);
	return ret;
}

static int on_h2c_data(struct tgt_conn *c, uint8_t *hb, unsigned have)
{
	const struct nvme_tcp_data_pdu *d = (const struct nvme_tcp_data_pdu *)hb;
	unsigned dd = (d->hdr.flags & NVME_TCP_F_DDGST) ? NVME_TCP_DIGEST_LEN : 0;
	uint32_t datal = d->hdr.plen - d->hdr.pdo - dd; /* > 0: checked */
	struct tgt_r2t *s;
	int bad, ret;

	if (d->datal != datal)
		return term(c, hb, have, NVME_TCP_FES_INVALID_PDU_HDR,
			    offsetof(struct nvme_tcp_data_pdu, datal),
			    "H2CData DATAL disagrees with PLEN");
	if (datal > FX_TGT_MAXH2CDATA)
		return term(c, hb, have, NVME_TCP_FES_DATA_LIMIT_EXCEEDED,
			    offsetof(struct nvme_tcp_data_pdu, datal),
			    "H2CData larger than MAXH2CDATA");
	if (c->ioq && (d->ttag & TGT_TTAG_IO)) {
		const char *why = NULL;
		uint32_t fei = 0;
		uint16_t fes = 0;
		uint8_t *dst = tgt_ioq_h2c_dest(c, d->ttag, d->cccid, d->datao, datal, &why, &fei,
						&fes);

		if (!dst)
			return term(c, hb, have, fes, fei, why);
		ret = recv_data(c, &d->hdr, have, dst, datal, &bad);
		if (ret)
			return ret;
		ret = data_keeps_alive(c);
		if (ret)
			return ret;
		return tgt_ioq_h2c_done(c, d->ttag, datal, bad);
	}
	if (d->ttag >= c->r2t_n || !c->r2t[d->ttag].active)
		return term(c, hb, have, NVME_TCP_FES_INVALID_PDU_HDR,
			    offsetof(struct nvme_tcp_data_pdu, ttag), "H2CData for no R2T of ours");
	s = &c->r2t[d->ttag];
	if (s->sqe.cid != d->cccid)
		return term(c, hb, have, NVME_TCP_FES_INVALID_PDU_HDR,
			    offsetof(struct nvme_tcp_data_pdu, cccid),
			    "H2CData CCCID does not match its R2T");
	if (d->datao != s->done || datal > s->len - s->done)
		return term(c, hb, have, NVME_TCP_FES_DATA_OUT_OF_RANGE,
			    offsetof(struct nvme_tcp_data_pdu, datao),
			    "H2CData outside the R2T's range");

	ret = recv_data(c, &d->hdr, have, s->buf ? s->buf + s->done : c->chunk, datal, &bad);
	if (ret)
		return ret;
	ret = data_keeps_alive(c);
	if (ret)
		return ret;
	if (bad && !s->err)
		s->err = TGT_SF(0, TGT_SC_TRANSIENT_TRANSPORT);
	if (s->ns && !s->err && pwrite_full(s->ns->fd, c->chunk, datal, s->off + s->done) < 0)
		s->err = TGT_SF(2, TGT_SC_WRITE_FAULT);
	s->done += datal;
	if (s->done == s->len)
		return finish_r2t(c, d->ttag);
	return 0;
}

static uint32_t max_plen(uint8_t type)
{
	/* Header + digest + the most pad a pdo byte can express + data + digest */
	switch (type) {
	case NVME_TCP_CMD:
		return UINT8_MAX + FX_TGT_ICD_MAX + NVME_TCP_DIGEST_LEN;
	case NVME_TCP_H2C_DATA:
		return UINT8_MAX + FX_TGT_MAXH2CDATA + NVME_TCP_DIGEST_LEN;
	default: /* ICReq (exactly 128) and TermReq (header + 152) */
		return FX_TCP_TERM_MAX;
	}
}

static int recv_pdu(struct tgt_conn *c)
{
	uint8_t hb[HDR_BUF] __attribute__((aligned(8)));
	struct nvme_tcp_hdr *h = (struct nvme_tcp_hdr *)hb;
	int n, ret;

	/* Silence before a PDU is legal (see the top of this file). */
	ret = recv_bytes(c, hb, sizeof(*h), 1);
	if (ret)
		return ret;

	if (h->type == NVME_TCP_H2C_TERM) {
		struct nvme_tcp_term_pdu *p = (struct nvme_tcp_term_pdu *)hb;

		if (h->hlen == sizeof(*p) && h->plen >= sizeof(*p) &&
		    recv_all(c, hb + sizeof(*h), sizeof(*p) - sizeof(*h)) == 0)
			tgt_log(c->t,
				"%s qid %u: host terminated the connection (H2CTermReq fes %u)",
				c->peer, c->qid, p->fes);
		else
			tgt_log(c->t, "%s qid %u: host terminated the connection", c->peer, c->qid);
		c->state = TGT_CONN_CLOSING;
		return -ECONNRESET;
	}
	if ((c->state == TGT_CONN_WAIT_ICREQ) != (h->type == NVME_TCP_ICREQ))
		return term(c, hb, sizeof(*h), NVME_TCP_FES_PDU_SEQ_ERR, 0,
			    c->state == TGT_CONN_WAIT_ICREQ ? "first PDU is not an ICReq"
							    : "second ICReq");
	n = fx_tcp_pdu_check(h, 0, c->hdgst, c->ddgst, max_plen(h->type));
	if (n < 0) {
		uint32_t fei = bad_field(h, c->hdgst);
		int too_long = fei == offsetof(struct nvme_tcp_hdr, plen) &&
			       h->plen > max_plen(h->type) &&
			       (h->type == NVME_TCP_CMD || h->type == NVME_TCP_H2C_DATA);

		return term(c, hb, sizeof(*h),
			    too_long ? NVME_TCP_FES_DATA_LIMIT_EXCEEDED
				     : NVME_TCP_FES_INVALID_PDU_HDR,
			    fei, "malformed PDU header");
	}
	if ((unsigned)n > sizeof(hb)) /* cannot happen: hlen <= 128 */
		return term(c, hb, sizeof(*h), NVME_TCP_FES_INVALID_PDU_HDR, 2, "header too long");
	ret = recv_all(c, hb + sizeof(*h), (size_t)n - sizeof(*h));
	if (ret)
		return ret;
	if (fx_tcp_hdgst_check(hb, (unsigned)n) < 0)
		return term(c, hb, h->hlen, NVME_TCP_FES_HDR_DIGEST_ERR, 0, "header digest error");
	switch (h->type) {
	case NVME_TCP_ICREQ:
		return on_icreq(c, hb);
	case NVME_TCP_CMD:
		return on_capsule(c, hb, (unsigned)n);
	case NVME_TCP_H2C_DATA:
		return on_h2c_data(c, hb, (unsigned)n);
	default:
		return term(c, hb, (unsigned)n, NVME_TCP_FES_INVALID_PDU_HDR, 0,
			    "unexpected PDU type");
	}
}

void *tgt_conn_main(void *arg)
{
	struct tgt_conn *c = arg;
	struct fx_target *t = c->t;
	sigset_t pipe, old;
	int ret;

	/* sendfile() has no MSG_NOSIGNAL: a host gone while a cached read
	 * is sent must fail the send (EPIPE), not kill the process.  (The
	 * caller's mask is restored at the end: tgt_serve_fd runs here on
	 * its thread; a SIGPIPE left pending is taken first.) */
	sigemptyset(&pipe);
	sigaddset(&pipe, SIGPIPE);
	pthread_sigmask(SIG_BLOCK, &pipe, &old);
	c->state = TGT_CONN_WAIT_ICREQ;
	if (t->verbose)
		tgt_log(t, "%s: connected", c->peer);
	/* the secure channel comes before ICReq (it logs its own failures) */
	ret = tgt_tls_accept(c);
	while (ret == 0)
		ret = recv_pdu(c);
	/* First the disk I/O in flight ends (the engine sends nothing more),
	 * so that no write of this queue lands after its qid is free again
	 * or a controller reset waiting for it completes; then the queue is
	 * given back before the host can see the close, so that it may
	 * reconnect the same qid at once.  (The state stays as it was until
	 * the reason is told below: CLOSING means it was told already.) */
	tgt_ioq_stop(c);
	/* The engine's sends failed first and it shut the socket: its error
	 * is the reason (-ECONNABORTED when it has said why already).  Read
	 * only now that its thread is joined: a send and our receive see
	 * one broken connection at once, and its error may come after our
	 * receive returned. */
	if (ret == -ECONNRESET && atomic_load(&c->engine_err))
		ret = atomic_load(&c->engine_err);
	/* Neither thread may have seen TCP's own error: when TCP ends a
	 * connection whose window the host kept shut, the error can reach
	 * the socket's receive and send as a plain reset or end (one of them
	 * takes it, the other may be woken by our shutdown first).  The
	 * socket's state still says the window was shut; whether TCP gave up
	 * or the host reset it cannot tell, so the line says both. */
	if (ret == -ECONNRESET && !t->stop && closed_on_a_shut_window(c->fd) && say_why_first(c))
		tgt_log(t,
			"%s qid %u: connection ended with the host's window shut (the host "
			"stopped reading until TCP's user timeout, %u ms, or reset it); closed",
			c->peer, c->qid, tgt_user_timeout_ms(t));
	/* (CLOSING: the reason was logged where it was found) */
	if (atomic_load(&c->why_said))
		c->state = TGT_CONN_CLOSING; /* (a send said why, here or in the engine) */
	if (ret == -ETIMEDOUT && !t->stop && c->state != TGT_CONN_CLOSING)
		/* TCP gave up: keepalive probes or our data unacknowledged (or
		 * refused by a zero window) for longer than the user timeout */
		tgt_log(t,
			"%s qid %u: host stopped reading or vanished (nothing acknowledged for "
			"%u ms); closed",
			c->peer, c->qid, tgt_user_timeout_ms(t));
	else if (ret != -ECONNRESET && ret != -EPROTO && ret != -ECONNABORTED && !t->stop &&
		 c->state != TGT_CONN_CLOSING)
		tgt_log(t, "%s qid %u: connection ended: %s", c->peer, c->qid, strerror(-ret));
	else if (t->verbose)
		tgt_log(t, "%s qid %u: closed (%s; %s, engine %d)", c->peer, c->qid,
			tgt_conn_state_str(c->state), strerror(-ret), atomic_load(&c->engine_err));
	c->state = TGT_CONN_CLOSING;
	tgt_conn_drained(c);
	tgt_conn_detach(c);
	if (ret == -EPROTO)
		linger_after_term(c);
	shutdown(c->fd, SHUT_RDWR);
	tgt_auth_queue_free(c);
	for (unsigned i = 0; i < c->r2t_n; i++)
		if (c->r2t[i].buf) {
			free(c->r2t[i].buf);
			r2t_budget_give(c, c->r2t[i].len);
		}
	free(c->r2t);
	free(c->r2t_free);
	free(c->icd);
	free(c->chunk);
	free(c->abuf);
	fx_tls_free(c->tls);
	c->tls = NULL;
	fx_ktls_free(c->ktls);
	c->ktls = NULL;
	if (c->tls_open_counted)
		atomic_fetch_sub(&t->tls_open, 1);
	c->tls_open_counted = 0;
	if (!sigismember(&old, SIGPIPE)) {
		const struct timespec none = {0, 0};

		while (sigtimedwait(&pipe, NULL, &none) == SIGPIPE)
			;
		pthread_sigmask(SIG_SETMASK, &old, NULL);
	}
	atomic_store(&c->done, 1);
	return NULL;
}
