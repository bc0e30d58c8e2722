/*
 * The benchmark's C I/O loop (csrc/bench_loop.c) without Python: histogram
 * layout and percentiles on known values, every block of a random-map write
 * pass written exactly once (read back from the file), a failed I/O coming
 * back with its errno and offset, and no leak on any path (SANITIZE=1).
 * The fx_queue backend runs over a queue made here (fx_queue_* below, in
 * place of the core's): it takes at most a few requests per submit, answers
 * out of order, refuses requests past its end as a transport does, and
 * fails chosen offsets with an NVMe status.
 */
#include "bench_loop.h"
#include "check.h"
#include "fx100io.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static uint64_t mono_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int run_to_end(struct fx_bl *b)
{
	int rc;

	while ((rc = fx_bl_run(b, mono_ns() + 50000000ull)) == 0)
		;
	return rc;
}

static void test_buckets(void)
{
	/* exact below 2 * SUB, then every bucket's midpoint maps to itself */
	for (uint64_t v = 0; v < FX_BL_EXACT; v++) {
		CHECK_EQ(fx_bl_bucket(v), v);
		CHECK_EQ(fx_bl_bucket_value((uint32_t)v), v);
	}
	/* (values clamp at INT64_MAX, as in Python: the top buckets stay empty) */
	for (uint32_t i = FX_BL_EXACT;
	     i < FX_BL_NBUCKETS && fx_bl_bucket_value(i) <= (uint64_t)INT64_MAX; i++)
		CHECK_EQ(fx_bl_bucket(fx_bl_bucket_value(i)), i);
	uint32_t prev = 0;
	uint64_t s = 1;
	for (int k = 0; k < 100000; k++) {
		uint64_t v = test_rand(&s) >> (test_rand(&s) % 64);
		uint32_t b = fx_bl_bucket(v);
		CHECK(b < FX_BL_NBUCKETS);
		if (v >= FX_BL_EXACT && v <= (uint64_t)INT64_MAX) { /* within 1/SUB of the value */
			uint64_t m = fx_bl_bucket_value(b);
			CHECK((m > v ? m - v : v - m) <= v / FX_BL_SUB);
		}
	}
	for (uint64_t v = 1; v < (1ull << 40); v = v * 3 + 1) {
		uint32_t b = fx_bl_bucket(v);
		CHECK(b >= prev);
		prev = b;
	}
	CHECK_EQ(fx_bl_bucket(UINT64_MAX), fx_bl_bucket((uint64_t)INT64_MAX));
	CHECK(fx_bl_bucket(UINT64_MAX) < FX_BL_NBUCKETS);
}

static void test_percentiles(void)
{
	static struct fx_bl_dir d;

	memset(&d, 0, sizeof(d));
	CHECK_EQ(fx_bl_percentile(&d, 50), 0);
	/* 100 samples: 1..100 ns, exact buckets */
	for (uint64_t v = 1; v <= 100; v++)
		d.counts[fx_bl_bucket(v)]++;
	d.ios = 100;
	d.min_ns = 1;
	d.max_ns = 100;
	CHECK_EQ(fx_bl_percentile(&d, 1), 1);
	CHECK_EQ(fx_bl_percentile(&d, 50), 50);
	CHECK_EQ(fx_bl_percentile(&d, 50.5), 51); /* nearest rank rounds up */
	CHECK_EQ(fx_bl_percentile(&d, 99.99), 100);
	CHECK_EQ(fx_bl_percentile(&d, 100), 100);
	CHECK_EQ(fx_bl_percentile(&d, 0), 0);

	/* exact ranks where pct / 100 * n is not exact in binary: p99.9 of
	 * 1000 samples is rank 999, p99.99 of 10000 is rank 9999 */
	memset(&d, 0, sizeof(d));
	d.counts[10] = 999;
	d.counts[200] = 1;
	d.ios = 1000;
	d.min_ns = 10;
	d.max_ns = 200;
	CHECK_EQ(fx_bl_percentile(&d, 99.9), 10);
	CHECK_EQ(fx_bl_percentile(&d, 99.91), 200);
	CHECK_EQ(fx_bl_percentile(&d, 100), 200);
	d.counts[10] = 9999;
	d.ios = 10000;
	CHECK_EQ(fx_bl_percentile(&d, 99.99), 10);
	CHECK_EQ(fx_bl_percentile(&d, 99.995), 200);
	/* 0.1 * 30 = 3.0000000000000004 in doubles: rank 3, not 4 */
	memset(&d, 0, sizeof(d));
	for (uint64_t v = 1; v <= 30; v++)
		d.counts[v]++;
	d.ios = 30;
	d.min_ns = 1;
	d.max_ns = 30;
	CHECK_EQ(fx_bl_percentile(&d, 10), 3);
}

