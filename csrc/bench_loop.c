/*
 * The benchmark's I/O loop in C (see bench_loop.h).
 *
 * One pass of the loop: take a clock reading, fill every free slot with the
 * next I/O of the access pattern (handed over every iodepth_batch_submit
 * of them, or all together), then the backend submits what is left and
 * waits for at least one completion; every completion that is there is
 * accounted (its latency goes into the histogram) and its slot is free for
 * the next pass.  The backend (struct backend) is the only part that knows
 * how I/O goes down: its own io_uring over an fd (one io_uring_enter both
 * submits and waits) or an fx_queue of the core (fx_queue_submit, which may
 * take fewer than offered: the rest is kept, in order, for the next pass;
 * fx_queue_wait; fx_queue_reap in batches).  The pattern (sequential, a keyed permutation of the region
 * per pass, or uniform random) and the read/write mix are generated here,
 * so Python has nothing to do per I/O.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <limits.h>
#include <liburing.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <time.h>

#include "bench_loop.h"
#include "fx100io.h"

#define WAIT_SLICE_NS 250000000ull /* longest wait before looking at the clock */
#define DRAIN_LIMIT_NS 30000000000ull
#define BACKOFF_NS 50000  /* 50 us */
#define QUEUE_WAIT_MS 250 /* WAIT_SLICE_NS for fx_queue_wait */
#define QUEUE_REAP_BATCH 64
#define URING_OPTS (FX_BL_SQPOLL | FX_BL_REGFILES | FX_BL_FIXEDBUFS | FX_BL_REGRING)

struct slot {
	uint64_t t0;
	uint64_t off;
	int is_read;
	int busy;      /* taken by an I/O (prepared, maybe not yet handed over) */
	int submitted; /* handed to the backend: only then may it complete */
	uint32_t gen;  /* the queue backend's tags carry it: a stale or duplicate
	                * completion of an earlier use of the slot is not this one's */
};

/* The queue backend's tags: a marker bit, the slot's generation, the slot. */
#define QTAG_MARK (1ull << 63)
#define QTAG(s, gen) (QTAG_MARK | ((uint64_t)((gen)&0x7fffffffu) << 32) | (uint64_t)(s))
#define QTAG_SLOT(tag) ((uint32_t)((tag)&0xffffffffu))

struct fx_bl;

/* How I/O goes down and comes back; the loop around it is shared. */
struct backend {
	int kind; /* FX_BL_BACKEND_* */
	/* Queue the I/O of slot s (not yet submitted): 0, or -EBUSY when there
	 * is no room now (the slot stays free, the I/O is not taken). */
	int (*prep)(struct fx_bl *b, uint32_t s, void *buf, uint64_t off, int is_read);
	/* I/Os prepared and not yet handed over (the loop is not done while
	 * there are any). */
	unsigned (*unsubmitted)(const struct fx_bl *b);
	/* Hand over what is prepared; with wait, then wait (at most about
	 * WAIT_SLICE_NS) for at least one completion.  >= 0, or -ETIME,
	 * -EINTR, -EAGAIN, -EBUSY (nothing wrong, try again), or another
	 * -errno: the backend failed. */
	int (*submit)(struct fx_bl *b, int wait);
	/* Pass every completion that is there to complete(); how many. */
	unsigned (*reap)(struct fx_bl *b, uint64_t t1);
	/* Forget the prepared I/Os not handed over yet (stopping). */
	void (*drop_unsubmitted)(struct fx_bl *b);
	void (*exit)(struct fx_bl *b);
};

struct fx_bl {
	const struct backend *be;
	/* io_uring backend */
	struct io_uring ring;
	int ring_ok;
	int fd;
	/* fx_queue backend */
	struct fx_queue *q;
	struct fx_req *reqs; /* prepared, not yet accepted by the queue, in order */
	uint32_t nreqs;
	struct fx_cqe cqes[QUEUE_REAP_BATCH];

	uint32_t bs;
	uint32_t depth;
	uint32_t batch; /* submit once this many are prepared; 0 = once per fill */
	uint64_t start;
	uint64_t nblocks;
	uint64_t total; /* I/Os to issue, 0 = unbounded */
	uint64_t end_ns;
	uint64_t issued;
	double read_fraction;
	int random;
	int random_map;
	unsigned asked;
	unsigned features;
	unsigned refused;
	int refused_errno[4];

	/* the access pattern */
	uint64_t rng;
	uint64_t pass; /* pass whose keys are loaded */
	uint64_t keys[4];
	unsigned half;
	uint64_t half_mask;
	uint64_t domain; /* 1 << (2 * half) */

