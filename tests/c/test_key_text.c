/*
 * The key text reader DH-HMAC-CHAP secrets and TLS PSKs share
 * (csrc/auth/key_text.c), through a form of its own so each check is seen
 * apart from the two real forms (test_auth.c and test_tls_psk.c test those).
 */
#include "auth/key_text.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/evp.h>

#include "auth/auth_crypto.h"
#include "check.h"

/* every sentence differs, so a test names the check that fired */
static const struct fx_key_text_form form = {
	.prefix = "TEST-1:",
	.max_hash = 2,
	.max_len = 48,
	.hash_sets_len = true,
	.missing = "missing",
	.bad_prefix = "prefix",
	.bad_hash = "hash",
	.trailing = "trailing",
	.bad_len = "length",
	.bad_base64 = "base64",
	.len_hash = "len-vs-hash",
	.bad_crc = "crc",
};

/* "TEST-1:0<hh>:" base64(key || le32 crc) ":" of klen bytes 1, 2, 3, ... */
static void make(char *out, size_t cap, int hh, size_t klen, int colon)
{
	uint8_t raw[80];
	char b64[120];
	uint32_t crc;

	for (size_t i = 0; i < klen; i++)
		raw[i] = (uint8_t)(i + 1);
	crc = fx_auth_crc32_ieee(raw, klen);
	for (int i = 0; i < 4; i++)
		raw[klen + (size_t)i] = (uint8_t)(crc >> (8 * i));
	EVP_EncodeBlock((unsigned char *)b64, raw, (int)klen + 4);
	snprintf(out, cap, "TEST-1:0%d:%s%s", hh, b64, colon ? ":" : "");
}

static void expect(const char *text, size_t cap, const char *why_is)
{
	uint8_t key[FX_KEY_TEXT_MAX_KEY + 8], hash = 0xee, len = 0xee;
	const char *why = NULL;

	memset(key, 0xa5, sizeof(key));
	CHECK_EQ(fx_key_text_parse(text, &form, &hash, key, cap, &len, &why), -EINVAL);
	if (!why || strcmp(why, why_is) != 0) {
		fprintf(stderr, "\"%s\": why \"%s\", wanted \"%s\"\n", text ? text : "(null)",
			why ? why : "(null)", why_is);
		exit(1);
	}
	CHECK_EQ(len, 0);
	CHECK_EQ(hash, 0);
	/* nothing of a half-read key is left, and nothing past cap is touched */
	for (size_t i = 0; i < cap; i++)
		CHECK_EQ(key[i], 0);
	for (size_t i = cap; i < sizeof(key); i++)
		CHECK_EQ(key[i], 0xa5);
}

static void expect_ok(const char *text, int hh, size_t klen)
{
	uint8_t key[FX_KEY_TEXT_MAX_KEY], hash, len;
	const char *why = "x";

	CHECK_EQ(fx_key_text_parse(text, &form, &hash, key, sizeof(key), &len, &why), 0);
	CHECK(why == NULL);
	CHECK_EQ(hash, hh);
	CHECK_EQ(len, klen);
	for (size_t i = 0; i < klen; i++)
		CHECK_EQ(key[i], i + 1);
}

