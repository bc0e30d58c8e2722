/*
 * The NVMe/RDMA transport: a namespace of a remote NVMe-oF controller read
 * and written from userspace over RDMA (librdmacm + libibverbs).
 *
 * The device owns the controller (host/dev.c: admin queue over RDMA, keep
 * alive, re-open).  Each fx_queue (one per thread) connects `queues` I/O
 * queues of its own, each one RC queue pair (transport/rdma_conn.c).  A
 * command is its 64-byte capsule sent by SEND; its data never passes
 * through the capsule except small writes (in-capsule, up to IOCCSZ): the
 * target RDMA-WRITEs read data and RDMA-READs write data straight from the
 * caller's buffer, described by a keyed SGL.  Its key is the slot's memory
 * window, bound (in the same post, before the SEND) over that buffer alone
 * inside the pool's region (transport/rdma_mem.c), with remote write for a
 * read and remote read for a write.  The SGL asks the target to invalidate
 * the key with its response; if it did not, we post a LOCAL_INV and the
 * command completes only when that is done: no key outlives its command.
 * Memory in no pool goes through a registered bounce buffer (a window over
 * that piece of it): a copy, counted in the queue's stats.
 *
 * A command slot is free again only when its SEND completion, its response
 * and the end of its key have all arrived (the response may come first).  The queue's poll
 * fd is an epoll set of every connection's completion channel and CM event
 * channel, the connector's eventfd and a deadline timer: asyncio watches it
 * with add_reader, blocking callers sleep in epoll_wait without the GIL.
 *
 * A failed connection (flush, disconnect, bad response, a deadline) is torn
 * down at once, which stops the target touching our memory, and its
 * commands fail; the queue's connector thread reconnects it in the
 * background under the same policy as NVMe/TCP (reconnect_ms,
 * max_reconnects, io_timeout_ms).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include "internal.h"
#include "host/dev.h"
#include "reqs.h"
#include "transport/rdma_conn.h"

#define CID_SLOT_BITS 8
#define CID_SLOT_MASK ((1u << CID_SLOT_BITS) - 1)
#define TICK_MS 100
#define BOUNCE_MAX 8            /* bounce buffers per queue (of xfer bytes each) */
#define BOUNCE_BYTES (8u << 20) /* ... and no more than this in all, but one */

struct rdma_dev {
	struct fx_dev base;
	struct fx_nvmf_dev nd;
};

struct rcmd {
	uint8_t busy;
	uint8_t gen;
	uint8_t sent;     /* SEND completion seen */
	uint8_t rsp_seen; /* response seen */
	uint8_t key_live; /* its window is bound: the target may still use it */
	uint8_t inv_sent; /* our LOCAL_INV of it is posted */
	uint8_t inv_due;  /* response seen, key live: our LOCAL_INV is owed */
	uint8_t opcode;
	uint16_t status;
	int16_t bounce; /* bounce buffer index, -1: the caller's memory */
	uint32_t rkey;  /* the key the target was given (key_live) */
	uint32_t req;
	char *data;
	uint32_t len;
	int64_t deadline;
};

enum rstate { R_DOWN, R_CONNECTING, R_LIVE };

struct rconn {
	struct rdma_queue *q;
	unsigned idx;
	struct fx_rdma_conn rc;
	struct fx_nvmf_io_conn io; /* qid, epoch, in-capsule size of the live queue */
	enum rstate state;
	int err;
	int64_t retry_at;
	uint32_t fails;
	int ever_connected;
	uint16_t limit; /* commands in flight at most: ours and the target's */
	struct rcmd *cmds;
	uint16_t cmds_alloc; /* slots allocated */
	uint16_t ncmds;      /* slots in use: no more than the queue's capsule slots */
	uint16_t *free_cmds;
	uint16_t nfree;
	int inv_due; /* some command's LOCAL_INV is owed (rcmd.inv_due) */
};

struct rdma_queue {
	struct fx_queue base;
	struct rdma_dev *dev;
	struct rconn *conns;
	unsigned nconns;
	unsigned rr;
	uint32_t depth; /* commands in flight on all connections together */
	/* A response invalidated a key that was not its command's own: every
	 * connection of the queue goes down before anything more is posted
	 * (queue_key_fault). */
	int key_fault;
	struct req_table t;
	uint32_t xfer; /* bytes per command, fixed at creation (bounce buffer size) */
	int epfd;
	int timerfd;
	int tick_on;
	struct fx_nvmf_connector cx;
	int cx_busy;
	int starved;
	struct fx_nvmf_waits waits; /* requests waiting for a connection */
	/* bounce buffers for memory in no pool, made on first need */
	struct fx_rdma_pd *bpd;
	char *bmem;
	struct ibv_mr *bmr;
	uint32_t bsize;
	uint16_t bfree[BOUNCE_MAX];
	uint16_t nbfree;
};

#define now_ms fx_now_ms

/* ---------------------------------------------------------------- device */

static int rdma_dev_open(const struct fx_transport_ops *ops, const char *target,
			 const struct fx_dev_opts *o, struct fx_dev **out)
{
	struct rdma_dev *d = calloc(1, sizeof(*d));
	int ret;

	if (!d)
		return -ENOMEM;
	d->base.ops = ops;
	ret = fx_nvmf_dev_init(&d->nd, &fx_rdma_transport, "nvme+rdma", target, &d->base.info);
	if (ret < 0) {
		free(d);
		return ret;
	}
	d->base.info.caps = FX_CAP_FLUSH | FX_CAP_ALIGNED_ONLY |
			    (o->readonly ? FX_CAP_READONLY : 0);
	*out = &d->base;
	return 0;
}

static void rdma_dev_close(struct fx_dev *dev)
{
	struct rdma_dev *d = (struct rdma_dev *)dev;

	fx_nvmf_dev_fini(&d->nd);
	free(d);
}

