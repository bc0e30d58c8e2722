/*
 * Finding one ANA group's state in an ANA log page (see host/ana.h).
 */
#include "host/ana.h"

#include <errno.h>

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
