/*
 * One NVMe/RDMA queue: RDMA CM connect with the NVMe/RDMA private data,
 * Fabrics Connect, and synchronous commands for the control path (see
 * rdma_conn.h).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "transport/rdma_conn.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "fx100io/nvme.h"
#include "host/auth_host.h"

/* The private data of the CM connect request (NVMe/RDMA transport spec). */
struct rdma_cm_req_priv {
	uint16_t recfmt;
	uint16_t qid;
	uint16_t hrqsize;
	uint16_t hsqsize;
	uint8_t rsvd[24];
} __attribute__((packed));
_Static_assert(sizeof(struct rdma_cm_req_priv) == FX_RDMA_CM_PRIV_LEN, "CM request private data");

const char *fx_rdma_reject_reason(uint16_t sts)
{
	switch (sts) {
	case 1:
		return "invalid private data length";
	case 2:
		return "invalid record format";
	case 3:
		return "invalid queue id";
	case 4:
		return "invalid host submission queue size (hsqsize)";
	case 5:
		return "invalid host receive queue size (hrqsize)";
	case 6:
		return "no resources on the target";
	case 7:
		return "invalid IRD";
	case 8:
		return "invalid ORD";
	}
	return "unknown reason";
}

static int set_nonblocking(int fd)
{
	int fl = fcntl(fd, F_GETFL);

	if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0)
		return -errno;
	return 0;
}

int fx_rdma_nonblocking(struct fx_rdma_conn *c)
{
	int r = set_nonblocking(c->cch->fd);

	return r ? r : set_nonblocking(c->ech->fd);
}

/* Wait until one of fds is readable, the deadline passes (-ETIMEDOUT) or
 * the thread's cancel fd fires (-ECANCELED).  Returns the mask of readable
 * fds (bit i: fds[i]). */
static int wait_readable(const int *fds, int n, int64_t deadline)
{
	struct pollfd p[4];
	int cfd = fx_nvmf_cancel_fd();

	for (int i = 0; i < n; i++)
		p[i] = (struct pollfd){.fd = fds[i], .events = POLLIN};
	p[n] = (struct pollfd){.fd = cfd, .events = POLLIN};
	for (;;) {
		int64_t left = deadline - fx_nvmf_now_ms();
		if (left <= 0)
			return -ETIMEDOUT;
		int r = poll(p, (nfds_t)n + (cfd >= 0), (int)(left > 1000 ? 1000 : left));
		if (r < 0 && errno != EINTR)
			return -errno;
		if (r <= 0)
			continue;
		if (cfd >= 0 && p[n].revents)
			return -ECANCELED;
		int mask = 0;
		for (int i = 0; i < n; i++)
			if (p[i].revents)
				mask |= 1 << i;
		return mask;
	}
}

/* The next CM event, which must be want.  Copies up to 32 bytes of its
 * private data (accept or reject) into priv.  Errors describe the event. */
static int cm_wait(struct fx_rdma_conn *c, enum rdma_cm_event_type want, int64_t deadline,
		   uint8_t *priv, int *status)
{
	struct rdma_cm_event *ev;

	for (;;) {
		if (rdma_get_cm_event(c->ech, &ev) == 0)
			break;
		if (errno != EAGAIN && errno != EINTR)
			return -errno;
		int r = wait_readable(&c->ech->fd, 1, deadline);
		if (r < 0)
			return r;
	}
	enum rdma_cm_event_type got = ev->event;
	*status = ev->status;
	if (priv) {
		memset(priv, 0, FX_RDMA_CM_PRIV_LEN);
		if (ev->param.conn.private_data) {
			uint8_t len = ev->param.conn.private_data_len;
			memcpy(priv, ev->param.conn.private_data,
			       len < FX_RDMA_CM_PRIV_LEN ? len : FX_RDMA_CM_PRIV_LEN);
		}
	}
	rdma_ack_cm_event(ev);
	if (got == want)
		return 0;
	switch (got) {
	case RDMA_CM_EVENT_ADDR_ERROR:
		return -EHOSTUNREACH;
	case RDMA_CM_EVENT_ROUTE_ERROR:
		return -ENETUNREACH;
	case RDMA_CM_EVENT_REJECTED:
		return -ECONNREFUSED;
	case RDMA_CM_EVENT_UNREACHABLE:
	case RDMA_CM_EVENT_CONNECT_ERROR:
		return -ETIMEDOUT;
	case RDMA_CM_EVENT_DEVICE_REMOVAL:
		return -ENXIO;
	default:
		return -ECONNRESET;
	}
}