static char path[] = "/tmp/fx100io-test-bench-loop.XXXXXX";

static void test_write_pass_and_errors(void)
{
	enum { BS = 4096, N = 200, DEPTH = 8 };
	int fd = mkstemp(path);
	CHECK(fd >= 0);
	CHECK_EQ(ftruncate(fd, (off_t)N * BS), 0);
	close(fd);
	fd = open(path, O_RDWR | O_DIRECT);
	if (fd < 0) { /* a filesystem without O_DIRECT: buffered is enough here */
		fd = open(path, O_RDWR);
		CHECK(fd >= 0);
	}
	void *bufs[DEPTH];
	for (int i = 0; i < DEPTH; i++) {
		CHECK_EQ(posix_memalign(&bufs[i], 4096, BS), 0);
		memset(bufs[i], 0xA5, BS);
	}
	unsigned flag_sets[] = {0, FX_BL_REGFILES | FX_BL_FIXEDBUFS | FX_BL_REGRING};
	for (unsigned f = 0; f < 2; f++) {
		struct fx_bl_params p = {
			.fd = fd,
			.bs = BS,
			.depth = DEPTH,
			.start = 0,
			.nblocks = N,
			.passes = 1,
			.seed = 3 + f,
			.read_fraction = 0.0,
			.random = 1,
			.random_map = 1,
			.flags = flag_sets[f] | FX_BL_STAMP,
			.bufs = bufs,
		};
		struct fx_bl *b;
		CHECK_EQ(fx_bl_create(&p, &b), 0);
		CHECK_EQ(run_to_end(b), 1);
		const struct fx_bl_dir *w = fx_bl_stats(b, 0);
		CHECK_EQ(w->ios, N);
		CHECK_EQ(w->bytes, (uint64_t)N * BS);
		uint64_t sum = 0;
		for (uint32_t i = 0; i < FX_BL_NBUCKETS; i++)
			sum += w->counts[i];
		CHECK_EQ(sum, N);
		CHECK_EQ(fx_bl_stats(b, 1)->ios, 0);
		CHECK_EQ(fx_bl_inflight(b), 0);
		fx_bl_destroy(b);

		static unsigned char blk[BS] __attribute__((aligned(4096)));
		for (uint64_t i = 0; i < N; i++) {
			CHECK_EQ(pread(fd, blk, BS, (off_t)(i * BS)), BS);
			uint64_t off;
			memcpy(&off, blk, sizeof(off));
			CHECK_EQ(off, i * BS);
			CHECK_EQ(blk[8], 0xA5);
			CHECK_EQ(blk[BS - 1], 0xA5);
		}
		CHECK_EQ(ftruncate(fd, 0), 0);
		CHECK_EQ(ftruncate(fd, (off_t)N * BS), 0);
	}

	/* reading past the end: the first short I/O ends the run, the rest drain */
	struct fx_bl_params p = {
		.fd = fd,
		.bs = BS,
		.depth = DEPTH,
		.nblocks = 2 * N,
		.passes = 1,
		.read_fraction = 1.0,
		.bufs = bufs,
	};
	struct fx_bl *b;
	CHECK_EQ(fx_bl_create(&p, &b), 0);
	CHECK_EQ(run_to_end(b), -ENODATA);
	int err, is_read;
	uint64_t off;
	fx_bl_error(b, &err, &off, &is_read);
	CHECK_EQ(err, ENODATA);
	CHECK_EQ(off, (uint64_t)N * BS);
	CHECK_EQ(is_read, 1);
	CHECK_EQ(fx_bl_inflight(b), 0);
	fx_bl_destroy(b);

	/* stop: an unbounded run ends and drains */
	p.nblocks = N;
	p.passes = 0;
	CHECK_EQ(fx_bl_create(&p, &b), 0);
	CHECK_EQ(fx_bl_run(b, 0), 0);
	fx_bl_stop(b);
	CHECK_EQ(run_to_end(b), 1);
	CHECK(fx_bl_stats(b, 1)->ios > 0);
	fx_bl_destroy(b);

	/* refused arguments, no leak */
	p.nblocks = 0;
	CHECK_EQ(fx_bl_create(&p, &b), -EINVAL);
	CHECK(b == NULL);
	p.nblocks = 1;
	p.bs = 4;
	p.flags = FX_BL_STAMP;
	CHECK_EQ(fx_bl_create(&p, &b), -EINVAL);
	p.bs = BS;
	p.flags = 0;
	p.nblocks = UINT64_MAX / 2;
	CHECK_EQ(fx_bl_create(&p, &b), -EOVERFLOW);
	/* read_fraction outside [0, 1] or NaN is refused (NaN read as all writes) */
	p.nblocks = N;
	p.read_fraction = 0.0 / 0.0;
	CHECK_EQ(fx_bl_create(&p, &b), -EINVAL);
	p.read_fraction = 1.5;
	CHECK_EQ(fx_bl_create(&p, &b), -EINVAL);
	p.read_fraction = -0.1;
	CHECK_EQ(fx_bl_create(&p, &b), -EINVAL);
	p.read_fraction = 1.0;
	p.depth = FX_BL_MAX_DEPTH + 1;
	CHECK_EQ(fx_bl_create(&p, &b), -EINVAL);
	p.depth = DEPTH;

	/* at the end of a slice the freed slots are refilled and submitted:
	 * the queue stays at its depth while the caller looks */
	p.passes = 0;
	CHECK_EQ(fx_bl_create(&p, &b), 0);
	for (int k = 0; k < 5; k++) {
		CHECK_EQ(fx_bl_run(b, 0), 0);
		CHECK_EQ(fx_bl_inflight(b), DEPTH);
	}
	/* destroying with I/O in flight waits for it: everything came back */
	CHECK_EQ(fx_bl_destroy(b), 0);

	/* a completion that is none of the loop's I/Os leaves the count of
	 * I/Os in flight alone: the run still waits for every one of its own */
	p.passes = 1;
	p.nblocks = N;
	CHECK_EQ(fx_bl_create(&p, &b), 0);
	CHECK_EQ(fx_bl_run(b, 0), 0);
	for (int k = 0; k < 3; k++) {
		CHECK_EQ(fx_bl_queue_foreign_nop(b), 0);
		CHECK_EQ(fx_bl_run(b, 0), 0);
	}
	CHECK_EQ(run_to_end(b), 1);
	CHECK_EQ(fx_bl_stats(b, 1)->ios, N);
	CHECK_EQ(fx_bl_inflight(b), 0);
	CHECK_EQ(fx_bl_destroy(b), 0);

	/* end_ns ends an unbounded run by itself */
	p.passes = 0;
	p.end_ns = mono_ns() + 20000000ull;
	CHECK_EQ(fx_bl_create(&p, &b), 0);
	CHECK_EQ(run_to_end(b), 1);
	CHECK(fx_bl_stats(b, 1)->ios > 0);
	CHECK_EQ(fx_bl_inflight(b), 0);
	CHECK_EQ(fx_bl_destroy(b), 0);
	p.end_ns = 0;

	for (int i = 0; i < DEPTH; i++)
		free(bufs[i]);
	close(fd);
	unlink(path);
}

