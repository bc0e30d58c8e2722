/*
 * One NVMe/RDMA queue (transport/rdma_conn.c): an RDMA CM connection with
 * one RC queue pair, its completion queue and channel, the capsule and
 * response buffers, brought up to a completed Fabrics Connect.  The admin
 * queue runs commands on it synchronously (the nvmf transport table
 * fx_rdma_transport); the data path (transport/rdma.c) drives its
 * I/O queues itself with the same buffers.
 *
 * Work request ids: a SEND carries FX_RDMA_WR_SEND | slot, a memory window
 * bind FX_RDMA_WR_BIND | slot, a local invalidate FX_RDMA_WR_INV | slot, a
 * RECV the index of its response buffer.
 *
 * An I/O queue (qid > 0) has one type 2 memory window per capsule slot:
 * the command in that slot binds it over its own buffer, with only the
 * remote access it needs, and it is invalidated (by the target's
 * SEND_WITH_INVALIDATE or our LOCAL_INV) before the command completes.
 * The windows live and die with the queue pair.
 */
#ifndef FX100IO_TRANSPORT_RDMA_CONN_H
#define FX100IO_TRANSPORT_RDMA_CONN_H

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>
#include <stdint.h>

#include "host/nvmf.h"
#include "transport/rdma_mem.h"

#define FX_RDMA_WR_SEND (1ull << 32)
#define FX_RDMA_WR_BIND (2ull << 32)
#define FX_RDMA_WR_INV (4ull << 32)
#define FX_RDMA_WR_KIND (7ull << 32)
/* Most bytes one keyed SGL data block descriptor describes (24-bit length). */
#define FX_RDMA_SGL_MAX 0xFFFFFFu
/* The NVMe/RDMA CM private data (NVMe/RDMA transport spec). */
#define FX_RDMA_CM_PRIV_LEN 32

struct fx_rdma_conn {
	struct rdma_event_channel *ech; /* CM events (disconnects) */
	struct rdma_cm_id *id;
	struct fx_rdma_pd *pd;
	struct ibv_comp_channel *cch;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	uint16_t qid;
	uint16_t cntlid;
	uint16_t sqsize;  /* 0's based (Connect SQSIZE, CM hsqsize) */
	uint16_t nrecv;   /* receives posted: hrqsize */
	uint16_t crqsize; /* the controller's receive queue size (accept) */
	uint16_t next_cid;
	int timeout_ms;
	int shut;      /* shut down: every later command fails */
	int connected; /* the CM connection was established */
	uint8_t *sqes; /* (sqsize + 1) capsules of 64 bytes */
	struct ibv_mr *sqe_mr;
	uint8_t *rsps; /* nrecv responses of 16 bytes */
	struct ibv_mr *rsp_mr;
	struct ibv_mw **mw; /* I/O queues: one window per capsule slot (its
	                     * rkey: the one it was last bound with) */
	uint16_t nmw;
	/* windows wanted: the caller's command slots on this queue (set
	 * before connecting; 0: one per capsule slot) */
	uint16_t want_mw;
	/* wc_flags bits that say a receive invalidated a key: IBV_WC_WITH_INV,
	 * and on soft-RoCE the kernel's own bit, which its provider passes
	 * through unchanged */
	uint32_t inv_flags;
};

extern const struct fx_nvmf_transport fx_rdma_transport;

/*
 * CM connect (address, route, QP, the private data), then Fabrics Connect
 * (qid 0: admin, cntlid 0xFFFF).  Blocking, each step within
 * p->timeout_ms, cut short by the thread's cancel fd.  -EHOSTUNREACH /
 * -ENETUNREACH (no route), -ENXIO (no RDMA stack, or no RDMA device on the
 * way to the address), -ECONNREFUSED (rejected: the reason is logged),
 * -ETIMEDOUT, -ECANCELED, -EACCES/-ENOENT/-EIO (Connect status), -ENOMEM.
 */
int fx_rdma_connect(const struct fx_nvmf_addr *a, const struct fx_nvmf_params *p, uint16_t qid,
		    uint16_t sqsize, uint16_t cntlid, struct fx_rdma_conn *out, uint16_t *status);
void fx_rdma_close(struct fx_rdma_conn *c);

/* Post the receive buffer idx again. 0 or -errno. */
int fx_rdma_post_recv(struct fx_rdma_conn *c, uint32_t idx);

/* Fill sqe's data pointer with a keyed SGL data block descriptor; inv:
 * the "invalidate key" subtype, asking the target to invalidate rkey with
 * its response (SEND_WITH_INVALIDATE). */
void fx_rdma_keyed_sgl(struct nvme_sqe *sqe, uint64_t addr, uint32_t len, uint32_t rkey, int inv);

/* Words for a CM reject reason, from the status field of NVMe/RDMA's reject
 * private data. */
const char *fx_rdma_reject_reason(uint16_t sts);

/* Read the CM events that arrived: -ECONNRESET when one says the connection
 * is gone (disconnect, device removal), else 0. */
int fx_rdma_cm_event_check(struct fx_rdma_conn *c);

/* Take the completion channel's pending events and re-arm the CQ; poll the
 * CQ again afterwards (a completion may have come in between). */
void fx_rdma_cq_rearm(struct fx_rdma_conn *c);

/* Move the completion channel's and CM channel's fds to non-blocking mode
 * (the data path polls them from epoll). 0 or -errno. */
int fx_rdma_nonblocking(struct fx_rdma_conn *c);

#endif