int fx_rdma_post_recv(struct fx_rdma_conn *c, uint32_t idx)
{
	struct ibv_sge sge = {
		.addr = (uintptr_t)(c->rsps + (size_t)idx * 16),
		.length = 16,
		.lkey = c->rsp_mr->lkey,
	};
	struct ibv_recv_wr wr = {.wr_id = idx, .sg_list = &sge, .num_sge = 1}, *bad;
	int r = ibv_post_recv(c->qp, &wr, &bad);

	return r ? -r : 0;
}

void fx_rdma_keyed_sgl(struct nvme_sqe *sqe, uint64_t addr, uint32_t len, uint32_t rkey, int inv)
{
	uint8_t *d = (uint8_t *)&sqe->dptr;

	/* address u64, length u24 at byte 8, key u32 at byte 11, type at 15 */
	memset(d, 0, 16);
	for (int i = 0; i < 8; i++)
		d[i] = (uint8_t)(addr >> (8 * i));
	for (int i = 0; i < 3; i++)
		d[8 + i] = (uint8_t)(len >> (8 * i));
	for (int i = 0; i < 4; i++)
		d[11 + i] = (uint8_t)(rkey >> (8 * i));
	d[15] = inv ? NVME_SGL_KEYED_DATA_BLOCK_INV : NVME_SGL_KEYED_DATA_BLOCK;
	sqe->flags = (uint8_t)((sqe->flags & ~0xc0) | NVME_CMD_SGL_METABUF);
}

/* Address and route resolution: the RDMA device that reaches a. */
static int resolve(struct fx_rdma_conn *c, const struct fx_nvmf_addr *a, int timeout_ms,
		   int64_t deadline)
{
	struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *ai = NULL;
	int st = 0, r;

	if (getaddrinfo(a->host, a->port, &hints, &ai) != 0 || !ai)
		return -EHOSTUNREACH;
	r = rdma_resolve_addr(c->id, NULL, ai->ai_addr, timeout_ms);
	freeaddrinfo(ai);
	if (r)
		return errno == ENODEV || errno == EADDRNOTAVAIL ? -ENXIO : -errno;
	r = cm_wait(c, RDMA_CM_EVENT_ADDR_RESOLVED, deadline, NULL, &st);
	if (r)
		return r;
	if (rdma_resolve_route(c->id, timeout_ms))
		return -errno;
	return cm_wait(c, RDMA_CM_EVENT_ROUTE_RESOLVED, deadline, NULL, &st);
}

/* The vendor id soft-RoCE (rxe) reports. */
#define RXE_VENDOR_ID 0xFFFFFFu
/* The kernel's IB_WC_WITH_INVALIDATE: rxe's provider copies the kernel's
 * completion as it is, so there this bit (IBV_WC_IP_CSUM_OK in
 * libibverbs' numbering) is the one that says a key was invalidated. */
#define KERNEL_WC_WITH_INV (1u << 2)

/* An I/O queue's memory windows, one per capsule slot (type 2: bound by a
 * work request on this QP, usable only through it, remotely
 * invalidatable).  A device without them cannot scope a key to a command:
 * that is said, and the queue is not made. */
static int make_windows(struct fx_rdma_conn *c, uint32_t n)
{
	struct ibv_device_attr da;
	struct ibv_pd *pd = fx_rdma_pd_ibv(c->pd);

	c->inv_flags = IBV_WC_WITH_INV;
	if (ibv_query_device(c->id->verbs, &da) == 0 && da.vendor_id == RXE_VENDOR_ID)
		c->inv_flags |= KERNEL_WC_WITH_INV;
	c->mw = calloc(n, sizeof(*c->mw));
	if (!c->mw)
		return -ENOMEM;
	for (uint32_t i = 0; i < n; i++) {
		errno = 0; /* a stale errno must not name this failure */
		c->mw[i] = ibv_alloc_mw(pd, IBV_MW_TYPE_2);
		if (c->mw[i]) {
			c->nmw = (uint16_t)(i + 1);
			continue;
		}
		int err = errno ? errno : ENOMEM;
		const char *name = ibv_get_device_name(c->id->verbs->device);
		if (i > 0 || err == ENOMEM) {
			/* It made windows before, or said it has no memory:
			 * the device's max_mw is spent (threads x queues x
			 * min(depth, qsize) windows in this process, and
			 * others'), not
			 * missing. */
			fx_nvmf_log("qid %u: out of memory windows on RDMA device %s after %u of "
				    "%u (%s; the device allows max_mw %d in all): fewer threads, "
				    "queues or a smaller depth or qsize need fewer",
				    c->qid, name, i, n, strerror(err),
				    ibv_query_device(c->id->verbs, &da) == 0 ? da.max_mw : -1);
			return -ENOMEM;
		}
		fx_nvmf_log("qid %u: this RDMA device (%s) gives no type 2 memory window (%s): "
			    "a key scoped to each command is not possible on it, and NVMe/RDMA "
			    "needs one",
			    c->qid, name, strerror(err));
		return -EOPNOTSUPP;
	}
	return 0;
}