/* ---------------------------------------------------------------- bounce */

/* A bounce buffer registered in pd, its index; -EAGAIN when all are in
 * use (the command waits for one). */
static int bounce_take(struct rdma_queue *q, struct fx_rdma_pd *pd)
{
	if (!q->bmem) {
		q->bsize = q->xfer;
		uint32_t n = BOUNCE_BYTES / q->bsize;
		if (n > BOUNCE_MAX)
			n = BOUNCE_MAX;
		if (n == 0)
			n = 1;
		q->bmem = aligned_alloc(4096, (size_t)n * q->bsize);
		if (!q->bmem)
			return -ENOMEM;
		/* no remote access but through a command's window */
		q->bmr = fx_rdma_reg(pd, q->bmem, (size_t)n * q->bsize,
				     IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND);
		if (!q->bmr) {
			free(q->bmem);
			q->bmem = NULL;
			return -ENOMEM;
		}
		/* a reference of our own: the PD must outlive the MR */
		fx_rdma_pd_hold(pd);
		q->bpd = pd;
		for (uint32_t i = 0; i < n; i++)
			q->bfree[i] = (uint16_t)(n - 1 - i);
		q->nbfree = (uint16_t)n;
	}
	if (q->bpd != pd)
		return -EXDEV; /* queues of one fx_queue on two RDMA devices */
	if (!q->nbfree)
		return -EAGAIN;
	return q->bfree[--q->nbfree];
}

static void bounce_put(struct rdma_queue *q, int16_t b)
{
	if (b >= 0)
		q->bfree[q->nbfree++] = (uint16_t)b;
}

static void bounce_free(struct rdma_queue *q)
{
	if (q->bmr)
		ibv_dereg_mr(q->bmr);
	free(q->bmem);
	fx_rdma_pd_put(q->bpd);
	q->bmr = NULL;
	q->bmem = NULL;
	q->bpd = NULL;
}

/* The capsule slots a connection can use: its command slots, but never
 * more than its queue pair has capsule buffers for (a controller re-opened
 * with a smaller queue size gives fewer).  Only while nothing is in
 * flight on it. */
static void conn_fit_slots(struct rconn *c, uint32_t capsules)
{
	uint32_t n = c->cmds_alloc < capsules ? c->cmds_alloc : capsules;

	c->ncmds = (uint16_t)n;
	for (uint32_t i = 0; i < n; i++)
		c->free_cmds[i] = (uint16_t)(n - 1 - i);
	c->nfree = (uint16_t)n;
}

/* -------------------------------------------------------------- requests */

/* A command is over (err 0 and status 0: its data moved): data out of the
 * bounce buffer, the request accounted, the slot free. */
static void cmd_done(struct rconn *c, struct rcmd *m, int err, uint16_t status)
{
	struct rdma_queue *q = c->q;
	uint64_t bytes = 0;

	if (!err && status)
		err = -EIO;
	if (!err) {
		bytes = m->len;
		if (m->opcode == NVME_CMD_READ && m->bounce >= 0) {
			memcpy(m->data, q->bmem + (size_t)m->bounce * q->bsize, m->len);
			q->base.stats.bytes_copied += m->len;
		} else if (m->opcode == NVME_CMD_READ) {
			q->base.stats.bytes_direct += m->len;
		}
		q->base.stats.bytes += m->len;
		if (m->len)
			fx_req_crc_add(&q->t.reqs[m->req], m->data, m->len);
	}
	bounce_put(q, m->bounce);
	m->bounce = -1;
	m->busy = 0;
	m->key_live = 0;
	m->inv_due = 0;
	c->free_cmds[c->nfree++] = (uint16_t)(m - c->cmds);
	fx_req_piece_done(&q->t, m->req, err, bytes, status);
}

/* ----------------------------------------------------------- connections */

static void ep_del(struct rdma_queue *q, struct rconn *c)
{
	epoll_ctl(q->epfd, EPOLL_CTL_DEL, c->rc.cch->fd, NULL);
	epoll_ctl(q->epfd, EPOLL_CTL_DEL, c->rc.ech->fd, NULL);
}

static int ep_add(struct rdma_queue *q, int fd)
{
	struct epoll_event ev = {.events = EPOLLIN};

	return epoll_ctl(q->epfd, EPOLL_CTL_ADD, fd, &ev) ? -errno : 0;
}

/* Take a live connection down: the queue pair goes first (so the target
 * can no longer write into or read from any buffer), then every command on
 * it fails with err. */
static void conn_fail(struct rconn *c, int err)
{
	struct rdma_queue *q = c->q;

	if (c->state != R_LIVE)
		return;
	if (err != -ECANCELED)
		fprintf(stderr, "fx100io: nvme+rdma %s:%s: queue %u (qid %u) failed: %s\n",
			q->dev->nd.addr.host, q->dev->nd.addr.port, c->idx, c->io.qid,
			strerror(-err));
	ep_del(q, c);
	fx_nvmf_dev_close_io(&q->dev->nd, &c->rc, &c->io);
	c->state = R_DOWN;
	c->err = err;
	c->retry_at = now_ms();
	q->base.stats.conn_errors++;
	for (uint16_t i = 0; i < c->ncmds; i++)
		if (c->cmds[i].busy)
			cmd_done(c, &c->cmds[i], err, 0);
}

