/*
 * DH-HMAC-CHAP: secret parsing, key transform, response MACs, augmented
 * challenge and DH (csrc/auth/auth_crypto.c) against vectors computed by the
 * pure-Python reference (tests/support/dhchap_reference.py) and one secret made by
 * nvme-cli 2.3's gen-dhchap-key; the message build/parse helpers
 * (csrc/auth/auth_msg.h) on round trips and on every truncation and
 * hostile field value.  tests/fabric/test_dhchap_vectors.py checks many more
 * random vectors through tests/c/auth_vectors.
 */
#include "auth/auth_crypto.h"
#include "auth/auth_msg.h"
#include "check.h"

#include <stdlib.h>
#include <string.h>

static void unhex(const char *s, uint8_t *out, size_t n)
{
	CHECK_EQ(strlen(s), 2 * n);
	for (size_t i = 0; i < n; i++) {
		unsigned v;

		CHECK(sscanf(s + 2 * i, "%2x", &v) == 1);
		out[i] = (uint8_t)v;
	}
}

static void check_hex(const uint8_t *got, const char *want)
{
	uint8_t w[1024];
	size_t n = strlen(want) / 2;

	CHECK(n <= sizeof(w));
	unhex(want, w, n);
	CHECK(memcmp(got, w, n) == 0);
}

static void pattern(uint8_t *k, size_t n, unsigned step)
{
	for (size_t i = 0; i < n; i++)
		k[i] = (uint8_t)(i * step + n);
}

/* dhchap_reference.format_secret(pattern(n, step), hh) */
static const struct {
	const char *text;
	int hh, len, step;
} good_keys[] = {
	{"DHHC-1:00:ICcuNTxDSlFYX2ZtdHuCiZCXnqWss7rByM/W3eTr8vmMpzdS:", 0, 32, 7},
	{"DHHC-1:01:ICgwOEBIUFhgaHB4gIiQmKCosLjAyNDY4Ojw+AAIEBhKWqU/:", 1, 32, 8},
	{"DHHC-1:02:ICkyO0RNVl9ocXqDjJWep7C5wsvU3ebv+AEKExwlLjdW1I9k:", 2, 32, 9},
	{"DHHC-1:03:ICo0PkhSXGZweoSOmKKstsDK1N7o8vwGEBokLjhCTFbsCYaG:", 3, 32, 10},
	{"DHHC-1:00:MDc+RUxTWmFob3Z9hIuSmaCnrrW8w8rR2N/m7fT7AgkQFx4lLDM6QUhPVl1ka3J51wkKvA==:", 0,
	 48, 7},
	{"DHHC-1:01:MDhASFBYYGhweICIkJigqLC4wMjQ2ODo8PgACBAYICgwOEBIUFhgaHB4gIiQmKCoym42OQ==:", 1,
	 48, 8},
	{"DHHC-1:02:MDlCS1RdZm94gYqTnKWut8DJ0tvk7fb/CBEaIyw1PkdQWWJrdH2Gj5ihqrO8xc7XYENJLg==:", 2,
	 48, 9},
	{"DHHC-1:03:MDpETlhibHaAipSeqLK8xtDa5O74AgwWICo0PkhSXGZweoSOmKKstsDK1N7o8vwG0F48TA==:", 3,
	 48, 10},
	{"DHHC-1:00:QEdOVVxjanF4f4aNlJuiqbC3vsXM09rh6O/2/QQLEhkgJy41PENKUVhfZm10e4KJkJeepayzusHIz9bd5Ovy+eQYloY=:",
	 0, 64, 7},
	{"DHHC-1:01:QEhQWGBocHiAiJCYoKiwuMDI0Njg6PD4AAgQGCAoMDhASFBYYGhweICIkJigqLC4wMjQ2ODo8PgACBAYICgwOExZgqs=:",
	 1, 64, 8},
	{"DHHC-1:02:QElSW2Rtdn+IkZqjrLW+x9DZ4uv0/QYPGCEqMzxFTldgaXJ7hI2Wn6ixusPM1d7n8PkCCxQdJi84QUpTXGVud34c9pA=:",
	 2, 64, 9},
	{"DHHC-1:03:QEpUXmhyfIaQmqSuuMLM1uDq9P4IEhwmMDpETlhibHaAipSeqLK8xtDa5O74AgwWICo0PkhSXGZweoSOmKKstv0Fptc=:",
	 3, 64, 10},
};

