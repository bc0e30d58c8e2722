/*
 * DH-HMAC-CHAP cryptography (NVMe Base 2.x, "Authentication"), shared by
 * the initiator (host/auth_host.c) and our target (target/auth.c), on
 * OpenSSL 3 libcrypto: no primitive is written here, only the protocol's
 * compositions of them.
 *
 *   secret text   "DHHC-1:HH:<base64(key || le32 crc32(key))>:" as nvme-cli's
 *                 gen-dhchap-key writes it; key 32, 48 or 64 bytes; HH the
 *                 hash of the key transform (00 none, 01/02/03 SHA-256/384/512)
 *   transform     Kt = HH ? HMAC_HH(key, NQN || "NVMe-over-Fabrics") : key
 *                 (the host's key with the host NQN, the controller's key
 *                 with the subsystem NQN)
 *   augmented     Ca = HMAC_H(H(session key), C) when a DH group is in use;
 *                 the session key is g^xy mod p, big endian, padded to p's
 *                 size
 *   response      HMAC_H(Kt, Ca || le32 seq || le16 t_id || sc_c ||
 *                 "HostHost" || hostnqn || 0x00 || subnqn)       (host, R1)
 *                 HMAC_H(Kt, Ca || le32 seq || le16 t_id || sc_c ||
 *                 "Controller" || subnqn || 0x00 || hostnqn)     (ctrl, R2)
 *
 * Functions return 0 (or a length) or -errno: -EINVAL bad argument (unknown
 * hash or group id, short buffer), -EPROTO a peer's value is unusable (DH
 * public value out of range), -ENOMEM, -EIO libcrypto failed.  Every buffer
 * that held a secret or a derived key is wiped before it is freed or goes
 * out of scope; nothing here logs.
 */
#ifndef FX100IO_AUTH_AUTH_CRYPTO_H
#define FX100IO_AUTH_AUTH_CRYPTO_H

#include <stddef.h>
#include <stdint.h>

/* HashID */
#define FX_AUTH_HASH_SHA256 0x01
#define FX_AUTH_HASH_SHA384 0x02
#define FX_AUTH_HASH_SHA512 0x03
/* DHgID (RFC 7919 groups, generator 2) */
#define FX_AUTH_DHGROUP_NULL 0x00
#define FX_AUTH_DHGROUP_2048 0x01
#define FX_AUTH_DHGROUP_3072 0x02
#define FX_AUTH_DHGROUP_4096 0x03
#define FX_AUTH_DHGROUP_6144 0x04
#define FX_AUTH_DHGROUP_8192 0x05

#define FX_AUTH_MAX_HASH_LEN 64
#define FX_AUTH_MAX_DH_LEN 1024 /* ffdhe8192's p in bytes */
#define FX_AUTH_MAX_KEY_LEN 64

/* Digest size of hash id (32, 48, 64), 0 when unknown. */
size_t fx_auth_hash_len(uint8_t hash_id);
/* "sha256", "sha384", "sha512", or NULL when unknown. */
const char *fx_auth_hash_name(uint8_t hash_id);
/* Bytes of the group's prime (256..1024), 0 for the null group or an
 * unknown id (tell them apart with fx_auth_dhgroup_name). */
size_t fx_auth_dh_len(uint8_t dhgid);
/* "null", "ffdhe2048", ..., "ffdhe8192", or NULL when unknown. */
const char *fx_auth_dhgroup_name(uint8_t dhgid);

/* A parsed secret: the transform hash (HH) and the key bytes. */
struct fx_auth_key {
	uint8_t hash; /* 0: no transform; else FX_AUTH_HASH_* */
	uint8_t len;  /* 32, 48 or 64 */
	uint8_t key[FX_AUTH_MAX_KEY_LEN];
};

/*
 * Parse a secret in its text form into *key.  -EINVAL on any format error
 * with *why (may be NULL) a static sentence that names the problem and
 * never quotes the secret: bad prefix, HH not 00..03, bad base64, wrong
 * key length, CRC mismatch.  The trailing ':' is optional, as in Linux.
 * On error *key is zeroed.
 */
int fx_auth_key_parse(const char *text, struct fx_auth_key *key, const char **why);
/* CRC-32 as zlib computes it: the check value of a secret's text form
 * (DHHC-1 here, NVMeTLSkey-1 in nvme_tcp/tls_psk.c). */
uint32_t fx_auth_crc32_ieee(const void *data, size_t len);
/* Zero a key (OPENSSL_cleanse, not optimised away). */
void fx_auth_key_wipe(struct fx_auth_key *key);
/* Wipe any buffer that held secret material. */
void fx_auth_wipe(void *p, size_t len);

