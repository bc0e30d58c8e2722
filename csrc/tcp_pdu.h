/*
 * NVMe/TCP PDU rules shared by the initiator and our target: what a valid
 * header looks like for each direction, digests, and header set-up.
 */
#ifndef FX100IO_TCP_PDU_H
#define FX100IO_TCP_PDU_H

#include <stdint.h>

#include "fx100io/nvme.h"

/* Header length the spec fixes for a PDU type (without digest); 0 if the
 * type is unknown. */
unsigned fx_tcp_pdu_hlen(uint8_t type);

/*
 * Validate a received common header before trusting any length in it:
 * the type is one this side may receive (from_controller: the host receives
 * ICResp, C2HTermReq, CapsuleResp, C2HData, R2T; otherwise the controller
 * receives ICReq, H2CTermReq, CapsuleCmd, H2CData), hlen is the type's,
 * HDGSTF/DDGSTF match the negotiated digests (none before ICResp), plen is
 * at least hlen + digests and at most max_plen, and pdo (when there is data)
 * lies inside the PDU after the header and its digest.
 * Returns the number of header bytes to read in total (hlen + header digest),
 * or -EPROTO.
 */
int fx_tcp_pdu_check(const struct nvme_tcp_hdr *h, int from_controller, int hdgst,
                     int ddgst, uint32_t max_plen);

/* CRC32C header digest of the first hlen bytes. */
uint32_t fx_tcp_hdgst(const void *hdr, unsigned hlen);

/*
 * Fill a common header for a PDU of this type carrying datalen bytes of data
 * (0 for none): hlen, flags (HDGSTF/DDGSTF as negotiated; DDGSTF only with
 * data), pdo (data offset honouring the peer's alignment pda, in 4-byte
 * units 0's based), plen.  Returns pdo (0 without data).
 */
unsigned fx_tcp_hdr_init(struct nvme_tcp_hdr *h, uint8_t type, uint32_t datalen, int hdgst,
                         int ddgst, uint8_t pda);

/*
 * What the PDU rules need to know about one command's data transfer.  Both
 * initiators keep one per command (transport/tcp_ctrl.c's blocking control
 * path and transport/tcp.c's io_uring data path) and ask the functions below before
 * they act on an R2T, a C2HData or a response: one rule, one place
 * (docs/architecture.md rule 13).  A function that refuses returns -EPROTO
 * and leaves
 * why (for the log) and fes/fei (for an H2CTermReq) here; the caller fails
 * the command and tears the connection down.
 */
struct fx_tcp_xfer {
	uint32_t len;       /* the command's data length */
	uint32_t requested; /* write: bytes R2Ts asked for so far (the next valid r2to) */
	uint32_t sent;      /* write: bytes of requested data handed over completely */
	uint32_t received;  /* read: C2HData bytes so far */
	uint8_t write;      /* data flows host to controller */
	uint8_t incapsule;  /* the write data went in the capsule */
	uint8_t r2t_open;   /* an R2T's data is not all sent yet (we advertise MAXR2T 0) */
	uint8_t last;       /* read: a C2HData with LAST_PDU arrived */
	/* set when a check fails */
	uint16_t fes;
	uint32_t fei;
	const char *why;
};

void fx_tcp_xfer_init(struct fx_tcp_xfer *x, uint32_t len, int write, int incapsule);

/*
 * An R2T for this command: valid only for a write whose data did not go in
 * the capsule, with no other R2T of it outstanding, r2to equal to the data
 * requested so far (in order, no repeats) and r2tl > 0 with r2to + r2tl
 * inside the transfer.  On success it is recorded (requested += r2tl,
 * r2t_open); the caller sends exactly [r2to, r2to + r2tl) and then calls
 * fx_tcp_xfer_r2t_sent().  Returns 0 or -EPROTO.
 */
int fx_tcp_xfer_r2t(struct fx_tcp_xfer *x, uint32_t r2to, uint32_t r2tl);
/* Every byte of the open R2T has been sent. */
void fx_tcp_xfer_r2t_sent(struct fx_tcp_xfer *x);

/*
 * A C2HData header for this command (already past fx_tcp_pdu_check): a read,
 * not after LAST_PDU, datal equal to the PDU's payload, datao equal to the
 * bytes received so far, inside the buffer, and SUCCESS only with LAST_PDU
 * on the PDU that ends the transfer.  Returns 0 or -EPROTO; nothing is
 * recorded until fx_tcp_xfer_c2h_done().
 */
int fx_tcp_xfer_c2h(struct fx_tcp_xfer *x, const struct nvme_tcp_data_pdu *p, int ddgst);
/* The data of a checked C2HData has landed: record it.  Returns 1 when the
 * PDU's SUCCESS flag completes the command (no CapsuleResp follows). */
int fx_tcp_xfer_c2h_done(struct fx_tcp_xfer *x, const struct nvme_tcp_data_pdu *p);

/*
 * May a CapsuleResp with this status field complete the command?  An error
 * status always may.  Success only if the whole transfer happened: every
 * byte of a read received, every byte of a write in the capsule or
 * requested by R2T and sent.  Returns 0 or -EPROTO.
 */
int fx_tcp_xfer_rsp(struct fx_tcp_xfer *x, uint16_t status_field);

#endif