static void test_parse_good(void)
{
	for (size_t i = 0; i < sizeof(good_keys) / sizeof(good_keys[0]); i++) {
		struct fx_auth_key k;
		uint8_t want[64];
		const char *why = "x";
		char text[160];

		CHECK_EQ(fx_auth_key_parse(good_keys[i].text, &k, &why), 0);
		CHECK(why == NULL);
		CHECK_EQ(k.hash, good_keys[i].hh);
		CHECK_EQ(k.len, good_keys[i].len);
		pattern(want, (size_t)good_keys[i].len, (unsigned)good_keys[i].step);
		CHECK(memcmp(k.key, want, k.len) == 0);
		/* the closing ':' is optional, as in Linux */
		snprintf(text, sizeof(text), "%s", good_keys[i].text);
		text[strlen(text) - 1] = 0;
		CHECK_EQ(fx_auth_key_parse(text, &k, NULL), 0);
		CHECK_EQ(k.len, good_keys[i].len);
		fx_auth_key_wipe(&k);
		CHECK_EQ(k.len, 0);
	}
	/* made by `nvme gen-dhchap-key -m 2 -l 48` (nvme-cli 2.3) */
	struct fx_auth_key k;

	CHECK_EQ(fx_auth_key_parse("DHHC-1:02:lDurJbZQKwJvaimqEhaWEwkCIvQdyUUePC2ic0krn9A432YL/"
				   "uGsvibvMFEGhcKybvDTag==:",
				   &k, NULL),
		 0);
	CHECK_EQ(k.hash, 2);
	CHECK_EQ(k.len, 48);
	check_hex(k.key, "943bab25b6502b026f6a29aa12169613090222f41dc9451e3c2da273492b9fd0"
			 "38df660bfee1acbe26ef30510685c2b2");
}

static void expect_bad(const char *text, const char *why_part)
{
	struct fx_auth_key k;
	const char *why = NULL;

	memset(&k, 0xa5, sizeof(k));
	CHECK_EQ(fx_auth_key_parse(text, &k, &why), -EINVAL);
	CHECK(why != NULL);
	if (!strstr(why, why_part)) {
		fprintf(stderr, "secret %s: why \"%s\" lacks \"%s\"\n", text, why, why_part);
		exit(1);
	}
	/* never echoes the key material */
	if (strlen(text) > 12)
		CHECK(strstr(why, text + 10) == NULL);
	/* nothing of a half-parsed key is left */
	for (size_t i = 0; i < sizeof(k); i++)
		CHECK_EQ(((uint8_t *)&k)[i], 0);
}

static void test_parse_bad(void)
{
	const char *g = good_keys[0].text; /* 32-byte key, HH 00 */
	char t[200];

	expect_bad("", "DHHC-1:");
	expect_bad("DHHC-2:00:ICcuNTxDSlFYX2ZtdHuCiZCXnqWss7rByM/W3eTr8vmMpzdS:", "DHHC-1:");
	expect_bad("dhhc-1:00:ICcuNTxDSlFYX2ZtdHuCiZCXnqWss7rByM/W3eTr8vmMpzdS:", "DHHC-1:");
	expect_bad("DHHC-1:04:ICcuNTxDSlFYX2ZtdHuCiZCXnqWss7rByM/W3eTr8vmMpzdS:", "hash field");
	expect_bad("DHHC-1:0:ICcuNTxDSlFYX2ZtdHuCiZCXnqWss7rByM/W3eTr8vmMpzdS:", "hash field");
	expect_bad("DHHC-1:10:ICcuNTxDSlFYX2ZtdHuCiZCXnqWss7rByM/W3eTr8vmMpzdS:", "hash field");
	expect_bad("DHHC-1:00", "hash field");
	/* bad base64: a character outside the alphabet, '=' in the middle */
	snprintf(t, sizeof(t), "%s", g);
	t[20] = '*';
	expect_bad(t, "base64");
	snprintf(t, sizeof(t), "%s", g);
	t[20] = '=';
	expect_bad(t, "base64");
	/* '=' followed by data: "...=A:" */
	snprintf(t, sizeof(t), "%s", good_keys[4].text); /* ends "==:" */
	t[strlen(t) - 2] = 'A';
	expect_bad(t, "base64");
	/* bad CRC: one key character changed */
	snprintf(t, sizeof(t), "%s", g);
	t[12] = t[12] == 'A' ? 'B' : 'A';
	expect_bad(t, "CRC");
	/* wrong lengths: 40 bytes + CRC; 31-byte key; nothing */
	expect_bad("DHHC-1:00:AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA:",
		   "32, 48 or 64");
	expect_bad("DHHC-1:00:ICcuNTxDSlFYX2ZtdHuCiZCXnqWss7rByM/W3eTr8vmMpzd:", "32, 48 or 64");
	expect_bad("DHHC-1:00::", "32, 48 or 64");
	/* 48 characters decoding to 34 bytes + "==": length, not a crash */
	expect_bad("DHHC-1:00:ICcuNTxDSlFYX2ZtdHuCiZCXnqWss7rByM/W3eTr8vmMpz==:", "32, 48 or 64");
	/* text after the closing colon */
	snprintf(t, sizeof(t), "%sX", g);
	expect_bad(t, "after");
	snprintf(t, sizeof(t), "%s:", g);
	expect_bad(t, "after");
	/* whitespace is not base64 */
	snprintf(t, sizeof(t), "%s", g);
	t[strlen(t) - 1] = '\n';
	expect_bad(t, "32, 48 or 64");
	CHECK_EQ(fx_auth_key_parse(NULL, &(struct fx_auth_key){0}, NULL), -EINVAL);
}

