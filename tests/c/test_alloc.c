/*
 * fx_alloc against a bitmap model: random alloc/free/reserve sequences
 * (valid, double, partial, overlapping, out of range, unaligned) must give
 * the model's errno, the model's best-fit offset, and the same free-space
 * gauges after every step.
 */
#include "fx100io.h"
#include "check.h"

#include <errno.h>
#include <string.h>

struct model {
	uint64_t base;
	uint64_t align;
	size_t units;
	uint8_t *used; /* one byte per unit */
};

struct run {
	size_t start, len;
};

/* Free runs in address order; returns their count. */
static size_t model_runs(const struct model *m, struct run *out)
{
	size_t n = 0, i = 0;

	while (i < m->units) {
		if (m->used[i]) {
			i++;
			continue;
		}
		size_t s = i;

		while (i < m->units && !m->used[i])
			i++;
		out[n].start = s;
		out[n].len = i - s;
		n++;
	}
	return n;
}

static void check_gauges(const struct model *m, const struct fx_alloc *a, struct run *runs)
{
	size_t n = model_runs(m, runs), free_units = 0, largest = 0;

	for (size_t i = 0; i < n; i++) {
		free_units += runs[i].len;
		if (runs[i].len > largest)
			largest = runs[i].len;
	}
	CHECK_EQ(fx_alloc_free_bytes(a), free_units * m->align);
	CHECK_EQ(fx_alloc_largest_free(a), largest * m->align);
	CHECK_EQ(fx_alloc_free_extents(a), n);
}

/*
 * Expected result of free (want_used=1) or reserve (want_used=0) of
 * [off, off+len): -EINVAL for bad ranges, else whether every unit covered
 * is in the required state.
 */
static int model_range(const struct model *m, uint64_t off, uint64_t len, int want_used, size_t *u0,
		       size_t *nu)
{
	uint64_t end = m->base + m->units * m->align;

	if (len == 0 || (off & (m->align - 1)) || off < m->base || off >= end || len > end - off)
		return -EINVAL;
	*u0 = (off - m->base) / m->align;
	*nu = (len + m->align - 1) / m->align;
	for (size_t i = *u0; i < *u0 + *nu; i++)
		if (m->used[i] != want_used)
			return want_used ? -EINVAL : -EEXIST;
	return 0;
}

struct live {
	uint64_t off, len;
};

static uint64_t rand_len(uint64_t *rng, const struct model *m)
{
	uint64_t units = 1 + test_rand(rng) % (test_rand(rng) % 4 ? 8 : m->units + 2);
	uint64_t len = units * m->align;

	/* unaligned lengths are rounded up by the allocator */
	if (m->align > 1 && test_rand(rng) % 3 == 0)
		len -= test_rand(rng) % m->align;
	return len;
}

static uint64_t rand_off(uint64_t *rng, const struct model *m)
{
	uint64_t off = m->base + (test_rand(rng) % (m->units + 3)) * m->align;

	switch (test_rand(rng) % 16) {
	case 0:
		if (m->align > 1)
			off += 1 + test_rand(rng) % (m->align - 1);
		break;
	case 1:
		if (m->base >= m->align)
			off = m->base - m->align;
		break;
	}
	return off;
}