static int conn_adopt(struct rconn *c, const struct fx_nvmf_io_conn *io)
{
	struct rdma_queue *q = c->q;
	int ret = fx_rdma_nonblocking(&c->rc);

	if (!ret)
		ret = ep_add(q, c->rc.cch->fd);
	if (!ret) {
		ret = ep_add(q, c->rc.ech->fd);
		if (ret)
			epoll_ctl(q->epfd, EPOLL_CTL_DEL, c->rc.cch->fd, NULL);
	}
	if (ret) {
		fx_nvmf_dev_close_io(&q->dev->nd, &c->rc, io);
		return ret;
	}
	c->io = *io;
	conn_fit_slots(c, (uint32_t)io->sqsize + 1);
	/* In flight at most: our slots, the SQ (one entry short of full) and
	 * what the controller said it can receive. */
	uint32_t lim = c->ncmds;
	if (lim > io->sqsize)
		lim = io->sqsize ? io->sqsize : 1;
	if (c->rc.crqsize && lim > c->rc.crqsize)
		lim = c->rc.crqsize;
	c->limit = (uint16_t)lim;
	if (c->ever_connected) {
		q->base.stats.reconnects++;
		if (c->fails)
			fprintf(stderr,
				"fx100io: nvme+rdma %s:%s: queue %u reconnected after %u failed "
				"attempts\n",
				q->dev->nd.addr.host, q->dev->nd.addr.port, c->idx, c->fails);
	}
	c->ever_connected = 1;
	c->fails = 0;
	c->state = R_LIVE;
	c->err = 0;
	fx_nvmf_waits_connected(&q->waits);
	return 0;
}

static void conn_connect_failed(struct rconn *c, int err)
{
	struct rdma_queue *q = c->q;

	int changed = c->fails == 0 || c->err != err;

	c->state = R_DOWN;
	c->err = err;
	/* While another connection carries the I/O, nothing waits for this
	 * one: its retries back off (up to 32 x reconnect_ms), each of them
	 * costs the target a connect and maybe the admin queue a CSTS read. */
	int64_t delay = q->dev->nd.reconnect_ms;
	for (unsigned k = 0; k < q->nconns; k++)
		if (q->conns[k].state == R_LIVE) {
			delay <<= c->fails < 5 ? c->fails : 5;
			break;
		}
	c->retry_at = now_ms() + delay;
	/* Requests wait only while no connection is live, and every down one
	 * is retried in turn: the first one's attempts are the policy's
	 * (max_reconnects counts rounds, as with one connection, not the
	 * attempts of all of them). */
	if (c->idx == 0)
		fx_nvmf_waits_attempt_failed(&q->waits);
	c->fails++;
	/* said when it starts failing and whenever the reason changes (a
	 * connection that stays down while another carries the I/O is
	 * otherwise silent) */
	if (changed && err != -ECANCELED)
		fprintf(stderr,
			"fx100io: nvme+rdma %s:%s: queue %u: connect failed (%s, attempt %u); "
			"retrying every %d ms\n",
			q->dev->nd.addr.host, q->dev->nd.addr.port, c->idx, strerror(-err),
			c->fails, q->dev->nd.reconnect_ms);
}

/* Hand connection c to the connector; never blocks. */
static void cx_request(struct rdma_queue *q, struct rconn *c)
{
	if (q->cx_busy)
		return;
	/* the connector is idle: its connection is ours to set up */
	((struct fx_rdma_conn *)q->cx.q)->want_mw = c->cmds_alloc;
	int ret = fx_nvmf_cx_request(&q->cx, c->idx);
	if (ret < 0) {
		conn_connect_failed(c, ret);
		return;
	}
	c->state = R_CONNECTING;
	q->cx_busy = 1;
}

/* Adopt the connector's result, if there is one.  1 if it took one. */
static int cx_collect(struct rdma_queue *q)
{
	struct fx_nvmf_io_conn io;
	struct fx_rdma_conn rc;
	unsigned ci;

	if (!q->cx_busy || !fx_nvmf_cx_collect(&q->cx, &ci, &io, &rc))
		return 0;
	q->cx_busy = 0;
	struct rconn *c = &q->conns[ci];
	if (io.err == 0) {
		c->rc = rc;
		int ret = conn_adopt(c, &io);
		if (ret < 0)
			conn_connect_failed(c, ret);
	} else {
		conn_connect_failed(c, io.err);
	}
	return 1;
}

/* Pieces from this size up take the connections in turn; smaller ones fill
 * the first connection with room.  A large piece is mostly per-packet work
 * that rxe does for one queue pair on one CPU at a time, so spreading them
 * over queue pairs lets several CPUs move one thread's data
 * (docs/nvme-rdma.md, "Speed"); a small one is mostly per-command work,
 * and every queue pair it wakes costs a completion event and a re-arm of
 * its own (4 KiB random reads spread over two pairs: 0.70x the kernel's
 * throughput, against 0.97x on one in the same lab boot). */
#define SPREAD_MIN (64u << 10)

/* A live connection with room for a command of len bytes; else NULL and
 * *err: 0 when requests should wait for completions, < 0 when no
 * connection is live. */
static struct rconn *pick_conn(struct rdma_queue *q, uint64_t len, int *err)
{
	int64_t now = now_ms();
	int busy = 0, why = 0;
	int spread = len >= SPREAD_MIN;
	unsigned first = spread ? q->rr : 0;
	uint32_t inflight = 0;

	/* a connection that is down is retried whichever one is picked */
	for (unsigned k = 0; k < q->nconns; k++) {
		if (q->conns[k].state == R_DOWN && now >= q->conns[k].retry_at)
			cx_request(q, &q->conns[k]);
		inflight += (uint32_t)(q->conns[k].ncmds - q->conns[k].nfree);
	}
	/* depth is the thread's, whatever connections carry it (commands in
	 * flight are only ever on live connections: wait for them) */
	if (inflight >= q->depth) {
		*err = 0;
		return NULL;
	}
	for (unsigned k = 0; k < q->nconns; k++) {
		struct rconn *c = &q->conns[(first + k) % q->nconns];
		if (c->state == R_LIVE && c->nfree && c->ncmds - c->nfree < c->limit) {
			if (spread)
				q->rr = (unsigned)((c - q->conns) + 1) % q->nconns;
			return c;
		}
		if (c->state == R_LIVE)
			busy = 1;
		else if (c->err)
			why = c->err;
	}
	*err = busy ? 0 : why ? why : -ENOTCONN;
	return NULL;
}