int main(void)
{
	char t[4096], g[200];

	/* good: with and without the closing ':', both lengths, HH 00 any */
	make(t, sizeof(t), 1, 32, 1);
	expect_ok(t, 1, 32);
	make(t, sizeof(t), 1, 32, 0);
	expect_ok(t, 1, 32);
	make(t, sizeof(t), 2, 48, 1);
	expect_ok(t, 2, 48);
	make(t, sizeof(t), 0, 48, 0);
	expect_ok(t, 0, 48);
	make(t, sizeof(t), 0, 32, 1);
	expect_ok(t, 0, 32);

	make(g, sizeof(g), 1, 32, 1);
	/* missing and prefix */
	expect(NULL, 64, "missing");
	expect("", 64, "missing");
	expect("TEST-2:01:", 64, "prefix");
	expect("TEST-1", 64, "prefix");
	/* the hash field: out of range, one digit, at the very end */
	expect("TEST-1:03:AAAA:", 64, "hash");
	expect("TEST-1:1:", 64, "hash");
	expect("TEST-1:0", 64, "hash");
	expect("TEST-1:01", 64, "hash");
	expect("TEST-1:", 64, "hash");
	/* text after the closing ':', a second ':' */
	snprintf(t, sizeof(t), "%sx", g);
	expect(t, 64, "trailing");
	snprintf(t, sizeof(t), "%s:", g);
	expect(t, 64, "trailing");
	/* lengths: none, one character short or long, a 64-byte key (over
	 * this form's 48), 34 bytes in 48 characters ("=="), a key over cap */
	expect("TEST-1:01::", 64, "length");
	expect("TEST-1:01:", 64, "length");
	snprintf(t, sizeof(t), "%s", g);
	t[strlen(t) - 2] = ':';
	t[strlen(t) - 1] = '\0';
	expect(t, 64, "length");
	snprintf(t, sizeof(t), "%.*sA:", (int)strlen(g) - 1, g);
	expect(t, 64, "length");
	make(t, sizeof(t), 0, 64, 1);
	expect(t, 64, "length");
	snprintf(t, sizeof(t), "TEST-1:00:%.46s==:", g + 10);
	expect(t, 64, "length");
	make(t, sizeof(t), 0, 48, 1);
	expect(t, 32, "length");
	/* base64: outside the alphabet, whitespace, '=' in the middle, '='
	 * then data */
	snprintf(t, sizeof(t), "%s", g);
	t[20] = '*';
	expect(t, 64, "base64");
	t[20] = ' ';
	expect(t, 64, "base64");
	t[20] = '=';
	expect(t, 64, "base64");
	make(t, sizeof(t), 2, 48, 1); /* 52 bytes: ends "==:" */
	t[strlen(t) - 2] = 'A';
	expect(t, 64, "base64");
	/* the length the hash field demands */
	make(t, sizeof(t), 2, 32, 1);
	expect(t, 64, "len-vs-hash");
	make(t, sizeof(t), 1, 48, 1);
	expect(t, 64, "len-vs-hash");
	/* the CRC: a key character, a CRC character */
	snprintf(t, sizeof(t), "%s", g);
	t[12] = t[12] == 'A' ? 'B' : 'A';
	expect(t, 64, "crc");
	snprintf(t, sizeof(t), "%s", g);
	t[strlen(t) - 3] = t[strlen(t) - 3] == 'A' ? 'B' : 'A';
	expect(t, 64, "crc");
	/* overlong input: thousands of base64 characters, with and without the
	 * ':' (refused by length before any decoding) */
	memcpy(t, "TEST-1:01:", 10);
	memset(t + 10, 'A', sizeof(t) - 12);
	t[sizeof(t) - 2] = ':';
	t[sizeof(t) - 1] = '\0';
	expect(t, 64, "length");
	t[sizeof(t) - 2] = 'A';
	expect(t, 64, "length");
	/* bad arguments: no crash, -EINVAL */
	{
		uint8_t key[64], hash, len;

		CHECK_EQ(fx_key_text_parse(g, NULL, &hash, key, sizeof(key), &len, NULL), -EINVAL);
		CHECK_EQ(fx_key_text_parse(g, &form, NULL, key, sizeof(key), &len, NULL), -EINVAL);
		CHECK_EQ(fx_key_text_parse(g, &form, &hash, NULL, 0, &len, NULL), -EINVAL);
		CHECK_EQ(fx_key_text_parse(g, &form, &hash, key, sizeof(key), NULL, NULL), -EINVAL);
		CHECK_EQ(fx_key_text_parse(g, &form, &hash, key, sizeof(key), &len, NULL), 0);
	}
	printf("test_key_text: ok\n");
	return 0;
}
