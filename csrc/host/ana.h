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

/*
 * Reading the page over the network, bounded against a target that claims
 * more than it sends: read(ctx, lsp, off, buf, len, status) fetches len
 * bytes (a dword multiple, at most one MDTS) of the ANA log at off with that
 * log specific field, and returns 0 or -errno (*status on -EIO).  It is
 * asked with RGO (groups only, no NSID lists: our group's state is all we
 * need); a controller that fails that with Invalid Field is asked without
 * it from then on (the parser skips NSID lists either way).  The page is read in chunks of
 * mdts (0: one command); when that took more than one command the header
 * is read again and a CHGCNT that moved means a torn page, read again once
 * (-EAGAIN if it tears twice).  A page that goes on past what was read is
 * read again four times larger, up to FX_NVMF_ANA_LOG_MAX (-EPROTO past
 * it).  r carries what one poll learns to the next: the length that
 * sufficed (start there, not at 4 KiB again) and the CHGCNT of a page that
 * proved too large (while it stays, only the first chunk is read: a target
 * cannot make every poll re-grow to the cap without changing its page).
 */
#define FX_NVMF_ANA_LOG_FIRST 4096u
#define FX_NVMF_ANA_LOG_MAX (256u << 10) /* 8191 groups without NSIDs */

struct fx_nvmf_ana_reader {
	uint32_t len;        /* the page length to start with; 0: FIRST */
	int too_big;         /* the page proved longer than MAX ... */
	uint64_t big_chgcnt; /* ... while its CHGCNT was this */
	int no_rgo;          /* the controller refused RGO */
};

typedef int (*fx_nvmf_ana_read_fn)(void *ctx, uint8_t lsp, uint64_t off, void *buf, uint32_t len,
				   uint16_t *status);

/* 0 (*state and *chgcnt set), -ENOENT, -EPROTO, -EAGAIN, -ENOMEM, or what
 * read returned (*status set on -EIO). */
int fx_nvmf_ana_read(struct fx_nvmf_ana_reader *r, fx_nvmf_ana_read_fn read, void *ctx,
		     uint32_t mdts, uint32_t grpid, uint8_t *state, uint64_t *chgcnt,
		     uint16_t *status);

#endif