	void *const *bufs;
	struct slot *slots;
	uint32_t *free_slots;
	uint32_t nfree;
	uint64_t inflight;
	int stopping;
	int err;
	int ring_err;         /* the failure was the backend's, not an I/O's */
	uint64_t stall_ns;    /* see fx_bl_params.stall_ns */
	uint64_t progress_ns; /* last completion seen, or last run with none in flight */
	uint64_t err_off;
	int err_read;
	unsigned err_status;

	uint64_t depths[FX_BL_MAX_DEPTH_HIST + 1];
	struct fx_bl_dir rd;
	struct fx_bl_dir wr;
};

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* ------------------------------------------------------------ histogram */

uint32_t fx_bl_bucket(uint64_t ns)
{
	if (ns > (uint64_t)INT64_MAX)
		ns = (uint64_t)INT64_MAX;
	if (ns < FX_BL_EXACT)
		return (uint32_t)ns;
	unsigned bitlen = 64u - (unsigned)__builtin_clzll(ns);
	unsigned shift = bitlen - (FX_BL_SUB_BITS + 1);
	uint64_t top = ns >> shift; /* in [SUB, 2 * SUB) */
	return FX_BL_EXACT + (shift - 1) * FX_BL_SUB + (uint32_t)(top - FX_BL_SUB);
}

uint64_t fx_bl_bucket_value(uint32_t idx)
{
	if (idx < FX_BL_EXACT)
		return idx;
	if (idx >= FX_BL_NBUCKETS)
		idx = FX_BL_NBUCKETS - 1;
	uint32_t i = idx - FX_BL_EXACT;
	unsigned shift = i / FX_BL_SUB + 1;
	uint64_t top = i % FX_BL_SUB + FX_BL_SUB;
	return (top << shift) + ((1ull << shift) >> 1);
}

uint64_t fx_bl_percentile(const struct fx_bl_dir *d, double pct)
{
	if (d->ios == 0 || !(pct > 0.0))
		return 0;
	if (pct > 100.0)
		pct = 100.0;
	/* Nearest rank ceil(pct / 100 * n) in integers: pct in millionths
	 * (99.9 -> 99900000 exactly), so 99.9 of 1000 is rank 999, not the
	 * 1000 that 0.999 * 1000 = 999.0000000000001 would round up to. */
	unsigned __int128 ppm = (uint64_t)(pct * 1e6 + 0.5);
	unsigned __int128 r = (ppm * d->ios + 99999999u) / 100000000u;
	uint64_t rank = (uint64_t)r;
	if (rank == 0)
		rank = 1;
	uint64_t cum = 0;
	uint32_t idx = FX_BL_NBUCKETS - 1;
	for (uint32_t i = 0; i < FX_BL_NBUCKETS; i++) {
		cum += d->counts[i];
		if (cum >= rank) {
			idx = i;
			break;
		}
	}
	uint64_t v = fx_bl_bucket_value(idx);
	if (v < d->min_ns)
		v = d->min_ns;
	if (v > d->max_ns)
		v = d->max_ns;
	return v;
}

static inline void account(struct fx_bl_dir *d, uint64_t lat, uint64_t n, int is_short)
{
	if (d->ios == 0 || lat < d->min_ns)
		d->min_ns = lat;
	if (lat > d->max_ns)
		d->max_ns = lat;
	d->ios++;
	d->bytes += n;
	d->short_ios += (uint64_t)is_short;
	d->sum_ns += lat;
	d->sumsq += (double)lat * (double)lat;
	d->counts[fx_bl_bucket(lat)]++;
}

/* ------------------------------------------------------------ pattern */

static inline uint64_t splitmix(uint64_t *s)
{
	uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
	z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
	return z ^ (z >> 31);
}

static void load_keys(struct fx_bl *b, uint64_t pass)
{
	uint64_t s = b->rng ^ (0xA0761D6478BD642Full * (pass + 1));

	for (int i = 0; i < 4; i++)
		b->keys[i] = splitmix(&s);
	b->pass = pass;
}

static inline uint64_t feistel_round(uint64_t x, uint64_t key, uint64_t mask)
{
	uint64_t h = (x ^ key) * 0x9E3779B97F4A7C15ull;
	h ^= h >> 29;
	h *= 0xBF58476D1CE4E5B9ull;
	h ^= h >> 32;
	return h & mask;
}

static inline uint64_t feistel(const struct fx_bl *b, uint64_t x)
{
	uint64_t left = x >> b->half, right = x & b->half_mask;

	for (int i = 0; i < 4; i++) {
		uint64_t t = left ^ feistel_round(right, b->keys[i], b->half_mask);
		left = right;
		right = t;
	}
	return (left << b->half) | right;
}

