/*
 * The NVMe/TCP transport: a namespace of a remote NVMe-oF controller, read
 * and written from userspace over io_uring sockets.
 *
 * The device owns the controller (admin queue and keep alive, host/ctrl.c).
 * Each fx_queue (one per thread) connects `queues` I/O queues of its own,
 * each a TCP connection driven by one io_uring ring.  Per connection there
 * is always one recv in flight and at most one sendmsg, so the byte stream
 * stays ordered without locks.
 *
 * Receive is a small state machine: the 24-byte PDU header (+ digest) into
 * a header buffer, then C2HData payload into the caller's buffer, then the
 * data digest.  While only small reads are in flight, one recv takes all the
 * socket holds into a stage buffer and the machine is fed from it (many PDUs
 * per system call: at 4 KiB and queue depth 32 a recv per PDU was four
 * io_uring operations per I/O); with a large read in flight it receives
 * exactly what comes next, so large payloads go straight from the socket
 * into the caller's buffer (the one copy).  Every
 * length and id in a PDU is checked before it is used; a bad PDU, a digest
 * mismatch, a dropped connection or a command past its deadline takes the
 * connection down and fails its commands with a clear errno.
 *
 * Reconnecting never blocks the queue's thread (the event loop, for async
 * callers): a connection that is down and needed is handed to the queue's
 * connector thread (host/dev.c, as the URI options, the controller and the
 * qid map), which does the TCP connect, ICReq, Connect and, when the
 * controller is gone, its re-open, all blocking and without the GIL, then
 * posts the connected socket to a slot and writes an eventfd that the ring
 * polls.  The queue's thread adopts the socket when that poll completes, as
 * it does every other completion.  One attempt runs at a time per queue,
 * reconnect_ms apart after a failure.  While no connection is live a request
 * waits until max_reconnects attempts have failed or io_timeout_ms has
 * passed, then fails with the last attempt's error (or -ETIMEDOUT).
 */
#ifndef _GNU_SOURCE /* the C tests and fuzzers pass -D_GNU_SOURCE */
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "tcp_ctrl.h"
#include "../internal.h"
#include "../host/dev.h"
#include "../reqs.h"
#include "../nvme_tcp/pdu.h"
#include "../nvme_tcp/ktls.h"
#include "../nvme_tcp/tls.h"
#include "../nvme_tcp/xfer.h"

/* Every PDU the host receives after ICResp has a 24-byte header
 * (CapsuleResp, C2HData, R2T, C2HTermReq). */
#define RX_HLEN FX_TCP_RSP_HLEN
_Static_assert(FX_TCP_DATA_HLEN == RX_HLEN && sizeof(struct nvme_tcp_r2t_pdu) == RX_HLEN &&
		       sizeof(struct nvme_tcp_term_pdu) == RX_HLEN,
	       "one header length for every PDU the data path receives");
#define RX_HDR_MAX (RX_HLEN + NVME_TCP_DIGEST_LEN)
#define TX_BATCH 64 /* send items per sendmsg */
#define CID_SLOT_BITS 10
#define CID_SLOT_MASK ((1u << CID_SLOT_BITS) - 1)
#define TICK_MS 100
/* Receiving: while every read in flight on a connection is small, one recv
 * takes whatever the socket holds (up to RX_STAGE bytes: at queue depth 32,
 * a dozen or so PDUs at a time) and the PDUs are parsed out of it, payloads
 * copied to their buffers.  A read larger than RX_SMALL_MAX in flight
 * switches the connection to exact receives (header, then payload straight
 * into the caller's buffer), so large reads are never copied. */
#define RX_STAGE (128u << 10)
#ifndef RX_SMALL_MAX /* (the receive-path fuzzer sets its own) */
#define RX_SMALL_MAX (16u << 10)
#endif
#define BIG_CMD 1
#define BIG_READ 2
/* A secure channel's send buffer: this many sealed records per send (PDUs
 * are packed up to 2^14 plaintext bytes a record). */
#define TLS_TX_RECORDS 8
#define TLS_REC_MAX (FX_TLS_HEADER + FX_TLS_MAX_PLAINTEXT + 1 + FX_TLS_TAG)
_Static_assert(RX_STAGE >= 2 * (FX_TLS_HEADER + FX_TLS_MAX_CIPHERTEXT),
	       "the stage holds a whole record after a partial one");

enum ud_kind { UD_RECV = 1, UD_SEND = 2, UD_TICK = 3, UD_WAKE = 4, UD_CANCEL = 5 };
#define UD(conn, kind) (((uint64_t)(conn) << 8) | (kind))

/* --------------------------------------------------------------- device */

/* The URI options, the controller, the qid map and the connect attempts
 * are host/dev.c's (nd); what is here is how commands move. */
struct tcp_dev {
	struct fx_dev base;
	struct fx_nvmf_dev nd;
};

static int tcp_dev_open(const struct fx_transport_ops *ops, const char *target,
			const struct fx_dev_opts *o, struct fx_dev **out)
{
	struct tcp_dev *d = calloc(1, sizeof(*d));
	int ret;

	if (!d)
		return -ENOMEM;
	d->base.ops = ops;
	ret = fx_nvmf_dev_init(&d->nd, &fx_tcp_transport, "nvme+tcp", target, &d->base.info);
	if (ret < 0) {
		free(d);
		return ret;
	}
	if (d->nd.ctrl->icdoff)
		fprintf(stderr,
			"fx100io: nvme+tcp: controller reports in-capsule data offset (ICDOFF) %u; "
			"writes go by R2T, never in the capsule\n",
			d->nd.ctrl->icdoff);
	d->base.info.caps = FX_CAP_FLUSH | FX_CAP_ALIGNED_ONLY |
			    (o->readonly ? FX_CAP_READONLY : 0);
	*out = &d->base;
	return 0;
}

static void tcp_dev_close(struct fx_dev *dev)
{
	struct tcp_dev *d = (struct tcp_dev *)dev;

	fx_nvmf_dev_fini(&d->nd);
	free(d);
}

/* ----------------------------------------------------------- connections */

struct cmd {
	uint8_t busy;
	uint8_t gen;
	uint8_t opcode;
	uint32_t req; /* request slot */
	char *data;
	uint32_t len;
	struct fx_tcp_xfer x; /* what the PDU rules allow next (nvme_tcp/xfer.c) */
	/* Queued send items that point into data.  At most the capsule plus
	 * the H2CData of one R2T (fx_tcp_xfer_r2t allows one outstanding,
	 * in order, inside the transfer), so it cannot wrap. */
	uint32_t sends;
	uint32_t r2t_items; /* H2CData items of the open R2T not yet sent */
	uint8_t rsp_seen;   /* response arrived while sends were pending */
	uint8_t big;        /* BIG_CMD: longer than RX_SMALL_MAX, BIG_READ: and a read */
	uint16_t rsp_status;
	uint64_t slba;
	int64_t deadline;
};

struct send_item {
	struct send_item *next;
	struct cmd *cmd; /* whose data it carries, or NULL */
	uint8_t h2c;     /* H2CData answering the command's open R2T */
	struct iovec iov[4];
	int niov;
	/* a capsule's header and digest; a peer alignment that would pad
	 * past them is refused (-EPROTO) */
	uint8_t hdr[FX_TCP_CMD_HLEN + NVME_TCP_DIGEST_LEN];
	uint32_t ddgst;
};

/* DOWN -> CONNECTING (the connector has it) -> LIVE -> DRAINING (kernel
 * I/O still points at buffers) -> DOWN. */
enum conn_state { CONN_DOWN, CONN_CONNECTING, CONN_LIVE, CONN_DRAINING };
enum rx_state { RX_HDR, RX_PAD, RX_DATA, RX_DDGST };

static const char *conn_state_str(enum conn_state st)
{
	switch (st) {
	case CONN_DOWN:
		return "down";
	case CONN_CONNECTING:
		return "connecting";
	case CONN_LIVE:
		return "live";
	case CONN_DRAINING:
		return "draining";
	}
	return "?";
}

struct tcp_queue;

struct conn {
	struct tcp_queue *q;
	unsigned idx;
	struct fx_tcp_conn nc;
	/* qid, controller epoch, in-capsule size and ICDOFF of the live
	 * connection, copied at connect: another thread may re-open (and
	 * free) the controller while this connection sends */
	struct fx_nvmf_io_conn io;
	enum conn_state state;
	int err;          /* why it went down */
	int64_t retry_at; /* earliest reconnect */
	uint32_t fails;   /* connect attempts failed since it was last live */
	int ever_connected;
	int recv_busy, send_busy;
	struct cmd *cmds;
	uint16_t ncmds;
	uint16_t *free_cmds;
	uint16_t nfree;
	uint16_t limit; /* in flight at most: slots, and the live queue's SQ less one */
	/* receive */
	uint8_t *stage;     /* RX_STAGE bytes: bulk receives while reads are small */
	uint32_t big_reads; /* reads in flight longer than RX_SMALL_MAX */
	uint32_t big_cmds;  /* commands in flight longer than RX_SMALL_MAX */
	uint32_t writes;    /* write commands in flight (see conn_carries) */
	int rx_staged;      /* the recv in flight targets stage */
	int rx_cancel;      /* we asked the kernel to cancel that recv */
	enum rx_state rx;
	uint8_t rxhdr[RX_HDR_MAX];
	uint8_t rxpad[256];
	unsigned rx_have, rx_need;
	struct cmd *rx_cmd;
	uint32_t rx_datao, rx_datal;
	uint8_t rx_flags;
	uint8_t rx_dg[NVME_TCP_DIGEST_LEN];
	/* send */
	struct send_item *tx_head, *tx_tail;
	struct send_item *tx_out[TX_BATCH];
	int ntx_out;
	struct iovec tx_iov[TX_BATCH * 4];
	struct msghdr tx_msg;
	/* secure channel (nc.tls): the stage holds ciphertext, tls_have bytes
	 * of it not yet opened (a partial record kept at its start); sends
	 * seal the batch's iovecs (tx_iov[tls_pi..], tls_plain bytes left)
	 * into tls_ct, TLS_TX_RECORDS records at a time, and send
	 * tls_ct[tls_ct_pos..tls_ct_len) */
	uint32_t tls_have;
	uint8_t *tls_ct;
	size_t tls_ct_pos, tls_ct_len, tls_plain;
	unsigned tls_pi;
};

