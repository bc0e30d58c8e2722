/*
 * The benchmark's I/O loop in C: it keeps `depth` I/Os in flight and per
 * wakeup reaps every completion that is there, accounts it (counters and a
 * log-linear latency histogram) and submits the refills.  Python sees it
 * once per time slice.  Two I/O backends under the one loop: its own
 * io_uring over an fd (files and block devices; each I/O handed over as
 * it is prepared, or every batch_submit of them, or a whole refill with the
 * system call that waits for the next completions), or an
 * fx_queue of the core (NVMe/TCP, NVMe/RDMA, any transport), used from the
 * thread that runs the loop.
 */
#ifndef FX_BENCH_LOOP_H
#define FX_BENCH_LOOP_H

#include <stdint.h>

struct fx_queue;

/* Histogram layout, the same as fx100io/bench/stats.py: values below
 * 2 * FX_BL_SUB are exact, above that FX_BL_SUB linear sub-buckets per
 * power of two. */
#define FX_BL_SUB_BITS 7
#define FX_BL_SUB (1u << FX_BL_SUB_BITS)
#define FX_BL_EXACT (2u * FX_BL_SUB)
#define FX_BL_NBUCKETS (FX_BL_EXACT + (64u - FX_BL_SUB_BITS - 1u) * FX_BL_SUB)
#define FX_BL_MAX_DEPTH 32768   /* most I/Os in flight one loop takes */
#define FX_BL_MAX_DEPTH_HIST 64 /* depth histogram: 0..64, the last is ">= 64" */

/* Options (fx_bl_params.flags) and what fx_bl_features() reports. */
#define FX_BL_SQPOLL 0x1    /* kernel thread polls the submission queue */
#define FX_BL_REGFILES 0x2  /* the fd as a registered (fixed) file */
#define FX_BL_FIXEDBUFS 0x4 /* the buffers registered (READ/WRITE_FIXED) */
#define FX_BL_REGRING 0x8   /* the ring's own fd registered */
#define FX_BL_STAMP 0x100   /* writes carry their offset in their first 8 bytes */
/* Only in fx_bl_features(): how completions are run. */
#define FX_BL_DEFER_TASKRUN 0x10000
#define FX_BL_COOP_TASKRUN 0x20000
#define FX_BL_SINGLE_ISSUER 0x40000

struct fx_bl_dir {
	uint64_t ios;
	uint64_t bytes;
	uint64_t short_ios;
	uint64_t min_ns; /* meaningful when ios > 0 */
	uint64_t max_ns;
	uint64_t sum_ns;
	double sumsq;
	uint64_t counts[FX_BL_NBUCKETS];
};

struct fx_bl_params {
	int fd;           /* the io_uring backend's file; ignored with queue */
	uint32_t bs;      /* bytes per I/O, > 0 */
	uint32_t depth;   /* I/Os in flight, one buffer each */
	uint64_t start;   /* byte offset of block 0 */
	uint64_t nblocks; /* blocks in the region, > 0 */
	uint64_t passes;  /* walks over the region; 0 = until stopped */
	uint64_t ios;     /* > 0: I/Os in all (fio's io_size, number_ios), in place
	                        * of passes x nblocks; past nblocks it wraps around */
	uint64_t end_ns;  /* CLOCK_MONOTONIC instant to stop; 0 = none */
	uint64_t seed;
	double read_fraction; /* 1.0 all reads, 0.0 all writes */
	int random;           /* random order, else sequential */
	int random_map;       /* random: every block once per pass */
	unsigned flags;       /* FX_BL_* options asked for */
	void *const *bufs;    /* depth buffers of bs bytes each */
	/* Hand I/Os to the backend as soon as this many are prepared (fio's
	 * iodepth_batch_submit: 1 = each at once); 0 = all of a refill
	 * together, with the wait for the next completions. */
	uint32_t batch_submit;
	/* Non-NULL: the I/O goes through this queue (fx_queue_submit, _wait,
	 * _reap) instead of an io_uring of the loop's own; the caller keeps it
	 * alive past fx_bl_destroy and uses it from no other thread meanwhile.
	 * The io_uring options (SQPOLL, REGFILES, FIXEDBUFS, REGRING) do not
	 * apply and are refused (-EINVAL). */
	struct fx_queue *queue;
	/* io_uring backend: with I/O in flight and no completion for this
	 * long, the run fails with -ETIMEDOUT instead of waiting for good (a
	 * ring that lost its completions must not hang a benchmark or a test
	 * run).  0 = FX_BL_STALL_LIMIT_NS.  A queue has its own command
	 * timeouts. */
	uint64_t stall_ns;
};