/* Uniform random (no random map): N writes land on random blocks, some
 * twice, so fewer than N distinct blocks are written, every one stamped
 * with its own offset; the same seed gives the same blocks. */
static void test_uniform_random(void)
{
	enum { BS = 4096, N = 200, DEPTH = 4 };
	char upath[] = "/tmp/fx100io-test-bench-uniform.XXXXXX";
	int fd = mkstemp(upath);
	CHECK(fd >= 0);
	void *bufs[DEPTH];
	for (int i = 0; i < DEPTH; i++) {
		CHECK_EQ(posix_memalign(&bufs[i], 4096, BS), 0);
		memset(bufs[i], 0x11, BS);
	}
	static unsigned char blk[BS];
	unsigned distinct[2] = {0, 0};
	static uint8_t seen[2][N];
	for (int round = 0; round < 2; round++) {
		CHECK_EQ(ftruncate(fd, 0), 0);
		CHECK_EQ(ftruncate(fd, (off_t)N * BS), 0);
		struct fx_bl_params p = {
			.fd = fd,
			.bs = BS,
			.depth = DEPTH,
			.nblocks = N,
			.passes = 1,
			.seed = 99,
			.read_fraction = 0.0,
			.random = 1,
			.random_map = 0,
			.flags = FX_BL_STAMP,
			.bufs = bufs,
		};
		struct fx_bl *b;
		CHECK_EQ(fx_bl_create(&p, &b), 0);
		CHECK_EQ(run_to_end(b), 1);
		CHECK_EQ(fx_bl_stats(b, 0)->ios, N);
		CHECK_EQ(fx_bl_destroy(b), 0);
		for (uint64_t i = 0; i < N; i++) {
			CHECK_EQ(pread(fd, blk, BS, (off_t)(i * BS)), BS);
			uint64_t off;
			memcpy(&off, blk, sizeof(off));
			seen[round][i] = blk[8] == 0x11;
			if (seen[round][i]) {
				CHECK_EQ(off, i * BS);
				distinct[round]++;
			} else {
				CHECK_EQ(off, 0); /* a hole: never written */
			}
		}
	}
	CHECK(distinct[0] > N / 2 && distinct[0] < N);
	CHECK_EQ(distinct[0], distinct[1]);
	CHECK(memcmp(seen[0], seen[1], N) == 0);
	for (int i = 0; i < DEPTH; i++)
		free(bufs[i]);
	close(fd);
	unlink(upath);
}

