/*
 * The NVMe-oF control path over TCP, shared by the io_uring initiator
 * (transport/tcp.c) and tests: connection set-up (TCP, ICReq/ICResp,
 * Fabrics Connect), synchronous commands on blocking sockets (Property
 * Get/Set, Identify, Set Features, Get Log Page, Keep Alive), the controller
 * object with its admin queue and keep-alive thread, and discovery.
 *
 * The data path does not go through here: an I/O queue is connected with
 * fx_nvmf_tcp_connect() and its socket is then driven by io_uring.
 * Every function returns 0 or -errno; NVMe error statuses become -EIO (or a
 * more specific errno where one fits) with the raw status field reported
 * through the status out-parameter where there is one.
 */
#ifndef FX100IO_FABRIC_H
#define FX100IO_FABRIC_H

#include <pthread.h>
#include <stdint.h>

#include "fx100io/nvme.h"

struct fx_nvmf_addr {
	char host[256]; /* IPv4/IPv6 literal or name (tests use literals) */
	char port[16];  /* service, e.g. "4420" */
};

struct fx_nvmf_params {
	char hostnqn[NVMF_NQN_SIZE];
	uint8_t hostid[16];
	char subnqn[NVMF_NQN_SIZE];
	int hdgst;        /* ask for header digests */
	int ddgst;        /* ask for data digests */
	uint32_t kato_ms; /* keep alive timeout sent in Connect (admin) */
	int timeout_ms;   /* per command / connect step */
};

/* One connected queue (admin or I/O): a TCP socket past ICResp and Connect. */
struct fx_nvmf_conn {
	int fd;
	int hdgst, ddgst;     /* negotiated */
	uint8_t cpda;         /* controller's PDU data alignment (4-byte units, 0's based) */
	uint32_t maxh2cdata;  /* from ICResp */
	uint16_t qid;
	uint16_t cntlid;
	uint16_t sqsize;      /* 0's based, as sent in Connect */
	uint16_t next_cid;
	int timeout_ms;
	/* Most write data fx_nvmf_exec() sends in the capsule; larger writes
	 * wait for R2T.  fx_nvmf_tcp_connect() sets 8192 on the admin queue
	 * (NVMe/TCP) and 0 on I/O queues, where the caller should set
	 * IOCCSZ*16 - 64 from Identify (ctrl->ioccsz_bytes - 64): Linux's
	 * target (6.1) expects every write up to its inline size in the
	 * capsule and never sends an R2T for one.  The data goes at offset 0
	 * of the capsule's data area: leave 0 on an I/O queue of a controller
	 * whose ICDOFF is not 0. */
	uint32_t incap_max;
};

/*
 * TCP connect, ICReq/ICResp, Fabrics Connect (qid 0: admin with cntlid
 * 0xFFFF; qid > 0: I/O queue of controller cntlid).  On success *out holds
 * the blocking socket and the negotiated parameters.
 * -ECONNREFUSED/-EHOSTUNREACH/-ETIMEDOUT (TCP), -EPROTO (malformed or
 * unexpected ICResp/response PDU), -EACCES (Connect: host not allowed),
 * -ENOENT (Connect: no such subsystem / invalid parameters), -EIO (other
 * NVMe status; *status holds the status field), -ENOMEM.
 */
int fx_nvmf_tcp_connect(const struct fx_nvmf_addr *a, const struct fx_nvmf_params *p,
                        uint16_t qid, uint16_t sqsize, uint16_t cntlid,
                        struct fx_nvmf_conn *out, uint16_t *status);
void fx_nvmf_conn_close(struct fx_nvmf_conn *c);

/*
 * Give the calling thread a cancel eventfd (-1: none): once it is readable,
 * every network wait and CSTS.RDY poll that thread makes fails at once with
 * -ECANCELED (a connection it was using is shut down, as after any stream
 * error).  Other threads are unaffected.  A background connector sets it so
 * that closing its queue cuts a connect or controller open short instead of
 * waiting for connect_timeout_ms or CAP.TO.
 */
void fx_nvmf_set_cancel_fd(int fd);

/*
 * Run one command synchronously on a connected queue: fills sqe->cid and
 * dptr, sends it (with in-capsule data for writes up to the capsule size,
 * otherwise R2T/H2CData), receives C2HData into data (reads) and the
 * CapsuleResp.  *cqe gets the completion.  -ETIMEDOUT, -ECONNRESET, -EPROTO
 * (bad PDU, or an R2T, C2HData or success the rules in tcp_pdu.h do not
 * allow: the connection is unusable afterwards), -EIO (NVMe status not
 * success; see cqe->status).
 */