/* PD, CQ with its channel, the RC QP, capsule and response buffers, and
 * every receive posted: all before the CM connect. */
static int make_qp(struct fx_rdma_conn *c)
{
	uint32_t nsq = (uint32_t)c->sqsize + 1;
	struct ibv_context *ctx = c->id->verbs;

	c->pd = fx_rdma_pd_get(ctx);
	if (!c->pd)
		return errno ? -errno : -ENOMEM;
	c->cch = ibv_create_comp_channel(ctx);
	if (!c->cch)
		return errno ? -errno : -ENOMEM;
	/* Room for every completion there can be at once.  In normal running
	 * only the signalled ones come (each slot's SEND and LOCAL_INV, and
	 * every receive), but a queue pair that fails flushes every work
	 * request still queued with an error completion, signalled or not:
	 * the unsignalled binds too (a bind stays queued behind an un-ACKed
	 * SEND, work requests retire in order).  So a slot's bind, SEND and
	 * LOCAL_INV, every receive, and slack: an overrun CQ is an error
	 * of its own (rxe drops the rest, mlx5 fails the CQ). */
	c->cq = ibv_create_cq(ctx, (int)(3 * nsq + c->nrecv + 2), NULL, c->cch, 0);
	if (!c->cq)
		return errno ? -errno : -ENOMEM;
	if (ibv_req_notify_cq(c->cq, 0))
		return -EIO;
	struct ibv_qp_init_attr qa = {
		.send_cq = c->cq,
		.recv_cq = c->cq,
		.qp_type = IBV_QPT_RC,
		/* a command posts a bind, its SEND and maybe a LOCAL_INV */
		.cap = {.max_send_wr = 3 * nsq + 1,
			.max_recv_wr = (uint32_t)c->nrecv + 1,
			.max_send_sge = 2,
			.max_recv_sge = 1},
	};
	if (rdma_create_qp(c->id, fx_rdma_pd_ibv(c->pd), &qa))
		return errno ? -errno : -ENOMEM;
	c->qp = c->id->qp;
	c->sqes = aligned_alloc(64, (size_t)nsq * 64);
	c->rsps = aligned_alloc(64, ((size_t)c->nrecv * 16 + 63) & ~(size_t)63);
	if (!c->sqes || !c->rsps)
		return -ENOMEM;
	memset(c->sqes, 0, (size_t)nsq * 64);
	memset(c->rsps, 0, (size_t)c->nrecv * 16);
	/* capsules are only sent, responses only received: no remote access */
	c->sqe_mr = fx_rdma_reg(c->pd, c->sqes, (size_t)nsq * 64, 0);
	c->rsp_mr = fx_rdma_reg(c->pd, c->rsps, (size_t)c->nrecv * 16, IBV_ACCESS_LOCAL_WRITE);
	if (!c->sqe_mr || !c->rsp_mr)
		return errno ? -errno : -ENOMEM;
	for (uint32_t i = 0; i < c->nrecv; i++) {
		int r = fx_rdma_post_recv(c, i);
		if (r)
			return r;
	}
	/* a window per command slot the caller will use, never more than
	 * the capsule slots: an idle slot's window only costs the device's
	 * max_mw */
	return c->qid ? make_windows(c, c->want_mw && c->want_mw < nsq ? c->want_mw : nsq) : 0;
}