/* ios (fio's io_size, number_ios) in place of passes: fewer than a pass
 * ends early, more wraps around (which blocks: tests/bench/test_bench_loop.py). */
static void test_ios_instead_of_passes(void)
{
	enum { BS = 4096, N = 64, DEPTH = 4 };
	char ipath[] = "/tmp/fx100io-test-bench-ios.XXXXXX";
	int fd = mkstemp(ipath);
	CHECK(fd >= 0);
	CHECK_EQ(ftruncate(fd, (off_t)N * BS), 0);
	void *bufs[DEPTH];
	for (int i = 0; i < DEPTH; i++)
		CHECK_EQ(posix_memalign(&bufs[i], 4096, BS), 0);
	uint64_t want[] = {N / 4, N * 5 / 2};
	for (int k = 0; k < 2; k++) {
		struct fx_bl_params p = {
			.fd = fd,
			.bs = BS,
			.depth = DEPTH,
			.nblocks = N,
			.passes = 1,
			.ios = want[k],
			.seed = 7,
			.read_fraction = 1.0,
			.random = 1,
			.random_map = 1,
			.bufs = bufs,
		};
		struct fx_bl *b;
		CHECK_EQ(fx_bl_create(&p, &b), 0);
		CHECK_EQ(run_to_end(b), 1);
		CHECK_EQ(fx_bl_stats(b, 1)->ios, want[k]);
		CHECK_EQ(fx_bl_stats(b, 1)->bytes, want[k] * BS);
		CHECK_EQ(fx_bl_destroy(b), 0);
	}
	for (int i = 0; i < DEPTH; i++)
		free(bufs[i]);
	close(fd);
	unlink(ipath);
}

/* I/O that never completes (a read of an empty pipe): destroy gives up
 * after its limit and says so, so the caller keeps the buffers. */