struct tcp_queue {
	struct fx_queue base;
	struct fx_ring ring;
	struct tcp_dev *dev;
	struct conn *conns;
	unsigned nconns;
	unsigned rr;
	uint32_t depth; /* commands in flight per connection */
	struct req_table t;
	int tick_armed;
	struct __kernel_timespec tick;
	/* reconnecting: everything here is the queue thread's, but cx (set up
	 * on first need: most queues never lose a connection; cx.q is NULL
	 * until then).  The ring polls cx.wake_fd (UD_WAKE). */
	struct fx_nvmf_connector cx;
	int cx_busy;                /* an attempt is out (a conn is CONNECTING) */
	int wake_armed;             /* the poll on cx.wake_fd is in the ring */
	int starved;                /* requests wait for a connection */
	struct fx_nvmf_waits waits; /* requests waiting for a connection */
};

#define now_ms fx_now_ms

/* An SQE, submitting what is queued to make room if needed.  NULL when the
 * ring still has none (its submit failed): the caller leaves its work queued
 * and resume() arms it again; ring_submit() handles the error. */
static struct io_uring_sqe *get_sqe(struct tcp_queue *q)
{
	struct io_uring_sqe *sqe = io_uring_get_sqe(&q->ring.uring);
	if (!sqe) {
		io_uring_submit(&q->ring.uring);
		sqe = io_uring_get_sqe(&q->ring.uring);
	}
	return sqe;
}

/* Where the next bytes the receive state machine expects go. */
static uint8_t *rx_dst(struct conn *c)
{
	switch (c->rx) {
	case RX_HDR:
		return c->rxhdr + c->rx_have;
	case RX_PAD:
		return c->rxpad + c->rx_have;
	case RX_DATA:
		/* The caller's buffer (straight from the socket when exact) */
		return (uint8_t *)c->rx_cmd->data + c->rx_datao + c->rx_have;
	default:
		return c->rx_dg + c->rx_have;
	}
}

/* Keep one recv in flight: into the stage while only small reads are in
 * flight (what the socket holds, many PDUs per call), else exactly what the
 * state machine expects next, with MSG_WAITALL (large payloads land in the
 * caller's buffer with no copy). */
static void arm_recv(struct conn *c)
{
	struct io_uring_sqe *sqe = get_sqe(c->q);

	if (!sqe)
		return; /* recv_busy stays 0: resume() arms it again */
	if (c->nc.tls) {
		/* ciphertext into the stage, after what is left of a partial
		 * record, as much as fits (tls_rx opens it) */
		io_uring_prep_recv(sqe, c->nc.fd, c->stage + c->tls_have, RX_STAGE - c->tls_have,
				   0);
		c->rx_staged = 1;
	} else if (c->stage && c->big_reads == 0) {
		io_uring_prep_recv(sqe, c->nc.fd, c->stage, RX_STAGE, 0);
		c->rx_staged = 1;
	} else {
		/* (not on kTLS: there a record the kernel refuses after part of
		 * the receive has come is reported once, to whichever recvmsg
		 * call meets it first, and io_uring's MSG_WAITALL retry would
		 * meet it and complete with the part alone: the next receive
		 * would then wait for data that never comes.  Without it the
		 * part comes back and the refusal waits for our next call.) */
		io_uring_prep_recv(sqe, c->nc.fd, rx_dst(c), c->rx_need - c->rx_have,
				   c->nc.ktls ? 0 : MSG_WAITALL);
		c->rx_staged = 0;
	}
	io_uring_sqe_set_data64(sqe, UD(c->idx, UD_RECV));
	c->recv_busy = 1;
	c->rx_cancel = 0;
}

/* A large read is about to be sent while a staged recv waits: cancel that
 * recv first (the SQE goes before the capsule's send), so the read's
 * payload is received straight into its buffer.  A recv that completes
 * anyway is parsed as usual: only a copy more. */
static void cancel_staged_recv(struct conn *c)
{
	if (!c->recv_busy || !c->rx_staged || c->rx_cancel || c->nc.tls)
		return;
	struct io_uring_sqe *sqe = get_sqe(c->q);
	if (!sqe)
		return;
	io_uring_prep_cancel64(sqe, UD(c->idx, UD_RECV), 0);
	io_uring_sqe_set_data64(sqe, UD(c->idx, UD_CANCEL));
	c->rx_cancel = 1;
}

static void rx_expect_header(struct conn *c)
{
	c->rx = RX_HDR;
	c->rx_have = 0;
	c->rx_need = RX_HLEN + (c->nc.hdgst ? NVME_TCP_DIGEST_LEN : 0);
	c->rx_cmd = NULL;
}

static void free_tx(struct conn *c)
{
	for (int i = 0; i < c->ntx_out; i++)
		free(c->tx_out[i]);
	c->ntx_out = 0;
	while (c->tx_head) {
		struct send_item *n = c->tx_head->next;
		free(c->tx_head);
		c->tx_head = n;
	}
	c->tx_tail = NULL;
}

static void cmd_done(struct conn *c, struct cmd *m, int err, uint16_t status);

/* Take a connection down: in-flight I/O finishes (shutdown makes the
 * kernel end our recv/send promptly); commands fail once nothing in the
 * kernel still points at their buffers. */
static void conn_fail(struct conn *c, int err)
{
	if (c->state != CONN_LIVE)
		return;
	c->state = CONN_DRAINING;
	c->err = err;
	if (err != -ECANCELED)
		c->q->base.stats.conn_errors++;
	shutdown(c->nc.fd, SHUT_RDWR);
}

static void conn_finish_drain(struct conn *c)
{
	struct tcp_queue *q = c->q;

	if (c->state != CONN_DRAINING || c->recv_busy || c->send_busy)
		return;
	/* kTLS decrypts a record into the caller's buffer before it checks
	 * the tag: with an exact receive there, what came but was not
	 * reported (a bad tag, or the connection failed any other way before
	 * the next receive said why) may be bytes nobody authenticated.  A
	 * failed read's buffer holds data or zeros, as on our own layer. */
	if (c->nc.ktls && !c->rx_staged && c->rx == RX_DATA && c->rx_cmd && c->rx_cmd->busy)
		memset(rx_dst(c), 0, c->rx_need - c->rx_have);
	for (uint16_t i = 0; i < c->ncmds; i++) {
		struct cmd *m = &c->cmds[i];
		if (!m->busy)
			continue;
		m->busy = 0;
		m->big = 0;
		c->free_cmds[c->nfree++] = i;
		fx_req_piece_done(&q->t, m->req, c->err, 0, 0);
	}
	c->big_reads = 0;
	c->big_cmds = 0;
	c->writes = 0;
	free_tx(c);
	c->tls_have = 0;
	c->tls_ct_pos = c->tls_ct_len = c->tls_plain = 0;
	fx_nvmf_dev_close_io(&q->dev->nd, &c->nc, &c->io);
	c->state = CONN_DOWN;
	c->retry_at = now_ms(); /* the next submit may reconnect at once */
	c->nc.qid = 0;
	c->io.qid = 0;
}

/* --------------------------------------------------------------- sending */

/* A new batch in tx_iov: all of it is to be sealed. */
static void tls_tx_start(struct conn *c)
{
	c->tls_pi = 0;
	c->tls_plain = 0;
	for (size_t i = 0; i < c->tx_msg.msg_iovlen; i++)
		c->tls_plain += c->tx_iov[i].iov_len;
	c->tls_ct_pos = c->tls_ct_len = 0;
}

/* When everything sealed has been sent, seal the next records of the
 * batch (PDUs packed, 2^14 plaintext bytes a record) into tls_ct.  The
 * iovecs are consumed as they are sealed; the items stay owned until the
 * last record is sent. */
