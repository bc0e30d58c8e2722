/*
 * Index segment encoding: exact byte layout, round trips, every single-byte
 * corruption and every truncation of a real segment, and 100k hostile
 * buffers (many with a valid CRC, so record parsing is reached).  Every
 * decode input sits in a heap block of exactly its length, so an ASan build
 * turns any read past the end into a failure.
 */
#include "fx100io.h"
#include "check.h"

#include <errno.h>
#include <string.h>

#define GEN 0x0123456789abcdefULL

static uint64_t rd64(const uint8_t *p)
{
	uint64_t v = 0;

	for (int i = 7; i >= 0; i--)
		v = v << 8 | p[i];
	return v;
}

static uint32_t rd32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static void wr32(uint8_t *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static void wr64(uint8_t *p, uint64_t v)
{
	for (int i = 0; i < 8; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

/* Recompute the header CRC the way the format defines it. */
static void fix_crc(uint8_t *seg, size_t plen)
{
	wr32(seg + 32, 0);
	wr32(seg + 32, fx_crc32c(0, seg, 64 + plen));
}

/* Heap copy of exactly len bytes so ASan catches any overread. */
static uint8_t *exact_copy(const uint8_t *src, size_t len)
{
	uint8_t *p = malloc(len ? len : 1);

	CHECK(p);
	if (len)
		memcpy(p, src, len);
	return p;
}

static void test_rec_size(void)
{
	CHECK_EQ(fx_index_rec_size(0), 32);
	CHECK_EQ(fx_index_rec_size(1), 40);
	CHECK_EQ(fx_index_rec_size(8), 40);
	CHECK_EQ(fx_index_rec_size(9), 48);
	CHECK_EQ(fx_index_rec_size(FX_KEY_MAX), 32 + FX_KEY_MAX);
	CHECK_EQ(fx_index_rec_size(1023), 32 + 1024);
}

/* Byte-exact layout of a known segment, checked against the header text. */
static void test_layout(void)
{
	static const uint8_t key[] = "chunk-a"; /* 7 bytes -> padded to 8 */
	struct fx_index_rec r[2] = {
		{.type = FX_REC_PUT,
		 .flags = 0x5a,
		 .key_len = 7,
		 .data_crc = 0xdeadbeef,
		 .off = 0x1122334455667788ULL,
		 .len = 0x0000000100000000ULL,
		 .dev = 0xa1b2c3d4,
		 .key = key},
		{.type = FX_REC_DEL, .key_len = 1, .key = key},
	};
	uint8_t seg[256];

	memset(seg, 0xee, sizeof(seg));
	CHECK_EQ(fx_index_seg_encode(GEN, 42, r, 2, seg, sizeof(seg)), 64 + 40 + 40);
	CHECK(memcmp(seg, "FFXSEG01", 8) == 0);
	CHECK_EQ(rd64(seg + 8), GEN);
	CHECK_EQ(rd64(seg + 16), 42);
	CHECK_EQ(rd32(seg + 24), 80);
	CHECK_EQ(rd32(seg + 28), 2);
	for (int i = 36; i < 64; i++)
		CHECK_EQ(seg[i], 0);
	uint8_t tmp[144];

	memcpy(tmp, seg, 144);
	wr32(tmp + 32, 0);
	CHECK_EQ(rd32(seg + 32), fx_crc32c(0, tmp, 144));
	/* the CRC is header-with-zero-crc then payload, chained */
	CHECK_EQ(rd32(seg + 32), fx_crc32c(fx_crc32c(0, tmp, 64), tmp + 64, 80));

	const uint8_t *p = seg + 64;

	CHECK_EQ(p[0], FX_REC_PUT);
	CHECK_EQ(p[1], 0x5a);
	CHECK_EQ(p[2], 7);
	CHECK_EQ(p[3], 0);
	CHECK_EQ(rd32(p + 4), 0xdeadbeef);
	CHECK_EQ(rd64(p + 8), 0x1122334455667788ULL);
	CHECK_EQ(p[8], 0x88);
	CHECK_EQ(rd64(p + 16), 0x0000000100000000ULL);
	CHECK_EQ(rd32(p + 24), 0xa1b2c3d4);
	CHECK_EQ(rd32(p + 28), 0);
	CHECK(memcmp(p + 32, "chunk-a", 7) == 0);
	CHECK_EQ(p[39], 0);
	p += 40;
	CHECK_EQ(p[0], FX_REC_DEL);
	CHECK_EQ(p[2], 1);
	CHECK_EQ(p[32], 'c');
	for (int i = 33; i < 40; i++)
		CHECK_EQ(p[i], 0);
	/* nothing written past the returned size */
	for (size_t i = 144; i < sizeof(seg); i++)
		CHECK_EQ(seg[i], 0xee);
}

static void test_encode_errors(void)
{
	static const uint8_t key[FX_KEY_MAX + 1];
	struct fx_index_rec r = {.type = FX_REC_PUT, .key_len = 4, .key = key};
	uint8_t seg[2048];

	r.key_len = 0;
	CHECK_EQ(fx_index_seg_encode(GEN, 1, &r, 1, seg, sizeof(seg)), -EINVAL);
	r.key_len = FX_KEY_MAX + 1;
	CHECK_EQ(fx_index_seg_encode(GEN, 1, &r, 1, seg, sizeof(seg)), -EINVAL);
	r.key_len = FX_KEY_MAX;
	CHECK_EQ(fx_index_seg_encode(GEN, 1, &r, 1, seg, sizeof(seg)), 64 + 32 + FX_KEY_MAX);
	r.key_len = 4;
	r.type = 0;
	CHECK_EQ(fx_index_seg_encode(GEN, 1, &r, 1, seg, sizeof(seg)), -EINVAL);
	r.type = 3;
	CHECK_EQ(fx_index_seg_encode(GEN, 1, &r, 1, seg, sizeof(seg)), -EINVAL);
	r.type = FX_REC_DEL;
	r.key = NULL;
	CHECK_EQ(fx_index_seg_encode(GEN, 1, &r, 1, seg, sizeof(seg)), -EINVAL);
	CHECK_EQ(fx_index_seg_encode(GEN, 1, NULL, 1, seg, sizeof(seg)), -EINVAL);
	r.key = key;
	/* every too-small capacity, in an exact-size block */
	for (size_t cap = 0; cap < 64 + 40; cap++) {
		uint8_t *out = malloc(cap ? cap : 1);

		CHECK(out);
		CHECK_EQ(fx_index_seg_encode(GEN, 1, &r, 1, out, cap), -ENOSPC);
		free(out);
	}
	CHECK_EQ(fx_index_seg_encode(GEN, 1, &r, 1, NULL, 0), -ENOSPC);
	uint8_t *out = malloc(64 + 40);

	CHECK(out);
	CHECK_EQ(fx_index_seg_encode(GEN, 1, &r, 1, out, 64 + 40), 64 + 40);
	free(out);
}

static unsigned rand_recs(uint64_t *rng, struct fx_index_rec *r, unsigned max, uint8_t *keys)
{
	unsigned n = test_rand(rng) % (max + 1);

	for (unsigned i = 0; i < n; i++) {
		unsigned kl = test_rand(rng) % 4 ? 1 + test_rand(rng) % 64
						 : 1 + test_rand(rng) % FX_KEY_MAX;

		if (test_rand(rng) % 16 == 0)
			kl = FX_KEY_MAX;
		for (unsigned k = 0; k < kl; k++)
			keys[i * FX_KEY_MAX + k] = (uint8_t)test_rand(rng);
		r[i] = (struct fx_index_rec){
			.type = test_rand(rng) % 2 ? FX_REC_PUT : FX_REC_DEL,
			.flags = (uint8_t)test_rand(rng),
			.key_len = (uint16_t)kl,
			.data_crc = (uint32_t)test_rand(rng),
			.off = test_rand(rng),
			.len = test_rand(rng),
			.dev = (uint32_t)test_rand(rng),
			.key = keys + i * FX_KEY_MAX,
		};
	}
	return n;
}

static void check_same(const struct fx_index_rec *a, const struct fx_index_rec *b)
{
	CHECK_EQ(a->type, b->type);
	CHECK_EQ(a->flags, b->flags);
	CHECK_EQ(a->key_len, b->key_len);
	CHECK_EQ(a->data_crc, b->data_crc);
	CHECK_EQ(a->off, b->off);
	CHECK_EQ(a->len, b->len);
	CHECK_EQ(a->dev, b->dev);
	CHECK(memcmp(a->key, b->key, a->key_len) == 0);
}

enum { MAXR = 24, SEGCAP = 64 + MAXR * (32 + FX_KEY_MAX) };

static void test_round_trip(uint64_t *rng)
{
	static struct fx_index_rec in[MAXR], outr[MAXR + 1];
	static uint8_t keys[MAXR * FX_KEY_MAX];
	uint8_t *seg = malloc(SEGCAP + 100);
	uint64_t seq;
	unsigned nrecs;

	CHECK(seg);
	for (int it = 0; it < 500; it++) {
		unsigned n = rand_recs(rng, in, MAXR, keys);
		uint64_t sq = test_rand(rng);
		size_t want = 64;

		for (unsigned i = 0; i < n; i++)
			want += fx_index_rec_size(in[i].key_len);
		memset(seg, 0xcc, SEGCAP + 100);
		int64_t sz = fx_index_seg_encode(GEN, sq, in, n, seg, SEGCAP);

		CHECK_EQ(sz, want);
		for (size_t i = sz; i < SEGCAP + 100; i++)
			CHECK_EQ(seg[i], 0xcc);

		/* exact-size copy, and with trailing garbage after it */
		uint8_t *ex = exact_copy(seg, sz);

		nrecs = 9999;
		CHECK_EQ(fx_index_seg_decode(ex, sz, GEN, &seq, outr, MAXR + 1, &nrecs), sz);
		CHECK_EQ(seq, sq);
		CHECK_EQ(nrecs, n);
		for (unsigned i = 0; i < n; i++) {
			check_same(&outr[i], &in[i]);
			CHECK(outr[i].key >= ex + 64 && outr[i].key + outr[i].key_len <= ex + sz);
		}
		free(ex);
		CHECK_EQ(fx_index_seg_decode(seg, SEGCAP + 100, GEN, &seq, outr, n, &nrecs), sz);
		CHECK_EQ(fx_index_seg_decode(seg, SEGCAP + 100, GEN + 1, &seq, outr, n, &nrecs), 0);
		CHECK_EQ(fx_index_seg_decode(seg, SEGCAP + 100, ~GEN, &seq, outr, n, &nrecs), 0);
		if (n) {
			nrecs = 0;
			CHECK_EQ(fx_index_seg_decode(seg, sz, GEN, &seq, outr, n - 1, &nrecs),
				 -ENOSPC);
			CHECK_EQ(nrecs, n);
			CHECK_EQ(fx_index_seg_decode(seg, sz, GEN, &seq, NULL, 0, &nrecs), -ENOSPC);
			CHECK_EQ(nrecs, n);
		}
	}
	free(seg);
}

static void test_not_segments(void)
{
	uint8_t *z = calloc(1, 4096);
	struct fx_index_rec r[4];
	uint64_t seq;
	unsigned n;

	CHECK(z);
	for (size_t len = 0; len <= 4096; len += (len < 80 ? 1 : 512))
		CHECK_EQ(fx_index_seg_decode(z, len, 0, &seq, r, 4, &n), 0);
	CHECK_EQ(fx_index_seg_decode(NULL, 0, GEN, &seq, r, 4, &n), 0);
	/* an empty segment (header only) of generation 0 is real */
	CHECK_EQ(fx_index_seg_encode(0, 7, NULL, 0, z, 4096), 64);
	CHECK_EQ(fx_index_seg_decode(z, 4096, 0, &seq, r, 4, &n), 64);
	CHECK_EQ(seq, 7);
	CHECK_EQ(n, 0);
	free(z);
}

/*
 * Every single-byte corruption of a real segment: flips in magic or
 * generation make it someone else's (0), anything else must be caught
 * (a CRC detects every error burst of up to 32 bits).
 */
static void test_flips_and_truncations(uint64_t *rng)
{
	static struct fx_index_rec in[6], outr[6];
	static uint8_t keys[6 * FX_KEY_MAX];
	static const uint8_t masks[] = {0x01, 0x80, 0xff, 0x10};
	uint8_t *seg = malloc(SEGCAP);
	uint64_t seq;
	unsigned n, nrecs;

	CHECK(seg);
	for (int it = 0; it < 4; it++) {
		do
			n = rand_recs(rng, in, 6, keys);
		while (n == 0 && it);
		int64_t sz = fx_index_seg_encode(GEN, it, in, n, seg, SEGCAP);

		CHECK(sz > 0);
		for (int64_t i = 0; i < sz; i++) {
			for (size_t m = 0; m < sizeof(masks); m++) {
				uint8_t *b = exact_copy(seg, sz);

				b[i] ^= masks[m];
				CHECK_EQ(fx_index_seg_decode(b, sz, GEN, &seq, outr, 6, &nrecs),
					 i < 16 ? 0 : -EBADMSG);
				free(b);
			}
		}
		for (int64_t k = 0; k < sz; k++) {
			uint8_t *b = exact_copy(seg, k);

			CHECK_EQ(fx_index_seg_decode(b, k, GEN, &seq, outr, 6, &nrecs),
				 k < 16 ? 0 : -EBADMSG);
			free(b);
		}
	}
	free(seg);
}

/*
 * Segments whose CRC is right but whose structure lies: bad payload_len,
 * nrecs, key_len, type, misaligned payload, records overrunning it.
 */
static void test_crafted(uint64_t *rng)
{
	static struct fx_index_rec in[4], outr[8];
	static uint8_t keys[4 * FX_KEY_MAX];
	uint8_t seg[64 + 4 * 40 + 64];
	uint64_t seq;
	unsigned nrecs;
	int64_t sz;

	for (int i = 0; i < 4; i++) {
		keys[i * FX_KEY_MAX] = (uint8_t)i;
		in[i] = (struct fx_index_rec){
			.type = FX_REC_PUT, .key_len = 8, .key = keys + i * FX_KEY_MAX};
	}
	sz = fx_index_seg_encode(GEN, 1, in, 4, seg, sizeof(seg));
	CHECK_EQ(sz, 64 + 4 * 40);
	(void)rng;

#define MUTATE(stmt, plen, want)                                                           \
	do {                                                                               \
		uint8_t t_[sizeof(seg)];                                                   \
		memcpy(t_, seg, sizeof(seg));                                              \
		stmt;                                                                      \
		fix_crc(t_, (plen));                                                       \
		uint8_t *b_ = exact_copy(t_, sz);                                          \
		CHECK_EQ(fx_index_seg_decode(b_, sz, GEN, &seq, outr, 8, &nrecs), (want)); \
		free(b_);                                                                  \
	} while (0)

	MUTATE((void)0, 160, sz);
	MUTATE(wr32(t_ + 28, 3), 160, -EBADMSG); /* fewer recs than payload */
	MUTATE(wr32(t_ + 28, 5), 160, -EBADMSG); /* more recs than payload */
	MUTATE(wr32(t_ + 28, 0xffffffff), 160, -EBADMSG);
	MUTATE(wr32(t_ + 24, 152), 152, -EBADMSG); /* last record cut */
	MUTATE(wr32(t_ + 24, 156), 156, -EBADMSG); /* not 8-aligned */
	MUTATE(wr32(t_ + 24, 168), 160, -EBADMSG); /* past the buffer */
	MUTATE(wr32(t_ + 24, 0xfffffff8), 160, -EBADMSG);
	MUTATE(t_[64 + 2] = 0, 160, -EBADMSG);                         /* key_len 0 */
	MUTATE((t_[64 + 2] = 0x01, t_[64 + 3] = 0x04), 160, -EBADMSG); /* 1025 */
	MUTATE(t_[64 + 3] = 0xff, 160, -EBADMSG);                      /* huge key_len */
	MUTATE(t_[64 + 120 + 2] = 16, 160, -EBADMSG);                  /* last key overruns */
	MUTATE(t_[64 + 80 + 2] = 16, 160, -EBADMSG);                   /* misframes the rest */
	MUTATE(t_[64] = 0, 160, -EBADMSG);                             /* bad type */
	MUTATE(t_[64 + 40] = 3, 160, -EBADMSG);
	/* a record grows by 8 and nrecs drops by one: still consistent */
	MUTATE((t_[64 + 2] = 16, wr32(t_ + 28, 3)), 160, -EBADMSG);
	MUTATE((t_[64 + 2] = 48, wr32(t_ + 28, 3)), 160, sz);
	CHECK_EQ(nrecs, 3);
	CHECK_EQ(outr[0].key_len, 48);
	/* reserved and pad bytes are covered by the CRC but not interpreted */
	MUTATE(t_[64 + 28] = 1, 160, sz);
	MUTATE(t_[40] = 1, 160, sz);
#undef MUTATE
}

/* 100k random inputs; a third get our magic+generation and a valid CRC. */
static void test_hostile(uint64_t *rng)
{
	static struct fx_index_rec outr[16];
	static const uint16_t kls[] = {0, 1, 7, 8, 9, 16, 1024, 1025, 0xffff};
	size_t counts[5] = {0};
	uint64_t seq;
	unsigned nrecs;

	for (int it = 0; it < 100000; it++) {
		size_t len = test_rand(rng) % 700;
		uint8_t *b = malloc(len ? len : 1);
		unsigned kind = test_rand(rng) % 3;

		CHECK(b);
		for (size_t i = 0; i < len; i++)
			b[i] = (uint8_t)test_rand(rng);
		if (kind && len >= 16) {
			wr64(b, FX_SEG_MAGIC);
			wr64(b + 8, GEN);
		}
		if (kind == 2 && len >= 64) {
			/* plausible structure so parsing goes deep */
			uint32_t plen = (uint32_t)((len - 64) & ~(size_t)7);

			if (test_rand(rng) % 8 == 0)
				plen = (uint32_t)test_rand(rng);
			else if (plen && test_rand(rng) % 2)
				plen = (uint32_t)(test_rand(rng) % (plen + 1)) & ~7u;
			wr32(b + 24, plen);
			uint32_t cnt = 0;

			for (size_t pos = 64; pos + 32 <= len; cnt++) {
				uint16_t kl = kls[test_rand(rng) % 9];

				if (test_rand(rng) % 4)
					kl = (uint16_t)(1 + test_rand(rng) % 40);
				b[pos] = (uint8_t)(1 + test_rand(rng) % 2);
				b[pos + 2] = (uint8_t)kl;
				b[pos + 3] = (uint8_t)(kl >> 8);
				pos += fx_index_rec_size(kl);
				if (pos > 64 + (size_t)plen)
					break;
				if (pos == 64 + (size_t)plen) {
					cnt++;
					break;
				}
			}
			/* mostly the true count, so whole segments parse */
			if (test_rand(rng) % 4 == 0)
				cnt = (uint32_t)(test_rand(rng) % 20);
			wr32(b + 28, cnt);
			if (64 + (uint64_t)plen <= len)
				fix_crc(b, plen);
		}
		unsigned max = test_rand(rng) % 17;
		int64_t rc = fx_index_seg_decode(b, len, GEN, &seq, outr, max, &nrecs);

		if (rc > 0) {
			CHECK(kind == 2);
			CHECK((size_t)rc <= len);
			CHECK(nrecs <= max);
			for (unsigned i = 0; i < nrecs; i++) {
				CHECK(outr[i].key >= b + 64);
				CHECK(outr[i].key + outr[i].key_len <= b + rc);
				CHECK(outr[i].key_len >= 1 && outr[i].key_len <= FX_KEY_MAX);
			}
			counts[0]++;
		} else if (rc == 0) {
			counts[1]++;
		} else if (rc == -EBADMSG) {
			counts[2]++;
		} else {
			CHECK_EQ(rc, -ENOSPC);
			CHECK(kind == 2 && nrecs > max);
			counts[3]++;
		}
		free(b);
	}
	printf("  hostile: %zu ok, %zu not-ours, %zu bad, %zu nospc\n", counts[0], counts[1],
	       counts[2], counts[3]);
	/* the generator must actually reach every outcome */
	CHECK(counts[0] > 1000 && counts[1] > 1000 && counts[2] > 1000 && counts[3] > 100);
}

int main(void)
{
	uint64_t seed = test_seed(), rng = seed;

	printf("test_index, seed 0x%llx\n", (unsigned long long)seed);
	test_rec_size();
	test_layout();
	test_encode_errors();
	test_round_trip(&rng);
	test_not_segments();
	test_flips_and_truncations(&rng);
	test_crafted(&rng);
	test_hostile(&rng);
	printf("test_index: ok\n");
	return 0;
}