static void test_destroy_gives_up(void)
{
	enum { BS = 4096, DEPTH = 2 };
	static unsigned char mem[DEPTH][BS];
	void *bufs[DEPTH] = {mem[0], mem[1]};
	int pfd[2];
	CHECK_EQ(pipe(pfd), 0);
	struct fx_bl_params p = {
		.fd = pfd[0],
		.bs = BS,
		.depth = DEPTH,
		.nblocks = 1,
		.passes = 0,
		.read_fraction = 1.0,
		.bufs = bufs,
	};
	struct fx_bl *b;
	CHECK_EQ(fx_bl_create(&p, &b), 0);
	CHECK_EQ(fx_bl_run(b, 0), 0);
	CHECK_EQ(fx_bl_inflight(b), DEPTH);
	CHECK_EQ(fx_bl_destroy_within(b, 20000000ull), -EBUSY);
	close(pfd[0]);
	close(pfd[1]);
}

/* ------------------------------------------------------------ a queue */

enum { FQ_MAX = 256 };

struct fx_queue {
	unsigned char *disk;
	uint64_t size;
	unsigned accept_max; /* requests one submit takes at most */
	unsigned cap;        /* accepted and not reaped, at most */
	uint64_t fail_off;   /* an I/O at this offset fails (UINT64_MAX: none) */
	int garbage;         /* also answer each request twice and with a tag of no request */
	int stale;           /* also answer a request kept back, and one answered before */
	int lose;            /* take requests and never answer them */
	uint64_t old_tag;    /* (stale) a tag answered before */
	int have_old;
	unsigned submits, waits;
	unsigned most_per_submit; /* the most requests one submit was offered */
	uint64_t *per_block;      /* I/Os seen per block */
	struct fx_cqe done[FQ_MAX];
	unsigned ndone;
};

int fx_queue_submit(struct fx_queue *q, const struct fx_req *reqs, unsigned n)
{
	q->submits++;
	if (n > q->most_per_submit)
		q->most_per_submit = n;
	for (unsigned k = 0; k < n; k++)
		if (reqs[k].op > FX_OP_WRITE || reqs[k].off + reqs[k].len > q->size)
			return -EINVAL;
	unsigned take = n < q->accept_max ? n : q->accept_max;
	if (take > q->cap - q->ndone)
		take = q->cap - q->ndone;
	if (q->lose)
		return (int)take;
	if (q->stale && q->ndone + 2 <= FQ_MAX) {
		struct fx_cqe *c;
		if (take < n) { /* a request it did not take */
			c = &q->done[q->ndone++];
			memset(c, 0, sizeof(*c));
			c->tag = reqs[take].tag;
			c->res = (int64_t)reqs[take].len;
		}
		if (q->have_old) { /* a late duplicate of an earlier answer */
			c = &q->done[q->ndone++];
			memset(c, 0, sizeof(*c));
			c->tag = q->old_tag;
			c->res = 4096;
		}
		if (take) {
			q->old_tag = reqs[0].tag;
			q->have_old = 1;
		}
	}
	for (unsigned k = 0; k < take; k++) {
		const struct fx_req *r = &reqs[k];
		struct fx_cqe *c = &q->done[q->ndone++];
		memset(c, 0, sizeof(*c));
		c->tag = r->tag;
		if (r->off == q->fail_off) {
			c->res = -EIO;
			c->status = 0x0281; /* unrecovered read error */
			continue;
		}
		if (r->op == FX_OP_READ)
			memcpy(r->addr, q->disk + r->off, r->len);
		else
			memcpy(q->disk + r->off, r->addr, r->len);
		if (q->per_block)
			q->per_block[r->off / r->len]++;
		c->res = (int64_t)r->len;
		if (q->garbage && q->ndone + 2 <= FQ_MAX) {
			q->done[q->ndone++] = *c;
			q->done[q->ndone] = *c;
			q->done[q->ndone++].tag = UINT64_MAX - r->tag;
		}
	}
	return (int)take;
}

/* Newest first: completions come back out of submission order. */
int fx_queue_reap(struct fx_queue *q, struct fx_cqe *out, unsigned max)
{
	unsigned n = 0;

	while (n < max && q->ndone)
		out[n++] = q->done[--q->ndone];
	return (int)n;
}

int fx_queue_wait(struct fx_queue *q, unsigned min, int timeout_ms)
{
	(void)timeout_ms;
	q->waits++;
	return q->ndone >= min ? (int)q->ndone : -ETIME;
}

