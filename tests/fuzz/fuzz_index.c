/*
 * Index log segments (csrc/index.c) from arbitrary bytes, as replay reads
 * them back from a device after a crash.
 *
 * Input: u8 ctl; u64 generation (LE); the log.  ctl bit 0: before decoding,
 * give each segment header of this generation a correct CRC (so record
 * parsing is reached, as a crafted or buggy-but-CRC-valid segment would);
 * bits 1-2: block size the log is walked in (8, 64, 512, 4096); bits 3-7:
 * one extra decode offset (0..31, times 8 plus ctl's low bits: unaligned).
 *
 * The log is walked as the store's replay walks it (decode, stop at the
 * first non-segment or broken sequence chain, advance by the size rounded
 * up to the block size), and every decoded segment must hold: its size
 * within what was left, each key inside the segment and 1..FX_KEY_MAX long,
 * decoding with fewer record slots reports -ENOSPC and the same count, a
 * truncated copy never decodes, and encode(decode(x)) has the same size and
 * decodes to the same records.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>

#include "fx100io.h"

#define FAIL(...)                                            \
	do {                                                 \
		fprintf(stderr, "fuzz_index: " __VA_ARGS__); \
		fprintf(stderr, "\n");                       \
		abort();                                     \
	} while (0)

static uint64_t le64(const uint8_t *p)
{
	uint64_t v = 0;

	for (int i = 7; i >= 0; i--)
		v = v << 8 | p[i];
	return v;
}

static uint32_t le32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static void put32(uint8_t *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

/* Give the header at p a correct CRC if it looks like one of ours. */
static void fix_crc(uint8_t *p, size_t len, uint64_t gen)
{
	uint32_t plen;

	if (len < FX_SEG_HDR_SIZE || le64(p) != FX_SEG_MAGIC || le64(p + 8) != gen)
		return;
	plen = le32(p + 24);
	if (plen > len - FX_SEG_HDR_SIZE)
		return;
	put32(p + 32, 0);
	put32(p + 32, fx_crc32c(0, p, FX_SEG_HDR_SIZE + (size_t)plen));
}

static int rec_equal(const struct fx_index_rec *a, const struct fx_index_rec *b)
{
	return a->type == b->type && a->flags == b->flags && a->key_len == b->key_len &&
	       a->data_crc == b->data_crc && a->off == b->off && a->len == b->len &&
	       a->dev == b->dev && memcmp(a->key, b->key, a->key_len) == 0;
}

/*
 * Decode at p (len bytes left) and check everything a caller relies on.
 * Returns what decode returned; *seq_out gets the sequence number.
 */
