/*
 * The ANA log page (LID 0Ch) as the host reads it (host/ana.c): the state
 * of one ANA group, out of a page that came from the network.
 */
#ifndef FX100IO_HOST_ANA_H
#define FX100IO_HOST_ANA_H

#include <stddef.h>
#include <stdint.h>

/*
 * The state (NVME_ANA_*) and change count of group grpid in the len bytes
 * of an ANA log page.  Every count in the page is checked against len
 * before it is used (docs/architecture.md rule 6).  0; -ENOENT (no
 * descriptor for grpid); -EPROTO (a page too short for what it says it
 * holds); -EMSGSIZE (the page goes on past len: read more of it).
 */
int fx_nvmf_ana_find(const uint8_t *log, size_t len, uint32_t grpid, uint8_t *state,
		     uint64_t *chgcnt);

#endif
