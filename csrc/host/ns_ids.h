/* Whether two sets of namespace identifiers name one namespace
 * (csrc/host/ns_ids.c). */
#ifndef FX100IO_HOST_NS_IDS_H
#define FX100IO_HOST_NS_IDS_H

#include <stdint.h>

/* Nonzero when a controller re-opened onto identifiers (nguid, eui64,
 * uuid: all zeroes where it reported none) that do not prove the namespace
 * the device had: a kind both reported differs, or the old one reported
 * some and no kind was reported by both. */
int fx_nvmf_ns_ids_differ(const uint8_t now_nguid[16], const uint8_t now_eui64[8],
			  const uint8_t now_uuid[16], const uint8_t had_nguid[16],
			  const uint8_t had_eui64[8], const uint8_t had_uuid[16]);

#endif
