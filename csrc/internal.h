/*
 * Internal interfaces shared by the C core's files.  Not installed, not part
 * of the public API.
 */
#ifndef FX100IO_INTERNAL_H
#define FX100IO_INTERNAL_H

#include <liburing.h>
#include <pthread.h>
#include <stdint.h>
#include <sys/uio.h>

#include "fx100io.h"

/* ------------------------------------------------------------------ ring */

/* Registered-buffer slots per ring.  A pool takes one slot per GiB (the
 * kernel caps one fixed buffer at 1 GiB), so this bounds registered memory
 * at 64 GiB per process; beyond that I/O still works, unregistered. */
#define FX_BUF_SLOTS 64
#define FX_BUF_SLOT_MAX (1ULL << 30)

struct fx_ring {
	struct io_uring uring;
	int efd;           /* eventfd registered with the ring */
	unsigned features; /* FX_RING_* */
	int disabled;      /* set up with R_DISABLED: fx_ring_enable() first */
	pthread_t issuer;  /* the thread the kernel ties a SINGLE_ISSUER ring to */
	/* generation of the pool slot installed in each fixed-buffer slot;
	 * 0 = nothing installed, UINT32_MAX = installing failed, stop trying */
	uint32_t installed[FX_BUF_SLOTS];
};

/*
 * Set up a ring with the best flags this kernel accepts (SINGLE_ISSUER +
 * DEFER_TASKRUN, else COOP_TASKRUN, else none; never DEFER_TASKRUN for a
 * queue_flags with FX_QUEUE_FD_WAKE), a registered ring fd, an
 * eventfd and a sparse fixed-buffer table.  -ENOSYS/-EPERM when io_uring is
 * unavailable, -ENOMEM, -errno of io_uring_setup.
 */
int fx_ring_init(struct fx_ring *r, unsigned entries, uint32_t queue_flags);
void fx_ring_exit(struct fx_ring *r);
/* Enable a ring set up disabled (FX_QUEUE_DEFER_ENABLE): the calling thread
 * becomes its single issuer.  0 when it was not disabled; -errno. */
int fx_ring_enable(struct fx_ring *r);
/* Whether the calling thread may submit to and wait on r: always, unless r
 * is SINGLE_ISSUER and tied to another thread (the kernel says -EEXIST). */
int fx_ring_is_issuer(const struct fx_ring *r);
/* Count n I/Os a queue destroy left with the kernel (fx_queue_leaked_ios). */
void fx_ring_count_leaked(unsigned n);
/* Fixed-buffer index covering [addr, addr+len), installing the pool slot in
 * this ring on first use; -1 when the range is not in a registered pool. */
int fx_ring_buf_index(struct fx_ring *r, const void *addr, uint64_t len);
/* Run deferred completions (DEFER_TASKRUN) and clear the eventfd. */
void fx_ring_flush_events(struct fx_ring *r);

/* ------------------------------------------------------------ buffer pool */

/* Slot of the registry that holds [addr, addr+len) and that slot's iovec and
 * generation; -1 if none.  Thread-safe. */
int fx_pool_lookup(const void *addr, uint64_t len, struct iovec *iov, uint32_t *gen);

/* Slot's iovec and generation when it holds a pool (its index), else -1. */
int fx_pool_slot(int slot, struct iovec *iov, uint32_t *gen);
/* Called by fx_pool_destroy for each slot it releases (with the generation
 * the slot had), before the memory is unmapped; set by transport/rdma_mem.c. */
extern void (*fx_pool_release_hook)(int slot, uint32_t gen);

/* ------------------------------------------------------------- transport */

/*
 * A transport plugs in through one const ops table
 * (docs/architecture.md rule 1).  Generic
 * code calls only through it; capabilities are FX_CAP_* flags.
 */
struct fx_transport_ops {
	const char *name;
	int (*dev_open)(const struct fx_transport_ops *ops, const char *target,
			const struct fx_dev_opts *opts, struct fx_dev **out);
	void (*dev_close)(struct fx_dev *d);
	int (*queue_create)(struct fx_dev *d, const struct fx_queue_opts *opts,
			    struct fx_queue **out);
	void (*queue_destroy)(struct fx_queue *q);
	/* fx_queue_enable; NULL where the transport's queue may be used from
	 * any thread as it is made (no ring of its own). */
	int (*queue_enable)(struct fx_queue *q);
	/* fx_queue_quiesce; NULL where the kernel holds no caller buffer
	 * past the transport's own destroy (it answers 0). */
	int (*queue_quiesce)(struct fx_queue *q, int timeout_ms);
	int (*queue_submit)(struct fx_queue *q, const struct fx_req *reqs, unsigned n);
	int (*queue_reap)(struct fx_queue *q, struct fx_cqe *out, unsigned max);
	int (*queue_wait)(struct fx_queue *q, unsigned min, int timeout_ms);
	/* NVMe-oF: the namespace's ANA group and state (fx_dev_ana); NULL
	 * where the transport has no controller behind it. */
	int (*dev_ana)(struct fx_dev *d, uint32_t *grpid, uint8_t *state);
};

/* Every transport's device and queue start with these headers. */
struct fx_dev {
	const struct fx_transport_ops *ops;
	struct fx_dev_info info;
};

struct req_table;

/* What every queue exposes; transports fill these in at create time, so the
 * dispatcher answers fd/pending/features/stats without an op each. */
struct fx_queue {
	const struct fx_transport_ops *ops;
	struct fx_dev *dev;
	struct req_table *reqs;      /* the transport's request table */
	int poll_fd;                 /* eventfd that signals completions */
	unsigned features;           /* FX_RING_* */
	struct fx_queue_stats stats; /* kept by the transport */
};

/* ---------------------------------------------------------------- crc32c */

/* The raw CRC32C register (no pre/post inversion) after len more bytes. */
uint32_t fx_crc32c_raw(uint32_t reg, const void *buf, size_t len);
/* Which implementation runs: "avx512-vpclmulqdq", "sse4.2" or "table". */
const char *fx_crc32c_impl(void);
/* The raw register advanced over nbytes zero bytes. */
uint32_t fx_crc32c_shift(uint32_t reg, uint64_t nbytes);

/* Monotonic milliseconds. */
int64_t fx_now_ms(void);

/*
 * The blocking wait of ring-driven queues: run process(q) (reap CQEs, issue
 * more work) and sleep in the ring until at least min requests are done or
 * timeout_ms passes (-ETIME; < 0 waits forever).  -EINTR on a signal.
 */
int fx_ring_wait_done(struct fx_queue *q, struct fx_ring *r, void (*process)(struct fx_queue *q),
		      unsigned min, int timeout_ms);
/* The non-blocking reap of ring-driven queues: clear the eventfd, run
 * process(q), hand out up to max finished requests. */
int fx_ring_reap(struct fx_queue *q, struct fx_ring *r, void (*process)(struct fx_queue *q),
		 struct fx_cqe *out, unsigned max);

extern const struct fx_transport_ops fx_transport_file;
extern const struct fx_transport_ops fx_transport_psync;
extern const struct fx_transport_ops fx_transport_tcp;
extern const struct fx_transport_ops fx_transport_rdma;

#endif