static int cm_connect(struct fx_rdma_conn *c, int64_t deadline)
{
	struct rdma_cm_req_priv priv = {
		.recfmt = 0,
		.qid = c->qid,
		.hrqsize = c->nrecv,
		.hsqsize = c->sqsize,
	};
	struct ibv_device_attr da;
	struct rdma_conn_param cp = {
		.private_data = &priv,
		.private_data_len = sizeof(priv),
		.retry_count = 7,
		.rnr_retry_count = 7,
		.flow_control = 1,
	};
	uint8_t back[FX_RDMA_CM_PRIV_LEN];
	int st = 0;

	/* The target RDMA-READs write data from us: as many reads in flight
	 * as the device takes. */
	if (ibv_query_device(c->id->verbs, &da) == 0)
		cp.responder_resources = (uint8_t)(da.max_qp_rd_atom > 255 ? 255
									   : da.max_qp_rd_atom);
	if (rdma_connect(c->id, &cp))
		return -errno;
	int r = cm_wait(c, RDMA_CM_EVENT_ESTABLISHED, deadline, back, &st);
	if (r == -ECONNREFUSED) {
		uint16_t sts = fx_nvmf_le16(back + 2);
		if (st == 28 && fx_nvmf_le16(back) == 0 && sts) /* consumer reject */
			fx_nvmf_log(
				"qid %u: the target rejected the RDMA connection: %s (status %u; "
				"hrqsize %u, hsqsize %u)",
				c->qid, fx_rdma_reject_reason(sts), sts, c->nrecv, c->sqsize);
		else
			fx_nvmf_log("qid %u: RDMA connection rejected (CM reason %d): no NVMe/RDMA "
				    "port there?",
				    c->qid, st);
		return r;
	}
	if (r)
		return r;
	c->connected = 1;
	c->crqsize = fx_nvmf_le16(back + 2);
	return 0;
}

int fx_rdma_connect(const struct fx_nvmf_addr *a, const struct fx_nvmf_params *p, uint16_t qid,
		    uint16_t sqsize, uint16_t cntlid, struct fx_rdma_conn *c, uint16_t *status)
{
	int timeout = p->timeout_ms > 0 ? p->timeout_ms : FX_NVMF_DEFAULT_TIMEOUT_MS;
	int64_t deadline = fx_nvmf_deadline_in(timeout);
	uint16_t want_mw = c->want_mw; /* the caller's, kept */
	int r;

	memset(c, 0, sizeof(*c));
	c->want_mw = want_mw;
	if (status)
		*status = 0;
	if (!fx_nvmf_nqn_ok(p->subnqn) || !fx_nvmf_nqn_ok(p->hostnqn))
		return -EINVAL;
	c->qid = qid;
	c->sqsize = sqsize;
	c->nrecv = (uint16_t)(sqsize + 1);
	c->timeout_ms = timeout;
	c->ech = rdma_create_event_channel();
	if (!c->ech)
		/* no /dev/infiniband/rdma_cm: this host has no RDMA stack */
		return errno == ENOENT || errno == ENODEV || errno == ENXIO ? -ENXIO : -errno;
	r = set_nonblocking(c->ech->fd);
	if (!r && rdma_create_id(c->ech, &c->id, c, RDMA_PS_TCP))
		r = -errno;
	if (!r)
		r = resolve(c, a, timeout, deadline);
	if (!r)
		r = make_qp(c);
	if (!r)
		r = set_nonblocking(c->cch->fd);
	if (!r)
		r = cm_connect(c, deadline);
	if (!r) {
		struct nvme_sqe sqe;
		struct nvme_cqe cqe;
		struct nvmf_connect_data cd;

		fx_nvmf_connect_cmd(p, qid, sqsize, cntlid, &sqe, &cd);
		r = fx_rdma_transport.exec(c, &sqe, &cd, sizeof(cd), 1, &cqe, 0);
		if (r == -EIO) {
			uint16_t sf = fx_nvmf_status_field(&cqe);
			if (status)
				*status = sf;
			r = fx_nvmf_connect_errno(sf);
		} else if (!r) {
			c->cntlid = (uint16_t)(cqe.dw0 & 0xffff);
			/* In-band authentication, when the Connect response asks for it. */
			r = fx_nvmf_auth_host(&fx_rdma_transport, c, p, qid, cqe.dw0, deadline);
		}
	}
	if (r)
		fx_rdma_close(c);
	return r;
}

static void conn_shutdown(void *q)
{
	struct fx_rdma_conn *c = q;

	if (__atomic_exchange_n(&c->shut, 1, __ATOMIC_ACQ_REL))
		return;
	/* The QP goes to the error state: outstanding work flushes, and the
	 * target can no longer touch our memory. */
	if (c->id && c->connected)
		rdma_disconnect(c->id);
}

