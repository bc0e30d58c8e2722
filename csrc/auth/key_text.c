/*
 * The interchange text of configured keys (see key_text.h).
 */
#include "auth/key_text.h"

#include <errno.h>
#include <string.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>

#include "auth/auth_crypto.h"

static int b64_char(char c)
{
	return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
	       c == '+' || c == '/';
}

/* The base64 length of a key of klen bytes plus its 4-byte CRC. */
static size_t b64_len(size_t klen)
{
	return (klen + 4 + 2) / 3 * 4;
}

int fx_key_text_parse(const char *text, const struct fx_key_text_form *form, uint8_t *hash,
		      uint8_t *key, size_t cap, uint8_t *len, const char **why)
{
	const char *dummy;
	/* the longest form: 68 bytes (64-byte key + CRC) in 92 characters, and
	 * EVP_DecodeBlock writes 3 bytes per 4 characters, padding included */
	uint8_t raw[72];
	size_t n, pad = 0, plen;
	const char *b64, *end;
	int rc = -EINVAL;

	if (!why)
		why = &dummy;
	*why = NULL;
	if (!form || !form->prefix || !hash || !key || !len)
		return -EINVAL;
	memset(key, 0, cap);
	*hash = 0;
	*len = 0;
	if (!text || !*text) {
		*why = form->missing;
		return -EINVAL;
	}
	plen = strlen(form->prefix);
	if (strncmp(text, form->prefix, plen) != 0) {
		*why = form->bad_prefix;
		return -EINVAL;
	}
	text += plen;
	/* text[1] is read only when text[0] is a digit, text[2] only when
	 * text[1] is: never past the NUL */
	if (text[0] != '0' || text[1] < '0' || text[1] > '0' + form->max_hash || text[2] != ':') {
		*why = form->bad_hash;
		return -EINVAL;
	}
	b64 = text + 3;
	end = strchr(b64, ':');
	if (end) {
		if (end[1] != '\0') {
			*why = form->trailing;
			return -EINVAL;
		}
	} else {
		end = b64 + strlen(b64);
	}
	n = (size_t)(end - b64);
	/* only the lengths a key of 32, 48 (or 64) bytes encodes to: this also
	 * bounds what EVP_DecodeBlock writes into raw */
	bool len_ok = false;

	for (size_t k = 32; k <= form->max_len && k <= FX_KEY_TEXT_MAX_KEY; k += 16)
		len_ok |= n == b64_len(k);
	if (!len_ok) {
		*why = form->bad_len;
		return -EINVAL;
	}
	for (size_t i = 0; i < n; i++) {
		if (b64_char(b64[i]))
			continue;
		/* '=' only as the last one or two characters */
		if (b64[i] == '=' && i >= n - 2 && (i == n - 1 || b64[n - 1] == '=')) {
			pad++;
			continue;
		}
		*why = form->bad_base64;
		return -EINVAL;
	}
	int got = EVP_DecodeBlock(raw, (const unsigned char *)b64, (int)n);

	if (got < 0 || (size_t)got < pad) {
		*why = form->bad_base64;
		goto out;
	}
	got -= (int)pad;
	/* 48 characters ending "==" decode to 34 bytes: the length, again */
	if (got < 36 || (got - 4) % 16 != 0 || (size_t)got - 4 > form->max_len ||
	    (size_t)got - 4 > cap) {
		*why = form->bad_len;
		goto out;
	}
	size_t klen = (size_t)got - 4;
	uint8_t hh = (uint8_t)(text[1] - '0');

	if (form->hash_sets_len && hh != 0 && klen != 16 * ((size_t)hh + 1)) {
		*why = form->len_hash;
		goto out;
	}
	uint32_t want = (uint32_t)raw[klen] | (uint32_t)raw[klen + 1] << 8 |
			(uint32_t)raw[klen + 2] << 16 | (uint32_t)raw[klen + 3] << 24;

	if (fx_auth_crc32_ieee(raw, klen) != want) {
		*why = form->bad_crc;
		goto out;
	}
	memcpy(key, raw, klen);
	*len = (uint8_t)klen;
	*hash = hh;
	rc = 0;
out:
	OPENSSL_cleanse(raw, sizeof(raw));
	return rc;
}