static int tls_tx_fill(struct conn *c)
{
	if (c->tls_ct_pos < c->tls_ct_len)
		return 0; /* the rest of what was sealed (a short send) */
	c->tls_ct_pos = c->tls_ct_len = 0;
	for (int r = 0; r < TLS_TX_RECORDS && c->tls_plain; r++) {
		size_t take = c->tls_plain < FX_TLS_MAX_PLAINTEXT ? c->tls_plain
								  : FX_TLS_MAX_PLAINTEXT;
		struct iovec *iov = c->tx_iov + c->tls_pi;
		int cnt = (int)(c->tx_msg.msg_iovlen - c->tls_pi);
		int n = fx_tls_seal_to(c->nc.tls, c->tls_ct + c->tls_ct_len, FX_TLS_CT_APPDATA, iov,
				       cnt, take);

		if (n < 0) {
			fprintf(stderr, "fx100io: nvme+tcp: qid %u: TLS: %s\n", c->nc.qid,
				fx_tls_why(c->nc.tls));
			return n;
		}
		c->tls_ct_len += (size_t)n;
		c->tls_plain -= take;
		for (size_t left = take; left;) {
			struct iovec *v = &c->tx_iov[c->tls_pi];
			size_t k = v->iov_len < left ? v->iov_len : left;

			v->iov_base = (char *)v->iov_base + k;
			v->iov_len -= k;
			left -= k;
			if (!v->iov_len)
				c->tls_pi++;
		}
		while (c->tls_pi < c->tx_msg.msg_iovlen && !c->tx_iov[c->tls_pi].iov_len)
			c->tls_pi++;
	}
	return 0;
}

/* Send the batch in tx_out (what is left of it after a short send), or a new
 * one from the queue.  The SQE comes first: without one nothing moves, so
 * no item is ever dropped (resume() tries again). */
static void kick_send(struct conn *c)
{
	struct io_uring_sqe *sqe;

	if (c->send_busy || c->state != CONN_LIVE || (!c->ntx_out && !c->tx_head))
		return;
	sqe = get_sqe(c->q);
	if (!sqe)
		return;
	if (!c->ntx_out) {
		int n = 0;

		while (c->tx_head && c->ntx_out < TX_BATCH) {
			struct send_item *it = c->tx_head;
			c->tx_head = it->next;
			for (int k = 0; k < it->niov; k++)
				c->tx_iov[n++] = it->iov[k];
			c->tx_out[c->ntx_out++] = it;
		}
		if (!c->tx_head)
			c->tx_tail = NULL;
		memset(&c->tx_msg, 0, sizeof(c->tx_msg));
		c->tx_msg.msg_iov = c->tx_iov;
		c->tx_msg.msg_iovlen = (size_t)n;
		if (c->nc.tls)
			tls_tx_start(c);
	}
	if (c->nc.tls) {
		if (tls_tx_fill(c) < 0) {
			/* the SQE is the ring's already: a nop whose completion
			 * nothing waits for (UD_CANCEL is ignored) */
			io_uring_prep_nop(sqe);
			io_uring_sqe_set_data64(sqe, UD(c->idx, UD_CANCEL));
			conn_fail(c, -EIO);
			return;
		}
		io_uring_prep_send(sqe, c->nc.fd, c->tls_ct + c->tls_ct_pos,
				   c->tls_ct_len - c->tls_ct_pos, MSG_NOSIGNAL);
		io_uring_sqe_set_data64(sqe, UD(c->idx, UD_SEND));
		c->send_busy = 1;
		return;
	}
	io_uring_prep_sendmsg(sqe, c->nc.fd, &c->tx_msg, MSG_NOSIGNAL);
	io_uring_sqe_set_data64(sqe, UD(c->idx, UD_SEND));
	c->send_busy = 1;
}

static void queue_item(struct conn *c, struct send_item *it)
{
	it->next = NULL;
	if (c->tx_tail)
		c->tx_tail->next = it;
	else
		c->tx_head = it;
	c->tx_tail = it;
}

static int rsp_finish(struct conn *c, struct cmd *m, uint16_t sf);

/* The whole batch in tx_out went out: free its items, finish the commands
 * whose response waited for them, send the next batch. */
static void batch_sent(struct conn *c)
{
	int n = c->ntx_out;

	c->ntx_out = 0;
	for (int k = 0; k < n; k++) {
		struct send_item *it = c->tx_out[k];
		struct cmd *m = it->cmd;
		int h2c = it->h2c;

		free(it);
		if (!m)
			continue;
		if (h2c && --m->r2t_items == 0)
			fx_tcp_xfer_r2t_sent(&m->x);
		if (--m->sends == 0 && m->rsp_seen && rsp_finish(c, m, m->rsp_status) < 0)
			conn_fail(c, -EPROTO);
	}
	kick_send(c);
}

/* Account a sendmsg completion: drop what went out, resend the rest. */
static void on_send(struct conn *c, int res)
{
	c->send_busy = 0;
	if (res < 0) {
		if (res == -EAGAIN || res == -EINTR) {
			kick_send(c); /* the same batch again */
			return;
		}
		for (int i = 0; i < c->ntx_out; i++)
			free(c->tx_out[i]);
		c->ntx_out = 0;
		if (c->nc.ktls && (res == -EBADMSG || res == -EMSGSIZE)) {
			/* the receive side's fault, said as the receive says it */
			res = fx_ktls_send_error(c->nc.ktls, res);
			fprintf(stderr, "fx100io: nvme+tcp: qid %u: kTLS: %s\n", c->nc.qid,
				fx_ktls_send_why(c->nc.ktls));
		}
		conn_fail(c, res == -EPIPE ? -ECONNRESET : res);
		return;
	}
	if (c->nc.tls) {
		/* the batch is done when its last record is out */
		c->tls_ct_pos += (size_t)res;
		if (c->tls_ct_pos < c->tls_ct_len || c->tls_plain) {
			kick_send(c);
			return;
		}
		batch_sent(c);
		return;
	}
	size_t left = (size_t)res;
	size_t i = 0;
	while (i < c->tx_msg.msg_iovlen && left >= c->tx_iov[i].iov_len) {
		left -= c->tx_iov[i].iov_len;
		i++;
	}
	if (i == c->tx_msg.msg_iovlen) {
		batch_sent(c);
		return;
	}
	/* Short send: resend the remaining iovecs, items stay owned. */
	c->tx_iov[i].iov_base = (char *)c->tx_iov[i].iov_base + left;
	c->tx_iov[i].iov_len -= left;
	memmove(c->tx_iov, c->tx_iov + i, (c->tx_msg.msg_iovlen - i) * sizeof(struct iovec));
	c->tx_msg.msg_iovlen -= i;
	kick_send(c);
}

/* Queue a CapsuleCmd for command m (with in-capsule data when it fits). */
static int send_capsule(struct conn *c, struct cmd *m, uint16_t cid)
{
	struct tcp_dev *d = c->q->dev;
	struct send_item *it = calloc(1, sizeof(*it));
	if (!it)
		return -ENOMEM;
	uint32_t incap_max = c->io.incap_max;
	/* In-capsule data goes at offset 0 of the capsule's data area, which
	 * is where it belongs only when ICDOFF is 0 (as NVMe/TCP targets
	 * report); otherwise every write goes by R2T. */
	int incapsule = c->io.icdoff == 0 && m->opcode == NVME_CMD_WRITE && m->len <= incap_max &&
			m->len > 0;
	uint32_t datalen = incapsule ? m->len : 0;
	struct nvme_tcp_cmd_pdu *pdu = (struct nvme_tcp_cmd_pdu *)it->hdr;
	fx_tcp_hdr_init(&pdu->hdr, NVME_TCP_CMD, datalen, c->nc.hdgst, c->nc.ddgst, c->nc.cpda);
	struct nvme_sqe *s = &pdu->sqe;
	s->opcode = m->opcode;
	s->flags = NVME_CMD_SGL_METABUF;
	s->cid = cid;
	s->nsid = d->nd.nsid;
	if (m->opcode != NVME_CMD_FLUSH) {
		uint32_t nlb = m->len / d->base.info.block_size;
		s->cdw10 = (uint32_t)m->slba;
		s->cdw11 = (uint32_t)(m->slba >> 32);
		s->cdw12 = nlb - 1;
	}
	s->dptr.length = m->len;
	s->dptr.type = incapsule ? NVME_SGL_DATA_BLOCK_OFFSET : NVME_SGL_TRANSPORT_DATA_BLOCK;
	s->dptr.addr = 0;
	int head = fx_tcp_head_finish(it->hdr, sizeof(it->hdr));
	if (head < 0) {
		free(it); /* a controller alignment we do not pad for */
		return head;
	}
	fx_tcp_xfer_init(&m->x, m->len, m->opcode == NVME_CMD_WRITE, incapsule);
	it->niov = fx_tcp_pdu_iov(it->iov, it->hdr, (unsigned)head, m->data, datalen, &it->ddgst);
	if (incapsule) {
		it->cmd = m;
		m->sends++;
	}
	queue_item(c, it);
	return 0;
}

/* Answer an R2T with H2CData PDUs of at most maxh2cdata bytes. */
static int send_h2c(struct conn *c, struct cmd *m, uint16_t cid, uint16_t ttag, uint32_t off,
		    uint32_t len)
{
	uint32_t maxd = c->nc.maxh2cdata ? c->nc.maxh2cdata : len;
	while (len) {
		uint32_t n = len < maxd ? len : maxd;
		struct send_item *it = calloc(1, sizeof(*it));
		if (!it)
			return -ENOMEM;
		struct nvme_tcp_data_pdu *p = (struct nvme_tcp_data_pdu *)it->hdr;
		fx_tcp_hdr_init(&p->hdr, NVME_TCP_H2C_DATA, n, c->nc.hdgst, c->nc.ddgst,
				c->nc.cpda);
		p->cccid = cid;
		p->ttag = ttag;
		p->datao = off;
		p->datal = n;
		if (n == len)
			p->hdr.flags |= NVME_TCP_F_DATA_LAST;
		int head = fx_tcp_head_finish(it->hdr, sizeof(it->hdr));
		if (head < 0) {
			free(it);
			return head;
		}
		it->niov = fx_tcp_pdu_iov(it->iov, it->hdr, (unsigned)head, m->data + off, n,
					  &it->ddgst);
		it->cmd = m;
		it->h2c = 1;
		m->sends++;
		m->r2t_items++;
		queue_item(c, it);
		off += n;
		len -= n;
	}
	return 0;
}