/* The same policy as NVMe/TCP for a request no connection can carry: wait
 * for a reconnect until max_reconnects attempts failed or io_timeout_ms
 * passed. */
static int wait_for_conn(struct rdma_queue *q, uint32_t ri, int err)
{
	return fx_nvmf_waits_check(&q->waits, &q->dev->nd, ri, err, now_ms());
}

/* Post command m's capsule (and in-capsule data).  0 or -errno (the
 * connection is broken). */
static int post_cmd(struct rconn *c, struct rcmd *m, uint16_t cid, uint64_t slba)
{
	struct rdma_queue *q = c->q;
	struct fx_nvmf_dev *d = &q->dev->nd;
	uint16_t slot = (uint16_t)(m - c->cmds);
	struct nvme_sqe *sqe = (struct nvme_sqe *)(c->rc.sqes + (size_t)slot * 64);
	struct ibv_sge sge[2] = {
		{.addr = (uintptr_t)sqe, .length = 64, .lkey = c->rc.sqe_mr->lkey}};
	struct ibv_send_wr wr =
				   {
					   .wr_id = FX_RDMA_WR_SEND | slot,
					   .sg_list = sge,
					   .num_sge = 1,
					   .opcode = IBV_WR_SEND,
					   .send_flags = IBV_SEND_SIGNALED,
				   },
			   *bad = NULL; /* a provider that fails without saying where: fatal */
	struct ibv_send_wr bind;
	struct ibv_mr *mr = NULL;
	uint32_t lkey = 0;
	char *buf = m->data;

	memset(sqe, 0, sizeof(*sqe));
	sqe->opcode = m->opcode;
	sqe->cid = cid;
	sqe->nsid = d->nsid;
	if (m->len) {
		uint32_t nlb = m->len / q->dev->base.info.block_size - 1;
		sqe->cdw10 = (uint32_t)slba;
		sqe->cdw11 = (uint32_t)(slba >> 32);
		sqe->cdw12 = nlb;
		if (fx_rdma_pool_mr(c->rc.pd, m->data, m->len, &mr) == 0) {
			q->base.stats.fixed_ios++;
		} else {
			int b = bounce_take(q, c->rc.pd);
			if (b < 0)
				return b;
			m->bounce = (int16_t)b;
			buf = q->bmem + (size_t)b * q->bsize;
			mr = q->bmr;
			if (m->opcode == NVME_CMD_WRITE) {
				memcpy(buf, m->data, m->len);
				q->base.stats.bytes_copied += m->len;
			}
		}
		lkey = mr->lkey;
	}
	if (m->opcode == NVME_CMD_WRITE && m->len <= c->io.incap_max && c->io.icdoff == 0) {
		/* In-capsule: the data is the SEND's second piece. */
		uint8_t *dp = (uint8_t *)&sqe->dptr;
		memset(dp, 0, 16);
		memcpy(dp + 8, &m->len, 4);
		dp[15] = NVME_SGL_DATA_BLOCK_OFFSET;
		sqe->flags = NVME_CMD_SGL_METABUF;
		sge[1] = (struct ibv_sge){.addr = (uintptr_t)buf, .length = m->len, .lkey = lkey};
		wr.num_sge = 2;
	} else if (m->len) {
		/* The slot's window over this buffer alone, bound just before
		 * the SEND that tells the target its key: the target can only
		 * use the key once it has the capsule, which leaves after the
		 * bind (one send queue, in order).  A fresh key byte each time:
		 * an earlier command's key is dead, and only comes back 256
		 * binds later, naming that later command's buffer. */
		if (slot >= c->rc.nmw)
			return -EPROTO;
		struct ibv_mw *mw = c->rc.mw[slot];
		uint32_t rkey = ibv_inc_rkey(mw->rkey);
		bind = (struct ibv_send_wr){
			.wr_id = FX_RDMA_WR_BIND | slot,
			.next = &wr,
			.opcode = IBV_WR_BIND_MW,
			.bind_mw = {.mw = mw,
				    .rkey = rkey,
				    .bind_info =
					    {.mr = mr,
					     .addr = (uintptr_t)buf,
					     .length = m->len,
					     .mw_access_flags = m->opcode == NVME_CMD_READ
									? IBV_ACCESS_REMOTE_WRITE
									: IBV_ACCESS_REMOTE_READ}},
		};
		fx_rdma_keyed_sgl(sqe, (uintptr_t)buf, m->len, rkey, 1);
		int r = ibv_post_send(c->rc.qp, &bind, &bad);
		if (r && bad == &bind)
			return -r; /* nothing went: no key exists, the slot is clean */
		/* The provider names the window by the rkey it has now (the
		 * device checks it): the new one from here on. */
		mw->rkey = rkey;
		m->rkey = rkey;
		m->key_live = 1;
		if (r) {
			/* The bind went but not its SEND (a full send queue):
			 * the window is bound over a buffer the caller would
			 * get back if the command just failed.  Only the queue
			 * pair's end kills that key for sure, so this is an
			 * error of the connection (conn_fail destroys the QP,
			 * then fails the command), never -ENOMEM. */
			fprintf(stderr,
				"fx100io: nvme+rdma: qid %u: a memory window was bound but its "
				"command could not be sent (%s)\n",
				c->io.qid, strerror(r));
			return -EIO;
		}
		return 0;
	} else {
		fx_rdma_keyed_sgl(sqe, 0, 0, 0, 0);
	}
	int r = ibv_post_send(c->rc.qp, &wr, &bad);
	return r ? -r : 0;
}