static void random_run(uint64_t *rng, uint64_t base, uint32_t align, size_t units, int steps)
{
	struct model m = {base, align, units, calloc(units, 1)};
	struct run *runs = malloc((units + 1) * sizeof(*runs));
	struct live *live = malloc(units * sizeof(*live));
	size_t nlive = 0;
	struct fx_alloc *a;

	CHECK(m.used && runs && live);
	CHECK_EQ(fx_alloc_create(base, units * (uint64_t)align, align, &a), 0);
	check_gauges(&m, a, runs);
	for (int step = 0; step < steps; step++) {
		unsigned op = test_rand(rng) % 8;
		uint64_t off = 0, len;
		size_t u0, nu;
		int rc, want;

		if (op < 3) { /* alloc: best fit, lowest address on ties */
			len = rand_len(rng, &m);
			nu = (len + align - 1) / align;
			size_t nr = model_runs(&m, runs), best = nr;

			for (size_t i = 0; i < nr; i++)
				if (runs[i].len >= nu &&
				    (best == nr || runs[i].len < runs[best].len))
					best = i;
			rc = fx_alloc_alloc(a, len, &off);
			if (best == nr) {
				CHECK_EQ(rc, -ENOSPC);
			} else {
				CHECK_EQ(rc, 0);
				CHECK_EQ(off, base + runs[best].start * align);
				memset(m.used + runs[best].start, 1, nu);
				live[nlive].off = off;
				live[nlive++].len = len;
			}
		} else if (op < 5 && nlive) { /* free something handed out */
			size_t k = test_rand(rng) % nlive;

			off = live[k].off;
			len = live[k].len;
			live[k] = live[--nlive];
			want = model_range(&m, off, len, 1, &u0, &nu);
			CHECK_EQ(fx_alloc_free(a, off, len), want);
			if (want == 0)
				memset(m.used + u0, 0, nu);
		} else if (op < 7) { /* free an arbitrary range */
			off = rand_off(rng, &m);
			len = test_rand(rng) % 32 ? rand_len(rng, &m) : 0;
			want = model_range(&m, off, len, 1, &u0, &nu);
			CHECK_EQ(fx_alloc_free(a, off, len), want);
			if (want == 0)
				memset(m.used + u0, 0, nu);
		} else { /* reserve an arbitrary range (index replay) */
			off = rand_off(rng, &m);
			len = test_rand(rng) % 32 ? rand_len(rng, &m) : 0;
			want = model_range(&m, off, len, 0, &u0, &nu);
			CHECK_EQ(fx_alloc_reserve(a, off, len), want);
			if (want == 0) {
				memset(m.used + u0, 1, nu);
				live[nlive].off = off;
				live[nlive++].len = len;
			}
		}
		check_gauges(&m, a, runs);
	}
	/* return everything still in use; must end as one extent */
	for (size_t i = 0; i < units; i++) {
		if (m.used[i]) {
			CHECK_EQ(fx_alloc_free(a, base + i * align, align), 0);
			m.used[i] = 0;
		}
	}
	check_gauges(&m, a, runs);
	CHECK_EQ(fx_alloc_free_extents(a), units ? 1 : 0);
	fx_alloc_destroy(a);
	free(m.used);
	free(runs);
	free(live);
}

static void test_create(void)
{
	struct fx_alloc *a;
	uint64_t off;

	CHECK_EQ(fx_alloc_create(0, 4096, 0, &a), -EINVAL);
	CHECK_EQ(fx_alloc_create(0, 4096, 3, &a), -EINVAL);
	CHECK_EQ(fx_alloc_create(0, 4096, 4095, &a), -EINVAL);
	CHECK_EQ(fx_alloc_create(512, 4096, 4096, &a), -EINVAL);
	CHECK_EQ(fx_alloc_create(4096, UINT64_MAX, 4096, &a), -EINVAL);

	/* empty space: valid, but nothing to hand out */
	CHECK_EQ(fx_alloc_create(4096, 0, 4096, &a), 0);
	CHECK_EQ(fx_alloc_free_bytes(a), 0);
	CHECK_EQ(fx_alloc_free_extents(a), 0);
	CHECK_EQ(fx_alloc_largest_free(a), 0);
	CHECK_EQ(fx_alloc_alloc(a, 1, &off), -ENOSPC);
	CHECK_EQ(fx_alloc_reserve(a, 4096, 1), -EINVAL);
	CHECK_EQ(fx_alloc_free(a, 4096, 1), -EINVAL);
	fx_alloc_destroy(a);
	fx_alloc_destroy(NULL);

	/* a trailing partial unit is unusable */
	CHECK_EQ(fx_alloc_create(8192, 3 * 4096 + 100, 4096, &a), 0);
	CHECK_EQ(fx_alloc_free_bytes(a), 3 * 4096);
	CHECK_EQ(fx_alloc_alloc(a, 3 * 4096 + 1, &off), -ENOSPC);
	CHECK_EQ(fx_alloc_alloc(a, 3 * 4096, &off), 0);
	CHECK_EQ(off, 8192);
	fx_alloc_destroy(a);
}

