/*
 * NVMe/TCP PDUs (NVMe/TCP Transport 1.0, section 3.6), shared by the
 * initiator (transport/tcp_ctrl.c, transport/tcp.c) and our target
 * (target/): the header rules, and how a PDU is laid out to send.
 *
 * The checks look only at the 8-byte common header, so a receiver can
 * decide how many more bytes to read before it trusts anything else: the
 * lengths in a header from the network are checked here once, and code
 * further on may then size reads from them.
 */
#ifndef _GNU_SOURCE /* tests/c/Makefile passes -D_GNU_SOURCE */
#define _GNU_SOURCE
#endif
#include "nvme_tcp/pdu.h"

#include <errno.h>
#include <stddef.h>
#include <string.h>

#include "fx100io.h"

unsigned fx_tcp_pdu_hlen(uint8_t type)
{
	switch (type) {
	case NVME_TCP_ICREQ:
		return sizeof(struct nvme_tcp_icreq_pdu);
	case NVME_TCP_ICRESP:
		return sizeof(struct nvme_tcp_icresp_pdu);
	case NVME_TCP_H2C_TERM:
	case NVME_TCP_C2H_TERM:
		return sizeof(struct nvme_tcp_term_pdu);
	case NVME_TCP_CMD:
		return sizeof(struct nvme_tcp_hdr) + sizeof(struct nvme_sqe);
	case NVME_TCP_RSP:
		return sizeof(struct nvme_tcp_hdr) + sizeof(struct nvme_cqe);
	case NVME_TCP_H2C_DATA:
	case NVME_TCP_C2H_DATA:
		return sizeof(struct nvme_tcp_data_pdu);
	case NVME_TCP_R2T:
		return sizeof(struct nvme_tcp_r2t_pdu);
	default:
		return 0;
	}
}

/* Which direction a PDU type travels in: 1 controller to host, 0 host to
 * controller, -1 unknown. */
static int from_ctrl(uint8_t type)
{
	switch (type) {
	case NVME_TCP_ICRESP:
	case NVME_TCP_C2H_TERM:
	case NVME_TCP_RSP:
	case NVME_TCP_C2H_DATA:
	case NVME_TCP_R2T:
		return 1;
	case NVME_TCP_ICREQ:
	case NVME_TCP_H2C_TERM:
	case NVME_TCP_CMD:
	case NVME_TCP_H2C_DATA:
		return 0;
	default:
		return -1;
	}
}

/* Initialize and terminate PDUs never carry digests: they are exchanged
 * before digests are negotiated, or report that the stream is broken. */
static int digest_capable(uint8_t type)
{
	return type != NVME_TCP_ICREQ && type != NVME_TCP_ICRESP && type != NVME_TCP_H2C_TERM &&
	       type != NVME_TCP_C2H_TERM;
}

/* Types that may (CapsuleCmd) or must (Data PDUs) carry data after pdo. */
static int may_carry_data(uint8_t type)
{
	return type == NVME_TCP_CMD || type == NVME_TCP_H2C_DATA || type == NVME_TCP_C2H_DATA;
}

int fx_tcp_pdu_check(const struct nvme_tcp_hdr *h, int from_controller, int hdgst, int ddgst,
		     uint32_t max_plen)
{
	int dir = from_ctrl(h->type);
	unsigned hlen = fx_tcp_pdu_hlen(h->type);
	uint32_t plen = h->plen;
	uint8_t dflags = h->flags & (NVME_TCP_F_HDGST | NVME_TCP_F_DDGST);

	if (dir < 0 || dir != !!from_controller)
		return -EPROTO;
	if (h->hlen != hlen)
		return -EPROTO;
	if (plen > max_plen)
		return -EPROTO;

	if (!digest_capable(h->type)) {
		if (dflags)
			return -EPROTO;
		if (h->type == NVME_TCP_ICREQ || h->type == NVME_TCP_ICRESP) {
			/* fixed size: nothing may follow the 128 bytes */
			if (plen != hlen)
				return -EPROTO;
		} else if (plen < hlen || plen > hlen + FX_TCP_TERM_DATA_MAX) {
			return -EPROTO;
		}
		return (int)hlen;
	}

	unsigned hd = hdgst ? NVME_TCP_DIGEST_LEN : 0;
	unsigned dd = ddgst ? NVME_TCP_DIGEST_LEN : 0;

	/* The header digest is all or nothing once negotiated. */
	if (!!(h->flags & NVME_TCP_F_HDGST) != !!hdgst)
		return -EPROTO;
	if (plen < hlen + hd)
		return -EPROTO;

	int has_data = plen > hlen + hd;

	if (!has_data) {
		/* Data PDUs exist to carry data; an empty one is malformed. */
		if (h->type == NVME_TCP_H2C_DATA || h->type == NVME_TCP_C2H_DATA)
			return -EPROTO;
		if (h->flags & NVME_TCP_F_DDGST)
			return -EPROTO;
		return (int)(hlen + hd);
	}

	if (!may_carry_data(h->type))
		return -EPROTO; /* CapsuleResp / R2T with trailing bytes */
	/* A data digest accompanies every data field once negotiated, and
	 * only then. */
	if (!!(h->flags & NVME_TCP_F_DDGST) != !!ddgst)
		return -EPROTO;
	/* Data starts after header + header digest (plus any alignment pad)
	 * and at least one byte of it lies before the data digest. */
	if (h->pdo < hlen + hd)
		return -EPROTO;
	if ((uint64_t)h->pdo + dd >= plen)
		return -EPROTO;
	return (int)(hlen + hd);
}

