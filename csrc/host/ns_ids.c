/* Namespace identity at re-open: the identifiers a controller reports for
 * the namespace (NGUID, EUI-64, UUID) against those the device had. */
#include "ns_ids.h"

#include <stddef.h>
#include <string.h>

/* All zeroes: the controller did not report that identifier (it has none,
 * or refused the Identify that carries it). */
static int id_none(const uint8_t *id, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (id[i])
			return 0;
	return 1;
}

/* One kind as the new and the old controller reported it: -1 they differ,
 * 1 both reported it and it is equal, 0 one side did not report it (that
 * proves nothing either way). */
static int id_cmp(const uint8_t *a, const uint8_t *b, size_t n)
{
	if (id_none(a, n) || id_none(b, n))
		return 0;
	return memcmp(a, b, n) ? -1 : 1;
}

int fx_nvmf_ns_ids_differ(const uint8_t now_nguid[16], const uint8_t now_eui64[8],
			  const uint8_t now_uuid[16], const uint8_t had_nguid[16],
			  const uint8_t had_eui64[8], const uint8_t had_uuid[16])
{
	int c[3] = {id_cmp(now_nguid, had_nguid, 16), id_cmp(now_eui64, had_eui64, 8),
		    id_cmp(now_uuid, had_uuid, 16)};

	if (c[0] < 0 || c[1] < 0 || c[2] < 0)
		return 1;
	if (c[0] > 0 || c[1] > 0 || c[2] > 0)
		return 0;
	/* No kind in common: a volume with only an NGUID and one with only a
	 * UUID are not proven one.  A device that never had any identifier
	 * (one path, unidentified namespace) has nothing to hold it to. */
	return !(id_none(had_nguid, 16) && id_none(had_eui64, 8) && id_none(had_uuid, 16));
}
