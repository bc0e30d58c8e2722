/*
 * A namespace of a remote NVMe-oF controller as a device, on any transport
 * (host/dev.c): the URI options, the controller (opened, checked, re-opened
 * when the target forgot it), the I/O queue ids handed to queues, one
 * blocking connect attempt for an I/O queue, and the per-queue connector
 * thread that runs those attempts off the caller's thread
 * (docs/architecture.md rule 14).
 *
 * A transport's data path (transport/tcp.c, transport/rdma.c) embeds struct
 * fx_nvmf_dev in its device and keeps only what is its own: how commands
 * move.
 */
#ifndef FX100IO_HOST_DEV_H
#define FX100IO_HOST_DEV_H

#include <pthread.h>
#include <stdint.h>

#include "fx100io.h"
#include "host/ana.h"
#include "host/ctrl.h"
#include "host/nvmf.h"

#define FX_NVMF_RECONNECT_MS_DEFAULT 200 /* between failed connect attempts */
#define FX_NVMF_MAX_RECONNECTS_DEFAULT 3 /* failed attempts a waiting request sits through */

struct fx_nvmf_dev {
	const struct fx_nvmf_transport *tr;
	const char *label;        /* the URI scheme, for logs: "nvme+rdma" */
	struct fx_dev_info *info; /* the transport device's geometry, set here */
	struct fx_nvmf_addr addr;
	struct fx_nvmf_params params;
	/* lock: ctrl, its epoch, the qid map and the geometry; held for a few
	 * loads and stores, never across network I/O (queue threads take it).
	 * open_lock: controller (re)opens and the liveness check, which wait
	 * on the network; taken before lock, never after. */
	pthread_mutex_t lock;
	pthread_mutex_t open_lock;
	struct fx_nvmf_ctrl *ctrl;
	uint32_t nsid;
	uint32_t queues;   /* I/O queues per fx_queue */
	uint32_t qsize;    /* entries per I/O queue asked for (0: the controller's) */
	uint32_t max_xfer; /* bytes per NVMe command */
	int io_timeout_ms;
	int reconnect_ms;
	int max_reconnects;
	uint8_t *qid_used;   /* [1..ctrl->io_queues] */
	uint32_t ctrl_epoch; /* bumped when the controller is re-opened */
	uint32_t anagrpid;   /* the namespace's ANA group (0: none reported) */
	/* what one ANA log read tells the next (under open_lock; host/ana.h) */
	struct fx_nvmf_ana_reader ana;
	uint16_t next_qid;
	/* queues is the transport's default, not the URI's: a thread that
	 * cannot have them all runs on fewer (at least one) */
	int queues_default;
	int fewer_logged; /* ... which is said once per device (atomic) */
};

/*
 * Parse target (the key=value lines fx100io/fabric_uri.py makes), open the
 * controller over tr, read the namespace's geometry into *info.  On failure
 * nothing is left to release.  -EINVAL (bad options), the transport's
 * connect errors, -ENODEV (no such namespace), -EPROTO.
 */
int fx_nvmf_dev_init(struct fx_nvmf_dev *d, const struct fx_nvmf_transport *tr, const char *label,
		     const char *target, struct fx_dev_info *info);
void fx_nvmf_dev_fini(struct fx_nvmf_dev *d);
/* The keys fx_nvmf_dev_init reads from target, NULL-terminated (for the test
 * that holds them to fx100io/fabric_options.py). */
const char *const *fx_nvmf_dev_keys(void);

/* What one connect attempt for an I/O queue hands back. */
struct fx_nvmf_io_conn {
	int err;            /* 0: the queue storage holds a connected queue */
	uint32_t epoch;     /* controller epoch it was connected under */
	uint32_t incap_max; /* in-capsule data allowed (IOCCSZ*16 - 64) */
	uint32_t max_xfer;  /* bytes per command under this controller */
	uint16_t icdoff;
	uint16_t qid;
	uint16_t sqsize; /* 0's based */
};

/*
 * One blocking attempt to connect an I/O queue into q (dev->tr->queue_size
 * bytes): re-opens the controller first when it is gone, retries a refused
 * qid a few times, and re-opens a controller the target forgot.  *stop
 * (NULL: never) cuts waits for another thread's controller open short; the
 * calling thread's cancel fd (fx_nvmf_set_cancel_fd) cuts network waits.
 */
void fx_nvmf_dev_connect_io(struct fx_nvmf_dev *d, const int *stop, void *q,
			    struct fx_nvmf_io_conn *res);
/* Close a connected I/O queue and give its qid back. */
void fx_nvmf_dev_close_io(struct fx_nvmf_dev *d, void *q, const struct fx_nvmf_io_conn *res);