/*
 * The transformed key Kt of key for nqn into out (FX_AUTH_MAX_KEY_LEN
 * bytes); returns its length (the key's own length for HH 00, the digest
 * size of HH otherwise) or -errno.
 */
int fx_auth_key_transform(const struct fx_auth_key *key, const char *nqn, uint8_t *out);

/* HMAC_H(key, data) and H(data) into out (fx_auth_hash_len(hash_id) bytes). */
int fx_auth_hmac(uint8_t hash_id, const uint8_t *key, size_t key_len, const void *data, size_t len,
		 uint8_t *out);
int fx_auth_hash(uint8_t hash_id, const void *data, size_t len, uint8_t *out);

/* Ca = HMAC_H(H(sess), c), c and out fx_auth_hash_len(hash_id) bytes. */
int fx_auth_augmented_challenge(uint8_t hash_id, const uint8_t *sess, size_t sess_len,
				const uint8_t *c, uint8_t *out);

enum fx_auth_role {
	FX_AUTH_ROLE_HOST = 0, /* R1: "HostHost", keyed with the host's Kt */
	FX_AUTH_ROLE_CTRL = 1, /* R2: "Controller", keyed with the controller's Kt */
};

/*
 * The response MAC from an already transformed key tkey (tkey_len bytes)
 * and challenge chal (hash length bytes; already augmented when a DH group
 * is in use).  out gets fx_auth_hash_len(hash_id) bytes.
 */
int fx_auth_response_mac(enum fx_auth_role role, uint8_t hash_id, const uint8_t *tkey,
			 size_t tkey_len, const uint8_t *chal, uint32_t seq, uint16_t t_id,
			 uint8_t sc_c, const char *hostnqn, const char *subnqn, uint8_t *out);

/*
 * The whole response, the one function both sides call: transform key
 * (with hostnqn for the host role, subnqn for the controller role),
 * augment chal with sess when sess_len > 0, MAC.  The host computes R1
 * and checks R2 with it; the controller the other way round.
 */
int fx_auth_response(enum fx_auth_role role, uint8_t hash_id, const struct fx_auth_key *key,
		     const uint8_t *chal, const uint8_t *sess, size_t sess_len, uint32_t seq,
		     uint16_t t_id, uint8_t sc_c, const char *hostnqn, const char *subnqn,
		     uint8_t *out);

/* Equal MACs, in time independent of the contents (CRYPTO_memcmp). */
int fx_auth_mac_equal(const uint8_t *a, const uint8_t *b, size_t len);

/* len cryptographically random bytes (RAND_bytes). */
int fx_auth_random(void *buf, size_t len);

/*
 * Finite-field DH over an RFC 7919 group.  A key pair is made per
 * transaction and freed (its private key wiped by libcrypto) after it.
 */
struct fx_auth_dh;

/* A fresh key pair for dhgid (1..5); -EINVAL for the null or an unknown group. */
int fx_auth_dh_new(uint8_t dhgid, struct fx_auth_dh **out);
/* A key pair from a given private exponent (big endian, 1 < x < p-1): for
 * test vectors only. */
int fx_auth_dh_new_priv(uint8_t dhgid, const uint8_t *priv, size_t priv_len,
			struct fx_auth_dh **out);
/* Our public value g^x mod p, big endian padded to out_len, which must be
 * fx_auth_dh_len(group) (a DHVLEN a multiple of 4, as the spec asks). */
int fx_auth_dh_pub(const struct fx_auth_dh *dh, uint8_t *out, size_t out_len);
/*
 * The session key from the peer's public value (1..p-size bytes, big
 * endian): checks 1 < y < p-1 (and that y lies in the prime-order subgroup)
 * and returns -EPROTO when not; out gets the shared secret padded to
 * out_len == fx_auth_dh_len(group) bytes.
 */
int fx_auth_dh_derive(struct fx_auth_dh *dh, const uint8_t *peer, size_t peer_len, uint8_t *out,
		      size_t out_len);
/*
 * The same with the range check only (1 < y < p-1, what RFC 7919 5.1 asks
 * of a peer's value in these safe-prime groups), not the subgroup check: that
 * one is a modular exponentiation by the full-size q (ffdhe8192: about 0.1 s
 * of CPU), which a target must not spend on a value that a host holding no
 * secret sends for free.  A value outside the subgroup can at most tell the
 * peer one bit of our single-use private key.
 */
int fx_auth_dh_derive_range_checked(struct fx_auth_dh *dh, const uint8_t *peer, size_t peer_len,
				    uint8_t *out, size_t out_len);
/* The group of a key pair. */
uint8_t fx_auth_dh_group(const struct fx_auth_dh *dh);
void fx_auth_dh_free(struct fx_auth_dh *dh);

#endif