uint32_t fx_tcp_hdgst(const void *hdr, unsigned hlen)
{
	return fx_crc32c(0, hdr, hlen);
}

unsigned fx_tcp_hdr_init(struct nvme_tcp_hdr *h, uint8_t type, uint32_t datalen, int hdgst,
			 int ddgst, uint8_t pda)
{
	unsigned hlen = fx_tcp_pdu_hlen(type);
	int dig = digest_capable(type);
	unsigned hd = (dig && hdgst) ? NVME_TCP_DIGEST_LEN : 0;
	unsigned pdo = 0;

	memset(h, 0, sizeof(*h));
	h->type = type;
	h->hlen = (uint8_t)hlen;
	if (hd)
		h->flags |= NVME_TCP_F_HDGST;
	if (datalen) {
		/* The peer asked for data at multiples of (pda + 1) dwords;
		 * the gap after the header digest is zero padding. */
		unsigned align = ((unsigned)pda + 1) * 4;

		pdo = (hlen + hd + align - 1) / align * align;
		h->pdo = (uint8_t)pdo;
		h->plen = pdo + datalen;
		if (dig && ddgst) {
			h->flags |= NVME_TCP_F_DDGST;
			h->plen += NVME_TCP_DIGEST_LEN;
		}
	} else {
		h->plen = hlen + hd;
	}
	return pdo;
}

/* ------------------------------------------------------- building PDUs */

int fx_tcp_head_finish(uint8_t *b, unsigned cap)
{
	const struct nvme_tcp_hdr *h = (const struct nvme_tcp_hdr *)b;
	unsigned n = h->hlen;

	if ((h->flags & NVME_TCP_F_HDGST) && n + NVME_TCP_DIGEST_LEN > cap)
		return -EPROTO;
	if (h->flags & NVME_TCP_F_HDGST) {
		uint32_t d = fx_tcp_hdgst(b, n);

		memcpy(b + n, &d, sizeof(d));
		n += NVME_TCP_DIGEST_LEN;
	}
	if (h->pdo > n) {
		/* the peer's alignment: zeros between header and data */
		if (h->pdo > cap)
			return -EPROTO;
		memset(b + n, 0, h->pdo - n);
		n = h->pdo;
	}
	return (int)n;
}

int fx_tcp_pdu_iov(struct iovec *iov, const void *head, unsigned head_len, const void *data,
		   uint32_t datalen, uint32_t *ddgst)
{
	const struct nvme_tcp_hdr *h = head;
	int k = 0;

	iov[k++] = (struct iovec){(void *)head, head_len};
	if (datalen) {
		iov[k++] = (struct iovec){(void *)data, datalen};
		if (h->flags & NVME_TCP_F_DDGST) {
			*ddgst = fx_tcp_ddgst(data, datalen);
			iov[k++] = (struct iovec){ddgst, NVME_TCP_DIGEST_LEN};
		}
	}
	return k;
}

unsigned fx_tcp_term_build(uint8_t *b, uint8_t type, uint16_t fes, uint32_t fei, const void *hdr,
			   unsigned hdr_len)
{
	struct nvme_tcp_term_pdu *t = (struct nvme_tcp_term_pdu *)b;
	unsigned copy = hdr_len < FX_TCP_TERM_DATA_MAX ? hdr_len : FX_TCP_TERM_DATA_MAX;

	if (!hdr)
		copy = 0;
	memset(t, 0, sizeof(*t));
	fx_tcp_hdr_init(&t->hdr, type, 0, 0, 0, 0);
	t->hdr.plen = (uint32_t)(sizeof(*t) + copy);
	t->fes = fes;
	t->feil = (uint16_t)(fei & 0xFFFF);
	t->feiu = (uint16_t)(fei >> 16);
	if (copy)
		memcpy(b + sizeof(*t), hdr, copy);
	return (unsigned)sizeof(*t) + copy;
}

/* ------------------------------------------------------------- digests */

int fx_tcp_hdgst_check(const void *hdr, unsigned n)
{
	const struct nvme_tcp_hdr *h = hdr;
	uint32_t got;

	if (n <= h->hlen)
		return 0; /* no header digest on this PDU */
	memcpy(&got, (const uint8_t *)hdr + h->hlen, sizeof(got));
	return got == fx_tcp_hdgst(hdr, h->hlen) ? 0 : -EBADMSG;
}

uint32_t fx_tcp_ddgst(const void *data, uint32_t len)
{
	return fx_crc32c(0, data, len);
}
