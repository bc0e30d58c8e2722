/*
 * libFuzzer harness for the initiator's NVMe/TCP receive path
 * (csrc/transport/tcp.c): the byte stream a controller could send, cut into
 * recv chunks by the input, against one connection with reads, writes (one
 * of them in-capsule) and a flush in flight.
 *
 * tcp.c is driven through its own code: requests go in through issue(), and
 * every completion comes back through process_cqes() exactly as from the
 * kernel.  The io_uring is a fake one in user memory (flagged SQPOLL so
 * liburing never enters the kernel): this file plays the kernel, taking the
 * SQEs tcp.c prepares and posting their CQEs.  So a recv writes where tcp.c
 * asked, a sendmsg reads the iovecs tcp.c gave, and ASan sees both.
 *
 * Input: byte 0 picks digests (bits 0-1), MAXH2CDATA (4096 << bits 2-3), a
 * one-entry SQ (0x10: tcp.c must cope with io_uring_get_sqe returning NULL),
 * a ring whose submit fails (0x20), deadlines already passed (0x40) and a
 * stage buffer (0x80: bulk receives while only small reads are in flight;
 * RX_SMALL_MAX is 4096 here, so the 8192-byte read commands are large and
 * the connection switches between bulk and exact receives, cancelling a
 * bulk recv when a large read is issued); then
 * a sequence of steps:
 *   op & 3 == 0: (next byte + 1) bytes, taken from the input, arrive on
 *                the socket; tcp.c's recvs get them as they ask
 *   op & 3 == 1: the same with (next byte + 1) * 64 bytes
 *   op & 3 == 2: the pending sendmsg completes: next byte < 192 all of it,
 *                < 254 part of it, 254 -EAGAIN, 255 -EPIPE
 *   op & 3 == 3: the deadline tick fires
 * At the end of the input the controller hangs up.
 *
 * Invariants checked (beyond ASan/UBSan): a recv lands only in the
 * connection's header/pad/digest/stage buffers or inside a read still in
 * flight;
 * a send reads only whole ranges of a write still in flight (or headers);
 * a write's source buffer is never written; one recv and one send at most
 * in flight; a completed request's buffer is freed at once, so any later
 * use of it is a use after free; and when the connection is gone every
 * request has completed (nothing is lost).
 *
 * tests/c/test_tcp_conn.c includes this file for deterministic cases and
 * replays tests/fuzz/corpus/tcp_rx/ (where each crash found becomes a
 * seed).  Build alone: clang -fsanitize=fuzzer,address,undefined
 * -Icsrc/include -Icsrc, this file and every .c under csrc, -luring
 * -lpthread.  tcp.c's one global is renamed here, so csrc/transport/tcp.c
 * itself may be linked in as well.
 */
