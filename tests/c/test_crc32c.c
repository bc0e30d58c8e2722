/*
 * fx_crc32c against independent references: published vectors, a bitwise
 * implementation for every short length and alignment, and a bytewise table
 * for the lengths around the lane boundaries of the three-lane loop.  Also
 * prints throughput (informational; timing is not asserted).
 *
 * Built twice by the Makefile: as is (run once with the best path the CPU
 * has, once with FX100IO_CRC32C=sse4.2) and with -DFX_CRC32C_NO_HW
 * (slicing-by-8 table path).
 */
#include "fx100io.h"
#include "internal.h"
#include "check.h"

#include <string.h>
#include <time.h>

#define POLY 0x82f63b78u

static uint32_t ref_bitwise(uint32_t crc, const uint8_t *p, size_t len)
{
	crc = ~crc;
	while (len--) {
		crc ^= *p++;
		for (int k = 0; k < 8; k++)
			crc = (crc & 1) ? (crc >> 1) ^ POLY : crc >> 1;
	}
	return ~crc;
}

static uint32_t ref_tab[256];

static uint32_t ref_bytewise(uint32_t crc, const uint8_t *p, size_t len)
{
	crc = ~crc;
	while (len--)
		crc = ref_tab[(crc ^ *p++) & 0xff] ^ (crc >> 8);
	return ~crc;
}

static void test_vectors(void)
{
	uint8_t b[48];

	CHECK_EQ(fx_crc32c(0, "123456789", 9), 0xE3069283u);
	CHECK_EQ(fx_crc32c(0, NULL, 0), 0);
	CHECK_EQ(fx_crc32c(0x12345678, NULL, 0), 0x12345678);
	CHECK_EQ(fx_crc32c(0, "a", 1), 0xC1D04330u);
	/* RFC 3720 (iSCSI) appendix B.4 */
	memset(b, 0, 32);
	CHECK_EQ(fx_crc32c(0, b, 32), 0x8A9136AAu);
	memset(b, 0xff, 32);
	CHECK_EQ(fx_crc32c(0, b, 32), 0x62A8AB43u);
	for (int i = 0; i < 32; i++)
		b[i] = (uint8_t)i;
	CHECK_EQ(fx_crc32c(0, b, 32), 0x46DD794Eu);
	for (int i = 0; i < 32; i++)
		b[i] = (uint8_t)(31 - i);
	CHECK_EQ(fx_crc32c(0, b, 32), 0x113FDB5Cu);
	/* the references themselves must agree with the vectors */
	CHECK_EQ(ref_bitwise(0, (const uint8_t *)"123456789", 9), 0xE3069283u);
	CHECK_EQ(ref_bytewise(0, (const uint8_t *)"123456789", 9), 0xE3069283u);
}

/* Every length 0..1100 at every alignment, with zero and non-zero seeds. */
static void test_short_lengths(uint64_t *rng)
{
	enum { MAXLEN = 1100 };
	uint8_t *buf = malloc(MAXLEN + 8);

	CHECK(buf);
	for (size_t i = 0; i < MAXLEN + 8; i++)
		buf[i] = (uint8_t)test_rand(rng);
	for (size_t al = 0; al < 8; al++) {
		for (size_t len = 0; len <= MAXLEN; len++) {
			uint32_t seed = (len & 1) ? (uint32_t)test_rand(rng) : 0;

			CHECK_EQ(fx_crc32c(seed, buf + al, len), ref_bitwise(seed, buf + al, len));
		}
	}
	free(buf);
}

/*
 * Lengths just around where the implementation switches between the long
 * three-lane round (3 x 8 KiB), the short one (3 x 256 B) and the single
 * lane, so every combine step and tail is exercised.
 */
static void test_lane_boundaries(uint64_t *rng)
{
	static const size_t centers[] = {
		768,
		1536,
		2304,
		24576,
		24576 + 768,
		2 * 24576,
		2 * 24576 + 2 * 768,
		3 * 24576 + 767,
		65536,
		131072,
	};
	size_t cap = 3 * 24576 + 767 + 64 + 8;
	uint8_t *buf = malloc(cap);

	CHECK(buf);
	for (size_t i = 0; i < cap; i++)
		buf[i] = (uint8_t)test_rand(rng);
	for (size_t c = 0; c < sizeof(centers) / sizeof(centers[0]); c++) {
		for (size_t d = 0; d <= 32; d++) {
			size_t len = centers[c] + d - 16;

			if (len + 8 > cap)
				continue;
			for (size_t al = 0; al < 8; al += (d & 1) ? 3 : 1) {
				uint32_t seed = (uint32_t)test_rand(rng);

				CHECK_EQ(fx_crc32c(seed, buf + al, len),
					 ref_bytewise(seed, buf + al, len));
			}
		}
	}
	free(buf);
}

static void test_random_large(uint64_t *rng)
{
	size_t cap = 4u << 20;
	uint8_t *buf = malloc(cap);

	CHECK(buf);
	for (size_t i = 0; i < cap; i++)
		buf[i] = (uint8_t)test_rand(rng);
	for (int it = 0; it < 24; it++) {
		size_t al = test_rand(rng) % 64;
		size_t len = test_rand(rng) % (cap - al);

		CHECK_EQ(fx_crc32c(0, buf + al, len), ref_bytewise(0, buf + al, len));
	}
	CHECK_EQ(fx_crc32c(0, buf, cap), ref_bytewise(0, buf, cap));
	free(buf);
}