/*
 * The namespace's ANA group and its state now (NVME_ANA_*), from the
 * controller's ANA log page (LID 0Ch, read on the admin queue; waits on the
 * network, so never call it on an event loop).  -EOPNOTSUPP (the namespace
 * reports no ANA group, or the controller has no ANA log), -ENOTCONN (no
 * controller now), -ENOENT (the log has no descriptor for the group),
 * -EPROTO (a malformed page), the admin queue's errors.
 */
int fx_nvmf_dev_ana(struct fx_nvmf_dev *d, uint32_t *grpid, uint8_t *state);

/* Bytes per command: want (0: 1 MiB) within MDTS and NLB, whole blocks;
 * 0 when not even one block fits. */
uint32_t fx_nvmf_xfer_size(uint32_t want, uint32_t mdts_bytes, uint32_t lba);

/* ---------------------------------------------------------- wait policy */

/*
 * What a queue does with a request no connection can carry
 * (docs/architecture.md rule 13):
 * it waits for a reconnect until max_reconnects attempts have failed or
 * io_timeout_ms has passed, both counted from when it was submitted or the
 * queue began waiting, whichever is later.  The same for every transport.
 */
struct fx_nvmf_waits {
	uint32_t cx_fails;   /* failed connect attempts so far (monotonic) */
	int64_t disc_at;     /* when requests began waiting; 0: not waiting */
	uint32_t disc_fails; /* cx_fails then */
	int64_t *queued_at;  /* per request slot: when it was submitted */
	uint32_t *fails_at;  /* per request slot: cx_fails then */
};

/* -ENOMEM */
int fx_nvmf_waits_init(struct fx_nvmf_waits *w, uint32_t nslots);
void fx_nvmf_waits_fini(struct fx_nvmf_waits *w);
/* Request slot ri was just submitted: the policy counts from now. */
void fx_nvmf_waits_stamp(struct fx_nvmf_waits *w, uint32_t ri, int64_t now);
/* 0: request ri waits for a connection; else the errno to fail it with
 * (err, the last attempt's error, or -ETIMEDOUT). */
int fx_nvmf_waits_check(struct fx_nvmf_waits *w, const struct fx_nvmf_dev *d, uint32_t ri, int err,
			int64_t now);
/* A connection came up: nothing waits any more. */
static inline void fx_nvmf_waits_connected(struct fx_nvmf_waits *w)
{
	w->disc_at = 0;
}
/* A connect attempt failed. */
static inline void fx_nvmf_waits_attempt_failed(struct fx_nvmf_waits *w)
{
	w->cx_fails++;
}

/* ------------------------------------------------------------ connector */

enum fx_nvmf_cx_state { FX_CX_IDLE, FX_CX_BUSY, FX_CX_DONE };

/*
 * A queue's connector thread, started on first need.  The queue's thread
 * hands it a job (request), and takes the result (collect) once wake_fd
 * is readable; it touches nothing of the queue but this struct.
 */
struct fx_nvmf_connector {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	pthread_t thread;
	struct fx_nvmf_dev *dev;
	int started;
	int stop;
	int wake_fd;   /* eventfd: a result is ready (the queue polls it) */
	int notify_fd; /* written too when >= 0 (the queue's own poll fd) */
	int cancel_fd; /* eventfd: cuts the attempt in progress short */
	enum fx_nvmf_cx_state state;
	unsigned conn; /* which of the queue's connections it is for */
	struct fx_nvmf_io_conn res;
	void *q; /* the attempt's queue storage */
};

/* -ENOMEM or -errno of eventfd; wake_fd is valid afterwards. */
int fx_nvmf_cx_init(struct fx_nvmf_connector *x, struct fx_nvmf_dev *d, int notify_fd);
/* Start an attempt for connection conn (never blocks).  -EBUSY when one is
 * out already; -errno when the thread cannot start. */
int fx_nvmf_cx_request(struct fx_nvmf_connector *x, unsigned conn);
/* 1 and the result (the queue moved into q_out) when an attempt finished,
 * 0 while one runs or none was asked for. */
int fx_nvmf_cx_collect(struct fx_nvmf_connector *x, unsigned *conn, struct fx_nvmf_io_conn *res,
		       void *q_out);
/* Stop the thread (cutting an attempt short) and close a result nobody
 * took; the fds stay open (a queue whose poll still watches wake_fd closes
 * them with fx_nvmf_cx_fini once that poll is gone).  Never blocks past
 * the attempt's cancel. */
void fx_nvmf_cx_stop(struct fx_nvmf_connector *x);
/* fx_nvmf_cx_stop, then release everything (no-op when init failed or
 * never ran on zeroed storage). */
void fx_nvmf_cx_fini(struct fx_nvmf_connector *x);

#endif