void fx_rdma_close(struct fx_rdma_conn *c)
{
	if (c->id && c->connected && !c->shut)
		rdma_disconnect(c->id);
	/* The QP is in the error state (IB/RoCE; iWARP's closing states
	 * refuse remote access too): no new access by any key starts.  The
	 * windows go before the QP: a window still bound (a command in flight
	 * when the queue failed) holds a reference on the QP, and soft-RoCE,
	 * destroying the QP first, waited 50 s for it on the thread that
	 * reaps this queue, then freed the QP under the window anyway.  The
	 * commands fail only after the QP is destroyed (conn_fail), so an
	 * access already under way when the window went is over by then. */
	for (uint16_t i = 0; i < c->nmw; i++) {
		int r = ibv_dealloc_mw(c->mw[i]);

		if (r) /* its key dies with the QP below (a type 2 window is bound to it) */
			fx_nvmf_log("qid %u: memory window %u not deallocated: %s", c->qid, i,
				    strerror(r));
	}
	free(c->mw);
	if (c->id && c->qp)
		rdma_destroy_qp(c->id);
	if (c->cq)
		ibv_destroy_cq(c->cq);
	if (c->cch)
		ibv_destroy_comp_channel(c->cch);
	if (c->sqe_mr)
		ibv_dereg_mr(c->sqe_mr);
	if (c->rsp_mr)
		ibv_dereg_mr(c->rsp_mr);
	free(c->sqes);
	free(c->rsps);
	if (c->id)
		rdma_destroy_id(c->id);
	if (c->ech)
		rdma_destroy_event_channel(c->ech);
	fx_rdma_pd_put(c->pd);
	/* want_mw is the caller's setting, not the connection's state: a
	 * connect retried on the same struct (dev.c) binds as many windows
	 * as the first try would have */
	uint16_t want_mw = c->want_mw;

	memset(c, 0, sizeof(*c));
	c->want_mw = want_mw;
}

/* Take the completion channel's event (if any) and re-arm the CQ. */
void fx_rdma_cq_rearm(struct fx_rdma_conn *c)
{
	struct ibv_cq *cq;
	void *ctx;

	while (ibv_get_cq_event(c->cch, &cq, &ctx) == 0)
		ibv_ack_cq_events(cq, 1);
	ibv_req_notify_cq(c->cq, 0);
}

/* One work completion of a synchronous command (see conn_exec). */
static int sync_wc(struct fx_rdma_conn *c, const struct ibv_wc *wc, uint16_t cid, int *sent,
		   int *got, struct nvme_cqe *cqe)
{
	struct nvme_cqe resp;
	uint32_t idx = (uint32_t)wc->wr_id;

	if (wc->status != IBV_WC_SUCCESS)
		return -ECONNRESET;
	if (wc->wr_id & FX_RDMA_WR_SEND) {
		*sent = 1;
		return 0;
	}
	if (idx >= c->nrecv || wc->byte_len < sizeof(resp))
		return -EPROTO;
	memcpy(&resp, c->rsps + (size_t)idx * 16, sizeof(resp));
	int r = fx_rdma_post_recv(c, idx);
	if (r)
		return r;
	if (resp.cid != cid)
		return -EPROTO; /* one command at a time: nothing else is due */
	*cqe = resp;
	*got = 1;
	return 0;
}

int fx_rdma_cm_event_check(struct fx_rdma_conn *c)
{
	struct rdma_cm_event *ev;
	int r = 0;

	while (rdma_get_cm_event(c->ech, &ev) == 0) {
		enum rdma_cm_event_type t = ev->event;
		rdma_ack_cm_event(ev);
		if (t == RDMA_CM_EVENT_DISCONNECTED || t == RDMA_CM_EVENT_DEVICE_REMOVAL ||
		    t == RDMA_CM_EVENT_TIMEWAIT_EXIT) {
			if (!r)
				fx_nvmf_log("qid %u: %s", c->qid, rdma_event_str(t));
			r = -ECONNRESET;
		}
	}
	return r;
}

/*
 * One command, synchronously: the SQE by SEND from capsule slot 0, its data
 * (if any) registered for the call and described by a keyed SGL, done when
 * both the SEND completion and the response with its cid have arrived.  A
 * timeout, flush or stray response shuts the queue down: later commands on
 * it fail at once.
 */
