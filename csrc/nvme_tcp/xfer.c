/*
 * The NVMe/TCP transfer rules of one command (see xfer.h): both host paths
 * ask here before they act on an R2T, a C2HData or a response, so a
 * controller's PDU is judged by one rule wherever it arrives.
 */
#ifndef _GNU_SOURCE /* tests/c/Makefile passes -D_GNU_SOURCE */
#define _GNU_SOURCE
#endif
#include "nvme_tcp/xfer.h"

#include "auth/auth_msg.h"

#include <errno.h>
#include <stddef.h>
#include <string.h>

void fx_tcp_xfer_init(struct fx_tcp_xfer *x, uint32_t len, int write, int incapsule)
{
	memset(x, 0, sizeof(*x));
	x->len = len;
	x->write = !!write;
	x->incapsule = !!(write && incapsule);
	if (x->incapsule)
		x->requested = x->sent = len;
}

void fx_tcp_xfer_cmd(struct fx_tcp_xfer *x, const struct nvme_sqe *sqe)
{
	const struct nvmf_connect_cmd *f = (const struct nvmf_connect_cmd *)sqe;

	x->short_ok = !x->write && f->opcode == NVME_FABRICS_OPCODE &&
		      f->fctype == NVMF_FCTYPE_AUTH_RECV;
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
		return refuse(x, NVME_TCP_FES_PDU_SEQ_ERR, 0,
			      "R2T for a command without write data");
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
		if (p->datal != x->len - x->received && !x->short_ok)
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
	if (!x->write && x->received != x->len && !x->short_ok)
		return refuse(x, NVME_TCP_FES_PDU_SEQ_ERR, 0,
			      "success before all read data arrived");
	if (x->write && (x->r2t_open || x->sent != x->len))
		return refuse(x, NVME_TCP_FES_PDU_SEQ_ERR, 0,
			      "success before all write data was requested and sent");
	return 0;
}
