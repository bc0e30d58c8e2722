/*
 * The NVMe-oF controller, the same on every fabric (host/ctrl.c,
 * host/discovery.c): admin queue set-up through a transport table
 * (host/nvmf.h), CAP/VS, enable, Identify, Number of Queues, keep alive,
 * shutdown, Identify Namespace and the discovery log.
 */
#ifndef FX100IO_HOST_CTRL_H
#define FX100IO_HOST_CTRL_H

#include <pthread.h>
#include <stdint.h>

#include "host/nvmf.h"

/* An open controller: admin queue, identify data, keep-alive thread. */
struct fx_nvmf_ctrl {
	struct fx_nvmf_addr addr;
	struct fx_nvmf_params params;
	/* The transport and its admin queue: generic code reaches the queue
	 * only as aq, through tr.  aq is tr->queue_size bytes of the
	 * controller's (ctrl.c allocates them), so this layer never needs to
	 * know a transport's queue type. */
	const struct fx_nvmf_transport *tr;
	void *aq;
	pthread_mutex_t lock; /* serialises admin commands (keep alive vs others) */
	pthread_t ka_thread;
	int ka_running;
	int ka_stop;
	int ka_failed; /* keep alive failed: the controller is gone */
	uint64_t cap;
	uint32_t vs;
	uint8_t idctrl[4096];
	uint32_t mdts_bytes;   /* max data transfer size, 0 = unlimited */
	uint32_t ioccsz_bytes; /* I/O command capsule size incl. the 64-byte SQE
	                        * (IOCCSZ * 16, clamped to UINT32_MAX) */
	uint16_t icdoff;       /* in-capsule data offset, 16-byte units */
	uint32_t nn;
	uint16_t io_queues; /* granted by Set Features Number of Queues */
	uint16_t io_sqsize; /* 0's based queue size for I/O queues */
	uint16_t cntlid;
};

/*
 * Connect the admin queue over transport tr, read CAP/VS, enable the
 * controller (CC.EN=1, wait CSTS.RDY up to CAP.TO), Identify Controller,
 * Set Features Number of Queues (want_io_queues), start keep alive (every
 * kato/3) when kato_ms > 0.  Errors as tr's connect, plus -ETIMEDOUT
 * (CSTS.RDY never set).
 */
int fx_nvmf_ctrl_open(const struct fx_nvmf_transport *tr, const struct fx_nvmf_addr *a,
		      const struct fx_nvmf_params *p, uint16_t want_io_queues,
		      struct fx_nvmf_ctrl **out, uint16_t *status);
/* Identify Namespace: size in blocks and block size (nsze * lba_size fits in
 * 64 bits).  -ENODEV (nsid not active), -EPROTO (unusable LBA format or a size
 * that overflows 64 bits). */
int fx_nvmf_ctrl_ns_info(struct fx_nvmf_ctrl *c, uint32_t nsid, uint64_t *nsze, uint32_t *lba_size);
/* A namespace's identifiers; all zeroes: the namespace has none of that
 * kind. */
struct fx_nvmf_ns_ids {
	uint8_t nguid[16];
	uint8_t eui64[8];
	uint8_t uuid[16];
	uint32_t anagrpid; /* 0: the controller reports no ANA group */
};
/* fx_nvmf_ctrl_ns_info, and the identifiers: NGUID, EUI-64 and ANAGRPID
 * from the same Identify Namespace; only where it gave neither NGUID nor
 * EUI-64, the Namespace Identification Descriptor list (CNS 03h) too, for a
 * UUID (a controller that refuses it with a status leaves the UUID zero;
 * a transport error or timeout there fails the call with that error). */
int fx_nvmf_ctrl_ns_info_ids(struct fx_nvmf_ctrl *c, uint32_t nsid, uint64_t *nsze,
			     uint32_t *lba_size, struct fx_nvmf_ns_ids *ids);
/* Stop keep alive, shut the controller down (CC.SHN), close the admin queue. */
void fx_nvmf_ctrl_close(struct fx_nvmf_ctrl *c);
/* Get Log Page lid from off (chunks of MDTS), on the admin queue; the
 * caller holds c->lock or is the controller's only user. */
int fx_nvmf_ctrl_get_log(struct fx_nvmf_ctrl *c, uint8_t lid, uint64_t off, void *buf, uint32_t len,
			 uint16_t *status);
/* The same with a log specific field (LSP, CDW10 bits 12:08: the ANA log's
 * RGO, say). */
int fx_nvmf_ctrl_get_log_sp(struct fx_nvmf_ctrl *c, uint8_t lid, uint8_t lsp, uint64_t off,
			    void *buf, uint32_t len, uint16_t *status);

/*
 * Discovery over transport tr: connect to the discovery controller at a
 * (params' subnqn is ignored), read the whole discovery log (Get Log Page
 * 0x70, re-read if GENCTR changes), disconnect.  *entries is malloc'ed
 * (caller frees).
 */
int fx_nvmf_discover(const struct fx_nvmf_transport *tr, const struct fx_nvmf_addr *a,
		     const struct fx_nvmf_params *p, struct nvmf_disc_log_entry **entries,
		     uint32_t *n, uint16_t *status);

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
