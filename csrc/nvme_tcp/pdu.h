/*
 * NVMe/TCP PDUs, written once for the host control path
 * (transport/tcp_ctrl.c), the host data path (transport/tcp.c) and our
 * target (target/conn.c): what a valid header looks like for each
 * direction, how a PDU to send is laid out (header, header digest, padding
 * up to PDO, data, data digest) and the digests themselves.  The transfer
 * rules of one command are in xfer.h, socket I/O with deadlines in sock.h.
 */
#ifndef FX100IO_NVME_TCP_PDU_H
#define FX100IO_NVME_TCP_PDU_H

#include <stdint.h>
#include <sys/uio.h>

#include "fx100io/nvme.h"

/* The capsules: the common header and the SQE / CQE right behind it. */
struct nvme_tcp_cmd_pdu {
	struct nvme_tcp_hdr hdr;
	struct nvme_sqe sqe;
} FX_PACKED;
struct nvme_tcp_rsp_pdu {
	struct nvme_tcp_hdr hdr;
	struct nvme_cqe cqe;
} FX_PACKED;

/* Header lengths (HLEN) of the capsules and of the 24-byte PDUs that carry
 * no SQE/CQE (Data, R2T, TermReq all share it). */
#define FX_TCP_CMD_HLEN ((unsigned)sizeof(struct nvme_tcp_cmd_pdu))
#define FX_TCP_RSP_HLEN ((unsigned)sizeof(struct nvme_tcp_rsp_pdu))
#define FX_TCP_DATA_HLEN ((unsigned)sizeof(struct nvme_tcp_data_pdu))
_Static_assert(sizeof(struct nvme_tcp_cmd_pdu) == 72, "CapsuleCmd");
_Static_assert(sizeof(struct nvme_tcp_rsp_pdu) == 24, "CapsuleResp");

/* A TermReq carries at most this much of the offending PDU after its
 * header (the spec's "maximum of 152 bytes" for its Data field). */
#define FX_TCP_TERM_DATA_MAX 152
#define FX_TCP_TERM_MAX ((unsigned)sizeof(struct nvme_tcp_term_pdu) + FX_TCP_TERM_DATA_MAX)

/* Room for any header we build or read, with its digest and the padding up
 * to PDO: the largest header is ICReq/ICResp (128, never digested or
 * padded); a capsule (72 + 4) padded to the widest alignment a peer may ask
 * (PDA 31: 128 bytes) needs 128. */
#define FX_TCP_HEAD_MAX 160

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
int fx_tcp_pdu_check(const struct nvme_tcp_hdr *h, int from_controller, int hdgst, int ddgst,
		     uint32_t max_plen);

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
 * Finish a header to send, built in b (fx_tcp_hdr_init() and the type's
 * fields): append its digest when it carries HDGSTF and zero padding up to
 * PDO.  Returns the bytes that go before the data, or -EPROTO when they do
 * not fit in cap (an alignment the caller's buffer is not sized for).
 */
int fx_tcp_head_finish(uint8_t *b, unsigned cap);

/*
 * The iovecs of a whole PDU: the finished header (head, head_len bytes),
 * then datalen bytes of data (none when 0) and, when the header says
 * DDGSTF, their CRC32C, written to *ddgst.  *ddgst must live as long as
 * the iovecs.  Returns the iovec count (1 to 3).
 */
int fx_tcp_pdu_iov(struct iovec *iov, const void *head, unsigned head_len, const void *data,
		   uint32_t datalen, uint32_t *ddgst);

/*
 * An H2CTermReq (host) or C2HTermReq (controller) in b (FX_TCP_TERM_MAX
 * bytes): fatal error status fes, the offending field's byte offset fei and
 * up to FX_TCP_TERM_DATA_MAX bytes of the offending header.  Returns its
 * length.
 */
unsigned fx_tcp_term_build(uint8_t *b, uint8_t type, uint16_t fes, uint32_t fei, const void *hdr,
			   unsigned hdr_len);

/*
 * A received header of n bytes (what fx_tcp_pdu_check() returned): when n
 * exceeds hlen, the header digest follows the header and must match.
 * Returns 0, or -EBADMSG on a mismatch.
 */
int fx_tcp_hdgst_check(const void *hdr, unsigned n);

/* CRC32C data digest of a data field. */
uint32_t fx_tcp_ddgst(const void *data, uint32_t len);

#endif