/* ------------------------------------------------------------- receiving */

static struct cmd *find_cmd(struct conn *c, uint16_t cid)
{
	unsigned slot = cid & CID_SLOT_MASK;
	if (slot >= c->ncmds)
		return NULL;
	struct cmd *m = &c->cmds[slot];
	if (!m->busy || m->gen != (cid >> CID_SLOT_BITS))
		return NULL;
	return m;
}

static void cmd_done(struct conn *c, struct cmd *m, int err, uint16_t status)
{
	uint32_t ri = m->req;
	uint64_t bytes = (err || status) ? 0 : m->len;
	c->q->base.stats.ios++;
	c->q->base.stats.bytes += bytes;
	/* the data is in the caller's buffer (reads) or sent (writes) */
	fx_req_crc_add(&c->q->t.reqs[ri], m->data, bytes);
	m->busy = 0;
	if (m->big & BIG_READ)
		c->big_reads--;
	if (m->big & BIG_CMD)
		c->big_cmds--;
	if (m->opcode == NVME_CMD_WRITE)
		c->writes--;
	m->big = 0;
	c->free_cmds[c->nfree++] = (uint16_t)(m - c->cmds);
	fx_req_piece_done(&c->q->t, ri, err, bytes, status);
}

/* A PDU for command m broke nvme_tcp/xfer.c's rules: say which and why; the
 * caller tears the connection down, which fails m with -EPROTO. */
static int cmd_proto_err(struct conn *c, struct cmd *m, uint16_t cid, const char *what)
{
	fprintf(stderr, "fx100io: nvme+tcp: qid %u: cid %u: bad %s: %s (%s of %u bytes)\n",
		c->nc.qid, cid, what, m->x.why, m->x.write ? "write" : "read", m->len);
	return -EPROTO;
}

/* A response (or its deferred effect) for m with status field sf: complete
 * m if nvme_tcp/xfer.c's rule lets the response complete it, else fail it. */
static int rsp_finish(struct conn *c, struct cmd *m, uint16_t sf)
{
	if (fx_tcp_xfer_rsp(&m->x, sf) < 0) {
		int ret = cmd_proto_err(c, m, (uint16_t)((m->gen << CID_SLOT_BITS) | (m - c->cmds)),
					"response");
		cmd_done(c, m, ret, 0);
		return ret;
	}
	cmd_done(c, m, sf ? -EIO : 0, sf);
	return 0;
}

/* A full header is in rxhdr: check it and decide what to read next. */
static int on_header(struct conn *c)
{
	struct nvme_tcp_hdr *h = (struct nvme_tcp_hdr *)c->rxhdr;
	int need = fx_tcp_pdu_check(h, 1, c->nc.hdgst, c->nc.ddgst, UINT32_MAX);

	if (need < 0 || h->hlen != RX_HLEN)
		return -EPROTO;
	if (fx_tcp_hdgst_check(c->rxhdr, (unsigned)need) < 0)
		return -EBADMSG;
	unsigned hl = (unsigned)need;
	switch (h->type) {
	case NVME_TCP_RSP: {
		if (h->plen != hl)
			return -EPROTO;
		struct nvme_cqe *cqe = &((struct nvme_tcp_rsp_pdu *)c->rxhdr)->cqe;
		struct cmd *m = find_cmd(c, cqe->cid);
		if (!m || m->rsp_seen)
			return -EPROTO; /* unknown command id, or a second response */
		uint16_t sf = NVME_STATUS_FIELD(cqe->status);
		if (m->sends) {
			/* The response can be reaped before our own send's
			 * completion: finish the command only when no send
			 * points into the caller's buffer any more. */
			m->rsp_seen = 1;
			m->rsp_status = sf;
			rx_expect_header(c);
			return 0;
		}
		int ret = rsp_finish(c, m, sf);
		if (ret < 0)
			return ret;
		rx_expect_header(c);
		return 0;
	}
	case NVME_TCP_C2H_DATA: {
		struct nvme_tcp_data_pdu *p = (struct nvme_tcp_data_pdu *)c->rxhdr;
		struct cmd *m = find_cmd(c, p->cccid);
		if (!m || m->rsp_seen)
			return -EPROTO;
		/* Data in order and inside the command's buffer, and the PDU's
		 * lengths consistent: nothing is written outside it. */
		if (fx_tcp_xfer_c2h(&m->x, p, c->nc.ddgst) < 0)
			return cmd_proto_err(c, m, p->cccid, "C2HData");
		c->rx_cmd = m;
		c->rx_datao = p->datao;
		c->rx_datal = p->datal;
		c->rx_flags = h->flags;
		c->rx_have = 0;
		if (h->pdo > hl) {
			c->rx = RX_PAD;
			c->rx_need = h->pdo - hl;
			if (c->rx_need > sizeof(c->rxpad))
				return -EPROTO;
		} else {
			c->rx = RX_DATA;
			c->rx_need = p->datal;
		}
		return 0;
	}
	case NVME_TCP_R2T: {
		struct nvme_tcp_r2t_pdu *p = (struct nvme_tcp_r2t_pdu *)c->rxhdr;
		struct cmd *m = find_cmd(c, p->cccid);
		if (h->plen != hl || !m || m->rsp_seen)
			return -EPROTO;
		/* nvme_tcp/xfer.c's rule: one outstanding, in order, no repeats,
		 * inside the transfer; so what we queue is bounded by it. */
		if (fx_tcp_xfer_r2t(&m->x, p->r2to, p->r2tl) < 0)
			return cmd_proto_err(c, m, p->cccid, "R2T");
		int ret = send_h2c(c, m, p->cccid, p->ttag, p->r2to, p->r2tl);
		if (ret < 0)
			return ret;
		kick_send(c);
		rx_expect_header(c);
		return 0;
	}
	case NVME_TCP_C2H_TERM:
		return -ECONNABORTED; /* the controller ended the connection */
	default:
		return -EPROTO;
	}
}

static int on_data_complete(struct conn *c)
{
	struct cmd *m = c->rx_cmd;
	if (c->nc.ddgst) {
		uint32_t got, want = fx_tcp_ddgst(m->data + c->rx_datao, c->rx_datal);
		memcpy(&got, c->rx_dg, sizeof(got));
		if (got != want)
			return -EBADMSG; /* never hand back bytes that failed */
	}
	struct nvme_tcp_data_pdu p;
	memset(&p, 0, sizeof(p));
	p.hdr.flags = c->rx_flags;
	p.datao = c->rx_datao;
	p.datal = c->rx_datal;
	if (fx_tcp_xfer_c2h_done(&m->x, &p))
		cmd_done(c, m, 0, 0); /* SUCCESS: no CapsuleResp follows */
	rx_expect_header(c);
	return 0;
}

/* rx_have == rx_need: act on what came in and say what to receive next. */
static int rx_advance(struct conn *c)
{
	switch (c->rx) {
	case RX_HDR:
		return on_header(c);
	case RX_PAD:
		c->rx = RX_DATA;
		c->rx_have = 0;
		c->rx_need = c->rx_datal;
		return 0;
	case RX_DATA:
		if (c->nc.ddgst) {
			c->rx = RX_DDGST;
			c->rx_have = 0;
			c->rx_need = NVME_TCP_DIGEST_LEN;
			return 0;
		}
		return on_data_complete(c);
	case RX_DDGST:
		return on_data_complete(c);
	}
	return -EPROTO;
}

/* Feed n received bytes through the state machine: as many PDUs as they
 * hold, each piece copied where rx_dst() says (rx_need is never 0 after a
 * step: headers, padding, payloads and digests all have a length). */
static int rx_feed(struct conn *c, const uint8_t *buf, size_t n)
{
	size_t pos = 0;

	while (pos < n) {
		size_t take = c->rx_need - c->rx_have;
		if (take > n - pos)
			take = n - pos;
		memcpy(rx_dst(c), buf + pos, take);
		if (c->rx == RX_DATA)
			c->q->base.stats.bytes_copied += take;
		pos += take;
		c->rx_have += (unsigned)take;
		if (c->rx_have == c->rx_need) {
			int ret = rx_advance(c);
			if (ret < 0)
				return ret;
		}
	}
	return 0;
}

/* A record that starts with a PDU header (fx_tls_open_head): where the
 * payload after it goes, when the header is a C2HData's.  The header is not
 * authenticated yet, so it only picks a range that on_header would give
 * that PDU: inside an in-flight read's buffer, at the offset the transfer
 * rules expect next (nvme_tcp/xfer.c's check, run on a copy of the
 * command's transfer state: a refusal there notes why in the state, and
 * bytes no tag has vouched for must not touch the command); on_header
 * checks the same bytes again once the tag has, and tls_rx_head holds the
 * two to agree.  A record that fails its tag fails the connection, and with
 * it every read in flight on it, before anything completes; the range the
 * header picked (in this read's buffer, or, with a forged header, another
 * read's in flight) may have been zeroed by then (fx_tls_open_head wipes
 * what it decrypted into it). */
