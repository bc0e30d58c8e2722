/*
 * NVMe/TCP PDU header rules (NVMe/TCP Transport 1.0, section 3.6), shared by
 * the initiator (transport/tcp_ctrl.c, transport/tcp.c) and our target
 * (target/).
 *
 * Everything here looks only at the 8-byte common header, so a receiver can
 * decide how many more bytes to read before it trusts anything else: the
 * lengths in a header from the network are checked here once, and code
 * further on may then size reads from them.
 */
#ifndef _GNU_SOURCE /* tests/c/Makefile passes -D_GNU_SOURCE */
#define _GNU_SOURCE
#endif
#include "tcp_pdu.h"

#include <errno.h>
#include <stddef.h>
#include <string.h>

#include "fx100io.h"

/* TermReq carries at most this much of the offending PDU after its header
 * (the spec's "maximum of 152 bytes" for the Data field of H2C/C2HTermReq). */
#define TERM_MAX_DATA 152

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
		} else if (plen < hlen || plen > hlen + TERM_MAX_DATA) {
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

/* ------------------------------------------------ command transfer rules */

void fx_tcp_xfer_init(struct fx_tcp_xfer *x, uint32_t len, int write, int incapsule)
{
	memset(x, 0, sizeof(*x));
	x->len = len;
	x->write = !!write;
	x->incapsule = !!(write && incapsule);
	if (x->incapsule)
		x->requested = x->sent = len;
}

static int refuse(struct fx_tcp_xfer *x, uint16_t fes, uint32_t fei, const char *why)
{
	x->fes = fes;
	x->fei = fei;
	x->why = why;
	return -EPROTO;
}

int fx_tcp_xfer_r2t(struct fx_tcp_xfer *x, uint32_t r2to, uint32_t r2tl)
{
	const uint32_t off_r2to = offsetof(struct nvme_tcp_r2t_pdu, r2to);
	const uint32_t off_r2tl = offsetof(struct nvme_tcp_r2t_pdu, r2tl);

	if (!x->write)
		return refuse(x, NVME_TCP_FES_PDU_SEQ_ERR, 0, "R2T for a command without write data");
	if (x->incapsule)
		return refuse(x, NVME_TCP_FES_PDU_SEQ_ERR, 0, "R2T for data sent in the capsule");
	if (x->r2t_open)
		return refuse(x, NVME_TCP_FES_R2T_LIMIT_EXCEEDED, 0,
			      "R2T while another R2T of the command is outstanding");
	if (r2to != x->requested)
		return refuse(x, NVME_TCP_FES_DATA_OUT_OF_RANGE, off_r2to,
			      r2to < x->requested ? "R2T repeats data already requested"
						  : "R2T skips data (out of order)");
	if (r2tl == 0)
		return refuse(x, NVME_TCP_FES_DATA_OUT_OF_RANGE, off_r2tl, "R2T of length 0");
	/* r2to <= len holds (r2to == requested <= len): no overflow */
	if (r2tl > x->len - r2to)
		return refuse(x, NVME_TCP_FES_DATA_OUT_OF_RANGE, off_r2tl,
			      "R2T past the end of the transfer");
	x->requested += r2tl;
	x->r2t_open = 1;
	return 0;
}

void fx_tcp_xfer_r2t_sent(struct fx_tcp_xfer *x)
{
	if (x->r2t_open) {
		x->r2t_open = 0;
		x->sent = x->requested;
	}
}

int fx_tcp_xfer_c2h(struct fx_tcp_xfer *x, const struct nvme_tcp_data_pdu *p, int ddgst)
{
	const struct nvme_tcp_hdr *h = &p->hdr;
	uint64_t payload_end = (uint64_t)h->pdo + p->datal + (ddgst ? NVME_TCP_DIGEST_LEN : 0);

	if (x->write)
		return refuse(x, NVME_TCP_FES_PDU_SEQ_ERR, 0, "C2HData for a write");
	if (x->last)
		return refuse(x, NVME_TCP_FES_PDU_SEQ_ERR, 0, "C2HData after LAST_PDU");
	if (p->datal == 0 || payload_end != h->plen)
		return refuse(x, NVME_TCP_FES_DATA_OUT_OF_RANGE,
			      offsetof(struct nvme_tcp_data_pdu, datal),
			      "C2HData length disagrees with the PDU");
	/* In order: datao == bytes so far also catches gaps and repeats, so a
	 * complete transfer means every byte was written once. */
	if (p->datao != x->received)
		return refuse(x, NVME_TCP_FES_DATA_OUT_OF_RANGE,
			      offsetof(struct nvme_tcp_data_pdu, datao), "C2HData out of order");
	if (p->datal > x->len - x->received)
		return refuse(x, NVME_TCP_FES_DATA_OUT_OF_RANGE,
			      offsetof(struct nvme_tcp_data_pdu, datal),
			      "C2HData past the end of the buffer");
	if (h->flags & NVME_TCP_F_DATA_SUCCESS) {
		/* No CapsuleResp follows: only on the PDU that ends the data. */
		if (!(h->flags & NVME_TCP_F_DATA_LAST))
			return refuse(x, NVME_TCP_FES_INVALID_PDU_HDR, 1,
				      "C2HData SUCCESS without LAST_PDU");
		if (p->datal != x->len - x->received)
			return refuse(x, NVME_TCP_FES_INVALID_PDU_HDR, 1,
				      "C2HData SUCCESS before the end of the data");
	}
	return 0;
}

int fx_tcp_xfer_c2h_done(struct fx_tcp_xfer *x, const struct nvme_tcp_data_pdu *p)
{
	x->received += p->datal;
	if (p->hdr.flags & NVME_TCP_F_DATA_LAST)
		x->last = 1;
	return (p->hdr.flags & NVME_TCP_F_DATA_SUCCESS) != 0;
}

int fx_tcp_xfer_rsp(struct fx_tcp_xfer *x, uint16_t status_field)
{
	if (status_field)
		return 0; /* the controller failed it: nothing to trust */
	if (!x->write && x->received != x->len)
		return refuse(x, NVME_TCP_FES_PDU_SEQ_ERR, 0, "success before all read data arrived");
	if (x->write && (x->r2t_open || x->sent != x->len))
		return refuse(x, NVME_TCP_FES_PDU_SEQ_ERR, 0,
			      "success before all write data was requested and sent");
	return 0;
}