static int64_t decode_checked(const uint8_t *p, size_t len, uint64_t gen, uint64_t *seq_out)
{
	uint64_t seq = 0, seq2 = 0;
	unsigned n = 0, n2 = 0;
	struct fx_index_rec *recs, *recs2;
	int64_t size, size2;
	uint8_t *copy, *enc;

	/* no slots: a segment with records says -ENOSPC and how many */
	size = fx_index_seg_decode(p, len, gen, &seq, NULL, 0, &n);
	if (size == 0 || size == -EBADMSG)
		return size;
	if (size == -ENOSPC) {
		if (n == 0)
			FAIL("-ENOSPC with 0 records");
	} else if (size < 0) {
		FAIL("decode returned %lld", (long long)size);
	} else if (n != 0) {
		FAIL("decoded %u records into 0 slots", n);
	}

	recs = malloc(((size_t)n + 1) * sizeof(*recs));
	if (!recs)
		abort();
	if (n > 1) {
		/* one slot short: still -ENOSPC, the same count */
		unsigned n1 = 0;

		if (fx_index_seg_decode(p, len, gen, NULL, recs, n - 1, &n1) != -ENOSPC || n1 != n)
			FAIL("decode into %u slots of %u: not -ENOSPC", n - 1, n);
	}
	size = fx_index_seg_decode(p, len, gen, &seq2, recs, n, &n2);
	if (size <= 0 || n2 != n || seq2 != seq)
		FAIL("decode with enough slots: %lld, %u records (%u before)", (long long)size, n2,
		     n);
	if ((uint64_t)size > len || size < FX_SEG_HDR_SIZE || size % 8)
		FAIL("segment size %lld with %zu bytes left", (long long)size, len);
	for (unsigned i = 0; i < n; i++) {
		const struct fx_index_rec *r = &recs[i];

		if (r->key_len == 0 || r->key_len > FX_KEY_MAX)
			FAIL("record %u: key_len %u", i, r->key_len);
		if (r->type != FX_REC_PUT && r->type != FX_REC_DEL)
			FAIL("record %u: type %u", i, r->type);
		if (r->key < p + FX_SEG_HDR_SIZE + FX_REC_HDR_SIZE ||
		    r->key + r->key_len > p + size)
			FAIL("record %u: key outside the segment", i);
		if (i && r->key < recs[i - 1].key + recs[i - 1].key_len + FX_REC_HDR_SIZE)
			FAIL("record %u overlaps record %u", i, i - 1);
	}

	/* a torn copy of it (one byte short, in a block of that size) is
	 * never a segment */
	copy = malloc((size_t)size - 1);
	if (!copy)
		abort();
	memcpy(copy, p, (size_t)size - 1);
	if (fx_index_seg_decode(copy, (size_t)size - 1, gen, NULL, NULL, 0, NULL) != -EBADMSG)
		FAIL("truncated segment not reported as torn");
	free(copy);
	/* nor is it for another generation */
	if (fx_index_seg_decode(p, len, gen + 1, NULL, NULL, 0, NULL) != 0)
		FAIL("segment decodes under another generation");

	/* round trip: encode(decode(x)) is as long and decodes the same */
	enc = malloc((size_t)size); /* exactly enough */
	if (!enc)
		abort();
	if (fx_index_seg_encode(gen, seq, recs, n, enc, (size_t)size - 1) != -ENOSPC)
		FAIL("encode into a buffer one byte short did not fail");
	size2 = fx_index_seg_encode(gen, seq, recs, n, enc, (size_t)size);
	if (size2 != size)
		FAIL("re-encoded size %lld != %lld", (long long)size2, (long long)size);
	recs2 = malloc(((size_t)n + 1) * sizeof(*recs2));
	if (!recs2)
		abort();
	size2 = fx_index_seg_decode(enc, (size_t)size, gen, &seq2, recs2, n, &n2);
	if (size2 != size || seq2 != seq || n2 != n)
		FAIL("re-encoded segment decodes differently");
	for (unsigned i = 0; i < n; i++)
		if (!rec_equal(&recs[i], &recs2[i]))
			FAIL("record %u differs after a round trip", i);
	free(recs2);
	free(enc);
	free(recs);
	*seq_out = seq;
	return size;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const size_t block[4] = {8, 64, 512, 4096};
	uint8_t ctl;
	uint64_t gen, seq, last_seq = 0;
	size_t len, pos, bs, extra;
	uint8_t *log;
	int have_last = 0;

	if (size < 9)
		return 0;
	ctl = data[0];
	gen = le64(data + 1);
	len = size - 9;
	bs = block[(ctl >> 1) & 3];
	/* exactly len bytes on the heap: any overread is an ASan report */
	log = malloc(len ? len : 1);
	if (!log)
		abort();
	memcpy(log, data + 9, len);

	if (ctl & 1)
		for (pos = 0; pos < len; pos += bs)
			fix_crc(log + pos, len - pos, gen);

	/* the replay walk */
	for (pos = 0; pos < len;) {
		int64_t r = decode_checked(log + pos, len - pos, gen, &seq);

		if (r <= 0)
			break; /* not a segment, or a torn one: the end of the log */
		if (have_last && seq != last_seq + 1)
			break; /* a stale segment: the end of the log */
		have_last = 1;
		last_seq = seq;
		pos += ((size_t)r + bs - 1) / bs * bs;
	}

	/* and one decode at an arbitrary, possibly unaligned, offset */
	extra = (size_t)(ctl >> 3) * 8 + (ctl & 7);
	if (extra < len) {
		if (ctl & 1)
			fix_crc(log + extra, len - extra, gen);
		decode_checked(log + extra, len - extra, gen, &seq);
	}
	free(log);
	return 0;
}