static int tls_peek_dest(void *arg, const uint8_t *head, size_t h, size_t left, uint8_t **dst,
			 size_t *k)
{
	struct conn *c = arg;
	struct nvme_tcp_data_pdu p;
	unsigned hl = RX_HLEN + (c->nc.hdgst ? NVME_TCP_DIGEST_LEN : 0);
	struct fx_tcp_xfer x;
	struct cmd *m;

	if (h != hl)
		return -1;
	memcpy(&p, head, sizeof(p)); /* (the stage is not aligned for it) */
	if (p.hdr.type != NVME_TCP_C2H_DATA || p.hdr.hlen != RX_HLEN || p.hdr.pdo != hl ||
	    fx_tcp_pdu_check(&p.hdr, 1, c->nc.hdgst, c->nc.ddgst, UINT32_MAX) != (int)hl)
		return -1;
	m = find_cmd(c, p.cccid);
	if (!m || m->rsp_seen || !m->data)
		return -1;
	x = m->x;
	if (fx_tcp_xfer_c2h(&x, &p, c->nc.ddgst) < 0)
		return -1;
	*dst = (uint8_t *)m->data + p.datao;
	*k = p.datal < left ? p.datal : left;
	return 0;
}

/* The record opened by fx_tls_open_head, n plaintext bytes: its header
 * (now authenticated) through the state machine, which must have made the
 * PDU's payload land where the k bytes at dst went; then the rest. */
static int tls_rx_head(struct conn *c, const uint8_t *plain, size_t n, size_t h, uint8_t *dst,
		       size_t k)
{
	int ret = rx_feed(c, plain, n < h ? n : h);

	if (ret < 0 || n <= h)
		return ret;
	if (c->rx != RX_DATA || c->rx_have != 0 || c->rx_need < k ||
	    (uint8_t *)c->rx_cmd->data + c->rx_datao != dst)
		return -EPROTO; /* (cannot happen: the same bytes, the same rules) */
	size_t direct = n - h < k ? n - h : k;

	c->q->base.stats.bytes_direct += direct;
	c->rx_have += (unsigned)direct;
	if (c->rx_have == c->rx_need && (ret = rx_advance(c)) < 0)
		return ret;
	return n > h + k ? rx_feed(c, plain + h + k, n - h - k) : 0;
}

/* A secure channel's receive: n more ciphertext bytes in the stage after
 * tls_have.  Every whole record is opened (its tag checked before any of
 * its plaintext is acted on) and its PDU bytes fed to the state machine: a
 * record that starts inside a C2HData payload decrypts that part straight
 * into the caller's buffer, and so does one that starts with a C2HData's
 * header for the payload after it (tls_peek_dest); the rest in place in
 * the stage (headers, responses, payload after a header in the middle of
 * a record: copied out); a partial record moves to the stage's start for
 * the next recv to complete.  A
 * record's length is checked from its header before anything waits for
 * the rest of it. */
static int tls_rx(struct conn *c, size_t n)
{
	struct fx_tls *t = c->nc.tls;
	size_t have = c->tls_have + n, pos = 0;
	int ret = 0;

	while (have - pos >= FX_TLS_HEADER) {
		int blen = fx_tls_record_len(t, c->stage + pos);
		uint8_t *plain;

		if (blen < 0) {
			ret = blen;
			break;
		}
		size_t rlen = FX_TLS_HEADER + (size_t)blen;
		if (have - pos < rlen)
			break;
		/* C2HData payload whose header came in an earlier record (its
		 * tag checked, the header acted on) is decrypted straight into
		 * the caller's buffer, inside what this PDU still owes it; the
		 * command completes only after the tag is checked */
		size_t k = c->rx == RX_DATA ? c->rx_need - c->rx_have : 0;
		/* A record that starts with a PDU header: a C2HData's payload
		 * after it in the same record goes straight into the buffer too */
		int head = !k && c->rx == RX_HDR && c->rx_have == 0;
		size_t hlen = c->rx_need; /* (the header's, with its digest) */
		uint8_t *hdst = NULL;
		size_t hk = 0;
		int pl = head ? fx_tls_open_head(t, c->stage + pos, rlen, hlen, tls_peek_dest, c,
						 &hdst, &hk)
			      : fx_tls_open_split(t, c->stage + pos, rlen, k ? rx_dst(c) : NULL, k,
						  &plain);
		if (pl < 0) {
			ret = pl;
			break;
		}
		if (head)
			plain = c->stage + pos + FX_TLS_HEADER;
		pos += rlen;
		if (hk) {
			ret = tls_rx_head(c, plain, (size_t)pl, hlen, hdst, hk);
			if (ret < 0)
				return ret;
			continue;
		}
		size_t direct = k < (size_t)pl ? k : (size_t)pl;
		if (direct) {
			c->q->base.stats.bytes_direct += direct;
			c->rx_have += (unsigned)direct;
			if (c->rx_have == c->rx_need) {
				ret = rx_advance(c);
				if (ret < 0)
					return ret;
			}
		}
		if ((size_t)pl > direct) {
			ret = rx_feed(c, plain, (size_t)pl - direct);
			if (ret < 0)
				return ret;
		}
	}
	if (ret < 0) {
		fprintf(stderr, "fx100io: nvme+tcp: qid %u: TLS: %s\n", c->nc.qid, fx_tls_why(t));
		return ret == -ECONNRESET || ret == -EBADMSG ? ret : -EPROTO;
	}
	if (pos && have > pos)
		memmove(c->stage, c->stage + pos, have - pos);
	c->tls_have = (uint32_t)(have - pos);
	return 0;
}

/* A receive on a kTLS connection failed with res: a record that is not
 * application data (-EIO) is taken and acted on as our own record layer
 * would (fx_ktls_record: 0, receive again); anything else fails the
 * connection with the reason logged (conn_finish_drain wipes what the
 * kernel may have decrypted into the caller's buffer). */
static int ktls_rx_error(struct conn *c, int res)
{
	struct fx_ktls *k = c->nc.ktls;
	int ret;

	if (res == -EIO) {
		ret = fx_ktls_record(k, c->nc.fd);
		if (ret > 0)
			ret = rx_feed(c, k->rec, (size_t)ret);
		if (ret == 0)
			return 0;
	} else {
		ret = fx_ktls_recv_error(k, res);
	}
	if (fx_ktls_why(k)[0])
		fprintf(stderr, "fx100io: nvme+tcp: qid %u: kTLS: %s\n", c->nc.qid, fx_ktls_why(k));
	return ret < 0 ? ret : -EPROTO;
}

static void on_recv(struct conn *c, int res)
{
	int ret = 0;

	c->recv_busy = 0;
	if (c->state != CONN_LIVE) {
		conn_finish_drain(c);
		return;
	}
	/* ECANCELED: cancel_staged_recv()'s doing (nothing else cancels a
	 * live connection's recv) */
	if (res == -EAGAIN || res == -EINTR || res == -ENOBUFS || res == -ECANCELED) {
		arm_recv(c);
		return;
	}
	if (res < 0 && c->nc.ktls) {
		ret = ktls_rx_error(c, res);
		if (ret == 0) {
			arm_recv(c);
			return;
		}
		res = ret;
	}
	if (res <= 0) {
		conn_fail(c, res == 0 ? -ECONNRESET : res);
		conn_finish_drain(c);
		return;
	}
	if (c->nc.tls) {
		ret = tls_rx(c, (size_t)res);
	} else if (c->rx_staged) {
		ret = rx_feed(c, c->stage, (size_t)res);
	} else {
		if (c->rx == RX_DATA)
			c->q->base.stats.bytes_direct += (unsigned)
				res; /* recv wrote the caller's buffer */
		c->rx_have += (unsigned)res;
		if (c->rx_have == c->rx_need)
			ret = rx_advance(c);
	}
	if (ret < 0) {
		conn_fail(c, ret);
		conn_finish_drain(c);
		return;
	}
	arm_recv(c);
}

/* -------------------------------------------------------------- requests */

static void arm_wake(struct tcp_queue *q)
{
	if (q->wake_armed)
		return;
	struct io_uring_sqe *sqe = get_sqe(q);
	if (!sqe)
		return;
	io_uring_prep_poll_add(sqe, q->cx.wake_fd, POLLIN);
	io_uring_sqe_set_data64(sqe, UD(0, UD_WAKE));
	q->wake_armed = 1;
}

/* A secure channel joins the data path: its send buffer (kept across
 * reconnects), and the plaintext the blocking connect decrypted past the
 * Connect response, if any, fed to the state machine first.  A failure
 * takes the connection down (conn_finish_drain closes it). */
static int tls_adopt(struct conn *c)
{
	size_t left = fx_tls_pending(c->nc.tls);
	int r = 0;

	if (!c->tls_ct)
		c->tls_ct = malloc(TLS_TX_RECORDS * TLS_REC_MAX);
	if (!c->tls_ct)
		r = -ENOMEM;
	if (r == 0 && left) {
		uint8_t *tmp = malloc(left);

		r = tmp ? fx_tls_recv_full(c->nc.tls, c->nc.fd, tmp, left, 0, -1) : -ENOMEM;
		if (r == 0)
			r = rx_feed(c, tmp, left);
		free(tmp);
	}
	if (r < 0) {
		conn_fail(c, r);
		conn_finish_drain(c);
	}
	return r;
}

