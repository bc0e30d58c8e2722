/*
 * The benchmark's I/O loop in C (see bench_loop.h).
 *
 * One pass of the loop: take a clock reading, fill every free slot with the
 * next I/O of the access pattern, then one io_uring_enter submits the batch
 * and waits for at least one completion; every completion that is there is
 * accounted (its latency goes into the histogram) and its slot is free for
 * the next pass.  The pattern (sequential, a keyed permutation of the region
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

#define WAIT_SLICE_NS 250000000ull /* longest wait before looking at the clock */
#define DRAIN_LIMIT_NS 30000000000ull
#define BACKOFF_NS 50000 /* 50 us */

struct slot {
	uint64_t t0;
	uint64_t off;
	int is_read;
};

struct fx_bl {
	struct io_uring ring;
	int ring_ok;
	int fd;
	uint32_t bs;
	uint32_t depth;
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
	uint64_t pass;     /* pass whose keys are loaded */
	uint64_t keys[4];
	unsigned half;
	uint64_t half_mask;
	uint64_t domain;   /* 1 << (2 * half) */

	void *const *bufs;
	struct slot *slots;
	uint32_t *free_slots;
	uint32_t nfree;
	uint64_t inflight;
	int stopping;
	int err;
	int ring_err; /* the failure was the ring's, not an I/O's */
	uint64_t err_off;
	int err_read;

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

int fx_bl_create(const struct fx_bl_params *p, struct fx_bl **out)
{
	struct fx_bl *b;
	int ret;

	*out = NULL;
	if (p->fd < 0 || p->bs == 0 || p->depth == 0 || p->nblocks == 0 || !p->bufs)
		return -EINVAL;
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
	if (!b->slots || !b->free_slots) {
		ret = -ENOMEM;
		goto fail;
	}
	b->fd = p->fd;
	b->bs = p->bs;
	b->depth = p->depth;
	b->start = p->start;
	b->nblocks = p->nblocks;
	b->total = p->passes ? p->nblocks * p->passes : 0;
	b->end_ns = p->end_ns;
	b->read_fraction = p->read_fraction;
	b->random = p->random;
	b->random_map = p->random_map;
	b->asked = p->flags;
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

static inline void fail_io(struct fx_bl *b, int err, uint64_t off, int is_read)
{
	if (!b->err) {
		b->err = err;
		b->err_off = off;
		b->err_read = is_read;
	}
	b->stopping = 1;
}

/* Queue the next I/O of the pattern into every free slot; how many. */
static unsigned fill(struct fx_bl *b, uint64_t t0)
{
	unsigned n = 0;
	int fixed_file = (b->features & FX_BL_REGFILES) != 0;
	int fixed_buf = (b->features & FX_BL_FIXEDBUFS) != 0;
	int stamp = (b->asked & FX_BL_STAMP) != 0;

	while (b->nfree && !(b->total && b->issued >= b->total)) {
		uint64_t off;
		int is_read;
		struct io_uring_sqe *sqe = io_uring_get_sqe(&b->ring);

		if (!sqe)
			break;
		next_io(b, &off, &is_read);
		uint32_t s = b->free_slots[--b->nfree];
		void *buf = b->bufs[s];
		int fd = fixed_file ? 0 : b->fd;

		if (is_read) {
			if (fixed_buf)
				io_uring_prep_read_fixed(sqe, fd, buf, b->bs, off, (int)s);
			else
				io_uring_prep_read(sqe, fd, buf, b->bs, off);
		} else {
			if (stamp)
				memcpy(buf, &off, sizeof(off));
			if (fixed_buf)
				io_uring_prep_write_fixed(sqe, fd, buf, b->bs, off, (int)s);
			else
				io_uring_prep_write(sqe, fd, buf, b->bs, off);
		}
		if (fixed_file)
			sqe->flags |= IOSQE_FIXED_FILE;
		sqe->user_data = s;
		b->slots[s].t0 = t0;
		b->slots[s].off = off;
		b->slots[s].is_read = is_read;
		b->inflight++;
		n++;
	}
	return n;
}

/* Account every completion that is there; returns how many. */
static unsigned reap(struct fx_bl *b, uint64_t t1)
{
	struct io_uring_cqe *cqe;
	unsigned head, n = 0;

	io_uring_for_each_cqe(&b->ring, head, cqe) {
		n++;
		/* Not ours (liburing's own timeout on kernels without
		 * IORING_FEAT_EXT_ARG): not one of the I/Os in flight. */
		if (cqe->user_data >= b->depth)
			continue;
		b->inflight--;
		uint32_t s = (uint32_t)cqe->user_data;
		struct slot *sl = &b->slots[s];
		int res = cqe->res;

		b->free_slots[b->nfree++] = s;
		if (res <= 0) {
			fail_io(b, res < 0 ? -res : ENODATA, sl->off, sl->is_read);
			continue;
		}
		uint64_t lat = t1 > sl->t0 ? t1 - sl->t0 : 0;
		account(sl->is_read ? &b->rd : &b->wr, lat, (uint64_t)res, (uint32_t)res != b->bs);
	}
	io_uring_cq_advance(&b->ring, n);
	return n;
}

static void fill_counted(struct fx_bl *b, uint64_t t0)
{
	unsigned n;

	if (b->stopping)
		return;
	n = fill(b, t0);
	if (n) {
		uint64_t d = b->inflight;
		b->depths[d > FX_BL_MAX_DEPTH_HIST ? FX_BL_MAX_DEPTH_HIST : d] += n;
	}
}

/* The kernel is short of resources (-EAGAIN, -EBUSY) and nothing came
 * back: let it breathe instead of spinning on io_uring_enter. */
static void back_off(void)
{
	struct timespec ts = {.tv_sec = 0, .tv_nsec = BACKOFF_NS};

	nanosleep(&ts, NULL);
}

int fx_bl_run(struct fx_bl *b, uint64_t slice_end_ns)
{
	for (;;) {
		fill_counted(b, now_ns());
		if (b->inflight == 0 && io_uring_sq_ready(&b->ring) == 0)
			return b->err ? -b->err : 1;

		struct __kernel_timespec ts = {.tv_sec = 0, .tv_nsec = WAIT_SLICE_NS};
		struct io_uring_cqe *cqe = NULL;
		int ret = io_uring_submit_and_wait_timeout(&b->ring, &cqe, 1, &ts, NULL);
		uint64_t t1 = now_ns();

		if (ret < 0 && ret != -ETIME && ret != -EINTR && ret != -EAGAIN && ret != -EBUSY) {
			/* The ring itself failed: nothing more will complete that we
			 * could wait for.  Reported as the ring's failure, with no
			 * I/O's offset. */
			if (!b->err) {
				b->err = -ret;
				b->ring_err = 1;
				b->err_off = 0;
				b->err_read = 0;
			}
			b->stopping = 1;
			return ret;
		}
		unsigned got = reap(b, t1);
		if (b->end_ns && t1 >= b->end_ns)
			b->stopping = 1;
		if (!got && (ret == -EAGAIN || ret == -EBUSY))
			back_off();
		if (ret == -EINTR || t1 >= slice_end_ns) {
			/* Leave the queue full while Python looks at the slice:
			 * refill the freed slots and submit them without waiting. */
			fill_counted(b, now_ns());
			if (io_uring_sq_ready(&b->ring))
				io_uring_submit(&b->ring);
			return 0;
		}
	}
}

int fx_bl_queue_foreign_nop(struct fx_bl *b)
{
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
	if (b->ring_ok) {
		uint64_t deadline = now_ns() + limit_ns;

		b->stopping = 1;
		while (b->inflight && now_ns() < deadline) {
			struct __kernel_timespec ts = {.tv_sec = 0, .tv_nsec = WAIT_SLICE_NS};
			struct io_uring_cqe *cqe = NULL;
			int ret = io_uring_submit_and_wait_timeout(&b->ring, &cqe, 1, &ts, NULL);

			if (ret < 0 && ret != -ETIME && ret != -EINTR && ret != -EAGAIN && ret != -EBUSY)
				break;
			if (!reap(b, now_ns()) && (ret == -EAGAIN || ret == -EBUSY))
				back_off();
		}
		/* Gave up on I/O still in flight: the kernel may still write
		 * into its buffers, so the caller must not free them. */
		if (b->inflight)
			ret = -EBUSY;
		io_uring_queue_exit(&b->ring);
	}
	free(b->slots);
	free(b->free_slots);
	free(b);
	return ret;
}