/* Block of the I/O number `i`: a bijection on [0, nblocks) per pass
 * (cycle-walking the values a power-of-two permutation puts past the end). */
static inline uint64_t permuted(struct fx_bl *b, uint64_t i)
{
	uint64_t x = feistel(b, i);

	while (x >= b->nblocks)
		x = feistel(b, x);
	return x;
}

/* Uniform in [0, n) without modulo bias worth speaking of (n < 2^64). */
static inline uint64_t below(uint64_t *s, uint64_t n)
{
	return (uint64_t)(((unsigned __int128)splitmix(s) * n) >> 64);
}

/* The next I/O (the caller checked that the pattern has one). */
static inline void next_io(struct fx_bl *b, uint64_t *off, int *is_read)
{
	uint64_t i = b->issued++;
	uint64_t blk;

	if (!b->random) {
		blk = i % b->nblocks;
	} else if (b->random_map) {
		uint64_t pass = i / b->nblocks;
		if (pass != b->pass)
			load_keys(b, pass);
		blk = permuted(b, i % b->nblocks);
	} else {
		blk = below(&b->rng, b->nblocks);
	}
	*off = b->start + blk * b->bs;
	if (b->read_fraction >= 1.0)
		*is_read = 1;
	else if (b->read_fraction <= 0.0)
		*is_read = 0;
	else
		*is_read = (double)(splitmix(&b->rng) >> 11) * 0x1.0p-53 < b->read_fraction;
}

/* ------------------------------------------------------------ setup */

static int ring_setup(struct fx_bl *b, unsigned entries)
{
	static const struct {
		unsigned setup;
		unsigned features;
	} order[] = {
		{IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN,
		 FX_BL_SINGLE_ISSUER | FX_BL_DEFER_TASKRUN},
		{IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_COOP_TASKRUN,
		 FX_BL_SINGLE_ISSUER | FX_BL_COOP_TASKRUN},
		{IORING_SETUP_COOP_TASKRUN, FX_BL_COOP_TASKRUN},
		{0, 0},
	};
	struct io_uring_params p;
	int ret;

	if (b->asked & FX_BL_SQPOLL) {
		/* DEFER_TASKRUN needs the submitter to reap; SQPOLL submits from
		 * a kernel thread, so the two do not go together. */
		memset(&p, 0, sizeof(p));
		p.flags = IORING_SETUP_SQPOLL | IORING_SETUP_SINGLE_ISSUER;
		p.sq_thread_idle = 1000;
		ret = io_uring_queue_init_params(entries, &b->ring, &p);
		if (ret == -EINVAL) {
			memset(&p, 0, sizeof(p));
			p.flags = IORING_SETUP_SQPOLL;
			p.sq_thread_idle = 1000;
			ret = io_uring_queue_init_params(entries, &b->ring, &p);
		}
		if (ret == 0) {
			b->features |= FX_BL_SQPOLL;
			return 0;
		}
		b->refused |= FX_BL_SQPOLL;
		b->refused_errno[0] = -ret;
	}
	ret = -EINVAL;
	for (size_t i = 0; i < sizeof(order) / sizeof(order[0]); i++) {
		memset(&p, 0, sizeof(p));
		p.flags = order[i].setup;
		ret = io_uring_queue_init_params(entries, &b->ring, &p);
		if (ret == 0) {
			b->features |= order[i].features;
			return 0;
		}
		if (ret != -EINVAL)
			break; /* ENOSYS, EPERM, ENOMEM: no other flag set helps */
	}
	return ret;
}

/* ------------------------------------------------------------ the loop's shared parts */

static inline void fail_io(struct fx_bl *b, int err, uint64_t off, int is_read, unsigned status)
{
	if (!b->err) {
		b->err = err;
		b->err_off = off;
		b->err_read = is_read;
		b->err_status = status;
	}
	b->stopping = 1;
}

/* The backend itself failed: no I/O's error, no offset. */
static void fail_backend(struct fx_bl *b, int err)
{
	if (!b->err) {
		b->err = err;
		b->ring_err = 1;
		b->err_off = 0;
		b->err_read = 0;
		b->err_status = 0;
	}
	b->stopping = 1;
}

/* The slot of an I/O the backend gave back (never submitted or done):
 * free again, the pattern's position unchanged for the count. */
static inline void release_slot(struct fx_bl *b, uint32_t s)
{
	b->slots[s].busy = 0;
	b->slots[s].submitted = 0;
	b->slots[s].gen++;
	b->free_slots[b->nfree++] = s;
	b->inflight--;
}

/* The slot a completion's tag names, or -1 when it is none of the I/Os
 * handed over now (a foreign CQE, a duplicate, a stale tag of an earlier
 * use of the slot, one kept back and never handed over). */