/* Take a connection the connect attempt made (nc: connected past Connect,
 * io: what dev_connect_io said of it). */
static void conn_adopt(struct conn *c, const struct fx_tcp_conn *nc,
		       const struct fx_nvmf_io_conn *io)
{
	struct tcp_queue *q = c->q;

	c->nc = *nc;
	c->io = *io;
	/* A controller re-opened with a smaller queue gets no more than its SQ
	 * holds (one entry short of full). */
	c->limit = io->sqsize < c->ncmds ? (io->sqsize ? io->sqsize : 1) : c->ncmds;
	if (c->ever_connected) {
		q->base.stats.reconnects++;
		if (c->fails)
			fprintf(stderr,
				"fx100io: nvme+tcp %s:%s: connection %u reconnected after %u failed "
				"attempts\n",
				q->dev->nd.addr.host, q->dev->nd.addr.port, c->idx, c->fails);
	}
	c->ever_connected = 1;
	c->fails = 0;
	c->state = CONN_LIVE;
	c->err = 0;
	fx_nvmf_waits_connected(&q->waits);
	rx_expect_header(c);
	c->tls_have = 0;
	c->tls_ct_pos = c->tls_ct_len = c->tls_plain = 0;
	if (c->nc.ktls)
		q->base.stats.ktls_conns++;
	else if (c->nc.tls)
		q->base.stats.tls_user_conns++;
	if (c->nc.tls && tls_adopt(c) < 0)
		return;
	arm_recv(c);
}

static void conn_connect_failed(struct conn *c, int err)
{
	struct tcp_queue *q = c->q;

	c->state = CONN_DOWN;
	c->err = err;
	c->retry_at = now_ms() + q->dev->nd.reconnect_ms;
	fx_nvmf_waits_attempt_failed(&q->waits);
	if (c->fails++ == 0 && err != -ECANCELED)
		fprintf(stderr,
			"fx100io: nvme+tcp %s:%s: connection %u %s: connect failed (%s); retrying "
			"every %d ms while requests wait\n",
			q->dev->nd.addr.host, q->dev->nd.addr.port, c->idx,
			conn_state_str(c->state), strerror(-err), q->dev->nd.reconnect_ms);
}

/* Hand connection c to the connector; never blocks (one attempt at a time
 * per queue).  Its thread and fds are made on first need; besides wake_fd
 * (the ring's UD_WAKE poll) it writes the ring's eventfd directly too:
 * io_uring signals that eventfd for deferred task work queued from inside
 * an eventfd wake-up only by a deferred (RCU) path, and kernels were seen
 * to lose that signal, leaving an asyncio reader asleep with work pending. */
static void cx_request(struct tcp_queue *q, struct conn *c)
{
	int ret = 0;

	if (q->cx_busy)
		return;
	if (!q->cx.q)
		ret = fx_nvmf_cx_init(&q->cx, &q->dev->nd, q->ring.efd);
	if (ret == 0)
		ret = fx_nvmf_cx_request(&q->cx, c->idx);
	if (ret < 0) {
		conn_connect_failed(c, ret);
		return;
	}
	c->state = CONN_CONNECTING;
	q->cx_busy = 1;
	arm_wake(q);
}

/* Adopt the connector's result, if there is one (every processing pass
 * looks: the wake-ups only say when to look).  Returns 1 if it took one. */
static int cx_collect(struct tcp_queue *q)
{
	struct fx_nvmf_io_conn io;
	struct fx_tcp_conn nc;
	unsigned ci;

	if (!q->cx_busy)
		return 0;
	if (!fx_nvmf_cx_collect(&q->cx, &ci, &io, &nc)) {
		arm_wake(q);
		return 0;
	}
	q->cx_busy = 0;
	struct conn *c = &q->conns[ci];
	if (io.err == 0)
		conn_adopt(c, &nc, &io);
	else
		conn_connect_failed(c, io.err);
	return 1;
}

/* A live connection with a free command slot.  Otherwise NULL and *err:
 * 0 when requests should wait for completions (a connection is busy or
 * draining), < 0 when no connection is live (the last error, -ENOTCONN
 * when none is known).  A connection that is down and past its back-off is
 * handed to the connector on the way. */
/*
 * Whether connection k carries r.  With two connections or more, while a
 * load read waits or is in flight the first carries only load reads, and
 * the others everything else plus load reads while no write is in flight on
 * them: data a store sends (in capsule or after an R2T) goes out in order
 * on its connection, so a read behind it on the same one would wait for it
 * (docs/architecture.md, "Priority and write admission").  Reads alone, and
 * writes while no load waits, still use every connection.
 */
static int conn_carries(const struct tcp_queue *q, unsigned k, const struct req *r)
{
	if (q->nconns < 2)
		return 1;
	if (r->prio == FX_PRIO_LOAD && r->op == FX_OP_READ)
		return k == 0 || q->conns[k].writes == 0;
	return k != 0 || q->t.load_reads == 0;
}

static struct conn *pick_conn(struct tcp_queue *q, const struct req *r, int *err)
{
	int64_t now = now_ms();
	int busy = 0, why = 0, live = 0;

	/* First pass: the connections the class split prefers for r. */
	for (unsigned k = 0; k < q->nconns; k++) {
		struct conn *c = &q->conns[(q->rr + k) % q->nconns];
		if (!conn_carries(q, (unsigned)(c - q->conns), r))
			continue;
		if (c->state == CONN_DOWN && now >= c->retry_at)
			cx_request(q, c);
		if (c->state == CONN_LIVE && c->nfree && c->ncmds - c->nfree < c->limit) {
			q->rr = (unsigned)((c - q->conns) + 1) % q->nconns;
			return c;
		}
		if (c->state == CONN_LIVE || c->state == CONN_DRAINING)
			live = 1; /* busy, not broken: wait for it */
		else if (c->err)
			why = c->err;
	}
	/* The split is a preference, never a reason to wait for a reconnect or
	 * to fail: when none of the preferred connections is up, any live one
	 * carries r (as every connection did before the classes). */
	for (unsigned k = 0; !live && k < q->nconns; k++) {
		struct conn *c = &q->conns[(q->rr + k) % q->nconns];
		if (conn_carries(q, (unsigned)(c - q->conns), r))
			continue;
		if (c->state == CONN_LIVE && c->nfree && c->ncmds - c->nfree < c->limit) {
			q->rr = (unsigned)((c - q->conns) + 1) % q->nconns;
			q->base.stats.conn_fallbacks++;
			return c;
		}
		if (c->state == CONN_LIVE || c->state == CONN_DRAINING)
			busy = 1;
		else if (c->err && !why)
			why = c->err;
	}
	busy |= live;
	*err = busy ? 0 : why ? why : -ENOTCONN;
	return NULL;
}

/*
 * The policy for a request that no connection can carry: 0 to wait for the
 * reconnect, else the errno to fail it with.  It waits until max_reconnects
 * attempts have failed, and at most io_timeout_ms, both counted from when
 * it was submitted or the queue began waiting, whichever is later.
 */
static int wait_for_conn(struct tcp_queue *q, uint32_t ri, int err)
{
	return fx_nvmf_waits_check(&q->waits, &q->dev->nd, ri, err, now_ms());
}

static void arm_tick(struct tcp_queue *q)
{
	if (q->tick_armed)
		return;
	struct io_uring_sqe *sqe = get_sqe(q);
	if (!sqe)
		return;
	q->tick.tv_sec = 0;
	q->tick.tv_nsec = TICK_MS * 1000000LL;
	io_uring_prep_timeout(sqe, &q->tick, 0, 0);
	io_uring_sqe_set_data64(sqe, UD(0, UD_TICK));
	q->tick_armed = 1;
}