static void issue(struct rdma_queue *q)
{
	struct req_table *t = &q->t;
	struct fx_nvmf_dev *d = &q->dev->nd;

	for (int64_t next; (next = fx_reqs_fifo_next(t)) >= 0;) {
		uint32_t ri = (uint32_t)next;
		struct req *r = &t->reqs[ri];
		int err, waiting = 0;
		uint64_t piece = r->op == FX_OP_FLUSH ? 0 : r->len - r->issued;
		struct rconn *c = pick_conn(q, piece < q->xfer ? piece : q->xfer, &err);
		if (!c && err) {
			err = wait_for_conn(q, ri, err);
			waiting = !err;
		}
		if (!c) {
			if (err) {
				fx_reqs_fifo_fail_head(t, err);
				continue;
			}
			q->starved = waiting;
			break;
		}
		uint16_t slot = c->free_cmds[c->nfree - 1];
		struct rcmd *m = &c->cmds[slot];
		uint64_t slba = 0, n = 0;
		m->gen = (uint8_t)(m->gen + 1);
		m->req = ri;
		m->sent = 0;
		m->rsp_seen = 0;
		m->key_live = 0;
		m->inv_sent = 0;
		m->rkey = 0;
		m->status = 0;
		m->bounce = -1;
		m->deadline = now_ms() + d->io_timeout_ms;
		if (r->op == FX_OP_FLUSH) {
			m->opcode = NVME_CMD_FLUSH;
			m->data = NULL;
			m->len = 0;
		} else {
			n = r->len - r->issued;
			if (n > q->xfer)
				n = q->xfer;
			if (c->io.max_xfer && n > c->io.max_xfer)
				n = c->io.max_xfer;
			m->opcode = r->op == FX_OP_READ ? NVME_CMD_READ : NVME_CMD_WRITE;
			m->data = r->addr + r->issued;
			m->len = (uint32_t)n;
			slba = (r->off + r->issued) / q->dev->base.info.block_size;
		}
		uint16_t cid = (uint16_t)((m->gen << CID_SLOT_BITS) | slot);
		int pret = post_cmd(c, m, cid, slba);
		if (pret == -EAGAIN) {
			/* every bounce buffer is in use: wait for one */
			bounce_put(q, m->bounce);
			m->bounce = -1;
			break;
		}
		/* A failed post: the QP goes down (conn_fail) before the slot
		 * is reused, and the windows with it; nothing waits for an
		 * invalidation that will not come.  Only a post that put
		 * nothing on the send queue (-ENOMEM from post_cmd: no window
		 * was bound) or never tried (-EXDEV) fails the command alone. */
		/* the slot is taken now, whatever happens to the command */
		c->nfree--;
		m->busy = 1;
		if (r->op == FX_OP_FLUSH)
			r->issued = 1;
		else
			r->issued += n;
		r->inflight++;
		fx_reqs_piece_issued(t, ri);
		q->base.stats.ios++;
		if (pret < 0) {
			if (pret == -ENOMEM || pret == -EXDEV) {
				cmd_done(c, m, pret, 0);
				continue;
			}
			conn_fail(c, pret);
		}
	}
	if (!t->nfifo)
		q->starved = 0;
}

/* Command m is over once its SEND completed, its response came and its
 * key is dead. */
static void cmd_check_done(struct rconn *c, struct rcmd *m)
{
	if (m->sent && m->rsp_seen && !m->key_live)
		cmd_done(c, m, 0, m->status);
}

/* Invalidate command m's key ourselves (the target did not): a signalled
 * LOCAL_INV, whose completion completes the command.  0 or -errno. */
static int post_local_inv(struct rconn *c, struct rcmd *m)
{
	uint16_t slot = (uint16_t)(m - c->cmds);
	struct ibv_send_wr wr = {.wr_id = FX_RDMA_WR_INV | slot,
				 .opcode = IBV_WR_LOCAL_INV,
				 .send_flags = IBV_SEND_SIGNALED,
				 .invalidate_rkey = m->rkey},
			   *bad;
	int r = ibv_post_send(c->rc.qp, &wr, &bad);

	if (r)
		return -r;
	m->inv_sent = 1;
	c->q->base.stats.local_invalidations++;
	return 0;
}

static const char *wr_kind(uint64_t wr_id)
{
	switch (wr_id & FX_RDMA_WR_KIND) {
	case FX_RDMA_WR_SEND:
		return "send";
	case FX_RDMA_WR_BIND:
		return "memory window bind";
	case FX_RDMA_WR_INV:
		return "local invalidate";
	}
	return "receive";
}

/* One work completion of a live connection.  0, or the error that takes
 * the connection down (after the rest of the batch).  It never posts a
 * LOCAL_INV itself: that waits for post_owed_invs, after every connection
 * of the queue was polled, so a connection that fails (its queue pair's
 * end kills its keys) or a key some other response invalidated is never
 * invalidated again (rxe does not survive a second invalidation of a
 * window). */
