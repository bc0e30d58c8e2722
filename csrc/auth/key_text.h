/*
 * The interchange text of a configured key, which DH-HMAC-CHAP secrets
 * ("DHHC-1:HH:...:", auth_crypto.c) and NVMe/TCP TLS PSKs
 * ("NVMeTLSkey-1:HH:...:", nvme_tcp/tls_psk.c) share:
 *
 *   <prefix>HH:<base64(key || le32 crc32(key))>[:]
 *
 * HH is a two-digit hash id, the key 32, 48 or 64 bytes and the CRC the one
 * zlib computes.  One reader for both, so a fix to one form's checks reaches
 * the other; what differs between the forms (the prefix, the hash ids and key
 * lengths allowed, the sentences a caller sees) is a struct fx_key_text_form.
 */
#ifndef FX100IO_AUTH_KEY_TEXT_H
#define FX100IO_AUTH_KEY_TEXT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The longest key any form carries (DH-HMAC-CHAP with SHA-512). */
#define FX_KEY_TEXT_MAX_KEY 64

struct fx_key_text_form {
	const char *prefix; /* "DHHC-1:", "NVMeTLSkey-1:" */
	uint8_t max_hash;   /* HH may be 00..max_hash (at most 09) */
	uint8_t max_len;    /* key lengths 32, 48 .. max_len (48 or 64) */
	bool hash_sets_len; /* HH 01, 02, 03 demand 32, 48, 64-byte keys */
	/* the sentences *why gets: static, never quoting the key */
	const char *missing;    /* NULL or empty text */
	const char *bad_prefix; /* not starting with prefix */
	const char *bad_hash;   /* HH not two digits in range, or no ':' after it */
	const char *trailing;   /* text after the closing ':' */
	const char *bad_len;    /* a key length not allowed */
	const char *bad_base64; /* outside the alphabet, misplaced '=' */
	const char *len_hash;   /* length does not match HH (hash_sets_len) */
	const char *bad_crc;    /* CRC mismatch */
};

/*
 * Parse text in form's shape: on success 0 with *hash = HH, the key in
 * key[0..*len) (key has room for cap bytes; a length over cap is refused as
 * bad_len).  -EINVAL on any format error with *why (may be NULL) one of
 * form's sentences; key[0..cap) is then zeroed.  Reads text only up to its
 * NUL; no length of input makes it read or write out of bounds.
 */
int fx_key_text_parse(const char *text, const struct fx_key_text_form *form, uint8_t *hash,
		      uint8_t *key, size_t cap, uint8_t *len, const char **why);

#endif