/* Turn queued requests into commands while connections have room. */
static void issue(struct tcp_queue *q)
{
	struct req_table *t = &q->t;
	struct tcp_dev *d = q->dev;

	unsigned skip = 0; /* classes whose request cannot go this pass */
	int starved = 0;

	for (int64_t next; (next = fx_reqs_fifo_next_skip(t, skip)) >= 0;) {
		uint32_t ri = (uint32_t)next;
		struct req *r = &t->reqs[ri];
		int err, waiting = 0;
		struct conn *c = pick_conn(q, r, &err);
		if (!c && err) {
			err = wait_for_conn(q, ri, err);
			waiting = !err;
		}
		if (!c) {
			if (err) {
				/* Nothing can carry it, per the policy: fail with why. */
				fx_reqs_fifo_fail_head(t, err);
				continue;
			}
			/* connections busy, or reconnecting: this class waits,
			 * the others may still go (on another connection) */
			starved |= waiting;
			skip |= 1u << r->prio;
			continue;
		}
		uint16_t slot = c->free_cmds[--c->nfree];
		struct cmd *m = &c->cmds[slot];
		m->busy = 1;
		m->gen = (uint8_t)((m->gen + 1) & ((1u << (16 - CID_SLOT_BITS)) - 1));
		m->req = ri;
		m->sends = 0;
		m->r2t_items = 0;
		m->rsp_seen = 0;
		m->deadline = now_ms() + d->nd.io_timeout_ms;
		if (r->op == FX_OP_FLUSH) {
			m->opcode = NVME_CMD_FLUSH;
			m->data = NULL;
			m->len = 0;
			m->slba = 0;
			r->issued = 1;
		} else {
			uint64_t n = r->len - r->issued;
			if (n > d->nd.max_xfer)
				n = d->nd.max_xfer;
			m->opcode = r->op == FX_OP_READ ? NVME_CMD_READ : NVME_CMD_WRITE;
			m->data = r->addr + r->issued;
			m->len = (uint32_t)n;
			m->slba = (r->off + r->issued) / d->base.info.block_size;
			r->issued += n;
		}
		r->inflight++;
		fx_reqs_piece_issued(t, ri);
		m->big = 0;
		if (m->len > RX_SMALL_MAX) {
			m->big = BIG_CMD;
			c->big_cmds++;
		}
		if (m->opcode == NVME_CMD_WRITE) {
			c->writes++;
			if (c == q->conns && q->nconns > 1 && t->load_reads)
				q->base.stats.load_conn_writes++;
		}
		if (m->opcode == NVME_CMD_READ && m->len > RX_SMALL_MAX) {
			m->big |= BIG_READ;
			if (c->big_reads++ == 0)
				cancel_staged_recv(c);
		}
		uint16_t cid = (uint16_t)((m->gen << CID_SLOT_BITS) | slot);
		int sret = send_capsule(c, m, cid);
		if (sret < 0) {
			cmd_done(c, m, sret, 0);
			continue;
		}
	}
	/* Every capsule this pass made goes out in one sendmsg per connection
	 * (not the first alone and the rest after its completion). */
	for (unsigned k = 0; k < q->nconns; k++)
		kick_send(&q->conns[k]);
	if (skip) /* (else this pass met no request that must wait) */
		q->starved = starved;
	if (!t->nfifo)
		q->starved = 0;
	/* The tick checks deadlines: of commands in flight, and of requests
	 * waiting for a connection (whose back-off it also ends). */
	if (q->starved) {
		arm_tick(q);
		return;
	}
	for (unsigned k = 0; k < q->nconns; k++)
		if (q->conns[k].nfree < q->conns[k].ncmds) {
			arm_tick(q);
			break;
		}
}

/* Fail commands past their deadline (the controller stopped answering). */
static void check_deadlines(struct tcp_queue *q)
{
	int64_t now = now_ms();
	for (unsigned k = 0; k < q->nconns; k++) {
		struct conn *c = &q->conns[k];
		if (c->state != CONN_LIVE)
			continue;
		for (uint16_t i = 0; i < c->ncmds; i++)
			if (c->cmds[i].busy && c->cmds[i].deadline <= now) {
				conn_fail(c, -ETIMEDOUT);
				break;
			}
	}
}

/* Arm again what a missing SQE left idle: a live connection always has a
 * recv in flight, queued sends go out, and commands in flight need the
 * deadline tick. */
static void resume(struct tcp_queue *q)
{
	int busy = 0;

	for (unsigned k = 0; k < q->nconns; k++) {
		struct conn *c = &q->conns[k];
		if (c->state == CONN_LIVE && !c->recv_busy)
			arm_recv(c);
		kick_send(c);
		busy |= c->nfree < c->ncmds;
	}
	if (busy)
		arm_tick(q);
}

/* The ring refused our SQEs for good (e.g. -EEXIST: submitted from a thread
 * other than its single issuer; -EBADF): take back what it never took,
 * then fail every connection with that error, so each request completes
 * with it instead of waiting forever for I/O that was never started. */
static void ring_fail(struct tcp_queue *q, int err)
{
	struct io_uring_sq *sq = &q->ring.uring.sq;
	unsigned head = io_uring_smp_load_acquire(sq->khead);

	for (unsigned i = head; i != sq->sqe_tail; i++) {
		uint64_t ud = sq->sqes[i & sq->ring_mask].user_data;
		unsigned kind = ud & 0xff, ci = (unsigned)(ud >> 8);
		if (kind == UD_TICK)
			q->tick_armed = 0;
		else if (ci < q->nconns && kind == UD_RECV)
			q->conns[ci].recv_busy = 0;
		else if (ci < q->nconns && kind == UD_SEND)
			q->conns[ci].send_busy = 0;
	}
	io_uring_smp_store_release(sq->ktail, head);
	sq->sqe_head = sq->sqe_tail = head;
	fprintf(stderr, "fx100io: nvme+tcp: io_uring submit failed: %s\n", strerror(-err));
	for (unsigned k = 0; k < q->nconns; k++) {
		conn_fail(&q->conns[k], err);
		conn_finish_drain(&q->conns[k]);
	}
}

/* Submit what is queued.  A transient refusal (-EAGAIN, -EBUSY, -EINTR)
 * leaves the SQEs in the ring for the next submit (every process and
 * submit call makes one); anything else is ring_fail(). */
static void ring_submit(struct tcp_queue *q)
{
	if (q->ring.disabled)
		return; /* made for another thread: tq_enable() submits */
	int ret = io_uring_submit(&q->ring.uring);
	if (ret < 0 && ret != -EAGAIN && ret != -EBUSY && ret != -EINTR)
		ring_fail(q, ret);
}

static int process_cqes(struct tcp_queue *q)
{
	struct io_uring_cqe *cqes[64];
	int total = 0, rounds = 0;
	unsigned n;

again:
	do {
		n = io_uring_peek_batch_cqe(&q->ring.uring, cqes, 64);
		for (unsigned k = 0; k < n; k++) {
			uint64_t ud = cqes[k]->user_data;
			int res = cqes[k]->res;
			unsigned kind = ud & 0xff, ci = (unsigned)(ud >> 8);
			if (kind == UD_TICK) {
				q->tick_armed = 0;
				check_deadlines(q);
			} else if (kind == UD_WAKE) {
				uint64_t v;
				q->wake_armed = 0;
				if (read(q->cx.wake_fd, &v, sizeof(v)) < 0) {
					/* EAGAIN: cleared by an earlier pass */
				}
			} else if (ci < q->nconns) {
				struct conn *c = &q->conns[ci];
				if (kind == UD_RECV)
					on_recv(c, res);
				else if (kind == UD_SEND)
					on_send(c, res);
				conn_finish_drain(c);
			}
		}
		io_uring_cq_advance(&q->ring.uring, n);
		total += (int)n;
	} while (n == 64);
	/* recvs and sends first: a short ring must not go to new work or
	 * the tick while a live connection has no recv in flight */
	resume(q);
	if (cx_collect(q))
		total++; /* a connection came up (or failed): issue again */
	if (total)
		issue(q);
	resume(q);
	ring_submit(q);
	/* A recv or send the submit could do at once completed inline: its
	 * completion is in the ring now, so take it in this pass instead of a
	 * wake-up and a trip through the caller later. */
	if (io_uring_cq_ready(&q->ring.uring) && ++rounds < 8)
		goto again;
	return total;
}

static int tq_submit(struct fx_queue *base, const struct fx_req *reqs, unsigned n)
{
	struct tcp_queue *q = (struct tcp_queue *)base;
	uint64_t bs = q->dev->base.info.block_size;
	unsigned k;

	if (q->ring.disabled)
		return -EBADFD; /* nothing could go out: fx_queue_enable() first */
	for (k = 0; k < n; k++) {
		int ret = fx_req_check(base->dev, &reqs[k]);
		if (ret < 0)
			return ret;
		/* NVMe moves whole blocks: the layer above pads (the store)
		 * or is told clearly (the device API). */
		if (reqs[k].op != FX_OP_FLUSH && ((reqs[k].off | reqs[k].len) & (bs - 1)))
			return -EINVAL;
		if (reqs[k].op == FX_OP_WRITE && (q->dev->base.info.caps & FX_CAP_READONLY))
			return -EROFS;
	}
	k = fx_reqs_accept(&q->t, reqs, n);
	resume(q);
	/* Stamp what joined the FIFO: the reconnect policy counts from here. */
	int64_t now = now_ms();
	for (uint32_t i = 0; i < q->t.naccepted; i++)
		fx_nvmf_waits_stamp(&q->waits, q->t.accepted[i], now);
	issue(q);
	resume(q);
	ring_submit(q);
	return (int)k;
}

static void tq_process(struct fx_queue *base)
{
	process_cqes((struct tcp_queue *)base);
}

static int tq_reap(struct fx_queue *base, struct fx_cqe *out, unsigned max)
{
	return fx_ring_reap(base, &((struct tcp_queue *)base)->ring, tq_process, out, max);
}

/* How long a wait polls the ring before it sleeps, in microseconds: a
 * sleeping thread is woken by the socket's data only after the scheduler
 * (and, in a VM, the host) gets round to it, which at queue depth 1 made the
 * 99th percentile 100x the median.  A loopback or LAN round trip usually
 * ends inside this budget; a slow target costs at most this much CPU per
 * wait.  Only while few commands are in flight (POLL_MAX_INFLIGHT), all of
 * them small (RX_SMALL_MAX at most): a deep queue sleeps about once per
 * batch of completions and a large transfer once per many bytes, so polling
 * there would only spend CPU (measured at depth 32: the same wake-ups per
 * I/O, 3 system calls per I/O instead of 0.2).
 * FX100IO_TCP_POLL_US overrides the budget (0: never poll). */
