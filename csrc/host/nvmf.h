/*
 * What every NVMe-oF transport shares (see docs/architecture.md, csrc/host/): the
 * addressing and connect parameters, the per-transport table the generic
 * code drives queues through, and the helpers that build and decode the
 * Fabrics commands (Connect, Property Get/Set) the same way on any fabric.
 *
 * Generic code (host/ctrl.c, host/discovery.c) never looks inside a queue:
 * a queue is whatever the transport's connect filled in, handled as void *.
 * Every function returns 0 or -errno; NVMe error statuses become -EIO (or
 * a more specific errno where one fits) with the raw status field reported
 * through the status out-parameter where there is one.
 */
#ifndef FX100IO_HOST_NVMF_H
#define FX100IO_HOST_NVMF_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include "fx100io/nvme.h"
#include "auth/auth_crypto.h"
#include "nvme_tcp/tls_psk.h"

struct fx_nvmf_transport;

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
	/* I/O queues: the write data a command may carry in its capsule
	 * (IOCCSZ - 64 from the admin queue's Identify, when ICDOFF is 0; 0:
	 * none or not known yet).  The commands a connect sends after Connect
	 * (AUTH_Send) use it: Linux's nvmet-tcp answers no R2T for a write
	 * small enough for the capsule. */
	uint32_t io_incap_max;
	/* DH-HMAC-CHAP secrets (len 0: none), parsed once when the device or
	 * discovery is opened; the controller's one asks for bidirectional
	 * authentication.  Wiped with the params (fx_nvmf_params_wipe). */
	struct fx_auth_key dhchap_key;
	struct fx_auth_key dhchap_ctrl_key;
	/* NVMe/TCP secure channel: asked for (URI tls=1), and the configured
	 * PSK (tls_key; len 0: none), wiped with the params. */
	int tls;
	struct fx_tls_key tls_key;
	/* URI ktls=off: keep the records in our userspace layer even where
	 * the kernel could take them (kTLS, nvme_tcp/ktls.h); 0 (auto): the
	 * kernel's where it has the tls ULP */
	int ktls_off;
};

/* Set params' host (ctrl == 0) or controller (ctrl != 0) secret from its
 * DHHC-1 text; -EINVAL with *why (never quoting the secret) when malformed. */
int fx_nvmf_params_set_secret(struct fx_nvmf_params *p, int ctrl, const char *text,
			      const char **why);
/* Set params' configured TLS PSK from its NVMeTLSkey-1 text; -EINVAL with
 * *why (never quoting the key) when malformed. */
int fx_nvmf_params_set_tls_key(struct fx_nvmf_params *p, const char *text, const char **why);
/* Wipe the secrets a params holds. */
void fx_nvmf_params_wipe(struct fx_nvmf_params *p);

/* Why this thread's last connect failed authentication ("" if it did not:
 * cleared by every Connect, fx_nvmf_connect_cmd; set by host/auth_host.c). */
const char *fx_nvmf_auth_error(void);
void fx_nvmf_auth_error_clear(void);
void fx_nvmf_auth_error_vset(const char *fmt, va_list ap) __attribute__((format(printf, 1, 0)));

/*
 * One transport, as the generic controller code sees it.  Const and
 * stateless: the state lives in the queue, opaque here.
 *
 * connect: bring queue qid up to a completed Fabrics Connect (qid 0: admin,
 *   cntlid ignored; qid > 0: I/O queue of controller cntlid) into the
 *   caller's storage q; *cntlid_out gets the controller id.  Errors as
 *   fx_tcp_connect in transport/tcp_ctrl.h.  On failure q holds nothing to close.
 * exec: one command, synchronously (fx_tcp_exec's contract).  timeout_ms
 *   > 0 caps the wait below the queue's own timeout (close uses it so a
 *   dead target cannot hold it for a full command timeout); 0: the queue's.
 *   Returns 0 when done, or a negative errno; only for an Authentication
 *   Receive a transport may also return the bytes that arrived (> 0), or
 *   -ENODATA for none, when the controller ended its data early (the rest
 *   zeroed); a transport that cannot tell (RDMA) returns 0.
 * shutdown: make the queue fail every later command at once, without
 *   freeing it (keep alive uses it when the controller is lost, so no
 *   waiter parses a stream that is out of step).  Safe while another
 *   thread is in exec.
 * close: release the queue (idempotent).
 * queue_size: bytes of the storage a queue needs (the connect target);
 *   a connected queue may be moved to other storage with memcpy.
 * max_xfer: most bytes one command can move on this transport whatever
 *   MDTS says (NVMe/RDMA: a keyed SGL's 24-bit length); 0: no limit.
 */