static const char HOSTNQN[] = "nqn.2014-08.org.nvmexpress:uuid:host1";
static const char SUBNQN[] = "nqn.2026-01.io.fx100:sub1";

static void test_transform(void)
{
	static const char *want[] = {
		NULL,
		"0eeb4c7770e8d9c45499d8bf3195ea460176b2da325557ce01d5d217481036fb",
		"7cf11df9333fadc2001d3c4203c4bd78beb28eca1e029d5140d2a594ec4fa000"
		"c7dd16bc6f40394a25c9be2fd7edffcc",
		"46c70b745d2c05e498968417b68c4854703748e76fcb355ac64b8abf08810b84"
		"df227c809f27e2bb74c966377afc3ec976eeb1d8615360cab1f5a518ca2df2c0",
	};
	struct fx_auth_key k = {.len = 32};
	uint8_t out[64];

	pattern(k.key, 32, 3);
	CHECK_EQ(fx_auth_key_transform(&k, HOSTNQN, out), 32);
	CHECK(memcmp(out, k.key, 32) == 0);
	for (uint8_t hh = 1; hh <= 3; hh++) {
		k.hash = hh;
		CHECK_EQ(fx_auth_key_transform(&k, HOSTNQN, out), (int)fx_auth_hash_len(hh));
		check_hex(out, want[hh]);
	}
	k.hash = 4;
	CHECK_EQ(fx_auth_key_transform(&k, HOSTNQN, out), -EINVAL);
}

static void test_response(void)
{
	/* response(role, hid, pattern(48, 5), HH 2, bytes(range(hl)), sess, 0x12345678, 0xabcd, 0) */
	static const struct {
		uint8_t hid;
		enum fx_auth_role role;
		int dh;
		const char *want;
	} v[] = {
		{1, FX_AUTH_ROLE_HOST, 0,
		 "bf7efd448455321c0d70e15c78b9f584a982fdba1486f59e86269e2d27ecfac6"},
		{1, FX_AUTH_ROLE_HOST, 1,
		 "8f81535956b29bb13f9d3c3e0490127605675d482e9ea23f32d309072f57ddc6"},
		{1, FX_AUTH_ROLE_CTRL, 0,
		 "5f258f6064d8da28e1048d60a6a4685b3bc710f27b80a981c9b9bfe2e2e1f8b8"},
		{1, FX_AUTH_ROLE_CTRL, 1,
		 "e8c79447d21716b6491e6cc9297f49a28c7845e8e880140d3d8b46361912eafb"},
		{2, FX_AUTH_ROLE_HOST, 0,
		 "4a1770db012ddebc9da87c229dd0465efb53c4752055f3475d68ff8679c53763"
		 "e39d5da1695fed87ca9df300e9cbe706"},
		{2, FX_AUTH_ROLE_HOST, 1,
		 "5be964c90ddc7075613807a8f42db69f4a7fec1b1a2eb5ffe89a1a12e4141d5b"
		 "ae0c318e204ee59df413417e14dc5bd7"},
		{2, FX_AUTH_ROLE_CTRL, 0,
		 "cfb6e33aa3aef309247a4cfd974f23f95a119e25e3d5cbb1b700d4dbd80b4c60"
		 "c6b9e9fd800342816f0ef36d81956bd2"},
		{2, FX_AUTH_ROLE_CTRL, 1,
		 "915e54a90771c3bf1202843ff368801c894958a534972d821d558c350f3948b8"
		 "eaa23de43da89d44c55a805f9cd893cf"},
		{3, FX_AUTH_ROLE_HOST, 0,
		 "5cd567fde49de87058c3837e0e05744a03b2283185d8598c3e51c208c33dd1af"
		 "59d51f8dfaf81d87cd560b7927fcca9dc0bba2c5af85b1f1c8823d35dd236786"},
		{3, FX_AUTH_ROLE_HOST, 1,
		 "6745ab7b9c4406c59177b3a8f8b2ded1ecd07ed559c3c059da8e82e63446e7e5"
		 "d8094ae9da2563e0ade7e648e0b27289119f3937baf40d069fe6681f953117b2"},
		{3, FX_AUTH_ROLE_CTRL, 0,
		 "ef6269f2fdd6cf353d690e5aaec6c95ac96a903a52edd2890540959ce186fe90"
		 "52398efd2bfefc3efe16f170de1cdd3e8320d0d3844a29985f5a6f8137e08160"},
		{3, FX_AUTH_ROLE_CTRL, 1,
		 "9ef34940eef43c9e1de7fe1f69ae385c7c41fc69be70e8c21cac73ac9de058a6"
		 "e9eb9d650c8e27d5469b3ce1d702b97f61b9f3b78f01533ebb544bb13c051b80"},
	};
	struct fx_auth_key k = {.hash = 2, .len = 48};
	uint8_t chal[64], sess[100], out[64], want[64];

	pattern(k.key, 48, 5);
	for (int i = 0; i < 64; i++)
		chal[i] = (uint8_t)i;
	for (int i = 0; i < 100; i++)
		sess[i] = (uint8_t)(100 + i);
	for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++) {
		size_t hl = fx_auth_hash_len(v[i].hid);

		CHECK_EQ(fx_auth_response(v[i].role, v[i].hid, &k, chal, v[i].dh ? sess : NULL,
					  v[i].dh ? sizeof(sess) : 0, 0x12345678, 0xabcd, 0,
					  HOSTNQN, SUBNQN, out),
			 0);
		check_hex(out, v[i].want);
		unhex(v[i].want, want, hl);
		CHECK(fx_auth_mac_equal(out, want, hl));
		want[hl - 1] ^= 1;
		CHECK(!fx_auth_mac_equal(out, want, hl));
	}
	CHECK_EQ(fx_auth_response(FX_AUTH_ROLE_HOST, 4, &k, chal, NULL, 0, 1, 1, 0, HOSTNQN, SUBNQN,
				  out),
		 -EINVAL);
	CHECK_EQ(fx_auth_response((enum fx_auth_role)7, 1, &k, chal, NULL, 0, 1, 1, 0, HOSTNQN,
				  SUBNQN, out),
		 -EINVAL);
}

