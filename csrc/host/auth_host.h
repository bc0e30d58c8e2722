/*
 * The host's side of in-band authentication (DH-HMAC-CHAP,
 * host/auth_host.c), which every transport's connect runs after Fabrics
 * Connect.  The reason for a failure is fx_nvmf_auth_error() (host/nvmf.h).
 */
#ifndef FX100IO_HOST_AUTH_HOST_H
#define FX100IO_HOST_AUTH_HOST_H

#include <stdint.h>

#include "host/nvmf.h"

/*
 * In-band authentication after a successful Fabrics Connect on queue q
 * (host/auth_host.c); every transport's connect calls it with the Connect
 * response's DW0, so the admin queue, every I/O queue and every reconnect
 * authenticate.  0: the controller asked for none, or DH-HMAC-CHAP
 * succeeded (bidirectionally when p has a controller secret).  Errors
 * (the queue is then unusable; the caller closes it):
 *   -EACCES  authentication required and no dhchap_secret given, or none
 *            asked although p has a controller secret (not for discovery); the
 *            controller's AUTH_Failure1 (wrong secret, ...); the
 *            controller's response did not match dhchap_ctrl_secret
 *   -EPROTONOSUPPORT  the controller requires secure channel concatenation
 *   -EPROTO  a malformed or unexpected message, a DH value out of range
 *   -EIO     an AUTH_Send/Receive completed with an NVMe error status
 *   -ETIMEDOUT  the transaction did not end by deadline (the connect's,
 *            on fx_nvmf_now_ms's clock; 0: each command gets the queue's
 *            own timeout)
 *   or what the transport's exec returned.
 * The reason, in words, is fx_nvmf_auth_error() on the same thread.
 */
int fx_nvmf_auth_host(const struct fx_nvmf_transport *tr, void *q, const struct fx_nvmf_params *p,
		      uint16_t qid, uint32_t connect_dw0, int64_t deadline);
#endif
