/*
 * The NVMe-oF control path as its users see it (the io_uring initiator
 * transport/tcp.c, the Python binding and tests): connection set-up,
 * synchronous commands on blocking sockets (Property Get/Set, Identify,
 * Set Features, Get Log Page, Keep Alive), the controller object with its
 * admin queue and keep-alive thread, and discovery.
 *
 * It is split by what depends on the fabric (see docs/architecture.md):
 *   nvmf/nvmf.h          addressing, parameters, the per-transport table,
 *                        Connect/Property helpers (nvmf/common.c)
 *   nvmf/ctrl.h          the controller and discovery, on any transport
 *                        (nvmf/ctrl.c, nvmf/discovery.c)
 *   transport/tcp_ctrl.h NVMe/TCP queues and the TCP table
 * This header names the TCP controller entry points the callers use.
 *
 * Every function returns 0 or -errno; NVMe error statuses become -EIO (or a
 * more specific errno where one fits) with the raw status field reported
 * through the status out-parameter where there is one.
 */
#ifndef FX100IO_FABRIC_H
#define FX100IO_FABRIC_H

#include <pthread.h>
#include <stdint.h>

#include "fx100io/nvme.h"
#include "nvmf/ctrl.h"
#include "nvmf/nvmf.h"
#include "transport/tcp_ctrl.h"

/* fx_nvmf_ctrl_open_tr over NVMe/TCP.  Errors as fx_nvmf_tcp_connect, plus
 * -ETIMEDOUT (CSTS.RDY never set). */
int fx_nvmf_ctrl_open(const struct fx_nvmf_addr *a, const struct fx_nvmf_params *p,
                      uint16_t want_io_queues, struct fx_nvmf_ctrl **out, uint16_t *status);

/* fx_nvmf_discover_tr over NVMe/TCP. */
int fx_nvmf_discover(const struct fx_nvmf_addr *a, const struct fx_nvmf_params *p,
                     struct nvmf_disc_log_entry **entries, uint32_t *n, uint16_t *status);

#endif