static int on_wc(struct rconn *c, const struct ibv_wc *wc)
{
	if (wc->status != IBV_WC_SUCCESS) {
		if (wc->status != IBV_WC_WR_FLUSH_ERR)
			fprintf(stderr, "fx100io: nvme+rdma: qid %u: %s %s\n", c->io.qid,
				wr_kind(wc->wr_id), ibv_wc_status_str(wc->status));
		return wc->status == IBV_WC_WR_FLUSH_ERR ? -ECONNRESET : -EIO;
	}
	if (wc->wr_id & FX_RDMA_WR_KIND) {
		uint32_t slot = (uint32_t)(wc->wr_id & 0xffff);
		if (slot >= c->ncmds || !c->cmds[slot].busy)
			return -EPROTO;
		struct rcmd *m = &c->cmds[slot];
		if ((wc->wr_id & FX_RDMA_WR_KIND) == FX_RDMA_WR_INV) {
			/* binds are unsignalled: only these and SENDs come */
			if (!m->inv_sent || !m->key_live)
				return -EPROTO;
			m->key_live = 0;
		} else if ((wc->wr_id & FX_RDMA_WR_KIND) == FX_RDMA_WR_SEND && !m->sent) {
			m->sent = 1;
		} else {
			return -EPROTO;
		}
		cmd_check_done(c, m);
		return 0;
	}
	uint32_t idx = (uint32_t)wc->wr_id;
	struct nvme_cqe resp;
	if (idx >= c->rc.nrecv || wc->byte_len < sizeof(resp))
		return -EPROTO;
	memcpy(&resp, c->rc.rsps + (size_t)idx * 16, sizeof(resp));
	/* the response is ours now (copied): its buffer goes back at once */
	int r = fx_rdma_post_recv(&c->rc, idx);
	uint32_t slot = resp.cid & CID_SLOT_MASK;
	struct rcmd *m = slot < c->ncmds ? &c->cmds[slot] : NULL;
	if (!m || !m->busy || m->rsp_seen || m->gen != (uint8_t)(resp.cid >> CID_SLOT_BITS)) {
		fprintf(stderr,
			"fx100io: nvme+rdma: qid %u: response for command id 0x%x, which is not "
			"in flight\n",
			c->io.qid, resp.cid);
		return -EPROTO;
	}
	if (wc->wc_flags & c->rc.inv_flags) {
		/* The target invalidated a key with this response: it must be
		 * this command's own, still live.  Any other key is a target
		 * playing with keys it was not given for this command. */
		if (!m->key_live || m->inv_sent || wc->invalidated_rkey != m->rkey) {
			/* That key may be a live command's on another
			 * connection of this queue, whose window is dead now
			 * while we think it live: a LOCAL_INV of it would be
			 * a second invalidation, which rxe does not survive.
			 * So the whole queue goes down (queue_key_fault). */
			fprintf(stderr,
				"fx100io: nvme+rdma: qid %u: the response to command id 0x%x "
				"invalidated key 0x%x, not the command's own: every queue "
				"pair of this thread goes down\n",
				c->io.qid, resp.cid, wc->invalidated_rkey);
			c->q->key_fault = 1;
			return -EPROTO;
		}
		m->key_live = 0;
		c->q->base.stats.remote_invalidations++;
	}
	m->rsp_seen = 1;
	m->status = NVME_STATUS_FIELD(resp.status);
	if (m->key_live) {
		/* owed, posted once every connection's completions are in
		 * (post_owed_invs): one of them may say the key is dead */
		m->inv_due = 1;
		c->inv_due = 1;
	}
	cmd_check_done(c, m);
	return r; /* a failed re-post of the receive takes the connection down */
}

/* Reap connection c's completions (and CM events) until none are left and
 * its CQ is armed again. */
static void conn_poll(struct rconn *c)
{
	int r = 0;

	/* completions first: responses (and their data) that arrived before a
	 * disconnect are good */
	for (int armed = 0; !r;) {
		struct ibv_wc wc[32];
		int n = ibv_poll_cq(c->rc.cq, 32, wc);
		if (n < 0) {
			r = -EIO;
			break;
		}
		/* the whole batch: a flushed SEND may come before a good
		 * response; the first error takes the connection down after */
		for (int i = 0; i < n; i++) {
			int e = on_wc(c, &wc[i]);
			if (e && !r)
				r = e;
		}
		if (n > 0)
			continue;
		if (armed)
			break;
		/* empty: arm, then look once more for what came in between */
		fx_rdma_cq_rearm(&c->rc);
		armed = 1;
	}
	if (!r)
		r = fx_rdma_cm_event_check(&c->rc);
	if (r)
		conn_fail(c, r);
}

/* A response invalidated a key that was not its command's own (on_wc).
 * Which window that killed is not ours to know: it may be a live
 * command's on any connection of this queue.  Every connection goes down
 * now, before any LOCAL_INV is posted (the queue pairs' end kills all
 * their keys, none is invalidated again), and reconnects as after any
 * failure. */
static void queue_key_fault(struct rdma_queue *q)
{
	q->key_fault = 0;
	for (unsigned k = 0; k < q->nconns; k++)
		conn_fail(&q->conns[k], -EPROTO);
}

/* Post the LOCAL_INVs that responses without an invalidation left owed,
 * on connections still live once all were polled.  A failed post takes
 * its connection down. */
static void post_owed_invs(struct rdma_queue *q)
{
	for (unsigned k = 0; k < q->nconns; k++) {
		struct rconn *c = &q->conns[k];
		if (!c->inv_due)
			continue;
		c->inv_due = 0;
		if (c->state != R_LIVE)
			continue;
		for (uint16_t i = 0; i < c->ncmds; i++) {
			struct rcmd *m = &c->cmds[i];
			if (!m->busy || !m->inv_due)
				continue;
			m->inv_due = 0;
			int r = post_local_inv(c, m);
			if (r) {
				conn_fail(c, r);
				break;
			}
		}
	}
}

static void check_deadlines(struct rdma_queue *q)
{
	int64_t now = now_ms();

	for (unsigned k = 0; k < q->nconns; k++) {
		struct rconn *c = &q->conns[k];
		if (c->state != R_LIVE)
			continue;
		for (uint16_t i = 0; i < c->ncmds; i++)
			if (c->cmds[i].busy && c->cmds[i].deadline <= now) {
				conn_fail(c, -ETIMEDOUT);
				break;
			}
	}
}