static inline int64_t tag_slot(const struct fx_bl *b, uint64_t tag)
{
	uint32_t s;

	if (b->q) {
		s = QTAG_SLOT(tag);
		if (!(tag & QTAG_MARK) || s >= b->depth || QTAG(s, b->slots[s].gen) != tag)
			return -1;
	} else {
		if (tag >= b->depth)
			return -1;
		s = (uint32_t)tag;
	}
	return b->slots[s].busy && b->slots[s].submitted ? (int64_t)s : -1;
}

/* One completion: res bytes moved, or -errno; status the raw NVMe status
 * when there is one.  Tags that are none of ours are ignored. */
static inline void complete(struct fx_bl *b, uint64_t tag, int64_t res, unsigned status,
			    uint64_t t1)
{
	int64_t slot = tag_slot(b, tag);

	if (slot < 0)
		return;
	uint32_t s = (uint32_t)slot;
	struct slot *sl = &b->slots[s];

	release_slot(b, s);
	if (res <= 0 || status) {
		int err = res < 0 ? (res < -4095 ? EIO : (int)-res)
				  : (res == 0 && !status ? ENODATA : EIO);
		fail_io(b, err, sl->off, sl->is_read, status);
		return;
	}
	uint64_t lat = t1 > sl->t0 ? t1 - sl->t0 : 0;
	account(sl->is_read ? &b->rd : &b->wr, lat, (uint64_t)res, (uint64_t)res != b->bs);
}

/* The kernel is short of resources (-EAGAIN, -EBUSY) and nothing came
 * back: let it breathe instead of spinning. */
static void back_off(void)
{
	struct timespec ts = {.tv_sec = 0, .tv_nsec = BACKOFF_NS};

	nanosleep(&ts, NULL);
}

static inline int transient(int ret)
{
	return ret == -ETIME || ret == -EINTR || ret == -EAGAIN || ret == -EBUSY;
}

/* ------------------------------------------------------------ backend: own io_uring */

static int uring_prep(struct fx_bl *b, uint32_t s, void *buf, uint64_t off, int is_read)
{
	int fixed_file = (b->features & FX_BL_REGFILES) != 0;
	int fixed_buf = (b->features & FX_BL_FIXEDBUFS) != 0;
	int fd = fixed_file ? 0 : b->fd;
	struct io_uring_sqe *sqe = io_uring_get_sqe(&b->ring);

	if (!sqe)
		return -EBUSY;
	if (is_read) {
		if (fixed_buf)
			io_uring_prep_read_fixed(sqe, fd, buf, b->bs, off, (int)s);
		else
			io_uring_prep_read(sqe, fd, buf, b->bs, off);
	} else {
		if (fixed_buf)
			io_uring_prep_write_fixed(sqe, fd, buf, b->bs, off, (int)s);
		else
			io_uring_prep_write(sqe, fd, buf, b->bs, off);
	}
	if (fixed_file)
		sqe->flags |= IOSQE_FIXED_FILE;
	sqe->user_data = s;
	return 0;
}

static unsigned uring_unsubmitted(const struct fx_bl *b)
{
	return io_uring_sq_ready(&b->ring);
}

static int uring_submit(struct fx_bl *b, int wait)
{
	if (!wait)
		return io_uring_sq_ready(&b->ring) ? io_uring_submit(&b->ring) : 0;
	struct __kernel_timespec ts = {.tv_sec = 0, .tv_nsec = WAIT_SLICE_NS};
	struct io_uring_cqe *cqe = NULL;
	return io_uring_submit_and_wait_timeout(&b->ring, &cqe, 1, &ts, NULL);
}

static unsigned uring_reap(struct fx_bl *b, uint64_t t1)
{
	struct io_uring_cqe *cqe;
	unsigned head, n = 0;

	/* Completions that are no slot's (liburing's own timeout on kernels
	 * without IORING_FEAT_EXT_ARG) are consumed and ignored. */
	io_uring_for_each_cqe(&b->ring, head, cqe)
	{
		n++;
		complete(b, cqe->user_data, cqe->res, 0, t1);
	}
	io_uring_cq_advance(&b->ring, n);
	return n;
}

static void uring_drop_unsubmitted(struct fx_bl *b)
{
	(void)b; /* prepared SQEs go down with the next enter; they are waited for */
}

static void uring_exit(struct fx_bl *b)
{
	if (b->ring_ok)
		io_uring_queue_exit(&b->ring);
	b->ring_ok = 0;
}

static const struct backend uring_backend = {
	.kind = FX_BL_BACKEND_URING,
	.prep = uring_prep,
	.unsubmitted = uring_unsubmitted,
	.submit = uring_submit,
	.reap = uring_reap,
	.drop_unsubmitted = uring_drop_unsubmitted,
	.exit = uring_exit,
};