/* dhchap_reference.dh_shared(1, x, dh_pub(1, y)) for the x, y below */
static const char *SHARED_2048 = "ce7c53bac0a733ab41123466d19100e45ee516438e3e0612809e541f6b629e84"
				 "ea1c337a69deb858108b932a85230aebc4ddead199e6832e3db26dfce2e97f47"
				 "1a83d8b8917ed018f66aa9db6211e02513aa4e1f7f8201d4d349829ff15f11ea"
				 "d554c8e7e6d72ef7d2bedaf57662dd4446c57167380ef5138005bdea6d50b643"
				 "38c59b1bba561d8ba39d1c405c4d5b730c869af87bd73a6ec72558536d1db2b7"
				 "eda7ed84daf2ec8a8d3b7ed68ff10a0db87936bd201153b90ef946bb839587dc"
				 "235a1f6854891c3aea9ad28cfefb057daeff564ca7e1f9aa4534e94a1b4b0e18"
				 "886d6b9e9616a574a017e5779b18b103f647dabad04811cc68539b3b6d2c9212";

static void test_dh(void)
{
	/* x = 0x1234567890abcdef1122334455667788, y = 0xfedcba0987654321 */
	static const uint8_t x[] = {0x12, 0x34, 0x56, 0x78, 0x90, 0xab, 0xcd, 0xef,
				    0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88};
	static const uint8_t y[] = {0xfe, 0xdc, 0xba, 0x09, 0x87, 0x65, 0x43, 0x21};
	struct fx_auth_dh *a, *b;
	uint8_t pa[256], pb[256], sa[256], sb[256], bad[257];

	CHECK_EQ(fx_auth_dh_new_priv(FX_AUTH_DHGROUP_2048, x, sizeof(x), &a), 0);
	CHECK_EQ(fx_auth_dh_new_priv(FX_AUTH_DHGROUP_2048, y, sizeof(y), &b), 0);
	CHECK_EQ(fx_auth_dh_group(a), FX_AUTH_DHGROUP_2048);
	CHECK_EQ(fx_auth_dh_pub(a, pa, sizeof(pa)), 0);
	CHECK_EQ(fx_auth_dh_pub(b, pb, sizeof(pb)), 0);
	CHECK_EQ(fx_auth_dh_pub(a, pa, 255), -EINVAL);
	CHECK_EQ(fx_auth_dh_derive(a, pb, sizeof(pb), sa, sizeof(sa)), 0);
	CHECK_EQ(fx_auth_dh_derive(b, pa, sizeof(pa), sb, sizeof(sb)), 0);
	CHECK(memcmp(sa, sb, sizeof(sa)) == 0);
	check_hex(sa, SHARED_2048);
	/* out of range: 0, 1, p-1, p, all ones; empty and too long */
	memset(bad, 0, sizeof(bad));
	CHECK_EQ(fx_auth_dh_derive(a, bad, 256, sa, sizeof(sa)), -EPROTO);
	bad[255] = 1;
	CHECK_EQ(fx_auth_dh_derive(a, bad, 256, sa, sizeof(sa)), -EPROTO);
	CHECK_EQ(fx_auth_dh_derive(a, bad + 255, 1, sa, sizeof(sa)), -EPROTO);
	memset(bad, 0xff, sizeof(bad));
	CHECK_EQ(fx_auth_dh_derive(a, bad, 256, sa, sizeof(sa)), -EPROTO);
	CHECK_EQ(fx_auth_dh_derive(a, bad, 257, sa, sizeof(sa)), -EPROTO);
	CHECK_EQ(fx_auth_dh_derive(a, bad, 0, sa, sizeof(sa)), -EPROTO);
	/* a small value in range is accepted */
	CHECK_EQ(fx_auth_dh_derive(a, (const uint8_t[]){4}, 1, sa, sizeof(sa)), 0);
	CHECK_EQ(fx_auth_dh_derive(a, pb, sizeof(pb), sa, 255), -EINVAL);
	fx_auth_dh_free(a);
	fx_auth_dh_free(b);
	/* every group: fresh pairs agree */
	for (uint8_t g = FX_AUTH_DHGROUP_2048; g <= FX_AUTH_DHGROUP_8192; g++) {
		static uint8_t p1[1024], p2[1024], s1[1024], s2[1024];
		size_t n = fx_auth_dh_len(g);

		CHECK_EQ(n, 256 + (g == 2 ? 128 : g == 3 ? 256 : g == 4 ? 512 : g == 5 ? 768 : 0));
		CHECK_EQ(fx_auth_dh_new(g, &a), 0);
		CHECK_EQ(fx_auth_dh_new(g, &b), 0);
		CHECK_EQ(fx_auth_dh_pub(a, p1, n), 0);
		CHECK_EQ(fx_auth_dh_pub(b, p2, n), 0);
		CHECK(memcmp(p1, p2, n) != 0);
		CHECK_EQ(fx_auth_dh_derive(a, p2, n, s1, n), 0);
		CHECK_EQ(fx_auth_dh_derive(b, p1, n, s2, n), 0);
		CHECK(memcmp(s1, s2, n) == 0);
		fx_auth_dh_free(a);
		fx_auth_dh_free(b);
	}
	CHECK_EQ(fx_auth_dh_new(FX_AUTH_DHGROUP_NULL, &a), -EINVAL);
	CHECK_EQ(fx_auth_dh_new(6, &a), -EINVAL);
	CHECK_EQ(fx_auth_dh_new_priv(FX_AUTH_DHGROUP_2048, (const uint8_t[]){1}, 1, &a), -EINVAL);
	fx_auth_dh_free(NULL);
}

