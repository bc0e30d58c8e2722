/*
 * Namespace identity at re-open (csrc/host/ns_ids.c): a controller that
 * comes back must show the namespace the device had.  A kind of identifier
 * both reported must be equal; one side not reporting a kind proves nothing;
 * but two namespaces that report different kinds (one only an NGUID, the
 * other only a UUID or an EUI-64) are not proven one and are refused.
 */
#include "host/ns_ids.h"
#include "check.h"

#include <string.h>

static const uint8_t Z16[16], Z8[8];

int main(void)
{
	uint8_t n1[16], n2[16], e1[8], u1[16], u2[16];

	memset(n1, 0xaa, 16);
	memset(n2, 0xab, 16);
	memset(e1, 0xee, 8);
	memset(u1, 0xbb, 16);
	memset(u2, 0xbc, 16);
	/* the same identifiers */
	CHECK_EQ(fx_nvmf_ns_ids_differ(n1, e1, u1, n1, e1, u1), 0);
	/* one kind went unreported this time (a refused CNS 03h): the rest match */
	CHECK_EQ(fx_nvmf_ns_ids_differ(n1, Z8, Z16, n1, Z8, u1), 0);
	CHECK_EQ(fx_nvmf_ns_ids_differ(n1, Z8, u1, n1, Z8, Z16), 0);
	/* a kind both reported differs, whatever else matches */
	CHECK_EQ(fx_nvmf_ns_ids_differ(n2, e1, u1, n1, e1, u1), 1);
	CHECK_EQ(fx_nvmf_ns_ids_differ(n1, Z8, u2, n1, Z8, u1), 1);
	/* disjoint kinds: an NGUID only against a UUID only, an EUI-64 only */
	CHECK_EQ(fx_nvmf_ns_ids_differ(Z16, Z8, u1, n1, Z8, Z16), 1);
	CHECK_EQ(fx_nvmf_ns_ids_differ(n1, Z8, Z16, Z16, Z8, u1), 1);
	CHECK_EQ(fx_nvmf_ns_ids_differ(Z16, e1, Z16, Z16, Z8, u1), 1);
	/* had identifiers, now reports none: not proven the same */
	CHECK_EQ(fx_nvmf_ns_ids_differ(Z16, Z8, Z16, n1, Z8, Z16), 1);
	/* never had any (an unidentified namespace on one path): nothing to hold */
	CHECK_EQ(fx_nvmf_ns_ids_differ(Z16, Z8, Z16, Z16, Z8, Z16), 0);
	CHECK_EQ(fx_nvmf_ns_ids_differ(n1, Z8, Z16, Z16, Z8, Z16), 0);
	printf("test_ns_ids: ok\n");
	return 0;
}