/* ------------------------------------------------------------ backend: fx_queue */

static int queue_prep(struct fx_bl *b, uint32_t s, void *buf, uint64_t off, int is_read)
{
	struct fx_req *r;

	if (b->nreqs >= b->depth)
		return -EBUSY; /* cannot happen: one request per busy slot at most */
	r = &b->reqs[b->nreqs++];
	memset(r, 0, sizeof(*r));
	r->tag = QTAG(s, b->slots[s].gen);
	r->addr = buf;
	r->len = b->bs;
	r->off = off;
	r->op = is_read ? FX_OP_READ : FX_OP_WRITE;
	return 0;
}

static unsigned queue_unsubmitted(const struct fx_bl *b)
{
	return b->nreqs;
}

/* The first n prepared requests were taken: keep the rest, in order. */
static void queue_taken(struct fx_bl *b, uint32_t n, uint64_t t0)
{
	for (uint32_t i = 0; i < n; i++) {
		struct slot *sl = &b->slots[QTAG_SLOT(b->reqs[i].tag)];

		sl->t0 = t0;
		sl->submitted = 1;
	}
	if (n < b->nreqs)
		memmove(b->reqs, b->reqs + n, (b->nreqs - n) * sizeof(*b->reqs));
	b->nreqs -= n;
}

static void queue_drop_unsubmitted(struct fx_bl *b)
{
	for (uint32_t i = 0; i < b->nreqs; i++)
		release_slot(b, QTAG_SLOT(b->reqs[i].tag));
	b->nreqs = 0;
}

/* fx_queue_submit refused the batch (-EINVAL, -EROFS, ...): it checks the
 * whole batch before it takes any, so offer them one at a time to find the
 * one it refuses; that I/O fails with the queue's errno, the ones before it
 * go down, the ones after it are dropped (the loop is stopping). */
static int queue_submit_one_by_one(struct fx_bl *b, int err)
{
	uint32_t k = 0;
	uint64_t t0 = now_ns();

	while (k < b->nreqs) {
		int ret = fx_queue_submit(b->q, &b->reqs[k], 1);
		if (ret == 1) {
			k++;
			continue;
		}
		if (ret == 0) {
			/* full before the refused one: the rest waits for the
			 * next pass, which finds it again */
			queue_taken(b, k, t0);
			return 0;
		}
		err = ret < 0 ? -ret : EIO;
		break;
	}
	queue_taken(b, k, t0);
	if (b->nreqs) {
		const struct fx_req *r = &b->reqs[0];
		fail_io(b, err, r->off, r->op == FX_OP_READ, 0);
		/* that one went nowhere: its slot is free, not in flight */
		release_slot(b, QTAG_SLOT(r->tag));
		memmove(b->reqs, b->reqs + 1, (b->nreqs - 1) * sizeof(*b->reqs));
		b->nreqs--;
	}
	return 0;
}

/* The queue holds none of the I/Os we handed it (someone else reaped their
 * completions, or it lost them): waiting for them would spin forever.  The
 * queue has nothing of ours in flight, so their slots are free again. */
static void queue_forget_lost(struct fx_bl *b)
{
	fail_backend(b, EIO);
	for (uint32_t s = 0; s < b->depth; s++)
		if (b->slots[s].busy && b->slots[s].submitted)
			release_slot(b, s);
}

static int queue_submit(struct fx_bl *b, int wait)
{
	if (b->stopping && b->nreqs)
		queue_drop_unsubmitted(b); /* submit nothing more */
	if (b->nreqs) {
		uint64_t t0 = now_ns();
		int ret = fx_queue_submit(b->q, b->reqs, b->nreqs);

		if (ret < 0) {
			queue_submit_one_by_one(b, -ret);
			if (b->stopping)
				queue_drop_unsubmitted(b);
		} else {
			queue_taken(b, (uint32_t)(ret < (int)b->nreqs ? ret : (int)b->nreqs), t0);
		}
	}
	if (fx_queue_pending(b->q) == 0) {
		if (b->inflight > b->nreqs) {
			queue_forget_lost(b);
			queue_drop_unsubmitted(b);
			return -EIO;
		}
		if (b->nreqs) {
			/* An idle queue that takes nothing: waiting would
			 * never end.  Never spin on it either. */
			fail_backend(b, EAGAIN);
			queue_drop_unsubmitted(b);
			return -EAGAIN;
		}
		return 0;
	}
	if (!wait)
		return 0;
	return fx_queue_wait(b->q, 1, QUEUE_WAIT_MS);
}

