/*
 * The NVMe/TCP transfer rules of one command, as the host sees them: which
 * R2T, C2HData and CapsuleResp may act on it and when (NVMe/TCP Transport
 * 1.0, sections 3.3-3.6).  Header rules and PDU layout are in pdu.h.
 */
#ifndef FX100IO_NVME_TCP_XFER_H
#define FX100IO_NVME_TCP_XFER_H

#include <stdint.h>

#include "fx100io/nvme.h"

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
	uint8_t short_ok;   /* read: success may come before len bytes (fx_tcp_xfer_cmd) */
	/* set when a check fails */
	uint16_t fes;
	uint32_t fei;
	const char *why;
};

void fx_tcp_xfer_init(struct fx_tcp_xfer *x, uint32_t len, int write, int incapsule);
/*
 * After fx_tcp_xfer_init: what the command itself allows.  An Authentication
 * Receive's length is only an allocation length, and controllers differ:
 * Linux's sends all of it, SPDK's only its message (then success, as the
 * Linux and SPDK hosts accept).  So a read that ends early is allowed there
 * and nowhere else (a short read of data would leave stale bytes trusted);
 * the initiator then zeroes the rest of the buffer and reports how many bytes
 * came (transport/tcp_ctrl.c), so the message parsers check each message's
 * own length against them (host/auth_host.c: a cut message is "truncated").
 */
void fx_tcp_xfer_cmd(struct fx_tcp_xfer *x, const struct nvme_sqe *sqe);

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
 * on the PDU that ends the transfer (for a command fx_tcp_xfer_cmd lets end
 * early: on the last PDU, wherever it ends).  Returns 0 or -EPROTO; nothing is
 * recorded until fx_tcp_xfer_c2h_done().
 */
int fx_tcp_xfer_c2h(struct fx_tcp_xfer *x, const struct nvme_tcp_data_pdu *p, int ddgst);
/* The data of a checked C2HData has landed: record it.  Returns 1 when the
 * PDU's SUCCESS flag completes the command (no CapsuleResp follows). */
int fx_tcp_xfer_c2h_done(struct fx_tcp_xfer *x, const struct nvme_tcp_data_pdu *p);

/*
 * May a CapsuleResp with this status field complete the command?  An error
 * status always may.  Success only if the whole transfer happened: every
 * byte of a read received (unless fx_tcp_xfer_cmd allowed an early end: then
 * after any number of bytes, none included), every byte of a write in the
 * capsule or requested by R2T and sent.  Returns 0 or -EPROTO.
 */
int fx_tcp_xfer_rsp(struct fx_tcp_xfer *x, uint16_t status_field);

#endif