static int conn_exec(void *q, struct nvme_sqe *sqe, void *data, uint32_t len, int write,
		     struct nvme_cqe *cqe, int timeout_ms)
{
	struct fx_rdma_conn *c = q;
	struct ibv_mr *mr = NULL;
	int to = timeout_ms > 0 && timeout_ms < c->timeout_ms ? timeout_ms : c->timeout_ms;
	int64_t deadline = fx_nvmf_deadline_in(to);
	int sent = 0, got = 0, r = 0;

	if (__atomic_load_n(&c->shut, __ATOMIC_ACQUIRE) || !c->qp)
		return -ECONNRESET;
	if (len > FX_RDMA_SGL_MAX)
		return -EINVAL; /* one keyed SGL carries 24 bits of length */
	if (len) {
		/* the target only reads what we send, only writes what we read */
		mr = fx_rdma_reg(c->pd, data, len,
				 write ? IBV_ACCESS_REMOTE_READ
				       : IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
		if (!mr)
			return errno ? -errno : -ENOMEM;
	}
	uint16_t cid = c->next_cid++;
	sqe->cid = cid;
	fx_rdma_keyed_sgl(sqe, len ? (uintptr_t)data : 0, len, mr ? mr->rkey : 0, 0);
	memcpy(c->sqes, sqe, sizeof(*sqe));
	struct ibv_sge sge = {.addr = (uintptr_t)c->sqes, .length = 64, .lkey = c->sqe_mr->lkey};
	struct ibv_send_wr wr =
				   {
					   .wr_id = FX_RDMA_WR_SEND,
					   .sg_list = &sge,
					   .num_sge = 1,
					   .opcode = IBV_WR_SEND,
					   .send_flags = IBV_SEND_SIGNALED,
				   },
			   *bad;
	r = ibv_post_send(c->qp, &wr, &bad);
	if (r) {
		r = -r;
		goto out;
	}
	while (!r && !(sent && got)) {
		struct ibv_wc wc[4];
		int n = ibv_poll_cq(c->cq, 4, wc);
		if (n < 0) {
			r = -EIO;
			break;
		}
		for (int i = 0; i < n && !r; i++)
			r = sync_wc(c, &wc[i], cid, &sent, &got, cqe);
		if (n > 0)
			continue;
		/* Nothing there: arm, look once more, then sleep. */
		fx_rdma_cq_rearm(c);
		n = ibv_poll_cq(c->cq, 1, wc);
		if (n > 0) {
			r = sync_wc(c, &wc[0], cid, &sent, &got, cqe);
			continue;
		}
		int fds[2] = {c->cch->fd, c->ech->fd};
		int m = wait_readable(fds, 2, deadline);
		if (m < 0) {
			r = m;
			break;
		}
		if (m & 2) {
			/* A response that landed just before a disconnect is
			 * taken first: the disconnect may be its consequence. */
			n = ibv_poll_cq(c->cq, 4, wc);
			for (int i = 0; i < n && !r; i++)
				r = sync_wc(c, &wc[i], cid, &sent, &got, cqe);
			if (n > 0)
				continue;
			r = fx_rdma_cm_event_check(c);
		}
	}
	if (r == 0 && NVME_STATUS_FIELD(cqe->status) != 0)
		r = -EIO;
out:
	if (r && r != -EIO)
		conn_shutdown(c);
	if (mr)
		ibv_dereg_mr(mr);
	return r;
}

static int conn_connect(const struct fx_nvmf_addr *a, const struct fx_nvmf_params *p, uint16_t qid,
			uint16_t sqsize, uint16_t cntlid, void *q, uint16_t *cntlid_out,
			uint16_t *status)
{
	struct fx_rdma_conn *c = q;
	int r = fx_rdma_connect(a, p, qid, sqsize, cntlid, c, status);

	if (!r)
		*cntlid_out = c->cntlid;
	return r;
}

static void conn_close(void *q)
{
	fx_rdma_close(q);
}

const struct fx_nvmf_transport fx_rdma_transport = {
	.name = "rdma",
	.queue_size = sizeof(struct fx_rdma_conn),
	.max_xfer = FX_RDMA_SGL_MAX,
	.connect = conn_connect,
	.exec = conn_exec,
	.shutdown = conn_shutdown,
	.close = conn_close,
	/* Two queue pairs per thread, as the kernel's nvme-rdma has one per
	 * CPU: soft-RoCE (rxe) runs each queue pair's send work and receive
	 * work as one task each, never on two CPUs at once, so one queue pair
	 * caps a thread's reads at what one CPU can move for it (measured in
	 * docs/nvme-rdma.md, "Speed"). */
	.default_queues = 2,
};