static unsigned queue_reap(struct fx_bl *b, uint64_t t1)
{
	unsigned total = 0;

	for (;;) {
		int n = fx_queue_reap(b->q, b->cqes, QUEUE_REAP_BATCH);
		if (n < 0) {
			fail_backend(b, -n);
			return total;
		}
		if (n > QUEUE_REAP_BATCH)
			n = QUEUE_REAP_BATCH;
		for (int i = 0; i < n; i++)
			complete(b, b->cqes[i].tag, b->cqes[i].res, b->cqes[i].status, t1);
		total += (unsigned)n;
		if (n < QUEUE_REAP_BATCH)
			return total;
	}
}

static void queue_exit(struct fx_bl *b)
{
	(void)b; /* the queue is the caller's */
}

static const struct backend queue_backend = {
	.kind = FX_BL_BACKEND_QUEUE,
	.prep = queue_prep,
	.unsubmitted = queue_unsubmitted,
	.submit = queue_submit,
	.reap = queue_reap,
	.drop_unsubmitted = queue_drop_unsubmitted,
	.exit = queue_exit,
};

/* ------------------------------------------------------------ create */

int fx_bl_create(const struct fx_bl_params *p, struct fx_bl **out)
{
	struct fx_bl *b;
	int ret;

	*out = NULL;
	if ((!p->queue && p->fd < 0) || p->bs == 0 || p->depth == 0 || p->nblocks == 0 || !p->bufs)
		return -EINVAL;
	if (p->queue && (p->flags & URING_OPTS))
		return -EINVAL;
	/* requests of someone else still on the queue: their completions
	 * would be reaped here, and never reach their owner */
	if (p->queue && fx_queue_pending(p->queue))
		return -EBUSY;
	if (p->nblocks > UINT64_MAX / p->bs || p->start > UINT64_MAX - p->nblocks * p->bs)
		return -EOVERFLOW;
	if (p->depth > FX_BL_MAX_DEPTH)
		return -EINVAL;
	/* NaN compares false both ways and would read as "all writes" */
	if (!(p->read_fraction >= 0.0 && p->read_fraction <= 1.0))
		return -EINVAL;
	if ((p->flags & FX_BL_STAMP) && p->bs < sizeof(uint64_t))
		return -EINVAL;
	for (uint32_t i = 0; i < p->depth; i++)
		if (!p->bufs[i])
			return -EINVAL;
	if (p->passes && p->nblocks > UINT64_MAX / p->passes)
		return -EOVERFLOW;

	b = calloc(1, sizeof(*b));
	if (!b)
		return -ENOMEM;
	b->slots = calloc(p->depth, sizeof(*b->slots));
	b->free_slots = calloc(p->depth, sizeof(*b->free_slots));
	if (p->queue)
		b->reqs = calloc(p->depth, sizeof(*b->reqs));
	if (!b->slots || !b->free_slots || (p->queue && !b->reqs)) {
		ret = -ENOMEM;
		goto fail;
	}
	b->fd = p->queue ? -1 : p->fd;
	b->q = p->queue;
	b->be = p->queue ? &queue_backend : &uring_backend;
	b->bs = p->bs;
	b->depth = p->depth;
	b->start = p->start;
	b->nblocks = p->nblocks;
	b->total = p->ios ? p->ios : p->passes ? p->nblocks * p->passes : 0;
	b->end_ns = p->end_ns;
	b->read_fraction = p->read_fraction;
	b->random = p->random;
	b->random_map = p->random_map;
	b->asked = p->flags;
	b->batch = p->batch_submit;
	b->stall_ns = p->stall_ns ? p->stall_ns : FX_BL_STALL_LIMIT_NS;
	b->bufs = p->bufs;
	b->rng = p->seed ^ 0x6A09E667F3BCC909ull;
	unsigned bits = 2;
	while (bits < 64 && (1ull << bits) < p->nblocks)
		bits++;
	bits += bits & 1;
	b->half = bits / 2;
	b->half_mask = (1ull << b->half) - 1;
	load_keys(b, 0);
	for (uint32_t i = 0; i < p->depth; i++)
		b->free_slots[i] = p->depth - 1 - i;
	b->nfree = p->depth;
	if (b->q) {
		*out = b;
		return 0;
	}

	ret = ring_setup(b, p->depth);
	if (ret < 0)
		goto fail;
	b->ring_ok = 1;

	if (b->asked & FX_BL_REGFILES) {
		ret = io_uring_register_files(&b->ring, &b->fd, 1);
		if (ret == 0) {
			b->features |= FX_BL_REGFILES;
		} else {
			b->refused |= FX_BL_REGFILES;
			b->refused_errno[1] = -ret;
		}
	}
	if (b->asked & FX_BL_FIXEDBUFS) {
		struct iovec *iov = calloc(p->depth, sizeof(*iov));
		if (!iov) {
			ret = -ENOMEM;
		} else {
			for (uint32_t i = 0; i < p->depth; i++) {
				iov[i].iov_base = p->bufs[i];
				iov[i].iov_len = p->bs;
			}
			ret = io_uring_register_buffers(&b->ring, iov, p->depth);
			free(iov);
		}
		if (ret == 0) {
			b->features |= FX_BL_FIXEDBUFS;
		} else {
			b->refused |= FX_BL_FIXEDBUFS;
			b->refused_errno[2] = -ret;
		}
	}
	if (b->asked & FX_BL_REGRING) {
		/* Held by this thread: fx_bl_run must be called from the thread
		 * that created the loop (the benchmark's job process does). */
		ret = io_uring_register_ring_fd(&b->ring);
		if (ret == 1) {
			b->features |= FX_BL_REGRING;
		} else {
			b->refused |= FX_BL_REGRING;
			b->refused_errno[3] = ret < 0 ? -ret : EINVAL;
		}
	}
	*out = b;
	return 0;
fail:
	free(b->slots);
	free(b->free_slots);
	free(b->reqs);
	free(b);
	return ret;
}

