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

#endif