int fx_nvmf_exec(struct fx_nvmf_conn *c, struct nvme_sqe *sqe, void *data, uint32_t len,
                 int write, struct nvme_cqe *cqe);

int fx_nvmf_prop_get(struct fx_nvmf_conn *c, uint32_t off, int size8, uint64_t *val);
int fx_nvmf_prop_set(struct fx_nvmf_conn *c, uint32_t off, int size8, uint64_t val);

/* An open controller: admin queue, identify data, keep-alive thread. */
struct fx_nvmf_ctrl {
	struct fx_nvmf_addr addr;
	struct fx_nvmf_params params;
	struct fx_nvmf_conn admin;
	pthread_mutex_t lock; /* serialises admin commands (keep alive vs others) */
	pthread_t ka_thread;
	int ka_running;
	int ka_stop;
	int ka_failed;        /* keep alive failed: the controller is gone */
	uint64_t cap;
	uint32_t vs;
	uint8_t idctrl[4096];
	uint32_t mdts_bytes;   /* max data transfer size, 0 = unlimited */
	uint32_t ioccsz_bytes; /* I/O command capsule size incl. the 64-byte SQE
	                        * (IOCCSZ * 16, clamped to UINT32_MAX) */
	uint16_t icdoff;       /* in-capsule data offset, 16-byte units */
	uint32_t nn;
	uint16_t io_queues;    /* granted by Set Features Number of Queues */
	uint16_t io_sqsize;    /* 0's based queue size for I/O queues */
	uint16_t cntlid;
};

/*
 * Connect the admin queue, read CAP/VS, enable the controller (CC.EN=1, wait
 * CSTS.RDY up to CAP.TO), Identify Controller, Set Features Number of
 * Queues (want_io_queues), start keep alive (every kato/3) when kato_ms > 0.
 * Errors as fx_nvmf_tcp_connect, plus -ETIMEDOUT (CSTS.RDY never set).
 */
int fx_nvmf_ctrl_open(const struct fx_nvmf_addr *a, const struct fx_nvmf_params *p,
                      uint16_t want_io_queues, struct fx_nvmf_ctrl **out, uint16_t *status);
/* Identify Namespace: size in blocks and block size (nsze * lba_size fits in
 * 64 bits).  -ENODEV (nsid not active), -EPROTO (unusable LBA format or a size
 * that overflows 64 bits). */
int fx_nvmf_ctrl_ns_info(struct fx_nvmf_ctrl *c, uint32_t nsid, uint64_t *nsze,
                         uint32_t *lba_size);
/* Stop keep alive, shut the controller down (CC.SHN), close the admin queue. */
void fx_nvmf_ctrl_close(struct fx_nvmf_ctrl *c);

/*
 * Discovery: connect to the discovery controller at a (params' subnqn is
 * ignored), read the whole discovery log (Get Log Page 0x70, re-read if
 * GENCTR changes), disconnect.  *entries is malloc'ed (caller frees).
 */
int fx_nvmf_discover(const struct fx_nvmf_addr *a, const struct fx_nvmf_params *p,
                     struct nvmf_disc_log_entry **entries, uint32_t *n, uint16_t *status);

/*
 * The discovery log reader fx_nvmf_discover() uses, on any source of log
 * bytes: get_log(ctx, off, buf, len, status) reads len bytes of the log at
 * offset off into buf (0 or -errno).  Reads the header, then NUMREC
 * entries, then the header again, and starts over while GENCTR or NUMREC
 * moved.  On success *entries (malloc'ed, NULL when *n is 0) holds *n
 * entries exactly as the controller sent them: the string fields are
 * fixed-width and need not end in a NUL.  -EPROTO: header unusable (record
 * format not 0, or more records than we accept; *why says which), -EAGAIN:
 * the log never settled, -ENOMEM, or what get_log returned.
 */
typedef int (*fx_nvmf_get_log_fn)(void *ctx, uint64_t off, void *buf, uint32_t len,
                                  uint16_t *status);
int fx_nvmf_disc_log_read(fx_nvmf_get_log_fn get_log, void *ctx,
                          struct nvmf_disc_log_entry **entries, uint32_t *n, uint16_t *status,
                          const char **why);

#endif