/* The deadline timer runs while commands are in flight or requests wait
 * for a connection. */
static void set_tick(struct rdma_queue *q)
{
	int want = q->starved;

	for (unsigned k = 0; k < q->nconns && !want; k++)
		want = q->conns[k].nfree < q->conns[k].ncmds;
	if (want == q->tick_on)
		return;
	struct itimerspec its = {0};
	if (want) {
		its.it_value.tv_nsec = TICK_MS * 1000000L;
		its.it_interval.tv_nsec = TICK_MS * 1000000L;
	}
	if (timerfd_settime(q->timerfd, 0, &its, NULL) == 0)
		q->tick_on = want;
}

static void process(struct fx_queue *base)
{
	struct rdma_queue *q = (struct rdma_queue *)base;
	uint64_t v;

	int tick = read(q->timerfd, &v, sizeof(v)) == (ssize_t)sizeof(v);

	cx_collect(q);
	for (unsigned k = 0; k < q->nconns; k++) {
		if (q->conns[k].state == R_LIVE)
			conn_poll(&q->conns[k]);
		if (q->key_fault)
			queue_key_fault(q);
	}
	post_owed_invs(q);
	/* after the completions: a response already here is not late */
	if (tick)
		check_deadlines(q);
	issue(q);
	set_tick(q);
}

/* ------------------------------------------------------------ queue ops */

static int rq_submit(struct fx_queue *base, const struct fx_req *reqs, unsigned n)
{
	struct rdma_queue *q = (struct rdma_queue *)base;
	uint64_t bs = q->dev->base.info.block_size;
	unsigned k;

	for (k = 0; k < n; k++) {
		int ret = fx_req_check(base->dev, &reqs[k]);
		if (ret < 0)
			return ret;
		if (reqs[k].op != FX_OP_FLUSH && ((reqs[k].off | reqs[k].len) & (bs - 1)))
			return -EINVAL;
		if (reqs[k].op == FX_OP_WRITE && (q->dev->base.info.caps & FX_CAP_READONLY))
			return -EROFS;
	}
	k = fx_reqs_accept(&q->t, reqs, n);
	int64_t now = now_ms();
	for (uint32_t i = 0; i < q->t.naccepted; i++)
		fx_nvmf_waits_stamp(&q->waits, q->t.accepted[i], now);
	/* An idle queue of a blocking caller has not looked at its fds since
	 * its last call: a connection the target dropped meanwhile must be
	 * seen before new commands go to it (they would fail, where a
	 * reconnect can carry them).  One non-blocking epoll_wait says
	 * whether anything is pending. */
	struct epoll_event ev;
	if (epoll_wait(q->epfd, &ev, 1, 0) > 0) {
		process(base);
		return (int)k;
	}
	issue(q);
	set_tick(q);
	return (int)k;
}

static int rq_reap(struct fx_queue *base, struct fx_cqe *out, unsigned max)
{
	process(base);
	return fx_reqs_pop_done(base->reqs, out, max);
}

static int rq_wait(struct fx_queue *base, unsigned min, int timeout_ms)
{
	struct rdma_queue *q = (struct rdma_queue *)base;
	int64_t deadline = timeout_ms >= 0 ? now_ms() + timeout_ms : -1;

	if (min > q->t.pending)
		min = q->t.pending;
	for (;;) {
		struct epoll_event ev[8];
		int wait = -1;

		process(base);
		if (q->t.ndone >= min)
			return (int)q->t.ndone;
		if (deadline >= 0) {
			int64_t left = deadline - now_ms();
			if (left <= 0)
				return -ETIME;
			wait = (int)left;
		}
		if (epoll_wait(q->epfd, ev, 8, wait) < 0 && errno == EINTR)
			return -EINTR;
	}
}

static void rq_destroy(struct fx_queue *base)
{
	struct rdma_queue *q = (struct rdma_queue *)base;

	/* First the connector: it may be making a connection for us. */
	if (q->cx.q)
		fx_nvmf_cx_fini(&q->cx);
	for (unsigned k = 0; q->conns && k < q->nconns; k++) {
		struct rconn *c = &q->conns[k];
		conn_fail(c, -ECANCELED);
		free(c->cmds);
		free(c->free_cmds);
	}
	free(q->conns);
	bounce_free(q);
	if (q->timerfd >= 0)
		close(q->timerfd);
	if (q->epfd >= 0)
		close(q->epfd);
	fx_nvmf_waits_fini(&q->waits);
	fx_reqs_fini(&q->t);
	free(q);
}

static uint16_t granted_io_queues(struct fx_nvmf_dev *d)
{
	pthread_mutex_lock(&d->lock);
	uint16_t n = d->ctrl ? d->ctrl->io_queues : 0;
	pthread_mutex_unlock(&d->lock);
	return n;
}

/* Said once per device: threads after the first few run on fewer queue
 * pairs than the default, and why. */
static void queues_fewer(struct rdma_queue *q, unsigned got)
{
	struct fx_nvmf_dev *d = &q->dev->nd;

	if (__atomic_exchange_n(&d->fewer_logged, 1, __ATOMIC_ACQ_REL))
		return;
	fprintf(stderr,
		"fx100io: nvme+rdma %s:%s: the controller granted %u I/O queues, fewer than "
		"the %u threads x %u queue pairs the default asks for: threads run on "
		"%u queue pair%s (a `queues` in the URI sets it)\n",
		d->addr.host, d->addr.port, granted_io_queues(d),
		d->queues * 8 < 64 ? 8 : 64 / d->queues, d->queues, got, got == 1 ? "" : "s");
}

/* A queue that cannot be made at all for want of qids: why, since
 * -EBUSY alone does not say. */