struct fx_nvmf_transport {
	const char *name;
	size_t queue_size;
	uint32_t max_xfer;
	int (*connect)(const struct fx_nvmf_addr *a, const struct fx_nvmf_params *p, uint16_t qid,
		       uint16_t sqsize, uint16_t cntlid, void *q, uint16_t *cntlid_out,
		       uint16_t *status);
	int (*exec)(void *q, struct nvme_sqe *sqe, void *data, uint32_t len, int write,
		    struct nvme_cqe *cqe, int timeout_ms);
	void (*shutdown)(void *q);
	void (*close)(void *q);
	/* I/O connections per thread when the URI gives no `queues` (0: 1). */
	uint32_t default_queues;
};

/* Default per-command timeout when params.timeout_ms is 0. */
#define FX_NVMF_DEFAULT_TIMEOUT_MS 30000

/* Log one line on stderr, prefixed "fx100io: nvmf: ". */
void fx_nvmf_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
int64_t fx_nvmf_now_ms(void);
/* now + timeout_ms (FX_NVMF_DEFAULT_TIMEOUT_MS when <= 0) */
int64_t fx_nvmf_deadline_in(int timeout_ms);
/* The calling thread's cancel fd (fx_nvmf_set_cancel_fd), -1: none. */
int fx_nvmf_cancel_fd(void);
/* Sleep ms; -ECANCELED at once when the thread's cancel fd fires. */
int fx_nvmf_sleep_ms(int ms);
/*
 * Give the calling thread a cancel eventfd (-1: none): once it is readable,
 * every network wait and CSTS.RDY poll that thread makes fails at once with
 * -ECANCELED (a connection it was using is shut down, as after any stream
 * error).  Other threads are unaffected.  A background connector sets it so
 * that closing its queue cuts a connect or controller open short instead of
 * waiting for connect_timeout_ms or CAP.TO.
 */
void fx_nvmf_set_cancel_fd(int fd);

static inline uint16_t fx_nvmf_le16(const uint8_t *p)
{
	return (uint16_t)(p[0] | p[1] << 8);
}

static inline uint32_t fx_nvmf_le32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static inline uint64_t fx_nvmf_le64(const uint8_t *p)
{
	return (uint64_t)fx_nvmf_le32(p) | (uint64_t)fx_nvmf_le32(p + 4) << 32;
}

static inline uint16_t fx_nvmf_status_field(const struct nvme_cqe *cqe)
{
	return NVME_STATUS_FIELD(cqe->status);
}

/* Both NQNs present and NUL-terminated within NVMF_NQN_SIZE. */
int fx_nvmf_nqn_ok(const char *nqn);
/* The Fabrics Connect command and its 1024 bytes of data for queue qid
 * (KATO only on the admin queue, which asks for any controller). */
void fx_nvmf_connect_cmd(const struct fx_nvmf_params *p, uint16_t qid, uint16_t sqsize,
			 uint16_t cntlid, struct nvme_sqe *sqe, struct nvmf_connect_data *cd);
/* Errno for a failed Connect's status field (-EACCES, -ENOENT, -EIO). */
int fx_nvmf_connect_errno(uint16_t sf);

/* Property Get/Set on any transport's queue. */
int fx_nvmf_q_prop_get(const struct fx_nvmf_transport *tr, void *q, uint32_t off, int size8,
		       uint64_t *val, int timeout_ms);
int fx_nvmf_q_prop_set(const struct fx_nvmf_transport *tr, void *q, uint32_t off, int size8,
		       uint64_t val, int timeout_ms);

#endif
