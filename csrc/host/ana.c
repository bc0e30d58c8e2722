/*
 * One ANA group's state out of the ANA log page: finding it in the bytes of
 * a page, and reading the page over the network within bounds (host/ana.h).
 */
#include "host/ana.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "fx100io/nvme.h"
#include "host/nvmf.h"

int fx_nvmf_ana_find(const uint8_t *log, size_t len, uint32_t grpid, uint8_t *state,
		     uint64_t *chgcnt)
{
	size_t off = sizeof(struct nvme_ana_log_hdr);

	if (!log || len < off)
		return -EPROTO;
	unsigned ngrps = fx_nvmf_le16(log + 8);
	for (unsigned i = 0; i < ngrps; i++) {
		if (len - off < sizeof(struct nvme_ana_group_desc))
			return -EMSGSIZE;
		const uint8_t *g = log + off;
		uint32_t nnsids = fx_nvmf_le32(g + 4);
		size_t room = (len - off - sizeof(struct nvme_ana_group_desc)) / 4;

		if (fx_nvmf_le32(g) == grpid) {
			*state = g[16] & 0xf;
			*chgcnt = fx_nvmf_le64(g + 8);
			return 0;
		}
		/* NSIDs follow only when the host asked for them (RGO 0);
		 * a count past the page's end means read more. */
		if (nnsids > room)
			return -EMSGSIZE;
		off += sizeof(struct nvme_ana_group_desc) + (size_t)nnsids * 4;
	}
	return -ENOENT;
}

/* The page's len bytes in chunks of at most mdts; 0, -EAGAIN (CHGCNT moved
 * between the first chunk and the header read after the last: a torn
 * page), or read's error. */
static int read_page(fx_nvmf_ana_read_fn read, void *ctx, uint8_t lsp, uint32_t mdts, uint8_t *log,
		     uint32_t len, uint16_t *status)
{
	/* (dword multiples: NUMD counts dwords) */
	uint32_t chunk = mdts >= sizeof(struct nvme_ana_log_hdr) && mdts < len ? mdts & ~3u : len;
	struct nvme_ana_log_hdr again;
	int ret;

	for (uint32_t off = 0; off < len; off += chunk) {
		ret = read(ctx, lsp, off, log + off, len - off < chunk ? len - off : chunk, status);
		if (ret)
			return ret;
	}
	if (chunk == len)
		return 0; /* one command: the controller sent one page */
	ret = read(ctx, lsp, 0, &again, sizeof(again), status);
	if (ret)
		return ret;
	return memcmp(&again.chgcnt, log, sizeof(again.chgcnt)) ? -EAGAIN : 0;
}

int fx_nvmf_ana_read(struct fx_nvmf_ana_reader *r, fx_nvmf_ana_read_fn read, void *ctx,
		     uint32_t mdts, uint32_t grpid, uint8_t *state, uint64_t *chgcnt,
		     uint16_t *status)
{
	uint32_t len = r->len >= FX_NVMF_ANA_LOG_FIRST && r->len <= FX_NVMF_ANA_LOG_MAX
			       ? r->len
			       : FX_NVMF_ANA_LOG_FIRST;
	int torn = 0, ret;

	for (;;) {
		uint8_t *log = calloc(1, len);
		uint64_t pgcnt;

		if (!log)
			return -ENOMEM;
		ret = read_page(read, ctx, r->no_rgo ? 0 : NVME_ANA_LSP_RGO, mdts, log, len,
				status);
		if (ret == -EIO && !r->no_rgo && NVME_SCT(*status) == 0 &&
		    NVME_SC(*status) == NVME_SC_INVALID_FIELD) {
			r->no_rgo = 1; /* (once: no_rgo stays) */
			free(log);
			continue;
		}
		if (ret == -EAGAIN && !torn++) {
			free(log);
			continue;
		}
		pgcnt = fx_nvmf_le64(log);
		if (ret == 0)
			ret = fx_nvmf_ana_find(log, len, grpid, state, chgcnt);
		free(log);
		if (ret == 0) {
			r->len = len;
			r->too_big = 0;
			return 0;
		}
		if (ret != -EMSGSIZE)
			return ret;
		/* The same page that proved too large last time, or this
		 * one now: no growing again until its CHGCNT moves. */
		if (len >= FX_NVMF_ANA_LOG_MAX || (r->too_big && pgcnt == r->big_chgcnt)) {
			r->too_big = 1;
			r->big_chgcnt = pgcnt;
			return -EPROTO;
		}
		len = len > FX_NVMF_ANA_LOG_MAX / 4 ? FX_NVMF_ANA_LOG_MAX : len * 4;
	}
}
