/*
 * Index log segment encoding (layout in fx100io.h).
 *
 * Fields are written and read byte by byte in little-endian order rather
 * than through packed structs: the on-device format must not depend on the
 * host's endianness or on the alignment of the caller's buffer, and decode
 * runs on bytes read back from a device after a crash, so it treats them as
 * hostile: every length is checked against what is left before it is used,
 * and the CRC is verified before any record is parsed.
 */
#include "fx100io.h"

#include <errno.h>
#include <string.h>

/* Header field offsets. */
#define H_MAGIC 0
#define H_GEN 8
#define H_SEQ 16
#define H_PLEN 24
#define H_NRECS 28
#define H_CRC 32

/* Record field offsets. */
#define R_TYPE 0
#define R_FLAGS 1
#define R_KEYLEN 2
#define R_DCRC 4
#define R_OFF 8
#define R_LEN 16
#define R_DEV 24 /* then u32 reserved, written as 0, ignored on read */

static void put16(uint8_t *p, uint16_t v)
{
	p[0] = (uint8_t)v;
	p[1] = (uint8_t)(v >> 8);
}

static void put32(uint8_t *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static void put64(uint8_t *p, uint64_t v)
{
	for (int i = 0; i < 8; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static uint16_t get16(const uint8_t *p)
{
	return (uint16_t)(p[0] | p[1] << 8);
}

static uint32_t get32(const uint8_t *p)
{
	uint32_t v = 0;

	for (int i = 0; i < 4; i++)
		v |= (uint32_t)p[i] << (8 * i);
	return v;
}

static uint64_t get64(const uint8_t *p)
{
	uint64_t v = 0;

	for (int i = 0; i < 8; i++)
		v |= (uint64_t)p[i] << (8 * i);
	return v;
}

static int valid_type(uint8_t type)
{
	return type == FX_REC_PUT || type == FX_REC_DEL;
}

size_t fx_index_rec_size(unsigned key_len)
{
	/* size_t arithmetic: cannot wrap for any unsigned key_len on LP64 */
	return (FX_REC_HDR_SIZE + (size_t)key_len + 7) & ~(size_t)7;
}

int64_t fx_index_seg_encode(uint64_t generation, uint64_t seq, const struct fx_index_rec *recs,
			    unsigned n, void *out, size_t cap)
{
	uint8_t *p = out;
	uint64_t payload = 0, size;
	uint32_t crc;

	if (n && !recs)
		return -EINVAL;
	for (unsigned i = 0; i < n; i++) {
		const struct fx_index_rec *r = &recs[i];

		if (r->key_len == 0 || r->key_len > FX_KEY_MAX || !r->key || !valid_type(r->type))
			return -EINVAL;
		payload += fx_index_rec_size(r->key_len);
	}
	/* payload_len is a u32 on the device */
	if (payload > UINT32_MAX)
		return -ENOSPC;
	size = FX_SEG_HDR_SIZE + payload;
	if (!p || size > cap)
		return -ENOSPC;

	/* pads and reserved fields must be zero: they are under the CRC */
	memset(p, 0, size);
	put64(p + H_MAGIC, FX_SEG_MAGIC);
	put64(p + H_GEN, generation);
	put64(p + H_SEQ, seq);
	put32(p + H_PLEN, (uint32_t)payload);
	put32(p + H_NRECS, n);

	uint8_t *r = p + FX_SEG_HDR_SIZE;

	for (unsigned i = 0; i < n; i++) {
		r[R_TYPE] = recs[i].type;
		r[R_FLAGS] = recs[i].flags;
		put16(r + R_KEYLEN, recs[i].key_len);
		put32(r + R_DCRC, recs[i].data_crc);
		put64(r + R_OFF, recs[i].off);
		put64(r + R_LEN, recs[i].len);
		put32(r + R_DEV, recs[i].dev);
		memcpy(r + FX_REC_HDR_SIZE, recs[i].key, recs[i].key_len);
		r += fx_index_rec_size(recs[i].key_len);
	}

	/* crc field is still zero from the memset, as the format requires */
	crc = fx_crc32c(0, p, size);
	put32(p + H_CRC, crc);
	return (int64_t)size;
}

int64_t fx_index_seg_decode(const void *buf, size_t len, uint64_t generation, uint64_t *seq,
			    struct fx_index_rec *recs, unsigned max, unsigned *nrecs)
{
	const uint8_t *p = buf;
	uint8_t hdr[FX_SEG_HDR_SIZE];
	uint32_t plen, n, crc;
	size_t pos;

	if (!recs)
		max = 0;
	/* too short to tell whose segment this is: not ours */
	if (!p || len < H_GEN + 8)
		return 0;
	if (get64(p + H_MAGIC) != FX_SEG_MAGIC || get64(p + H_GEN) != generation)
		return 0;
	/* ours from here on, so any inconsistency means a torn or bad write */
	if (len < FX_SEG_HDR_SIZE)
		return -EBADMSG;
	plen = get32(p + H_PLEN);
	n = get32(p + H_NRECS);
	if (plen > len - FX_SEG_HDR_SIZE || plen % 8 || (uint64_t)n * FX_REC_HDR_SIZE > plen)
		return -EBADMSG;

	memcpy(hdr, p, sizeof(hdr));
	put32(hdr + H_CRC, 0);
	crc = fx_crc32c(0, hdr, sizeof(hdr));
	crc = fx_crc32c(crc, p + FX_SEG_HDR_SIZE, plen);
	if (crc != get32(p + H_CRC))
		return -EBADMSG;

	/*
	 * A valid CRC proves nothing against a crafted segment, so records
	 * are still bounds-checked; all of them are, even past max, so that
	 * -ENOSPC is only ever reported for a well-formed segment.
	 */
	pos = 0;
	for (uint32_t i = 0; i < n; i++) {
		const uint8_t *r = p + FX_SEG_HDR_SIZE + pos;
		uint16_t key_len;
		size_t rsize;

		if (plen - pos < FX_REC_HDR_SIZE)
			return -EBADMSG;
		key_len = get16(r + R_KEYLEN);
		if (key_len == 0 || key_len > FX_KEY_MAX || !valid_type(r[R_TYPE]))
			return -EBADMSG;
		rsize = fx_index_rec_size(key_len);
		if (rsize > plen - pos)
			return -EBADMSG;
		if (i < max) {
			recs[i].type = r[R_TYPE];
			recs[i].flags = r[R_FLAGS];
			recs[i].key_len = key_len;
			recs[i].data_crc = get32(r + R_DCRC);
			recs[i].off = get64(r + R_OFF);
			recs[i].len = get64(r + R_LEN);
			recs[i].dev = get32(r + R_DEV);
			recs[i].key = r + FX_REC_HDR_SIZE;
		}
		pos += rsize;
	}
	if (pos != plen)
		return -EBADMSG;

	if (seq)
		*seq = get64(p + H_SEQ);
	if (nrecs)
		*nrecs = n;
	if (n > max)
		return -ENOSPC;
	return FX_SEG_HDR_SIZE + (int64_t)plen;
}
