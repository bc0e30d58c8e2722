/*
 * The NVMe/TCP side of the control path (transport/tcp_ctrl.c): TCP
 * connect, ICReq/ICResp and Fabrics Connect on a blocking socket, and
 * synchronous commands on it (in-capsule data, R2T/H2CData, C2HData).  It
 * implements the transport table of host/nvmf.h (fx_tcp_transport),
 * through which the generic controller code (host/ctrl.c) drives it.
 *
 * The data path does not go through here: an I/O queue is connected with
 * fx_tcp_connect() and its socket is then driven by io_uring
 * (transport/tcp.c).
 */
#ifndef FX100IO_TRANSPORT_TCP_CTRL_H
#define FX100IO_TRANSPORT_TCP_CTRL_H

#include <stdint.h>

#include "fx100io/nvme.h"
#include "host/ctrl.h"
#include "host/nvmf.h"

struct fx_tls;
struct fx_ktls;

/* One connected queue (admin or I/O): a TCP socket past ICResp and Connect. */
struct fx_tcp_conn {
	int fd;
	int hdgst, ddgst;    /* negotiated */
	uint8_t cpda;        /* controller's PDU data alignment (4-byte units, 0's based) */
	uint32_t maxh2cdata; /* from ICResp */
	uint16_t qid;
	uint16_t cntlid;
	uint16_t sqsize; /* 0's based, as sent in Connect */
	uint16_t next_cid;
	int timeout_ms;
	/* Most write data fx_tcp_exec() sends in the capsule; larger writes
	 * wait for R2T.  fx_tcp_connect() sets 8192 on the admin queue
	 * (NVMe/TCP) and the params' io_incap_max on I/O queues, which the
	 * caller sets to IOCCSZ*16 - 64 from Identify (ctrl->ioccsz_bytes -
	 * 64; the AUTH_Send after Connect needs it already): Linux's
	 * target (6.1) expects every write up to its inline size in the
	 * capsule and never sends an R2T for one.  The data goes at offset 0
	 * of the capsule's data area: leave 0 on an I/O queue of a controller
	 * whose ICDOFF is not 0. */
	uint32_t incap_max;
	/* The secure channel's record state (NULL: clear text), freed by
	 * fx_tcp_conn_close.  The blocking calls here seal and open records
	 * with it, and so does the data path (transport/tcp.c) once an I/O
	 * queue is handed over, continuing its sequence numbers. */
	struct fx_tls *tls;
	/* The same channel on the kernel's record layer (kTLS, tls is then
	 * NULL): the socket carries clear PDUs, and only records that are not
	 * data come to us (nvme_tcp/ktls.h).  Freed by fx_tcp_conn_close. */
	struct fx_ktls *ktls;
};

/* The NVMe/TCP transport table; its queues are struct fx_tcp_conn. */
extern const struct fx_nvmf_transport fx_tcp_transport;

/*
 * TCP connect, ICReq/ICResp, Fabrics Connect (qid 0: admin with cntlid
 * 0xFFFF; qid > 0: I/O queue of controller cntlid).  On success *out holds
 * the blocking socket and the negotiated parameters.
 * -ECONNREFUSED/-EHOSTUNREACH/-ETIMEDOUT (TCP), -EPROTO (malformed or
 * unexpected ICResp/response PDU), -EACCES (Connect: host not allowed),
 * -ENOENT (Connect: no such subsystem / invalid parameters), -EIO (other
 * NVMe status; *status holds the status field), -ENOMEM.
 */
int fx_tcp_connect(const struct fx_nvmf_addr *a, const struct fx_nvmf_params *p, uint16_t qid,
		   uint16_t sqsize, uint16_t cntlid, struct fx_tcp_conn *out, uint16_t *status);
void fx_tcp_conn_close(struct fx_tcp_conn *c);

/*
 * Run one command synchronously on a connected queue: fills sqe->cid and
 * dptr, sends it (with in-capsule data for writes up to the capsule size,
 * otherwise R2T/H2CData), receives C2HData into data (reads) and the
 * CapsuleResp.  *cqe gets the completion.  -ETIMEDOUT, -ECONNRESET, -EPROTO
 * (bad PDU, or an R2T, C2HData or success the rules in nvme_tcp/xfer.h do not
 * allow: the connection is unusable afterwards), -EIO (NVMe status not
 * success; see cqe->status).  A read that nvme_tcp/xfer.h lets end early (an
 * Authentication Receive) and did: the bytes received (> 0), or -ENODATA
 * when none came; the rest of data is zeroed.
 */
int fx_tcp_exec(struct fx_tcp_conn *c, struct nvme_sqe *sqe, void *data, uint32_t len, int write,
		struct nvme_cqe *cqe);

int fx_tcp_prop_get(struct fx_tcp_conn *c, uint32_t off, int size8, uint64_t *val);
int fx_tcp_prop_set(struct fx_tcp_conn *c, uint32_t off, int size8, uint64_t val);

/* fx_nvmf_ctrl_open over NVMe/TCP.  Errors as fx_tcp_connect, plus
 * -ETIMEDOUT (CSTS.RDY never set). */
int fx_tcp_ctrl_open(const struct fx_nvmf_addr *a, const struct fx_nvmf_params *p,
		     uint16_t want_io_queues, struct fx_nvmf_ctrl **out, uint16_t *status);

/* fx_nvmf_discover over NVMe/TCP. */
int fx_tcp_discover(const struct fx_nvmf_addr *a, const struct fx_nvmf_params *p,
		    struct nvmf_disc_log_entry **entries, uint32_t *n, uint16_t *status);

#endif