static void test_names(void)
{
	CHECK_EQ(fx_auth_hash_len(0), 0);
	CHECK_EQ(fx_auth_hash_len(1), 32);
	CHECK_EQ(fx_auth_hash_len(2), 48);
	CHECK_EQ(fx_auth_hash_len(3), 64);
	CHECK_EQ(fx_auth_hash_len(4), 0);
	CHECK_EQ(fx_auth_hash_len(255), 0);
	CHECK(fx_auth_hash_name(255) == NULL);
	CHECK(strcmp(fx_auth_dhgroup_name(0), "null") == 0);
	CHECK(strcmp(fx_auth_dhgroup_name(5), "ffdhe8192") == 0);
	CHECK(fx_auth_dhgroup_name(6) == NULL);
	CHECK_EQ(fx_auth_dh_len(0), 0);
	CHECK_EQ(fx_auth_dh_len(1), 256);
	CHECK_EQ(fx_auth_dh_len(5), 1024);
	CHECK_EQ(fx_auth_dh_len(200), 0);
	uint8_t r1[32] = {0}, r2[32] = {0};

	CHECK_EQ(fx_auth_random(r1, sizeof(r1)), 0);
	CHECK_EQ(fx_auth_random(r2, sizeof(r2)), 0);
	CHECK(memcmp(r1, r2, sizeof(r1)) != 0);
}

/* ------------------------------------------------------------- messages */

/* Every prefix shorter than the whole message fails with -EPROTO, copied
 * into an exact-size heap buffer so ASan sees any over-read. */
typedef int (*parse_fn)(const void *buf, size_t len, void *m, uint8_t *reason, const char **why);

static void check_truncations(parse_fn parse, const uint8_t *msg, size_t n, void *m)
{
	for (size_t len = 0; len < n; len++) {
		uint8_t *b = malloc(len ? len : 1);
		uint8_t reason = 0;
		const char *why = NULL;

		memcpy(b, msg, len);
		CHECK_EQ(parse(b, len, m, &reason, &why), -EPROTO);
		CHECK(why != NULL);
		CHECK_EQ(reason, FX_AUTH_FAIL_INCORRECT_PAYLOAD);
		free(b);
	}
	uint8_t *b = malloc(n);

	memcpy(b, msg, n);
	CHECK_EQ(parse(b, n, m, NULL, NULL), 0);
	free(b);
}

