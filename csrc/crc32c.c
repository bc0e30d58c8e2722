/*
 * CRC32C (Castagnoli).
 *
 * NVMe/TCP digests and the chunk store's data and index checksums all run
 * through here, so large buffers must go at memory speed.  The SSE4.2 crc32
 * instruction has a latency of about three cycles but can start one per
 * cycle, so a single dependency chain wastes two thirds of it: large buffers
 * are cut into three equal lanes whose CRCs run interleaved and are then
 * joined with a "shift by n zero bytes" operator (linear over GF(2), so four
 * 256-entry tables per lane length do it without carry-less multiply).
 * Without SSE4.2 (or off x86-64) a slicing-by-8 table does the work.
 *
 * CPUs with AVX-512 and VPCLMULQDQ take a faster path for buffers of 256
 * bytes and more: carry-less multiplies fold four 64-byte accumulators
 * forward over the buffer (256 bytes a step, independent of the crc32
 * instruction's one-per-cycle limit), then the crc32 instruction reduces
 * the last 16 bytes.  The fold constants are powers of x computed at start
 * from the polynomial, not tables copied from anywhere.
 * FX100IO_CRC32C=sse4.2 or =table in the environment picks a slower path
 * (tests cover every path on one machine).
 *
 * All internal state is the raw reflected CRC register (no pre/post
 * inversion), which is what the crc32 instruction computes; fx_crc32c()
 * applies the inversions once so calls chain.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* internal.h pulls in liburing */
#endif
#include "fx100io.h"
#include "internal.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__) && !defined(FX_CRC32C_NO_HW)
#include <immintrin.h>
#endif

/* Castagnoli polynomial 0x1EDC6F41, bit-reflected. */
#define POLY 0x82f63b78u

/*
 * Per-lane lengths of the three-lane loop.  LONG_LANE amortises the combine
 * (a few table loads) over 24 KiB; SHORT_LANE keeps buffers of a few KiB
 * (PDUs, index segments) off the latency-bound single-lane loop.  Both must
 * be multiples of 8.
 */
#define LONG_LANE 8192
#define SHORT_LANE 256

static uint32_t slice_tab[8][256];
static uint32_t shift_long[4][256];
static uint32_t shift_short[4][256];
#if defined(__x86_64__) && !defined(FX_CRC32C_NO_HW)
static int have_sse42;
static int have_vpclmul; /* AVX-512 carry-less multiply: the folding path */
#endif
static pthread_once_t init_once = PTHREAD_ONCE_INIT;

