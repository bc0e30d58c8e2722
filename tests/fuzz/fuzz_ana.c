/*
 * The ANA log page reader (fx_nvmf_ana_find, csrc/host/ana.c): the bytes of
 * a Get Log Page 0Ch answer, which come from the controller.
 *
 * Input: 4 bytes of the group id to look for (little endian), then the
 * page.  Any bytes: no crash and no read past the page (ASan), and an
 * answer of 0 always names the group asked for with a state that a
 * reference walk here finds at the same place.
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "host/ana.h"

static uint32_t le32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 4)
		return 0;
	uint32_t grpid = le32(data);
	size_t len = size - 4;
	/* a copy of exactly len bytes, so ASan sees any read past the page */
	uint8_t *page = malloc(len ? len : 1);
	if (!page)
		return 0;
	memcpy(page, data + 4, len);
	uint8_t state = 0xff;
	uint64_t chgcnt = 0;
	int r = fx_nvmf_ana_find(page, len, grpid, &state, &chgcnt);

	if (r != 0 && r != -ENOENT && r != -EPROTO && r != -EMSGSIZE)
		abort();
	if (r == 0) {
		/* the reference walk: the first descriptor of grpid */
		size_t off = 16;
		unsigned n = (unsigned)(page[8] | page[9] << 8);
		int found = 0;
		for (unsigned i = 0; i < n && off + 32 <= len; i++) {
			if (le32(page + off) == grpid) {
				found = (page[off + 16] & 0xf) == state;
				break;
			}
			off += 32 + (size_t)le32(page + off + 4) * 4;
		}
		if (!found || state > 0xf)
			abort();
	}
	free(page);
	return 0;
}