static void test_cmd(void)
{
	struct nvme_sqe sqe;
	const uint8_t *s = (const uint8_t *)&sqe;
	int send;
	uint32_t len;
	unsigned field;

	fx_auth_cmd_init(&sqe, 1, 72);
	CHECK_EQ(s[0], 0x7f);
	CHECK_EQ(s[4], 0x05);
	CHECK_EQ(s[41], 0x01);
	CHECK_EQ(s[42], 0x01);
	CHECK_EQ(s[43], 0xe9);
	CHECK_EQ(s[44] | s[45] << 8 | s[46] << 16 | s[47] << 24, 72);
	CHECK_EQ(fx_auth_cmd_parse(&sqe, &send, &len, &field), 0);
	CHECK_EQ(send, 1);
	CHECK_EQ(len, 72);
	fx_auth_cmd_init(&sqe, 0, 4096);
	CHECK_EQ(s[4], 0x06);
	CHECK_EQ(fx_auth_cmd_parse(&sqe, &send, &len, &field), 0);
	CHECK_EQ(send, 0);
	CHECK_EQ(len, 4096);
	((uint8_t *)&sqe)[43] = 0xea;
	CHECK_EQ(fx_auth_cmd_parse(&sqe, &send, &len, &field), -EINVAL);
	CHECK_EQ(field, 43);
	fx_auth_cmd_init(&sqe, 0, 0);
	CHECK_EQ(fx_auth_cmd_parse(&sqe, &send, &len, &field), -EINVAL);
	CHECK_EQ(field, 44);
}

static void test_negotiate(void)
{
	struct fx_auth_negotiate m = {.t_id = 0x1234,
				      .nhash = 3,
				      .ndh = 6,
				      .hash_ids = {1, 2, 3},
				      .dh_ids = {0, 1, 2, 3, 4, 5}};
	struct fx_auth_negotiate p;
	uint8_t buf[128], reason;
	const char *why;
	int n = fx_auth_negotiate_build(buf, sizeof(buf), &m);

	CHECK_EQ(n, 72);
	/* the bytes Linux's host sends */
	CHECK_EQ(buf[0], 0x00);
	CHECK_EQ(buf[1], 0x00);
	CHECK_EQ(buf[4], 0x34);
	CHECK_EQ(buf[5], 0x12);
	CHECK_EQ(buf[6], 0); /* sc_c */
	CHECK_EQ(buf[7], 1); /* napd */
	CHECK_EQ(buf[8], 1); /* authid */
	CHECK_EQ(buf[10], 3);
	CHECK_EQ(buf[11], 6);
	CHECK_EQ(buf[12], 1);
	CHECK_EQ(buf[14], 3);
	CHECK_EQ(buf[12 + 30], 0);
	CHECK_EQ(buf[12 + 35], 5);
	CHECK_EQ(fx_auth_negotiate_build(buf, 71, &m), -EINVAL);
	check_truncations((parse_fn)fx_auth_negotiate_parse, buf, 72, &p);
	CHECK_EQ(fx_auth_negotiate_parse(buf, 72, &p, &reason, &why), 0);
	CHECK_EQ(p.t_id, 0x1234);
	CHECK_EQ(p.nhash, 3);
	CHECK_EQ(p.ndh, 6);
	CHECK_EQ(p.hash_ids[2], 3);
	CHECK_EQ(p.dh_ids[5], 5);
	buf[10] = 31;
	CHECK_EQ(fx_auth_negotiate_parse(buf, 72, &p, &reason, &why), -EPROTO);
	CHECK_EQ(reason, FX_AUTH_FAIL_INCORRECT_PAYLOAD);
	buf[10] = 3;
	buf[8] = 2; /* no DH-HMAC-CHAP descriptor */
	CHECK_EQ(fx_auth_negotiate_parse(buf, 72, &p, &reason, &why), -EPROTO);
	CHECK_EQ(reason, FX_AUTH_FAIL_NOT_USABLE);
	buf[8] = 1;
	buf[7] = 0;
	CHECK_EQ(fx_auth_negotiate_parse(buf, 72, &p, &reason, &why), -EPROTO);
	buf[7] = 2; /* a second descriptor that is not there */
	CHECK_EQ(fx_auth_negotiate_parse(buf, 72, &p, &reason, &why), -EPROTO);
	buf[7] = 255;
	CHECK_EQ(fx_auth_negotiate_parse(buf, 72, &p, &reason, &why), -EPROTO);
	buf[7] = 1;
	buf[1] = 1;
	CHECK_EQ(fx_auth_negotiate_parse(buf, 72, &p, &reason, &why), -EPROTO);
	CHECK_EQ(reason, FX_AUTH_FAIL_INCORRECT_MESSAGE);
}