static void test_edges(void)
{
	struct fx_alloc *a;
	uint64_t off, o1, o2, o3;

	CHECK_EQ(fx_alloc_create(1 << 20, 16 * 4096, 4096, &a), 0);
	CHECK_EQ(fx_alloc_alloc(a, 0, &off), -EINVAL);
	CHECK_EQ(fx_alloc_alloc(a, UINT64_MAX, &off), -ENOSPC);
	CHECK_EQ(fx_alloc_alloc(a, UINT64_MAX - 4094, &off), -ENOSPC);
	CHECK_EQ(fx_alloc_alloc(a, 17 * 4096, &off), -ENOSPC);

	/* rounding: 1 byte takes a whole unit */
	CHECK_EQ(fx_alloc_alloc(a, 1, &o1), 0);
	CHECK_EQ(o1, 1 << 20);
	CHECK_EQ(fx_alloc_free_bytes(a), 15 * 4096);
	CHECK_EQ(fx_alloc_alloc(a, 4097, &o2), 0);
	CHECK_EQ(o2, (1 << 20) + 4096);
	CHECK_EQ(fx_alloc_alloc(a, 4096, &o3), 0);
	CHECK_EQ(o3, (1 << 20) + 3 * 4096);

	/* bad ranges */
	CHECK_EQ(fx_alloc_free(a, o1, 0), -EINVAL);
	CHECK_EQ(fx_alloc_free(a, o1 + 1, 4096), -EINVAL);
	CHECK_EQ(fx_alloc_free(a, o1 - 4096, 4096), -EINVAL);
	CHECK_EQ(fx_alloc_free(a, o1, UINT64_MAX), -EINVAL);
	CHECK_EQ(fx_alloc_free(a, (1 << 20) + 16 * 4096, 4096), -EINVAL);
	CHECK_EQ(fx_alloc_free(a, (1 << 20) + 15 * 4096, 2 * 4096), -EINVAL);
	CHECK_EQ(fx_alloc_reserve(a, UINT64_MAX - 4095, 4096), -EINVAL);
	CHECK_EQ(fx_alloc_reserve(a, (1 << 20) + 4096 * 15, UINT64_MAX), -EINVAL);
	CHECK_EQ(fx_alloc_reserve(a, 0, 4096), -EINVAL);

	/* double and partially-free frees */
	CHECK_EQ(fx_alloc_free(a, o2, 4097), 0);
	CHECK_EQ(fx_alloc_free(a, o2, 4097), -EINVAL);
	CHECK_EQ(fx_alloc_free(a, o2 + 4096, 4096), -EINVAL);
	CHECK_EQ(fx_alloc_free(a, o1, 2 * 4096), -EINVAL);
	CHECK_EQ(fx_alloc_free(a, o1, 4 * 4096), -EINVAL);
	CHECK_EQ(fx_alloc_free_extents(a), 2);

	/* merge both sides */
	CHECK_EQ(fx_alloc_free(a, o1, 1), 0);
	CHECK_EQ(fx_alloc_free_extents(a), 2);
	CHECK_EQ(fx_alloc_free(a, o3, 4096), 0);
	CHECK_EQ(fx_alloc_free_extents(a), 1);
	CHECK_EQ(fx_alloc_free_bytes(a), 16 * 4096);
	CHECK_EQ(fx_alloc_largest_free(a), 16 * 4096);

	/* reserve: split, overlap, whole */
	CHECK_EQ(fx_alloc_reserve(a, (1 << 20) + 4 * 4096, 4096), 0);
	CHECK_EQ(fx_alloc_free_extents(a), 2);
	CHECK_EQ(fx_alloc_reserve(a, (1 << 20) + 3 * 4096, 2 * 4096), -EEXIST);
	CHECK_EQ(fx_alloc_reserve(a, (1 << 20) + 4 * 4096, 1), -EEXIST);
	CHECK_EQ(fx_alloc_reserve(a, (1 << 20), 16 * 4096), -EEXIST);
	CHECK_EQ(fx_alloc_reserve(a, (1 << 20), 4 * 4096), 0);
	CHECK_EQ(fx_alloc_free_extents(a), 1);
	CHECK_EQ(fx_alloc_reserve(a, (1 << 20) + 15 * 4096, 4096), 0);
	CHECK_EQ(fx_alloc_largest_free(a), 10 * 4096);
	CHECK_EQ(fx_alloc_reserve(a, (1 << 20) + 5 * 4096, 10 * 4096), 0);
	CHECK_EQ(fx_alloc_free_extents(a), 0);
	CHECK_EQ(fx_alloc_free_bytes(a), 0);
	CHECK_EQ(fx_alloc_alloc(a, 1, &off), -ENOSPC);
	CHECK_EQ(fx_alloc_free(a, 1 << 20, 16 * 4096), 0);
	CHECK_EQ(fx_alloc_free_extents(a), 1);
	fx_alloc_destroy(a);

	/* space ending at the top of the address range: no overflow */
	CHECK_EQ(fx_alloc_create(UINT64_MAX - (1ULL << 20) + 1 - 4096, (1ULL << 20) + 4095, 4096,
				 &a),
		 0);
	CHECK_EQ(fx_alloc_free_bytes(a), 1ULL << 20);
	CHECK_EQ(fx_alloc_reserve(a, UINT64_MAX - 4095 - 4096, 4096), 0);
	CHECK_EQ(fx_alloc_free(a, UINT64_MAX - 4095 - 4096, UINT64_MAX), -EINVAL);
	CHECK_EQ(fx_alloc_free(a, UINT64_MAX - 4095 - 4096, 4096), 0);
	CHECK_EQ(fx_alloc_alloc(a, (1ULL << 20) + 1, &off), -ENOSPC);
	CHECK_EQ(fx_alloc_alloc(a, 1ULL << 20, &off), 0);
	CHECK_EQ(off, UINT64_MAX - (1ULL << 20) + 1 - 4096);
	fx_alloc_destroy(a);
}