unsigned fx_bl_features(const struct fx_bl *b)
{
	return b->features;
}

unsigned fx_bl_refused(const struct fx_bl *b, int *errnos)
{
	if (errnos)
		memcpy(errnos, b->refused_errno, sizeof(b->refused_errno));
	return b->refused;
}

/* ------------------------------------------------------------ the loop */

/* fio's "IO depths": the n I/Os of a refill, counted at the depth the
 * refill brought the queue to.  (Also when they went down one at a time:
 * fio, which submits each as it is ready, counts a steady iodepth=8 job
 * 99% at 8, not spread over the depths each submit passed through.) */
static void count_depth(struct fx_bl *b, unsigned n)
{
	uint64_t d = b->inflight;

	if (n)
		b->depths[d > FX_BL_MAX_DEPTH_HIST ? FX_BL_MAX_DEPTH_HIST : d] += n;
}

/*
 * Prepare the next I/O of the pattern in every free slot.  With b->batch
 * (fio's iodepth_batch_submit), every b->batch prepared I/Os are handed
 * over at once rather than all of the refill with the next wait: on a
 * virtualised disk a refill that goes down as one batch (one plug, one
 * notification of the device) comes back as one burst, and the device
 * serves fewer I/Os per second at the same depth.  Each I/O's clock then
 * starts when it is prepared, so the hand-over of the ones before it is
 * not in its latency (as fio stamps each I/O when it queues it).
 */
static void fill(struct fx_bl *b, uint64_t t0)
{
	unsigned n = 0;     /* prepared in this refill */
	unsigned ready = 0; /* prepared since the last hand-over */
	int full = 0;       /* the backend left some unsubmitted: no more tries now */
	int stamp = (b->asked & FX_BL_STAMP) != 0;

	if (b->stopping)
		return;
	while (b->nfree && !(b->total && b->issued >= b->total)) {
		uint32_t s = b->free_slots[b->nfree - 1];
		void *buf = b->bufs[s];
		uint64_t i = b->issued, rng = b->rng, off;
		int is_read;

		next_io(b, &off, &is_read);
		if (!is_read && stamp)
			memcpy(buf, &off, sizeof(off));
		if (b->be->prep(b, s, buf, off, is_read) < 0) {
			/* no room: this I/O is the next one again */
			b->issued = i;
			b->rng = rng;
			break;
		}
		b->nfree--;
		b->slots[s].t0 = b->batch ? now_ns() : t0;
		b->slots[s].off = off;
		b->slots[s].is_read = is_read;
		b->slots[s].busy = 1;
		/* a ring's SQE completes only once the kernel took it; a queue's
		 * request is handed over by queue_taken */
		b->slots[s].submitted = !b->q;
		b->inflight++;
		n++;
		ready++;
		if (b->batch && !full && ready >= b->batch) {
			int ret = b->be->submit(b, 0);

			if (ret < 0 && !transient(ret))
				fail_backend(b, -ret);
			if (b->stopping) /* (the backend failed, or refused an I/O) */
				break;
			ready = 0;
			/* A ring that said EAGAIN or EBUSY, or a queue that took
			 * only some (it is full): the rest goes with the next
			 * wait.  (Not the ring's sq_ready: under SQPOLL it also
			 * counts entries handed over that the kernel's thread has
			 * not picked up yet.) */
			full = ret < 0 || (b->q && b->be->unsubmitted(b) != 0);
		}
	}
	count_depth(b, n);
}