static void test_challenge(void)
{
	static uint8_t c1[64], dhv[1024], buf[2048];
	struct fx_auth_challenge m = {.t_id = 7,
				      .hl = 48,
				      .hashid = 2,
				      .dhgid = 3,
				      .dhvlen = 512,
				      .seqnum = 0xdeadbeef,
				      .cval = c1,
				      .dhv = dhv};
	struct fx_auth_challenge p;
	uint8_t reason;
	const char *why;

	for (int i = 0; i < 64; i++)
		c1[i] = (uint8_t)(i + 1);
	for (int i = 0; i < 1024; i++)
		dhv[i] = (uint8_t)(i * 3);
	int n = fx_auth_challenge_build(buf, sizeof(buf), &m);

	CHECK_EQ(n, 16 + 48 + 512);
	CHECK_EQ(buf[0], 1);
	CHECK_EQ(buf[1], 1);
	CHECK_EQ(buf[6], 48);
	CHECK_EQ(buf[8], 2);
	CHECK_EQ(buf[9], 3);
	CHECK_EQ(buf[10] | buf[11] << 8, 512);
	CHECK_EQ(buf[12], 0xef);
	CHECK_EQ(buf[15], 0xde);
	CHECK_EQ(buf[16], 1);
	CHECK_EQ(buf[16 + 48], 0);
	CHECK_EQ(buf[16 + 48 + 1], 3);
	check_truncations((parse_fn)fx_auth_challenge_parse, buf, (size_t)n, &p);
	/* trailing bytes (AL larger than the message) are fine */
	CHECK_EQ(fx_auth_challenge_parse(buf, sizeof(buf), &p, &reason, &why), 0);
	CHECK_EQ(p.t_id, 7);
	CHECK_EQ(p.seqnum, 0xdeadbeef);
	CHECK(p.cval == buf + 16);
	CHECK(p.dhv == buf + 64);
	CHECK_EQ(p.dhvlen, 512);
	/* hostile fields */
	buf[8] = 4;
	CHECK_EQ(fx_auth_challenge_parse(buf, sizeof(buf), &p, &reason, &why), -EPROTO);
	CHECK_EQ(reason, FX_AUTH_FAIL_HASH_UNUSABLE);
	buf[8] = 0;
	CHECK_EQ(fx_auth_challenge_parse(buf, sizeof(buf), &p, &reason, &why), -EPROTO);
	buf[8] = 2;
	buf[6] = 64; /* HL of another hash */
	CHECK_EQ(fx_auth_challenge_parse(buf, sizeof(buf), &p, &reason, &why), -EPROTO);
	CHECK_EQ(reason, FX_AUTH_FAIL_HASH_UNUSABLE);
	buf[6] = 48;
	buf[9] = 6;
	CHECK_EQ(fx_auth_challenge_parse(buf, sizeof(buf), &p, &reason, &why), -EPROTO);
	CHECK_EQ(reason, FX_AUTH_FAIL_DHGROUP_UNUSABLE);
	buf[9] = 0; /* null group with a DH value */
	CHECK_EQ(fx_auth_challenge_parse(buf, sizeof(buf), &p, &reason, &why), -EPROTO);
	CHECK_EQ(reason, FX_AUTH_FAIL_INCORRECT_PAYLOAD);
	buf[9] = 1; /* ffdhe2048 with 512 bytes */
	CHECK_EQ(fx_auth_challenge_parse(buf, sizeof(buf), &p, &reason, &why), -EPROTO);
	buf[9] = 3;
	buf[10] = 0;
	buf[11] = 0; /* a group and no value */
	CHECK_EQ(fx_auth_challenge_parse(buf, sizeof(buf), &p, &reason, &why), -EPROTO);
	buf[10] = 0xff;
	buf[11] = 0xff;
	CHECK_EQ(fx_auth_challenge_parse(buf, sizeof(buf), &p, &reason, &why), -EPROTO);
	buf[0] = 0;
	buf[1] = 0xf1;
	CHECK_EQ(fx_auth_challenge_parse(buf, sizeof(buf), &p, &reason, &why), -EPROTO);
	CHECK_EQ(reason, FX_AUTH_FAIL_INCORRECT_MESSAGE);
	/* the null group */
	m.dhgid = 0;
	m.dhvlen = 0;
	m.hl = 32;
	m.hashid = 1;
	n = fx_auth_challenge_build(buf, sizeof(buf), &m);
	CHECK_EQ(n, 48);
	check_truncations((parse_fn)fx_auth_challenge_parse, buf, (size_t)n, &p);
	CHECK(p.dhv == NULL);
	CHECK_EQ(fx_auth_challenge_build(buf, 47, &m), -EINVAL);
}

static void test_reply(void)
{
	static uint8_t r[64], c[64], dhv[1024], buf[2048];
	struct fx_auth_reply m = {.t_id = 9,
				  .hl = 64,
				  .cvalid = 1,
				  .dhvlen = 1024,
				  .seqnum = 0x01020304,
				  .rval = r,
				  .cval = c,
				  .dhv = dhv};
	struct fx_auth_reply p;
	uint8_t reason;
	const char *why;

	memset(r, 0x11, sizeof(r));
	memset(c, 0x22, sizeof(c));
	memset(dhv, 0x33, sizeof(dhv));
	int n = fx_auth_reply_build(buf, sizeof(buf), &m);

	CHECK_EQ(n, 16 + 128 + 1024);
	CHECK_EQ(buf[1], 2);
	CHECK_EQ(buf[8], 1);
	CHECK_EQ(buf[10] | buf[11] << 8, 1024);
	CHECK_EQ(buf[12], 4);
	CHECK_EQ(buf[16], 0x11);
	CHECK_EQ(buf[16 + 64], 0x22);
	CHECK_EQ(buf[16 + 128], 0x33);
	check_truncations((parse_fn)fx_auth_reply_parse, buf, (size_t)n, &p);
	CHECK_EQ(fx_auth_reply_parse(buf, (size_t)n, &p, &reason, &why), 0);
	CHECK_EQ(p.cvalid, 1);
	CHECK_EQ(p.seqnum, 0x01020304);
	CHECK(p.rval == buf + 16 && p.cval == buf + 80 && p.dhv == buf + 144);
	buf[6] = 33;
	CHECK_EQ(fx_auth_reply_parse(buf, sizeof(buf), &p, &reason, &why), -EPROTO);
	CHECK_EQ(reason, FX_AUTH_FAIL_HASH_UNUSABLE);
	buf[6] = 64;
	buf[10] = 0x01;
	buf[11] = 0x04; /* 1025 */
	CHECK_EQ(fx_auth_reply_parse(buf, sizeof(buf), &p, &reason, &why), -EPROTO);
	/* unidirectional, no DH: C2 is zeros */
	m.cvalid = 0;
	m.seqnum = 0;
	m.dhvlen = 0;
	m.hl = 32;
	n = fx_auth_reply_build(buf, sizeof(buf), &m);
	CHECK_EQ(n, 16 + 64);
	CHECK_EQ(buf[8], 0);
	CHECK_EQ(buf[16 + 32], 0);
	check_truncations((parse_fn)fx_auth_reply_parse, buf, (size_t)n, &p);
	CHECK(p.dhv == NULL);
}