#define POLL_US_DEFAULT 50
#define POLL_MAX_INFLIGHT 4

static int64_t poll_budget_ns(void)
{
	static int64_t budget = -1;
	if (budget < 0) {
		const char *e = getenv("FX100IO_TCP_POLL_US");
		long us = e && *e ? strtol(e, NULL, 10) : POLL_US_DEFAULT;
		budget = us > 0 ? (int64_t)(us < 10000 ? us : 10000) * 1000 : 0;
	}
	return budget;
}

static int64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static int tq_wait(struct fx_queue *base, unsigned min, int timeout_ms)
{
	struct tcp_queue *q = (struct tcp_queue *)base;
	int64_t budget = poll_budget_ns();

	if (min > q->t.pending)
		min = q->t.pending;
	unsigned inflight = 0;
	for (unsigned k = 0; budget && k < q->nconns; k++) {
		inflight += (unsigned)(q->conns[k].ncmds - q->conns[k].nfree);
		if (q->conns[k].big_cmds || inflight > POLL_MAX_INFLIGHT)
			budget = 0;
	}
	if (budget && min && timeout_ms != 0) {
		int64_t until = now_ns() + budget;
		do {
			/* runs the deferred task work (socket data arrived) */
			io_uring_get_events(&q->ring.uring);
			process_cqes(q);
			if (q->t.ndone >= min)
				return (int)q->t.ndone;
		} while (now_ns() < until);
	}
	return fx_ring_wait_done(base, &q->ring, tq_process, min, timeout_ms);
}

static void tq_destroy(struct fx_queue *base)
{
	struct tcp_queue *q = (struct tcp_queue *)base;

	/* First the connector: it may be making a connection for us (the
	 * ring still polls its wake_fd, closed below once the ring is gone). */
	fx_nvmf_cx_stop(&q->cx);
	for (unsigned k = 0; k < q->nconns; k++)
		conn_fail(&q->conns[k], -ECANCELED);
	/* Wait (bounded) until the kernel has let go of every buffer. */
	int64_t until = now_ms() + 5000;
	/* A ring never enabled (FX_QUEUE_DEFER_ENABLE) has submitted nothing:
	 * the receives armed in it hold no buffer. */
	for (unsigned k = 0; q->ring.disabled && k < q->nconns; k++)
		q->conns[k].recv_busy = q->conns[k].send_busy = 0;
	for (;;) {
		int busy = 0;
		for (unsigned k = 0; k < q->nconns; k++) {
			conn_finish_drain(&q->conns[k]);
			busy |= q->conns[k].recv_busy | q->conns[k].send_busy;
		}
		if (!busy || now_ms() > until)
			break;
		struct io_uring_cqe *cqe;
		struct __kernel_timespec ts = {.tv_sec = 0, .tv_nsec = 50000000};
		/* Only the ring's own thread can reap (SINGLE_ISSUER): from any
		 * other, skip the wait; shutdown() has ended the socket I/O and
		 * closing the ring cancels what is left. */
		if (io_uring_submit_and_wait_timeout(&q->ring.uring, &cqe, 1, &ts, NULL) == -EEXIST)
			break;
		unsigned n = 0, head;
		io_uring_for_each_cqe(&q->ring.uring, head, cqe)
		{
			uint64_t ud = cqe->user_data;
			unsigned kind = ud & 0xff, ci = (unsigned)(ud >> 8);
			if (ci < q->nconns && kind == UD_RECV)
				q->conns[ci].recv_busy = 0;
			else if (ci < q->nconns && kind == UD_SEND)
				q->conns[ci].send_busy = 0;
			n++;
		}
		io_uring_cq_advance(&q->ring.uring, n);
	}
	fx_ring_exit(&q->ring);
	for (unsigned k = 0; k < q->nconns; k++) {
		struct conn *c = &q->conns[k];
		free_tx(c);
		/* (a DOWN one is closed and has no qid; one never set up has
		 * a zeroed nc, fd 0 included) */
		if (c->state != CONN_DOWN)
			fx_nvmf_dev_close_io(&q->dev->nd, &c->nc, &c->io);
		free(c->cmds);
		free(c->free_cmds);
		free(c->stage);
		free(c->tls_ct);
	}
	free(q->conns);
	/* after the ring: its poll on wake_fd is gone with it */
	fx_nvmf_cx_fini(&q->cx);
	fx_nvmf_waits_fini(&q->waits);
	fx_reqs_fini(&q->t);
	free(q);
}

/* On the thread that will use the queue (FX_QUEUE_DEFER_ENABLE): its
 * connections were made on the creating thread; their first receives wait
 * in the ring until now. */
static int tq_enable(struct fx_queue *base)
{
	struct tcp_queue *q = (struct tcp_queue *)base;
	int ret = fx_ring_enable(&q->ring);

	if (ret < 0)
		return ret;
	ring_submit(q);
	return 0;
}

static int tq_create(struct fx_dev *dev, const struct fx_queue_opts *o, struct fx_queue **out)
{
	struct tcp_dev *d = (struct tcp_dev *)dev;
	struct tcp_queue *q = calloc(1, sizeof(*q));
	int ret;

	if (!q)
		return -ENOMEM;
	q->base.ops = dev->ops;
	q->base.dev = dev;
	q->dev = d;
	q->base.reqs = &q->t;
	q->nconns = d->nd.queues;
	ret = fx_reqs_init(&q->t, o->slots);
	if (!ret)
		q->t.write_depth = o->write_depth;
	if (ret < 0) {
		free(q);
		return ret;
	}
	q->conns = calloc(q->nconns, sizeof(*q->conns));
	if (!q->conns || fx_nvmf_waits_init(&q->waits, q->t.nslots) < 0) {
		ret = -ENOMEM;
		goto fail;
	}
	pthread_mutex_lock(&d->nd.lock);
	uint32_t sq = d->nd.ctrl ? (uint32_t)d->nd.ctrl->io_sqsize + 1 : 32;
	pthread_mutex_unlock(&d->nd.lock);
	if (d->nd.qsize && d->nd.qsize < sq)
		sq = d->nd.qsize; /* the I/O queues are connected that size */
	/* One slot short of the queue size: a full SQ is an error on the
	 * target side, and the CID space has CID_SLOT_BITS for the slot. */
	uint32_t per = o->depth < sq - 1 ? o->depth : sq - 1;
	if (per > CID_SLOT_MASK + 1)
		per = CID_SLOT_MASK + 1;
	if (per == 0)
		per = 1;
	q->depth = per;
	/* recv + send per connection and the tick, with room to spare. */
	ret = fx_ring_init(&q->ring, 4 * q->nconns + 8, o->flags);
	if (ret < 0)
		goto fail;
	for (unsigned k = 0; k < q->nconns; k++) {
		struct conn *c = &q->conns[k];
		c->q = q;
		c->idx = k;
		c->nc.fd = -1;
		c->ncmds = (uint16_t)per;
		c->cmds = calloc(per, sizeof(*c->cmds));
		c->free_cmds = malloc(per * sizeof(*c->free_cmds));
		c->stage = malloc(RX_STAGE);
		if (!c->cmds || !c->free_cmds || !c->stage) {
			ret = -ENOMEM;
			goto fail_ring;
		}
		for (uint32_t i = 0; i < per; i++)
			c->free_cmds[i] = (uint16_t)(per - 1 - i);
		c->nfree = (uint16_t)per;
		/* At creation the caller waits (without the GIL): an open
		 * that cannot connect fails here, with why. */
		struct fx_nvmf_io_conn io;
		struct fx_tcp_conn nc = {.fd = -1};
		fx_nvmf_dev_connect_io(&d->nd, NULL, &nc, &io);
		ret = io.err;
		if (ret < 0)
			goto fail_ring;
		conn_adopt(c, &nc, &io);
	}
	ring_submit(q);
	q->base.poll_fd = q->ring.efd;
	q->base.features = q->ring.features;
	*out = &q->base;
	return 0;
fail_ring:
	for (unsigned k = 0; k < q->nconns; k++)
		conn_fail(&q->conns[k], ret);
	tq_destroy(&q->base);
	return ret;
fail:
	if (q->conns) {
		for (unsigned k = 0; k < q->nconns; k++) {
			free(q->conns[k].cmds);
			free(q->conns[k].free_cmds);
			free(q->conns[k].stage);
		}
		free(q->conns);
	}
	fx_nvmf_waits_fini(&q->waits);
	fx_reqs_fini(&q->t);
	free(q);
	return ret;
}

static int tcp_dev_ana(struct fx_dev *d, uint32_t *grpid, uint8_t *state)
{
	return fx_nvmf_dev_ana(&((struct tcp_dev *)d)->nd, grpid, state);
}

const struct fx_transport_ops fx_transport_tcp = {
	.name = "nvme+tcp",
	.dev_open = tcp_dev_open,
	.dev_close = tcp_dev_close,
	.queue_create = tq_create,
	.queue_destroy = tq_destroy,
	.queue_enable = tq_enable,
	.queue_submit = tq_submit,
	.queue_reap = tq_reap,
	.queue_wait = tq_wait,
	.dev_ana = tcp_dev_ana,
};