int fx_bl_run(struct fx_bl *b, uint64_t slice_end_ns)
{
	const struct backend *be = b->be;

	for (;;) {
		fill(b, now_ns());
		if (b->stopping)
			be->drop_unsubmitted(b);
		if (b->inflight == 0 && be->unsubmitted(b) == 0)
			return b->err ? -b->err : 1;
		/* (after a backend failure the calls go on: what is in flight
		 * still drains, until the backend fails again) */

		int ret = be->submit(b, 1);
		uint64_t t1 = now_ns();

		if (ret < 0 && !transient(ret)) {
			/* The backend itself failed: nothing more will complete
			 * that we could wait for.  Reported as its failure, with
			 * no I/O's offset. */
			fail_backend(b, -ret);
			return ret;
		}
		unsigned got = be->reap(b, t1);
		if (b->ring_err)
			return -b->err;
		if (got || !b->inflight || !b->progress_ns) {
			b->progress_ns = t1;
		} else if (be == &uring_backend && t1 - b->progress_ns >= b->stall_ns) {
			/* I/O in flight and not one completion for stall_ns: the
			 * kernel has lost them (seen once: 16 writes taken from the
			 * SQ, no CQE ever, nothing at the disk).  Fail the run with a
			 * clear error; close() then gives up on what is in flight and
			 * keeps its buffers. */
			fail_backend(b, ETIMEDOUT);
			return -ETIMEDOUT;
		}
		if (b->end_ns && t1 >= b->end_ns)
			b->stopping = 1;
		if (!got && (ret == -EAGAIN || ret == -EBUSY))
			back_off();
		if (ret == -EINTR || t1 >= slice_end_ns) {
			/* Leave the queue full while Python looks at the slice:
			 * refill the freed slots and submit them without waiting. */
			fill(b, now_ns());
			if (b->stopping)
				be->drop_unsubmitted(b);
			ret = be->submit(b, 0);
			if (ret < 0 && !transient(ret)) {
				fail_backend(b, -ret);
				return ret;
			}
			return 0;
		}
	}
}

int fx_bl_queue_foreign_nop(struct fx_bl *b)
{
	if (b->be != &uring_backend)
		return -EOPNOTSUPP;
	struct io_uring_sqe *sqe = io_uring_get_sqe(&b->ring);

	if (!sqe)
		return -EBUSY;
	io_uring_prep_nop(sqe);
	sqe->user_data = UINT64_MAX;
	return 0;
}

void fx_bl_stop(struct fx_bl *b)
{
	b->stopping = 1;
}

uint64_t fx_bl_stall_ns(const struct fx_bl *b)
{
	return b->stall_ns;
}

int fx_bl_ring_failed(const struct fx_bl *b)
{
	return b->ring_err ? b->err : 0;
}

void fx_bl_error(const struct fx_bl *b, int *err, uint64_t *off, int *is_read)
{
	*err = b->err;
	*off = b->err_off;
	*is_read = b->err_read;
}

unsigned fx_bl_error_status(const struct fx_bl *b)
{
	return b->err_status;
}

int fx_bl_backend(const struct fx_bl *b)
{
	return b->be->kind;
}

const struct fx_bl_dir *fx_bl_stats(const struct fx_bl *b, int is_read)
{
	return is_read ? &b->rd : &b->wr;
}

const uint64_t *fx_bl_depths(const struct fx_bl *b)
{
	return b->depths;
}

uint64_t fx_bl_inflight(const struct fx_bl *b)
{
	return b->inflight;
}

int fx_bl_destroy(struct fx_bl *b)
{
	return fx_bl_destroy_within(b, DRAIN_LIMIT_NS);
}

int fx_bl_destroy_within(struct fx_bl *b, uint64_t limit_ns)
{
	int ret = 0;

	if (!b)
		return 0;
	if (b->ring_ok || b->q) {
		const struct backend *be = b->be;
		uint64_t deadline = now_ns() + limit_ns;

		b->stopping = 1;
		be->drop_unsubmitted(b);
		while ((b->inflight || be->unsubmitted(b)) && now_ns() < deadline) {
			int r = be->submit(b, 1);

			if (r < 0 && !transient(r))
				break;
			unsigned got = be->reap(b, now_ns());
			if (!got && (r == -EAGAIN || r == -EBUSY))
				back_off();
		}
		/* Gave up on I/O still in flight: the kernel (or the queue) may
		 * still write into its buffers, so the caller must not free them. */
		if (b->inflight)
			ret = -EBUSY;
		be->exit(b);
	}
	free(b->slots);
	free(b->free_slots);
	free(b->reqs);
	free(b);
	return ret;
}