/* Many extents: forces the array to grow, then merges back to one. */
static void test_many_extents(void)
{
	enum { UNITS = 20000 };
	struct fx_alloc *a;

	CHECK_EQ(fx_alloc_create(0, UNITS * 512ULL, 512, &a), 0);
	for (uint64_t i = 1; i < UNITS; i += 2)
		CHECK_EQ(fx_alloc_reserve(a, i * 512, 512), 0);
	CHECK_EQ(fx_alloc_free_extents(a), UNITS / 2);
	CHECK_EQ(fx_alloc_largest_free(a), 512);
	for (uint64_t i = 1; i < UNITS; i += 4)
		CHECK_EQ(fx_alloc_free(a, i * 512, 512), 0);
	CHECK_EQ(fx_alloc_free_extents(a), UNITS / 4);
	CHECK_EQ(fx_alloc_largest_free(a), 3 * 512);
	for (uint64_t i = 3; i < UNITS; i += 4)
		CHECK_EQ(fx_alloc_free(a, i * 512, 1), 0);
	CHECK_EQ(fx_alloc_free_extents(a), 1);
	CHECK_EQ(fx_alloc_free_bytes(a), UNITS * 512ULL);
	fx_alloc_destroy(a);
}

int main(void)
{
	uint64_t seed = test_seed(), rng = seed;

	printf("test_alloc, seed 0x%llx\n", (unsigned long long)seed);
	test_create();
	test_edges();
	test_many_extents();
	random_run(&rng, 0, 1, 64, 20000);
	random_run(&rng, 4096, 4096, 300, 40000);
	random_run(&rng, 1ULL << 40, 512, 1000, 40000);
	random_run(&rng, UINT64_MAX - 199 * 8ULL - 7, 8, 199, 20000);
	random_run(&rng, 64, 64, 1, 2000);
	printf("test_alloc: ok\n");
	return 0;
}