#define FX_BL_STALL_LIMIT_NS 60000000000ull

/* Which backend a loop runs on (fx_bl_backend). */
#define FX_BL_BACKEND_URING 0
#define FX_BL_BACKEND_QUEUE 1

struct fx_bl;

/* 0 or -errno.  Options the kernel refuses are dropped, not fatal:
 * fx_bl_refused() says which, with the errno of the refusal. */
int fx_bl_create(const struct fx_bl_params *p, struct fx_bl **out);
unsigned fx_bl_features(const struct fx_bl *b);
int fx_bl_backend(const struct fx_bl *b);
unsigned fx_bl_refused(const struct fx_bl *b,
		       int *errnos /* [4]: SQPOLL, REGFILES, FIXEDBUFS, REGRING */);

/* Run until a completion is seen at or after slice_end_ns (returns 0, with
 * the freed slots refilled and submitted so the queue stays full),
 * until every I/O is done (1), or until an I/O failed and the rest drained
 * (-errno of the failure; -ENODATA for a read or write that moved 0 bytes).
 * Interrupted by a signal: returns 0 so the caller can look at it. */
int fx_bl_run(struct fx_bl *b, uint64_t slice_end_ns);
/* Tests: queue a NOP that is none of the loop's I/Os (as liburing's own
 * timeout SQE is on kernels without IORING_FEAT_EXT_ARG); the next
 * fx_bl_run submits it.  0 or -EBUSY (submission queue full). */
int fx_bl_queue_foreign_nop(struct fx_bl *b);
/* Submit nothing more; the next fx_bl_run drains and returns 1. */
void fx_bl_stop(struct fx_bl *b);
/* errno of a failure of the backend itself (io_uring_enter; a queue's
 * wait or reap that failed, or a queue that took no I/O with none in
 * flight), which is no I/O's and has no offset; 0 when the failure was an
 * I/O's or there was none. */
int fx_bl_ring_failed(const struct fx_bl *b);
/* The stall limit the loop runs with (fx_bl_params.stall_ns). */
uint64_t fx_bl_stall_ns(const struct fx_bl *b);
/* The failed I/O: its errno, offset and direction (1 = read). */
void fx_bl_error(const struct fx_bl *b, int *err, uint64_t *off, int *is_read);
/* Its raw NVMe status (fx_cqe.status) when the transport gave one, else 0. */
unsigned fx_bl_error_status(const struct fx_bl *b);

const struct fx_bl_dir *fx_bl_stats(const struct fx_bl *b, int is_read);
/* Submitted I/Os, each counted at the depth its batch brought the queue
 * to, FX_BL_MAX_DEPTH_HIST + 1 entries. */
const uint64_t *fx_bl_depths(const struct fx_bl *b);
uint64_t fx_bl_inflight(const struct fx_bl *b);
/* Waits (at most ~30 s) for what is still in flight, then frees.  0, or
 * -EBUSY when it gave up with I/O still in flight: the kernel may still
 * use the buffers then, and the caller must keep them (leak them). */
int fx_bl_destroy(struct fx_bl *b);
/* The same with the wait limited to limit_ns. */
int fx_bl_destroy_within(struct fx_bl *b, uint64_t limit_ns);

/* Histogram helpers, shared with the binding and its tests. */
uint32_t fx_bl_bucket(uint64_t ns);
uint64_t fx_bl_bucket_value(uint32_t idx);
/* Nearest-rank percentile (0 < pct <= 100), bucket midpoint clamped to
 * [min, max]; 0 when empty. */
uint64_t fx_bl_percentile(const struct fx_bl_dir *d, double pct);

#endif