unsigned fx_queue_pending(const struct fx_queue *q)
{
	return q->ndone;
}

/* One read pass of p over a queue that counts each block's I/Os: every
 * block read exactly once, nothing left in flight. */
static void read_pass_each_block_once(const struct fx_bl_params *p, uint64_t *per_block, uint64_t n)
{
	struct fx_bl *b;

	memset(per_block, 0, n * sizeof(*per_block));
	CHECK_EQ(fx_bl_create(p, &b), 0);
	CHECK_EQ(run_to_end(b), 1);
	CHECK_EQ(fx_bl_stats(b, 1)->ios, n);
	CHECK_EQ(fx_bl_inflight(b), 0);
	CHECK_EQ(fx_bl_destroy(b), 0);
	for (uint64_t i = 0; i < n; i++)
		CHECK_EQ(per_block[i], 1);
}

static void test_queue_backend(void)
{
	enum { BS = 4096, N = 100, DEPTH = 8 };
	static unsigned char disk[N * BS];
	static uint64_t per_block[N];
	static unsigned char mem[DEPTH][BS];
	void *bufs[DEPTH];
	struct fx_queue q = {
		.disk = disk,
		.size = sizeof(disk),
		.accept_max = 3,
		.cap = 5,
		.fail_off = UINT64_MAX,
		.per_block = per_block,
	};
	for (int i = 0; i < DEPTH; i++) {
		bufs[i] = mem[i];
		memset(mem[i], 0x5A, BS);
	}

	/* a write pass, random order: every block exactly once, stamped,
	 * though the queue takes 3 per call and holds 5 */
	struct fx_bl_params p = {
		.fd = -1,
		.bs = BS,
		.depth = DEPTH,
		.nblocks = N,
		.passes = 1,
		.seed = 9,
		.read_fraction = 0.0,
		.random = 1,
		.random_map = 1,
		.flags = FX_BL_STAMP,
		.bufs = bufs,
		.queue = &q,
	};
	struct fx_bl *b;
	CHECK_EQ(fx_bl_create(&p, &b), 0);
	CHECK_EQ(fx_bl_backend(b), FX_BL_BACKEND_QUEUE);
	CHECK_EQ(fx_bl_queue_foreign_nop(b), -EOPNOTSUPP);
	CHECK_EQ(run_to_end(b), 1);
	CHECK_EQ(fx_bl_stats(b, 0)->ios, N);
	CHECK_EQ(fx_bl_stats(b, 0)->bytes, (uint64_t)N * BS);
	CHECK_EQ(fx_bl_stats(b, 0)->short_ios, 0);
	CHECK_EQ(fx_bl_stats(b, 1)->ios, 0);
	CHECK_EQ(fx_bl_inflight(b), 0);
	uint64_t counted = 0, deep = 0;
	for (int d = 0; d <= FX_BL_MAX_DEPTH_HIST; d++) {
		counted += fx_bl_depths(b)[d];
		deep += d > DEPTH ? fx_bl_depths(b)[d] : 0;
	}
	CHECK_EQ(counted, N);
	CHECK_EQ(deep, 0);
	CHECK_EQ(fx_bl_destroy(b), 0);
	for (uint64_t i = 0; i < N; i++) {
		uint64_t off;
		memcpy(&off, disk + i * BS, sizeof(off));
		CHECK_EQ(off, i * BS);
		CHECK_EQ(disk[i * BS + 8], 0x5A);
		CHECK_EQ(disk[i * BS + BS - 1], 0x5A);
		CHECK_EQ(per_block[i], 1);
	}

	/* two sequential read passes, mixed into depth 1 too */
	for (uint32_t depth = 1; depth <= DEPTH; depth += DEPTH - 1) {
		memset(per_block, 0, sizeof(per_block));
		p.depth = depth;
		p.passes = 2;
		p.random = 0;
		p.read_fraction = 1.0;
		p.flags = 0;
		CHECK_EQ(fx_bl_create(&p, &b), 0);
		CHECK_EQ(run_to_end(b), 1);
		CHECK_EQ(fx_bl_stats(b, 1)->ios, 2 * N);
		CHECK_EQ(fx_bl_stats(b, 1)->bytes, 2ull * N * BS);
		CHECK_EQ(fx_bl_destroy(b), 0);
		for (uint64_t i = 0; i < N; i++)
			CHECK_EQ(per_block[i], 2);
	}
	p.depth = DEPTH;

	/* fio's iodepth_batch_submit: 1 offers each I/O on its own as soon
	 * as it is ready, 2 two at a time, 0 a whole refill at once; every
	 * block still read once per pass, and every I/O counted once in the
	 * depth histogram, with a queue that takes all and with one that
	 * takes 3 per call and holds 5 (requests kept back, offered again) */
	for (int takes_all = 1; takes_all >= 0; takes_all--) {
		for (uint32_t batch = 0; batch <= 2; batch++) {
			memset(per_block, 0, sizeof(per_block));
			q.most_per_submit = 0;
			q.accept_max = takes_all ? DEPTH : 3;
			q.cap = takes_all ? DEPTH : 5;
			p.passes = 1;
			p.batch_submit = batch;
			CHECK_EQ(fx_bl_create(&p, &b), 0);
			CHECK_EQ(run_to_end(b), 1);
			CHECK_EQ(fx_bl_stats(b, 1)->ios, N);
			uint64_t in_hist = 0;
			for (int d = 0; d <= FX_BL_MAX_DEPTH_HIST; d++)
				in_hist += fx_bl_depths(b)[d];
			CHECK_EQ(in_hist, N);
			/* as fio's "IO depths": a refill counted at the depth it
			 * brought the queue to, however it went down */
			if (takes_all)
				CHECK_EQ(fx_bl_depths(b)[1], 0);
			CHECK_EQ(fx_bl_inflight(b), 0);
			CHECK_EQ(fx_bl_destroy(b), 0);
			for (uint64_t i = 0; i < N; i++)
				CHECK_EQ(per_block[i], 1);
			if (takes_all)
				CHECK_EQ(q.most_per_submit, batch ? batch : DEPTH);
		}
	}

	/* ... and with one I/O at a time: a request refused mid-refill (past
	 * the end) ends the run with its errno and offset, the ones before it
	 * done, nothing left in flight; an idle queue that takes nothing is
	 * the backend's failure, no hang */
	p.batch_submit = 1;
	p.nblocks = N + 10;
	CHECK_EQ(fx_bl_create(&p, &b), 0);
	CHECK_EQ(run_to_end(b), -EINVAL);
	{
		int e, r;
		uint64_t o;
		fx_bl_error(b, &e, &o, &r);
		CHECK_EQ(e, EINVAL);
		CHECK_EQ(o, (uint64_t)N * BS);
	}
	CHECK_EQ(fx_bl_stats(b, 1)->ios, N);
	CHECK_EQ(fx_bl_inflight(b), 0);
	CHECK_EQ(fx_bl_destroy(b), 0);
	p.nblocks = N;
	q.accept_max = 0;
	CHECK_EQ(fx_bl_create(&p, &b), 0);
	CHECK_EQ(run_to_end(b), -EAGAIN);
	CHECK_EQ(fx_bl_inflight(b), 0);
	CHECK_EQ(fx_bl_destroy(b), 0);
	q.accept_max = 3;
	q.cap = 5;
	p.batch_submit = 0;

	/* an I/O the transport fails: its errno, offset, direction, status */
	q.fail_off = 37ull * BS;
	p.passes = 1;
	CHECK_EQ(fx_bl_create(&p, &b), 0);
	CHECK_EQ(run_to_end(b), -EIO);
	int err, is_read;
	uint64_t off;
	fx_bl_error(b, &err, &off, &is_read);
	CHECK_EQ(err, EIO);
	CHECK_EQ(off, 37ull * BS);
	CHECK_EQ(is_read, 1);
	CHECK_EQ(fx_bl_error_status(b), 0x0281);
	CHECK_EQ(fx_bl_ring_failed(b), 0);
	CHECK_EQ(fx_bl_inflight(b), 0);
	CHECK_EQ(fx_bl_destroy(b), 0);
	q.fail_off = UINT64_MAX;

	/* past the end: the queue refuses the request; the run ends with its
	 * errno at the first block past the end, the ones before it done */
	p.nblocks = N + 10;
	CHECK_EQ(fx_bl_create(&p, &b), 0);
	CHECK_EQ(run_to_end(b), -EINVAL);
	fx_bl_error(b, &err, &off, &is_read);
	CHECK_EQ(err, EINVAL);
	CHECK_EQ(off, (uint64_t)N * BS);
	CHECK_EQ(is_read, 1);
	CHECK_EQ(fx_bl_stats(b, 1)->ios, N);
	CHECK_EQ(fx_bl_inflight(b), 0);
	CHECK_EQ(fx_bl_destroy(b), 0);
	p.nblocks = N;

	/* stop: an unbounded run drains, nothing kept back is submitted */
	p.passes = 0;
	CHECK_EQ(fx_bl_create(&p, &b), 0);
	CHECK_EQ(fx_bl_run(b, 0), 0);
	fx_bl_stop(b);
	unsigned before = q.submits;
	CHECK_EQ(run_to_end(b), 1);
	CHECK_EQ(fx_bl_inflight(b), 0);
	CHECK(q.submits == before);
	CHECK_EQ(fx_bl_destroy(b), 0);

	/* an idle queue that takes nothing: the backend's failure, no hang */
	q.accept_max = 0;
	CHECK_EQ(fx_bl_create(&p, &b), 0);
	CHECK_EQ(run_to_end(b), -EAGAIN);
	CHECK_EQ(fx_bl_ring_failed(b), EAGAIN);
	CHECK_EQ(fx_bl_inflight(b), 0);
	CHECK_EQ(fx_bl_destroy(b), 0);
	q.accept_max = 3;

	/* destroy with I/O kept back and in flight: all accounted for */
	p.passes = 0;
	CHECK_EQ(fx_bl_create(&p, &b), 0);
	CHECK_EQ(fx_bl_run(b, 0), 0);
	CHECK(fx_bl_inflight(b) > q.ndone); /* some kept back, not submitted */
	CHECK_EQ(fx_bl_destroy(b), 0);

	/* a queue that answers twice and with tags that are no request's:
	 * only the first answer of each I/O counts, nothing is freed twice */
	q.garbage = 1;
	q.cap = FQ_MAX;
	p.passes = 1;
	read_pass_each_block_once(&p, per_block, N);
	q.garbage = 0;

	/* answers for a request it never took, and late duplicates of answers
	 * given before (after the slot was used again): ignored, so every
	 * block is done exactly once and nothing is counted twice */
	q.stale = 1;
	read_pass_each_block_once(&p, per_block, N);
	q.stale = 0;
	q.have_old = 0;
	q.ndone = 0;
	q.cap = 5;

	/* a queue that takes requests and never answers (someone else reaped
	 * them, or it lost them): the backend's failure, no spin, no hang */
	q.lose = 1;
	CHECK_EQ(fx_bl_create(&p, &b), 0);
	CHECK_EQ(run_to_end(b), -EIO);
	CHECK_EQ(fx_bl_ring_failed(b), EIO);
	CHECK_EQ(fx_bl_inflight(b), 0);
	CHECK_EQ(fx_bl_destroy(b), 0);
	q.lose = 0;

	/* a queue with someone else's requests on it: refused */
	q.done[0] = (struct fx_cqe){.tag = 7, .res = 4096};
	q.ndone = 1;
	CHECK_EQ(fx_bl_create(&p, &b), -EBUSY);
	q.ndone = 0;

	/* io_uring options do not apply to a queue */
	p.flags = FX_BL_REGRING;
	CHECK_EQ(fx_bl_create(&p, &b), -EINVAL);
	p.flags = 0;
	p.fd = 5;
	p.queue = NULL;
	p.nblocks = 0;
	CHECK_EQ(fx_bl_create(&p, &b), -EINVAL);
}

int main(void)
{
	test_buckets();
	test_percentiles();
	test_write_pass_and_errors();
	test_uniform_random();
	test_ios_instead_of_passes();
	test_destroy_gives_up();
	test_queue_backend();
	printf("test_bench_loop: ok\n");
	return 0;
}