#define fx_transport_tcp fx_transport_tcp_rx_harness
#define RX_SMALL_MAX 4096u
#include "../../csrc/transport/tcp.c"
#undef fx_transport_tcp

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define H_CHECK(cond)                                                                      \
	do {                                                                               \
		if (!(cond)) {                                                             \
			fprintf(stderr, "%s:%d: harness invariant failed: %s\n", __FILE__, \
				__LINE__, #cond);                                          \
			abort();                                                           \
		}                                                                          \
	} while (0)

#define H_SQ 64
#define H_CQ 128
#define H_NCMDS 12
#define H_MAX_XFER 8192
#define H_INCAP 2048
#define H_BLOCK 512

/* The requests in flight, in issue order.  With MAX_XFER 8192 they become
 * commands (CIDs 0x400 + slot, slots in this order): 0 read 4096, 1 write
 * 1024 (in the capsule), 2-4 read 20480 (8192, 8192, 4096), 5-6 write
 * 12288 (8192, 4096: by R2T), 7 flush, 8 read 512. */
static const struct {
	uint8_t op;
	uint32_t len;
	uint64_t off;
} h_reqs[] = {
	{FX_OP_READ, 4096, 0},       {FX_OP_WRITE, 1024, 8192}, {FX_OP_READ, 20480, 16384},
	{FX_OP_WRITE, 12288, 65536}, {FX_OP_FLUSH, 0, 0},       {FX_OP_READ, 512, 131072},
};
#define H_NREQ (sizeof(h_reqs) / sizeof(h_reqs[0]))

struct h_req {
	char *buf; /* freed as soon as the request completes */
	int done;
	int64_t res;
};

struct harness {
	/* the kernel's side of the fake ring */
	struct io_uring_sqe sqes[H_SQ];
	unsigned sq_khead, sq_ktail, sq_kflags, sq_kdropped, sq_array[H_SQ];
	struct io_uring_cqe cqes[H_CQ];
	unsigned cq_khead, cq_ktail, cq_kflags, cq_koverflow;
	int submit_fails; /* the SQEs are never taken (io_uring_enter fails) */
	int cancel_asked; /* an ASYNC_CANCEL of the recv was taken */
	/* what the kernel holds */
	int recv_armed, send_armed;
	uint8_t *recv_dst;
	unsigned recv_len;
	struct msghdr *send_msg;
	unsigned sent_sink;
	/* bytes the controller sent that tcp.c has not received yet */
	uint8_t *sock;
	size_t sock_have, sock_used;
	/* tcp.c's side */
	struct tcp_dev d;
	struct tcp_queue *q;
	struct conn *c;
	struct h_req reqs[H_NREQ];
};

static struct harness H;
/* Set by the deterministic tests: checks a read's bytes before it is freed. */
static void (*h_read_check)(unsigned req, const char *buf, uint32_t len);
static int h_trace = -1; /* FX_TCP_RX_TRACE=1: print each step (crash triage) */

#define H_TRACE(...)                                                 \
	do {                                                         \
		if (h_trace < 0)                                     \
			h_trace = getenv("FX_TCP_RX_TRACE") != NULL; \
		if (h_trace)                                         \
			fprintf(stderr, "harness: " __VA_ARGS__);    \
	} while (0)

static void h_fake_ring(struct io_uring *u, unsigned sq_entries)
{
	memset(u, 0, sizeof(*u));
	for (unsigned i = 0; i < H_SQ; i++)
		H.sq_array[i] = i;
	u->sq.khead = &H.sq_khead;
	u->sq.ktail = &H.sq_ktail;
	u->sq.kflags = &H.sq_kflags;
	u->sq.kdropped = &H.sq_kdropped;
	u->sq.array = H.sq_array;
	u->sq.sqes = H.sqes;
	u->sq.ring_mask = sq_entries - 1;
	u->sq.ring_entries = sq_entries;
	u->cq.khead = &H.cq_khead;
	u->cq.ktail = &H.cq_ktail;
	u->cq.kflags = &H.cq_kflags;
	u->cq.koverflow = &H.cq_koverflow;
	u->cq.cqes = H.cqes;
	u->cq.ring_mask = H_CQ - 1;
	u->cq.ring_entries = H_CQ;
	/* SQPOLL: submitting only publishes the tail, no syscall; with
	 * IORING_SQ_NEED_WAKEUP set it enters (fd -1: -EBADF). */
	u->flags = IORING_SETUP_SQPOLL;
	u->ring_fd = u->enter_ring_fd = -1;
}

static int h_inside(const void *p, size_t n, const void *base, size_t len)
{
	uintptr_t a = (uintptr_t)p, b = (uintptr_t)base;

	return a >= b && a - b <= len && n <= len - (a - b);
}

/* Which live request's buffer holds [p, p+n): its index, -1 for none,
 * -2 when the range straddles one (never allowed). */
static int h_owner(const void *p, size_t n)
{
	uintptr_t a = (uintptr_t)p;

	for (unsigned i = 0; i < H_NREQ; i++) {
		struct h_req *r = &H.reqs[i];
		uintptr_t b = (uintptr_t)r->buf;

		if (!r->buf || !h_reqs[i].len)
			continue;
		if (h_inside(p, n, r->buf, h_reqs[i].len))
			return (int)i;
		if (a < b + h_reqs[i].len && a + n > b)
			return -2;
	}
	return -1;
}

static void h_post(uint64_t ud, int res);

/* The kernel takes the SQEs tcp.c submitted. */
static void h_take(void)
{
	if (H.submit_fails)
		return;
	while (H.sq_khead != H.sq_ktail) {
		struct io_uring_sqe *s = &H.sqes[H.sq_khead & H.q->ring.uring.sq.ring_mask];
		unsigned kind = s->user_data & 0xff;

		H_CHECK((s->user_data >> 8) == 0 || kind == UD_TICK); /* one connection */
		H_TRACE("kernel takes SQE kind %u\n", kind);
		if (kind == UD_RECV) {
			struct conn *c = H.c;
			uint8_t *dst = (uint8_t *)(uintptr_t)s->addr;

			H_CHECK(!H.recv_armed);
			H_CHECK(s->len > 0);
			H_CHECK(h_inside(dst, s->len, c->rxhdr, sizeof(c->rxhdr)) ||
				h_inside(dst, s->len, c->rxpad, sizeof(c->rxpad)) ||
				(c->stage && h_inside(dst, s->len, c->stage, RX_STAGE)) ||
				h_inside(dst, s->len, c->rx_dg, sizeof(c->rx_dg)) ||
				(h_owner(dst, s->len) >= 0 &&
				 h_reqs[h_owner(dst, s->len)].op == FX_OP_READ));
			H.recv_armed = 1;
			H.recv_dst = dst;
			H.recv_len = s->len;
		} else if (kind == UD_SEND) {
			H_CHECK(!H.send_armed);
			H.send_armed = 1;
			H.send_msg = (struct msghdr *)(uintptr_t)s->addr;
		} else if (kind == UD_CANCEL) {
			H_CHECK(s->opcode == IORING_OP_ASYNC_CANCEL && s->addr == UD(0, UD_RECV));
			H.cancel_asked = 1;
		}
		/* UD_TICK: fired by an input step */
		H.sq_khead++;
	}
	if (H.cancel_asked) {
		/* The kernel cancels the recv if it is still waiting (it never
		 * took data: h_pump runs after this) and says so. */
		int found = H.recv_armed;

		H.cancel_asked = 0;
		if (found) {
			H.recv_armed = 0;
			h_post(UD(0, UD_RECV), -ECANCELED);
		}
		h_post(UD(0, UD_CANCEL), found ? 0 : -ENOENT);
	}
}

static void h_reap(void)
{
	struct fx_cqe out[16];
	int n;

	while ((n = fx_reqs_pop_done(&H.q->t, out, 16)) > 0)
		for (int k = 0; k < n; k++) {
			struct h_req *r = &H.reqs[out[k].tag];

			H_CHECK(out[k].tag < H_NREQ && !r->done);
			r->done = 1;
			r->res = out[k].res;
			if (h_reqs[out[k].tag].op == FX_OP_WRITE)
				for (uint32_t i = 0; i < h_reqs[out[k].tag].len; i++)
					H_CHECK((uint8_t)r->buf[i] ==
						(uint8_t)(i * 7 + out[k].tag));
			if (out[k].res >= 0)
				H_CHECK(out[k].res == h_reqs[out[k].tag].len);
			if (out[k].res >= 0 && h_read_check && h_reqs[out[k].tag].op == FX_OP_READ)
				h_read_check(out[k].tag, r->buf, h_reqs[out[k].tag].len);
			/* the caller may free it now: anything tcp.c still
			 * holds into it becomes a use after free */
			free(r->buf);
			r->buf = NULL;
		}
}

/* Post one completion and let tcp.c process it. */
static void h_post(uint64_t ud, int res)
{
	struct io_uring_cqe *e = &H.cqes[H.cq_ktail & (H_CQ - 1)];

	H_CHECK(H.cq_ktail - H.cq_khead < H_CQ);
	e->user_data = ud;
	e->res = res;
	e->flags = 0;
	io_uring_smp_store_release(&H.cq_ktail, H.cq_ktail + 1);
	process_cqes(H.q);
	h_take();
	h_reap();
}

static void h_recv(const uint8_t *data, unsigned n)
{
	if (!H.recv_armed || n == 0)
		return;
	if (n > H.recv_len)
		n = H.recv_len;
	memcpy(H.recv_dst, data, n);
	H.recv_armed = 0;
	H_TRACE("recv %u bytes (type 0x%02x at rx state %d)\n", n, data[0], H.c->rx);
	h_post(UD(0, UD_RECV), (int)n);
}

static void h_eof(void)
{
	if (!H.recv_armed)
		return;
	H.recv_armed = 0;
	h_post(UD(0, UD_RECV), 0);
}

/* The pending sendmsg completes; mode as in the file comment. */
static void h_send(uint8_t mode)
{
	struct msghdr *m = H.send_msg;
	size_t total = 0;

	if (!H.send_armed)
		return;
	for (size_t i = 0; i < m->msg_iovlen; i++) {
		const struct iovec *v = &m->msg_iov[i];
		int own = h_owner(v->iov_base, v->iov_len);

		H_CHECK(own != -2);
		H_CHECK(own < 0 || h_reqs[own].op == FX_OP_WRITE);
		/* the kernel reads every byte handed to it */
		for (size_t k = 0; k < v->iov_len; k++)
			H.sent_sink += ((const uint8_t *)v->iov_base)[k];
		total += v->iov_len;
	}
	int res;

	if (mode < 192)
		res = (int)total;
	else if (mode < 254)
		res = (int)(total * (size_t)(mode - 192) / 62);
	else
		res = mode == 254 ? -EAGAIN : -EPIPE;
	H.send_armed = 0;
	H_TRACE("sendmsg of %zu bytes completes: %d\n", total, res);
	h_post(UD(0, UD_SEND), res);
}

static void h_tick(void)
{
	h_post(UD(0, UD_TICK), -ETIME);
}

static void h_setup(uint8_t cfg)
{
	memset(&H, 0, sizeof(H));
	H.d.base.info.block_size = H_BLOCK;
	H.d.base.info.size = 1 << 30;
	H.d.nd.tr = &fx_tcp_transport;
	H.d.nd.label = "nvme+tcp";
	H.d.nd.info = &H.d.base.info;
	H.d.nd.nsid = 1;
	H.d.nd.queues = 1;
	H.d.nd.max_xfer = H_MAX_XFER;
	/* 0x40: every command is already past its deadline at the first tick */
	H.d.nd.io_timeout_ms = (cfg & 0x40) ? 0 : 1 << 30;
	pthread_mutex_init(&H.d.nd.lock, NULL);

	struct tcp_queue *q = calloc(1, sizeof(*q));
	H_CHECK(q);
	H.q = q;
	q->dev = &H.d;
	q->base.dev = &H.d.base;
	q->base.reqs = &q->t;
	q->nconns = 1;
	q->depth = H_NCMDS;
	q->ring.efd = -1;
	h_fake_ring(&q->ring.uring, (cfg & 0x10) ? 1 : H_SQ);
	H_CHECK(fx_reqs_init(&q->t, 16) == 0);
	/* as tq_create: the reconnect policy's per-request stamps, and no
	 * connector yet.  A request that finds the connection down fails at
	 * once (max_reconnects 0); the attempt it starts fails at once too
	 * (no address), on a connector thread that h_teardown joins. */
	H_CHECK(fx_nvmf_waits_init(&q->waits, q->t.nslots) == 0);
	pthread_mutex_init(&H.d.nd.open_lock, NULL);
	H.d.nd.max_reconnects = 0;

	struct conn *c = calloc(1, sizeof(*c));
	H_CHECK(c);
	q->conns = H.c = c;
	c->q = q;
	c->nc.fd = -1; /* shutdown()/close() on it are harmless no-ops */
	c->nc.qid = 1;
	c->io.qid = 1; /* (no qid map: giving it back is a no-op) */
	c->nc.hdgst = cfg & 1;
	c->nc.ddgst = !!(cfg & 2);
	c->nc.maxh2cdata = 4096u << ((cfg >> 2) & 3);
	c->io.incap_max = H_INCAP;
	c->ncmds = H_NCMDS;
	if (cfg & 0x80) {
		c->stage = malloc(RX_STAGE);
		H_CHECK(c->stage);
	}
	c->cmds = calloc(H_NCMDS, sizeof(*c->cmds));
	c->free_cmds = malloc(H_NCMDS * sizeof(*c->free_cmds));
	H_CHECK(c->cmds && c->free_cmds);
	for (unsigned i = 0; i < H_NCMDS; i++)
		c->free_cmds[i] = (uint16_t)(H_NCMDS - 1 - i);
	c->nfree = H_NCMDS;
	c->limit = H_NCMDS;
	c->state = CONN_LIVE;
	c->ever_connected = 1;
	rx_expect_header(c);
	arm_recv(c);

	struct fx_req r[H_NREQ];
	for (unsigned i = 0; i < H_NREQ; i++) {
		uint32_t len = h_reqs[i].len;

		H.reqs[i].buf = len ? malloc(len) : NULL;
		H_CHECK(!len || H.reqs[i].buf);
		for (uint32_t k = 0; k < len; k++)
			H.reqs[i].buf[k] = h_reqs[i].op == FX_OP_WRITE ? (char)(k * 7 + i) : 0;
		r[i] = (struct fx_req){.tag = i,
				       .addr = H.reqs[i].buf,
				       .len = len,
				       .off = h_reqs[i].off,
				       .op = h_reqs[i].op};
	}
	H_CHECK(fx_reqs_accept(&q->t, r, H_NREQ) == H_NREQ);
	issue(q);
	/* publish and hand over, as tq_submit does */
	process_cqes(q);
	if (cfg & 0x20) {
		/* from now on every submit with work in it fails */
		H.sq_kflags |= IORING_SQ_NEED_WAKEUP;
		H.submit_fails = 1;
	}
	h_take();
	h_reap();
}

/* The controller hangs up; the connection must wind down and every request
 * complete. */
static void h_finish(void)
{
	for (int i = 0; i < 16 && H.c->state != CONN_DOWN; i++) {
		if (H.send_armed) {
			H.send_armed = 0;
			h_post(UD(0, UD_SEND), -ECONNRESET);
		}
		h_eof();
		if (!H.recv_armed && !H.send_armed && H.c->state != CONN_DOWN)
			h_tick(); /* nothing of ours in flight: let tcp.c run */
	}
	H_CHECK(H.c->state == CONN_DOWN);
	h_reap();
	for (unsigned i = 0; i < H_NREQ; i++)
		H_CHECK(H.reqs[i].done); /* nothing lost */
	H_CHECK(H.q->t.pending == 0);
}

static void h_teardown(void)
{
	struct tcp_queue *q = H.q;

	fx_nvmf_cx_fini(&q->cx);
	pthread_mutex_destroy(&H.d.nd.open_lock);
	fx_nvmf_waits_fini(&q->waits);
	free_tx(H.c);
	free(H.c->cmds);
	free(H.c->free_cmds);
	free(H.c->stage);
	free(H.c);
	fx_reqs_fini(&q->t);
	free(q);
	for (unsigned i = 0; i < H_NREQ; i++)
		free(H.reqs[i].buf);
	pthread_mutex_destroy(&H.d.nd.lock);
}

/* Hand tcp.c what the socket holds, as much as each recv asks for. */
static void h_pump(void)
{
	while (H.recv_armed && H.sock_have > H.sock_used && H.c->state == CONN_LIVE) {
		size_t n = H.sock_have - H.sock_used;

		if (n > H.recv_len)
			n = H.recv_len;
		H.sock_used += n;
		h_recv(H.sock + H.sock_used - n, (unsigned)n);
	}
}

/* Run one input: steps as in the file comment.  Received bytes go into a
 * socket buffer first, so the chunks the input cuts need not match the
 * reads tcp.c asks for (short recvs happen where a chunk ends). */
static void h_run(const uint8_t *in, size_t n)
{
	size_t i = 1;

	h_setup(n ? in[0] : 0);
	H.sock = malloc(n ? n : 1);
	H_CHECK(H.sock);
	while (i < n && H.c->state == CONN_LIVE) {
		uint8_t op = in[i++];
		size_t len;

		switch (op & 3) {
		case 0:
		case 1:
			if (i >= n)
				break;
			len = (size_t)in[i++] + 1;
			if (op & 1)
				len *= 64;
			if (len > n - i)
				len = n - i;
			memcpy(H.sock + H.sock_have, in + i, len);
			H.sock_have += len;
			i += len;
			break;
		case 2:
			h_send(i < n ? in[i++] : 0);
			break;
		default:
			h_tick();
			break;
		}
		h_pump();
	}
	h_finish();
	free(H.sock);
	H.sock = NULL;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	h_run(data, size);
	h_teardown();
	return 0;
}