static inline uint32_t load_le32(const unsigned char *p)
{
	/* byte loads keep the table path endian-neutral; gcc fuses them */
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* Advance the raw register over n zero bytes (init-time only: O(n)). */
static uint32_t zeros_slow(uint32_t crc, size_t n)
{
	while (n--)
		crc = slice_tab[0][crc & 0xff] ^ (crc >> 8);
	return crc;
}

/*
 * Tables for "crc followed by n zero bytes".  That map is linear, so it is
 * fixed by the images of the 32 single-bit registers; each table entry is
 * the XOR of the images of its set bits.
 */
static void build_shift(uint32_t tab[4][256], size_t n)
{
	uint32_t basis[32];

	for (int j = 0; j < 32; j++)
		basis[j] = zeros_slow(1u << j, n);
	for (int k = 0; k < 4; k++) {
		tab[k][0] = 0;
		for (unsigned b = 1; b < 256; b++) {
			unsigned low = b & -b;

			tab[k][b] = tab[k][b ^ low] ^ basis[8 * k + __builtin_ctz(low)];
		}
	}
}

static inline uint32_t shift(uint32_t tab[4][256], uint32_t crc)
{
	return tab[0][crc & 0xff] ^ tab[1][(crc >> 8) & 0xff] ^ tab[2][(crc >> 16) & 0xff] ^
	       tab[3][crc >> 24];
}

/*
 * Advancing a register over n zero bytes multiplies it by x^(8n) modulo the
 * polynomial.  Polynomials here are bit-reflected: bit 31 is x^0.  For an
 * arbitrary n the power is built from x^(2^k) by squaring (pow2[k], k up to
 * 66 covers every 64-bit byte count), O(log n) products of 32 steps each:
 * well under a microsecond, next to a megabyte piece's checksum.
 */
static uint32_t gf2_mulmod(uint32_t a, uint32_t b)
{
	uint32_t prod = 0;

	for (uint32_t bit = 1u << 31; bit; bit >>= 1) {
		if (a & bit)
			prod ^= b;
		b = (b >> 1) ^ (POLY & -(b & 1)); /* b *= x */
	}
	return prod;
}

#define POW2_TERMS 67
static uint32_t pow2[POW2_TERMS]; /* x^(2^k) mod P, filled by crc_init */

/* reg * x^(n * 2^k) mod P: the product of pow2[k + j] over the set bits j of n */
static uint32_t mul_xpow(uint32_t reg, uint64_t n, int k)
{
	for (; n; k++, n >>= 1)
		if (n & 1)
			reg = gf2_mulmod(pow2[k], reg);
	return reg;
}

#if defined(__x86_64__) && !defined(FX_CRC32C_NO_HW)
/* x^n mod P */
static uint32_t xpow(uint64_t n)
{
	return mul_xpow(1u << 31 /* x^0 */, n, 0);
}

/*
 * Folding constants.  A 128-bit block X (bit k of the little-endian block
 * is the coefficient of x^(127-k), as the CRC reads its bytes) moves D bits
 * forward as X * x^D = Xh * x^(D+64) + Xl * x^D, where Xh is its low
 * quadword (the earlier bytes).  Each x^e is replaced by x^e mod P, and one
 * power of x less: a carry-less multiply of two reflected quadwords leaves
 * its product one bit short of the reflected 128-bit layout.  A constant of
 * degree < 32 sits in the top half of its quadword.
 */
struct fold_k {
	uint64_t early; /* for the low quadword: x^(D+63) mod P */
	uint64_t late;  /* for the high quadword: x^(D-1) mod P */
};
static struct fold_k k_2048, k_512, k_384, k_256, k_128;

static struct fold_k fold_const(unsigned d)
{
	struct fold_k k = {(uint64_t)xpow(d + 63) << 32, (uint64_t)xpow(d - 1) << 32};
	return k;
}
#endif

static void crc_init(void)
{
	pow2[0] = 1u << 30; /* x^1 */
	for (int k = 1; k < POW2_TERMS; k++)
		pow2[k] = gf2_mulmod(pow2[k - 1], pow2[k - 1]);
	for (unsigned i = 0; i < 256; i++) {
		uint32_t c = i;

		for (int k = 0; k < 8; k++)
			c = (c >> 1) ^ (POLY & -(c & 1));
		slice_tab[0][i] = c;
	}
	/* slice_tab[k][b]: byte b followed by k zero bytes */
	for (unsigned i = 0; i < 256; i++)
		for (int k = 1; k < 8; k++)
			slice_tab[k][i] = (slice_tab[k - 1][i] >> 8) ^
					  slice_tab[0][slice_tab[k - 1][i] & 0xff];
	build_shift(shift_long, LONG_LANE);
	build_shift(shift_short, SHORT_LANE);
#if defined(__x86_64__) && !defined(FX_CRC32C_NO_HW)
	/* may run before libgcc's constructor when called from another one */
	__builtin_cpu_init();
	have_sse42 = __builtin_cpu_supports("sse4.2");
	have_vpclmul = have_sse42 && __builtin_cpu_supports("pclmul") &&
		       __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("vpclmulqdq");
	const char *want = getenv("FX100IO_CRC32C");
	if (want && !strcmp(want, "table"))
		have_sse42 = have_vpclmul = 0;
	else if (want && !strcmp(want, "sse4.2"))
		have_vpclmul = 0;
	else if (want && *want) /* a test knob misspelt would test the wrong path silently */
		fprintf(stderr, "fx100io: FX100IO_CRC32C=%s ignored (only 'table' or 'sse4.2')\n",
			want);
	k_2048 = fold_const(2048);
	k_512 = fold_const(512);
	k_384 = fold_const(384);
	k_256 = fold_const(256);
	k_128 = fold_const(128);
#endif
}

static uint32_t crc_sw(uint32_t crc, const unsigned char *p, size_t len)
{
	while (len >= 8) {
		uint32_t lo = crc ^ load_le32(p);
		uint32_t hi = load_le32(p + 4);

		crc = slice_tab[7][lo & 0xff] ^ slice_tab[6][(lo >> 8) & 0xff] ^
		      slice_tab[5][(lo >> 16) & 0xff] ^ slice_tab[4][lo >> 24] ^
		      slice_tab[3][hi & 0xff] ^ slice_tab[2][(hi >> 8) & 0xff] ^
		      slice_tab[1][(hi >> 16) & 0xff] ^ slice_tab[0][hi >> 24];
		p += 8;
		len -= 8;
	}
	while (len--)
		crc = slice_tab[0][(crc ^ *p++) & 0xff] ^ (crc >> 8);
	return crc;
}

#if defined(__x86_64__) && !defined(FX_CRC32C_NO_HW)
static inline uint64_t load64(const unsigned char *p)
{
	uint64_t v;

	/* x86 is little endian and tolerates unaligned loads; memcpy keeps
	 * the compiler's aliasing rules happy */
	memcpy(&v, p, sizeof(v));
	return v;
}

/*
 * One round of three lanes of `lane` bytes each.  Lanes 1 and 2 start from
 * a zero register; by linearity crc(c0, A|B|C) = shift2(c0 over A) ^
 * shift1(crc(0, B)) ^ crc(0, C), computed as two shift-and-xor steps.
 */
__attribute__((target("sse4.2"))) static inline uint64_t
three_lanes(uint64_t c0, const unsigned char *p, size_t lane, uint32_t tab[4][256])
{
	uint64_t c1 = 0, c2 = 0;

	for (size_t i = 0; i < lane; i += 8) {
		c0 = __builtin_ia32_crc32di(c0, load64(p + i));
		c1 = __builtin_ia32_crc32di(c1, load64(p + lane + i));
		c2 = __builtin_ia32_crc32di(c2, load64(p + 2 * lane + i));
	}
	c0 = shift(tab, (uint32_t)c0) ^ (uint32_t)c1;
	return shift(tab, (uint32_t)c0) ^ (uint32_t)c2;
}

#define FOLD_TARGET __attribute__((target("sse4.2,pclmul,avx512f,vpclmulqdq")))

FOLD_TARGET static inline __m128i k128(struct fold_k k)
{
	return _mm_set_epi64x((long long)k.late, (long long)k.early);
}

/* x moved forward by the constant's distance, xor next; per 128-bit lane */
FOLD_TARGET static inline __m512i fold512(__m512i x, __m512i k, __m512i next)
{
	__m512i a = _mm512_clmulepi64_epi128(x, k, 0x00);
	__m512i b = _mm512_clmulepi64_epi128(x, k, 0x11);
	return _mm512_ternarylogic_epi64(a, b, next, 0x96); /* a ^ b ^ next */
}

FOLD_TARGET static inline __m128i fold128(__m128i x, struct fold_k k, __m128i next)
{
	__m128i kk = k128(k);
	__m128i a = _mm_clmulepi64_si128(x, kk, 0x00);
	__m128i b = _mm_clmulepi64_si128(x, kk, 0x11);
	return _mm_xor_si128(_mm_xor_si128(a, b), next);
}

/*
 * Fold *len >= 256 bytes at *p into the register; leaves under 16 bytes
 * for the caller.  The register is xored into the first four bytes (the
 * CRC of a message whose start is xored with r equals the CRC continued
 * from r), four 64-byte accumulators fold 256 bytes a step, collapse to 16
 * bytes, and the crc32 instruction over those 16 bytes from a zero register
 * gives their remainder times x^32: the register after the whole range.
 */
FOLD_TARGET static uint64_t crc_fold(uint32_t crc, const unsigned char **pp, size_t *plen)
{
	const unsigned char *p = *pp;
	size_t len = *plen;
	__m512i x0 = _mm512_loadu_si512(p), x1 = _mm512_loadu_si512(p + 64);
	__m512i x2 = _mm512_loadu_si512(p + 128), x3 = _mm512_loadu_si512(p + 192);
	__m512i k = _mm512_broadcast_i32x4(k128(k_2048));

	x0 = _mm512_xor_si512(x0, _mm512_zextsi128_si512(_mm_cvtsi32_si128((int)crc)));
	p += 256;
	len -= 256;
	while (len >= 256) {
		x0 = fold512(x0, k, _mm512_loadu_si512(p));
		x1 = fold512(x1, k, _mm512_loadu_si512(p + 64));
		x2 = fold512(x2, k, _mm512_loadu_si512(p + 128));
		x3 = fold512(x3, k, _mm512_loadu_si512(p + 192));
		p += 256;
		len -= 256;
	}
	k = _mm512_broadcast_i32x4(k128(k_512));
	x1 = fold512(x0, k, x1);
	x2 = fold512(x1, k, x2);
	x3 = fold512(x2, k, x3);
	__m128i acc = _mm512_extracti32x4_epi32(x3, 3);
	acc = fold128(_mm512_extracti32x4_epi32(x3, 0), k_384, acc);
	acc = fold128(_mm512_extracti32x4_epi32(x3, 1), k_256, acc);
	acc = fold128(_mm512_extracti32x4_epi32(x3, 2), k_128, acc);
	while (len >= 16) {
		acc = fold128(acc, k_128, _mm_loadu_si128((const __m128i *)p));
		p += 16;
		len -= 16;
	}
	uint64_t c = _mm_crc32_u64(0, (uint64_t)_mm_cvtsi128_si64(acc));
	c = _mm_crc32_u64(c, (uint64_t)_mm_extract_epi64(acc, 1));
	*pp = p;
	*plen = len;
	return c;
}

__attribute__((target("sse4.2"))) static uint32_t crc_hw(uint32_t crc, const unsigned char *p,
							 size_t len)
{
	uint64_t c = crc;

	/* aligned 8-byte loads never straddle a cache line */
	while (len && ((uintptr_t)p & 7)) {
		c = __builtin_ia32_crc32qi((uint32_t)c, *p++);
		len--;
	}
	if (have_vpclmul && len >= 256 + 64) {
		/* 64-byte loads aligned to cache lines too */
		while ((uintptr_t)p & 63) {
			c = __builtin_ia32_crc32di(c, load64(p));
			p += 8;
			len -= 8;
		}
		c = crc_fold((uint32_t)c, &p, &len);
	}
	while (len >= 3 * LONG_LANE) {
		c = three_lanes(c, p, LONG_LANE, shift_long);
		p += 3 * LONG_LANE;
		len -= 3 * LONG_LANE;
	}
	while (len >= 3 * SHORT_LANE) {
		c = three_lanes(c, p, SHORT_LANE, shift_short);
		p += 3 * SHORT_LANE;
		len -= 3 * SHORT_LANE;
	}
	while (len >= 8) {
		c = __builtin_ia32_crc32di(c, load64(p));
		p += 8;
		len -= 8;
	}
	while (len--)
		c = __builtin_ia32_crc32qi((uint32_t)c, *p++);
	return (uint32_t)c;
}
#endif

/* The raw register after len more bytes (no inversions). */
uint32_t fx_crc32c_raw(uint32_t reg, const void *buf, size_t len)
{
	const unsigned char *p = buf;

	(void)pthread_once(&init_once, crc_init);
#if defined(__x86_64__) && !defined(FX_CRC32C_NO_HW)
	if (have_sse42)
		return crc_hw(reg, p, len);
#endif
	return crc_sw(reg, p, len);
}

const char *fx_crc32c_impl(void)
{
	(void)pthread_once(&init_once, crc_init);
#if defined(__x86_64__) && !defined(FX_CRC32C_NO_HW)
	if (have_vpclmul)
		return "avx512-vpclmulqdq";
	if (have_sse42)
		return "sse4.2";
#endif
	return "table";
}

uint32_t fx_crc32c(uint32_t crc, const void *buf, size_t len)
{
	return ~fx_crc32c_raw(~crc, buf, len);
}

uint32_t fx_crc32c_shift(uint32_t reg, uint64_t nbytes)
{
	(void)pthread_once(&init_once, crc_init);
	return mul_xpow(reg, nbytes, 3); /* x^(8 n) = x^(n 2^3) */
}

/*
 * crc(a|b) = shift(crc(a), |b|) ^ crc(b): the pre- and post-inversions of the
 * two parts cancel by linearity.
 */
uint32_t fx_crc32c_combine(uint32_t crc1, uint32_t crc2, uint64_t len2)
{
	return fx_crc32c_shift(crc1, len2) ^ crc2;
}