static void queues_exhausted(struct rdma_queue *q)
{
	struct fx_nvmf_dev *d = &q->dev->nd;

	fprintf(stderr,
		"fx100io: nvme+rdma %s:%s: the controller granted %u I/O queues and all are "
		"taken: queues=%u per thread times the threads needs more\n",
		d->addr.host, d->addr.port, granted_io_queues(d), d->queues);
}

static int rq_create(struct fx_dev *dev, const struct fx_queue_opts *o, struct fx_queue **out)
{
	struct rdma_dev *d = (struct rdma_dev *)dev;
	struct rdma_queue *q = calloc(1, sizeof(*q));
	int ret;

	if (!q)
		return -ENOMEM;
	q->base.ops = dev->ops;
	q->base.dev = dev;
	q->dev = d;
	q->base.reqs = &q->t;
	q->nconns = d->nd.queues;
	q->epfd = epoll_create1(EPOLL_CLOEXEC);
	q->timerfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
	ret = fx_reqs_init(&q->t, o->slots);
	if (!ret)
		q->t.write_depth = o->write_depth;
	if (ret < 0) {
		if (q->epfd >= 0)
			close(q->epfd);
		if (q->timerfd >= 0)
			close(q->timerfd);
		free(q);
		return ret;
	}
	if (q->epfd < 0 || q->timerfd < 0) {
		ret = -errno;
		goto fail;
	}
	q->conns = calloc(q->nconns, sizeof(*q->conns));
	if (!q->conns || fx_nvmf_waits_init(&q->waits, q->t.nslots) < 0) {
		ret = -ENOMEM;
		goto fail;
	}
	ret = ep_add(q, q->timerfd);
	if (!ret)
		ret = fx_nvmf_cx_init(&q->cx, &d->nd, -1);
	if (!ret)
		ret = ep_add(q, q->cx.wake_fd);
	if (ret)
		goto fail;
	pthread_mutex_lock(&d->nd.lock);
	uint32_t sq = d->nd.ctrl ? (uint32_t)d->nd.ctrl->io_sqsize + 1 : 32;
	q->xfer = d->nd.max_xfer;
	pthread_mutex_unlock(&d->nd.lock);
	if (d->nd.qsize && d->nd.qsize < sq)
		sq = d->nd.qsize;
	/* Each connection can take the whole depth (small commands fill the
	 * first one, pick_conn), the queue no more than depth in all. */
	uint32_t per = o->depth < sq - 1 ? o->depth : sq - 1;
	if (per > CID_SLOT_MASK + 1)
		per = CID_SLOT_MASK + 1;
	if (per == 0)
		per = 1;
	q->depth = o->depth ? o->depth : 1;
	/* The default's extra queue pairs only where the controller granted
	 * all the I/O queues the device asked for (8 threads' worth,
	 * host/dev.c): on one that granted fewer, every thread runs on one
	 * pair, and as many threads are served as with queues=1. */
	uint16_t granted = granted_io_queues(&d->nd);
	uint32_t asked = d->nd.queues * 8 < 64 ? d->nd.queues * 8 : 64;
	if (d->nd.queues_default && q->nconns > 1 && granted < asked) {
		queues_fewer(q, 1);
		q->nconns = 1;
	}
	for (unsigned k = 0; k < q->nconns; k++) {
		struct rconn *c = &q->conns[k];
		c->q = q;
		c->idx = k;
		c->cmds_alloc = c->ncmds = (uint16_t)per;
		c->cmds = calloc(per, sizeof(*c->cmds));
		c->free_cmds = malloc(per * sizeof(*c->free_cmds));
		if (!c->cmds || !c->free_cmds) {
			ret = -ENOMEM;
			goto fail;
		}
		for (uint32_t i = 0; i < per; i++) {
			c->free_cmds[i] = (uint16_t)(per - 1 - i);
			c->cmds[i].bounce = -1;
		}
		c->nfree = (uint16_t)per;
		/* At creation the caller waits (without the GIL): an open that
		 * cannot connect fails here, with why. */
		struct fx_nvmf_io_conn io;
		c->rc.want_mw = (uint16_t)per;
		fx_nvmf_dev_connect_io(&d->nd, NULL, &c->rc, &io);
		ret = io.err;
		if (ret == -EBUSY && k > 0 && d->nd.queues_default) {
			/* The controller's I/O queues are all taken: the
			 * transport's default asks for more than it granted,
			 * and this thread runs on the ones it has. */
			queues_fewer(q, k);
			free(c->cmds);
			free(c->free_cmds);
			c->cmds = NULL;
			c->free_cmds = NULL;
			q->nconns = k;
			break;
		}
		if (ret == -EBUSY)
			queues_exhausted(q);
		if (!ret)
			ret = conn_adopt(c, &io);
		if (ret)
			goto fail;
		/* pools there are now: registered here, on the caller's thread,
		 * rather than by the first I/O on the event loop */
		if (k == 0)
			fx_rdma_pd_register_pools(c->rc.pd);
	}
	q->base.poll_fd = q->epfd;
	q->base.features = 0;
	*out = &q->base;
	return 0;
fail:
	rq_destroy(&q->base);
	return ret;
}

static int rdma_dev_ana(struct fx_dev *d, uint32_t *grpid, uint8_t *state)
{
	return fx_nvmf_dev_ana(&((struct rdma_dev *)d)->nd, grpid, state);
}

const struct fx_transport_ops fx_transport_rdma = {
	.name = "nvme+rdma",
	.dev_open = rdma_dev_open,
	.dev_close = rdma_dev_close,
	.queue_create = rq_create,
	.queue_destroy = rq_destroy,
	.queue_submit = rq_submit,
	.queue_reap = rq_reap,
	.queue_wait = rq_wait,
	.dev_ana = rdma_dev_ana,
};
