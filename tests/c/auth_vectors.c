/*
 * csrc/auth/auth_crypto.c driven line by line from stdin, so that
 * tests/fabric/test_dhchap_vectors.py can check it against the pure-Python
 * reference (tests/support/dhchap_reference.py) on many random inputs.  Binary
 * values are hex; one answer line per command line:
 *
 *   parse SECRET                          -> ok HH KEYHEX | err WHY
 *   transform HH KEYHEX NQN               -> HEX
 *   hash HID DATAHEX                      -> HEX
 *   hmac HID KEYHEX DATAHEX               -> HEX
 *   aug HID SESSHEX CHALHEX               -> HEX
 *   response ROLE HID HH KEYHEX CHALHEX SESSHEX|- SEQ TID SCC HOSTNQN SUBNQN -> HEX
 *   dh GID PRIVHEX PEERHEX                -> PUBHEX SHAREDHEX | err RC
 *
 * (ROLE: host or ctrl.)  Not a test by itself; built by `make all`.
 */
#include "auth/auth_crypto.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int unhex(const char *s, uint8_t *out, size_t cap, size_t *n)
{
	size_t len = strlen(s);

	if (len % 2 || len / 2 > cap)
		return -1;
	for (size_t i = 0; i < len / 2; i++) {
		unsigned v;

		if (sscanf(s + 2 * i, "%2x", &v) != 1)
			return -1;
		out[i] = (uint8_t)v;
	}
	*n = len / 2;
	return 0;
}

static void hex(const uint8_t *p, size_t n)
{
	for (size_t i = 0; i < n; i++)
		printf("%02x", p[i]);
}

#define MAXTOK 16

int main(void)
{
	static char line[16384];
	static uint8_t a[4096], b[4096], c[4096], out[4096], out2[4096];
	size_t na, nb, nc;

	while (fgets(line, sizeof(line), stdin)) {
		char *tok[MAXTOK];
		int nt = 0;

		line[strcspn(line, "\n")] = 0;
		for (char *s = strtok(line, " "); s && nt < MAXTOK; s = strtok(NULL, " "))
			tok[nt++] = s;
		if (nt == 0)
			continue;
		if (!strcmp(tok[0], "parse") && nt == 2) {
			struct fx_auth_key k;
			const char *why;

			if (fx_auth_key_parse(tok[1], &k, &why) == 0) {
				printf("ok %02d ", k.hash);
				hex(k.key, k.len);
				printf("\n");
			} else {
				printf("err %s\n", why);
			}
		} else if (!strcmp(tok[0], "transform") && nt == 4) {
			struct fx_auth_key k = {.hash = (uint8_t)atoi(tok[1])};

			if (unhex(tok[2], k.key, sizeof(k.key), &na))
				return 2;
			k.len = (uint8_t)na;
			int r = fx_auth_key_transform(&k, tok[3], out);

			if (r < 0)
				printf("err %d\n", r);
			else
				hex(out, (size_t)r), printf("\n");
		} else if (!strcmp(tok[0], "hash") && nt == 3) {
			uint8_t hid = (uint8_t)atoi(tok[1]);

			if (unhex(tok[2], a, sizeof(a), &na))
				return 2;
			if (fx_auth_hash(hid, a, na, out))
				printf("err\n");
			else
				hex(out, fx_auth_hash_len(hid)), printf("\n");
		} else if (!strcmp(tok[0], "hmac") && nt == 4) {
			uint8_t hid = (uint8_t)atoi(tok[1]);

			if (unhex(tok[2], a, sizeof(a), &na) || unhex(tok[3], b, sizeof(b), &nb))
				return 2;
			if (fx_auth_hmac(hid, a, na, b, nb, out))
				printf("err\n");
			else
				hex(out, fx_auth_hash_len(hid)), printf("\n");
		} else if (!strcmp(tok[0], "aug") && nt == 4) {
			uint8_t hid = (uint8_t)atoi(tok[1]);

			if (unhex(tok[2], a, sizeof(a), &na) || unhex(tok[3], b, sizeof(b), &nb))
				return 2;
			if (nb != fx_auth_hash_len(hid) ||
			    fx_auth_augmented_challenge(hid, a, na, b, out))
				printf("err\n");
			else
				hex(out, fx_auth_hash_len(hid)), printf("\n");
		} else if (!strcmp(tok[0], "response") && nt == 12) {
			enum fx_auth_role role = strcmp(tok[1], "host") ? FX_AUTH_ROLE_CTRL
									: FX_AUTH_ROLE_HOST;
			uint8_t hid = (uint8_t)atoi(tok[2]);
			struct fx_auth_key k = {.hash = (uint8_t)atoi(tok[3])};

			if (unhex(tok[4], k.key, sizeof(k.key), &na) ||
			    unhex(tok[5], b, sizeof(b), &nb))
				return 2;
			k.len = (uint8_t)na;
			nc = 0;
			if (strcmp(tok[6], "-") && unhex(tok[6], c, sizeof(c), &nc))
				return 2;
			int r = fx_auth_response(
				role, hid, &k, b, c, nc, (uint32_t)strtoul(tok[7], NULL, 0),
				(uint16_t)strtoul(tok[8], NULL, 0),
				(uint8_t)strtoul(tok[9], NULL, 0), tok[10], tok[11], out);
			if (r)
				printf("err %d\n", r);
			else
				hex(out, fx_auth_hash_len(hid)), printf("\n");
		} else if (!strcmp(tok[0], "dh") && nt == 4) {
			uint8_t gid = (uint8_t)atoi(tok[1]);
			struct fx_auth_dh *dh;
			size_t plen = fx_auth_dh_len(gid);

			if (unhex(tok[2], a, sizeof(a), &na) || unhex(tok[3], b, sizeof(b), &nb))
				return 2;
			int r = fx_auth_dh_new_priv(gid, a, na, &dh);

			if (r == 0) {
				r = fx_auth_dh_pub(dh, out, plen);
				if (r == 0)
					r = fx_auth_dh_derive(dh, b, nb, out2, plen);
				fx_auth_dh_free(dh);
			}
			if (r) {
				printf("err %d\n", r);
			} else {
				hex(out, plen);
				printf(" ");
				hex(out2, plen);
				printf("\n");
			}
		} else {
			printf("err usage\n");
		}
		fflush(stdout);
	}
	return 0;
}