static void test_chaining(uint64_t *rng)
{
	enum { N = 3000 };
	uint8_t *buf = malloc(N);

	CHECK(buf);
	for (size_t i = 0; i < N; i++)
		buf[i] = (uint8_t)test_rand(rng);
	uint32_t whole = fx_crc32c(0, buf, N);

	for (size_t s = 0; s <= N; s++)
		CHECK_EQ(fx_crc32c(fx_crc32c(0, buf, s), buf + s, N - s), whole);
	for (int it = 0; it < 2000; it++) {
		size_t a = test_rand(rng) % (N + 1);
		size_t b = a + test_rand(rng) % (N + 1 - a);
		uint32_t c = fx_crc32c(0, buf, a);

		c = fx_crc32c(c, buf + a, b - a);
		CHECK_EQ(fx_crc32c(c, buf + b, N - b), whole);
	}
	free(buf);
}

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/*
 * fx_crc32c_combine joins the CRCs of two parts into the CRC of both, for
 * every split of random buffers (short ones exhaustively), empty parts
 * included; and a shift over a huge zero run agrees with shifting in steps
 * (the O(log n) power path against the linear definition).
 */
static void test_combine(uint64_t *rng)
{
	enum { LEN = 3000 };
	uint8_t *buf = malloc(LEN);

	CHECK(buf);
	for (size_t i = 0; i < LEN; i++)
		buf[i] = (uint8_t)test_rand(rng);
	for (size_t len = 0; len <= 300; len++)
		for (size_t cut = 0; cut <= len; cut++)
			CHECK_EQ(fx_crc32c_combine(fx_crc32c(0, buf, cut),
						   fx_crc32c(0, buf + cut, len - cut), len - cut),
				 fx_crc32c(0, buf, len));
	for (int k = 0; k < 200; k++) {
		size_t cut = test_rand(rng) % (LEN + 1);

		CHECK_EQ(fx_crc32c_combine(fx_crc32c(0, buf, cut),
					   fx_crc32c(0, buf + cut, LEN - cut), LEN - cut),
			 fx_crc32c(0, buf, LEN));
	}
	/* a zero-length second part changes nothing */
	CHECK_EQ(fx_crc32c_combine(0xdeadbeef, 0, 0), 0xdeadbeef);
	/* crc of zeros: combining 1 MiB of zero bytes in 1 KiB steps against
	 * one combine over the whole MiB */
	uint8_t zeros[1024] = {0};
	uint32_t zc = fx_crc32c(0, zeros, sizeof(zeros)), step = 0x12345678;
	for (int i = 0; i < 1024; i++)
		step = fx_crc32c_combine(step, zc, sizeof(zeros));
	uint32_t whole = 0x12345678;
	for (int i = 0; i < 1024; i++)
		whole = fx_crc32c(whole, zeros, sizeof(zeros));
	CHECK_EQ(step, whole);
	/* 2^40 bytes: associativity of the power path (a|b|c two ways) */
	uint64_t big = 1ULL << 40;
	uint32_t a = 0x1111, b = 0x2222, c = 0x3333;
	CHECK_EQ(fx_crc32c_combine(fx_crc32c_combine(a, b, big), c, 7),
		 fx_crc32c_combine(a, fx_crc32c_combine(b, c, 7), big + 7));
	free(buf);
}

static void bench(void)
{
	static const size_t sizes[] = {4096, 65536, 1u << 20, 64u << 20};
	uint8_t *buf = malloc(64u << 20);
	volatile uint32_t sink = 0;

	CHECK(buf);
	memset(buf, 0xa5, 64u << 20);
	for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++) {
		size_t len = sizes[s], reps = 0;
		double t0 = now(), t;

		sink ^= fx_crc32c(0, buf, len); /* warm the cache and tables */
		do {
			for (int i = 0; i < 16; i++)
				sink ^= fx_crc32c(sink, buf, len);
			reps += 16;
			t = now() - t0;
		} while (t < 0.25);
		printf("  crc32c %8zu B: %6.2f GB/s\n", len, reps * len / t / 1e9);
	}
	(void)sink;
	free(buf);
}

int main(void)
{
	uint64_t seed = test_seed(), rng = seed;

	for (unsigned i = 0; i < 256; i++) {
		uint32_t c = i;

		for (int k = 0; k < 8; k++)
			c = (c & 1) ? (c >> 1) ^ POLY : c >> 1;
		ref_tab[i] = c;
	}
	printf("test_crc32c (%s path), seed 0x%llx\n", fx_crc32c_impl(), (unsigned long long)seed);
	test_vectors();
	test_short_lengths(&rng);
	test_lane_boundaries(&rng);
	test_random_large(&rng);
	test_chaining(&rng);
	test_combine(&rng);
	bench();
	printf("test_crc32c: ok\n");
	return 0;
}
