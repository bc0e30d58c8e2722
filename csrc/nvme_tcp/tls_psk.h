/*
 * NVMe/TCP secure channel key material (NVMe TCP Transport, "TLS PSK and
 * PSK identity derivation"), shared by our initiator and our target:
 *
 *   configured PSK   "NVMeTLSkey-1:HH:<base64(PSK || le32 crc32(PSK))>:" as
 *                    `nvme gen-tls-key` writes it; HH 00 (no transform,
 *                    32 or 48 bytes), 01 (SHA-256, 32 bytes), 02 (SHA-384,
 *                    48 bytes)
 *   retained PSK     HKDF-Expand-Label(HKDF-Extract(0, PSK), "HostNQN",
 *                    hostnqn, len(PSK)) with HH's hash (HH 00: the PSK)
 *   identity         "NVMe0R<hh> <hostnqn> <subnqn>" (version 0) or
 *                    "NVMe1R<hh> <hostnqn> <subnqn> <digest>" (version 1);
 *                    hh names the TLS suite's hash: 01 TLS_AES_128_GCM_SHA256,
 *                    02 TLS_AES_256_GCM_SHA384 (from HH, or from the key's
 *                    length when HH is 00)
 *   digest           base64(HMAC-hh(retained, hostnqn " " subnqn
 *                    " NVMe-over-Fabrics"))
 *   TLS PSK          HKDF-Expand-Label(HKDF-Extract(0, retained),
 *                    "nvme-tls-psk", ctx, hash length); ctx is the identity
 *                    (version 0) or "<hh> <digest>" (version 1)
 *
 * Two encodings of the HkdfLabel exist in deployed software: RFC 8446's
 * (SPDK, the Linux kernel, libnvme >= 1.16) and libnvme 1.7..1.15's
 * ("compat": a little-endian length, no length prefixes), which keys that
 * nvme-cli 2.7..2.15 inserted into a keyring were derived with.  Both are
 * here; RFC is the default everywhere.
 *
 * Functions return 0 (or a length) or -errno: -EINVAL a bad argument or
 * key text (with a sentence in *why that never quotes the key), -ENAMETOOLONG
 * an NQN too long for an identity, -ENOMEM, -EIO libcrypto failed.  Secret
 * buffers are wiped before they go out of scope; nothing here logs.
 */
#ifndef FX100IO_NVME_TCP_TLS_PSK_H
#define FX100IO_NVME_TCP_TLS_PSK_H

#include <stddef.h>
#include <stdint.h>

#define FX_TLS_PSK_MAX 48
/* "NVMe1R01 " + two NQNs of at most 223 bytes, two spaces, a 64-character
 * digest, a NUL */
#define FX_TLS_IDENTITY_MAX 528
#define FX_TLS_NQN_MAX 223

/* The TLS suite hashes an identity names (and the suites they stand for). */
#define FX_TLS_HASH_SHA256 1 /* TLS_AES_128_GCM_SHA256 */
#define FX_TLS_HASH_SHA384 2 /* TLS_AES_256_GCM_SHA384 */

enum fx_tls_kdf {
	FX_TLS_KDF_RFC = 0,    /* RFC 8446 HkdfLabel */
	FX_TLS_KDF_COMPAT = 1, /* libnvme 1.7..1.15 */
};

/* A configured PSK as parsed from its interchange text. */
struct fx_tls_key {
	uint8_t hash; /* HH: 0 no transform, 1 SHA-256, 2 SHA-384 */
	uint8_t len;  /* 32 or 48 */
	uint8_t key[FX_TLS_PSK_MAX];
};

/* What a connection uses: the TLS PSK, its identity and the one suite. */
struct fx_tls_psk {
	uint8_t hash; /* FX_TLS_HASH_*: the suite (AES-128 or AES-256 GCM) */
	uint8_t len;  /* 32 or 48: the suite's hash length */
	uint8_t psk[FX_TLS_PSK_MAX];
	char identity[FX_TLS_IDENTITY_MAX];
};

/*
 * Parse key text into *key.  -EINVAL with *why (may be NULL) naming the
 * problem: not "NVMeTLSkey-1:", HH not 00..02, bad base64, a length that
 * is not 32 or 48 bytes or does not match HH, a CRC mismatch, text after
 * the closing ':'.  The closing ':' is optional.  *key is zeroed on error.
 */
int fx_tls_key_parse(const char *text, struct fx_tls_key *key, const char **why);
void fx_tls_key_wipe(struct fx_tls_key *key);
void fx_tls_psk_wipe(struct fx_tls_psk *psk);

/* The suite hash a key's identities name: HH, or by length for HH 00. */
uint8_t fx_tls_key_suite(const struct fx_tls_key *key);

/* The retained PSK for hostnqn into out (FX_TLS_PSK_MAX bytes); returns its
 * length (the key's). */
int fx_tls_retained(const struct fx_tls_key *key, const char *hostnqn, enum fx_tls_kdf kdf,
		    uint8_t *out);

/*
 * The TLS PSK and identity of version idver (0 or 1) for a host and a
 * subsystem: what the initiator offers and what the target expects.
 * -EINVAL for an NQN that is empty or holds a space or a control
 * character (an identity is split at spaces), -ENAMETOOLONG over 223 bytes.
 */
int fx_tls_psk_derive(const struct fx_tls_key *key, const char *hostnqn, const char *subnqn,
		      int idver, enum fx_tls_kdf kdf, struct fx_tls_psk *out);

/* An identity a peer offered, split; the strings point into *id's own
 * copy. */
struct fx_tls_identity {
	int version;  /* 0 or 1 */
	uint8_t hash; /* FX_TLS_HASH_* */
	char text[FX_TLS_IDENTITY_MAX];
	const char *hostnqn;
	const char *subnqn;
	const char *digest; /* version 1 only, else "" */
};

/*
 * Split a peer's identity (len bytes, not NUL-terminated, from the wire).
 * -EINVAL when it is not "NVMe<0|1>R<01|02> <hostnqn> <subnqn>[ <digest>]"
 * with printable NQNs of at most 223 bytes; generated ("G") identities are
 * refused with the rest (we configure no secure concatenation).
 */
int fx_tls_identity_parse(const void *wire, size_t len, struct fx_tls_identity *id);

/* The HKDF-Expand-Label of RFC 8446 7.1 over secret (hash FX_TLS_HASH_*):
 * the record layer's keys come from it too.  out gets L bytes. */
int fx_tls_expand_label(uint8_t hash, const uint8_t *secret, size_t secret_len, const char *label,
			const void *ctx, size_t ctx_len, uint8_t *out, size_t L);

#endif