static void test_success_failure(void)
{
	uint8_t r2[48], buf[128], reason;
	const char *why;
	struct fx_auth_success1 m = {.t_id = 3, .hl = 48, .rvalid = 1, .rval = r2}, p;
	struct fx_auth_failure f = {.id = FX_AUTH_ID_FAILURE1,
				    .t_id = 3,
				    .rescode = FX_AUTH_RESCODE_FAILED,
				    .rescode_exp = FX_AUTH_FAIL_FAILED},
			       fp;
	uint16_t tid;

	memset(r2, 0x5a, sizeof(r2));
	int n = fx_auth_success1_build(buf, sizeof(buf), &m);

	CHECK_EQ(n, 64);
	CHECK_EQ(buf[1], 3);
	CHECK_EQ(buf[8], 1);
	check_truncations((parse_fn)fx_auth_success1_parse, buf, (size_t)n, &p);
	CHECK_EQ(fx_auth_success1_parse(buf, (size_t)n, &p, &reason, &why), 0);
	CHECK(p.rval == buf + 16);
	m.rvalid = 0;
	n = fx_auth_success1_build(buf, sizeof(buf), &m);
	CHECK_EQ(n, 16);
	check_truncations((parse_fn)fx_auth_success1_parse, buf, (size_t)n, &p);
	CHECK(p.rval == NULL);
	buf[6] = 0;
	CHECK_EQ(fx_auth_success1_parse(buf, 16, &p, &reason, &why), -EPROTO);

	n = fx_auth_success2_build(buf, sizeof(buf), 0x4455);
	CHECK_EQ(n, 16);
	CHECK_EQ(buf[1], 4);
	CHECK_EQ(fx_auth_success2_parse(buf, 16, &tid, &reason, &why), 0);
	CHECK_EQ(tid, 0x4455);
	CHECK_EQ(fx_auth_success2_parse(buf, 15, &tid, &reason, &why), -EPROTO);

	n = fx_auth_failure_build(buf, sizeof(buf), &f);
	CHECK_EQ(n, 8);
	CHECK_EQ(buf[0], 0);
	CHECK_EQ(buf[1], 0xf1);
	CHECK_EQ(buf[6], 1);
	CHECK_EQ(buf[7], 1);
	check_truncations((parse_fn)fx_auth_failure_parse, buf, 8, &fp);
	CHECK_EQ(fp.id, FX_AUTH_ID_FAILURE1);
	CHECK_EQ(fp.rescode_exp, 1);
	f.id = 0x42;
	CHECK_EQ(fx_auth_failure_build(buf, sizeof(buf), &f), -EINVAL);
	buf[1] = 0x42;
	CHECK_EQ(fx_auth_failure_parse(buf, 8, &fp, &reason, &why), -EPROTO);
	CHECK(strcmp(fx_auth_reason_str(FX_AUTH_FAIL_FAILED), "authentication failed") == 0);
	CHECK(strcmp(fx_auth_reason_str(7), "incorrect protocol message") == 0);
	CHECK(strcmp(fx_auth_reason_str(0x99), "unknown reason") == 0);
	/* peek */
	uint8_t type, id;

	CHECK_EQ(fx_auth_msg_peek(buf, 5, &type, &id, &tid), -EPROTO);
	CHECK_EQ(fx_auth_msg_peek(buf, 8, &type, &id, &tid), 0);
	CHECK_EQ(id, 0x42);
	CHECK_EQ(tid, 3);
}

int main(void)
{
	test_names();
	test_parse_good();
	test_parse_bad();
	test_transform();
	test_response();
	test_dh();
	test_cmd();
	test_negotiate();
	test_challenge();
	test_reply();
	test_success_failure();
	printf("test_auth: ok\n");
	return 0;
}
