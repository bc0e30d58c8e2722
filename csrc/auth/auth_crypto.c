/*
 * DH-HMAC-CHAP cryptography on OpenSSL 3 libcrypto (see auth_crypto.h).
 */
#include "auth/auth_crypto.h"
#include "auth/key_text.h"

#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/bn.h>
#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/dh.h>
#include <openssl/evp.h>
#include <openssl/param_build.h>
#include <openssl/params.h>
#include <openssl/rand.h>

static const struct {
	const char *name;
	size_t len;
} hashes[] = {
	[FX_AUTH_HASH_SHA256] = {"sha256", 32},
	[FX_AUTH_HASH_SHA384] = {"sha384", 48},
	[FX_AUTH_HASH_SHA512] = {"sha512", 64},
};

static const struct {
	const char *name;
	size_t len;
} groups[] = {
	[FX_AUTH_DHGROUP_NULL] = {"null", 0},        [FX_AUTH_DHGROUP_2048] = {"ffdhe2048", 256},
	[FX_AUTH_DHGROUP_3072] = {"ffdhe3072", 384}, [FX_AUTH_DHGROUP_4096] = {"ffdhe4096", 512},
	[FX_AUTH_DHGROUP_6144] = {"ffdhe6144", 768}, [FX_AUTH_DHGROUP_8192] = {"ffdhe8192", 1024},
};

size_t fx_auth_hash_len(uint8_t hash_id)
{
	return hash_id < sizeof(hashes) / sizeof(hashes[0]) ? hashes[hash_id].len : 0;
}

const char *fx_auth_hash_name(uint8_t hash_id)
{
	return hash_id < sizeof(hashes) / sizeof(hashes[0]) ? hashes[hash_id].name : NULL;
}

size_t fx_auth_dh_len(uint8_t dhgid)
{
	return dhgid < sizeof(groups) / sizeof(groups[0]) ? groups[dhgid].len : 0;
}

const char *fx_auth_dhgroup_name(uint8_t dhgid)
{
	return dhgid < sizeof(groups) / sizeof(groups[0]) ? groups[dhgid].name : NULL;
}

void fx_auth_wipe(void *p, size_t len)
{
	if (p && len)
		OPENSSL_cleanse(p, len);
}

void fx_auth_key_wipe(struct fx_auth_key *key)
{
	fx_auth_wipe(key, sizeof(*key));
}

/* ----------------------------------------------------------- secret text */

/* CRC-32 (IEEE 802.3, reflected, as zlib's crc32): the secret's check
 * value, not a cryptographic function. */
uint32_t fx_auth_crc32_ieee(const void *data, size_t len)
{
	const uint8_t *p = data;
	uint32_t crc = 0xffffffffu;

	while (len--) {
		crc ^= *p++;
		for (int k = 0; k < 8; k++)
			crc = (crc & 1) ? (crc >> 1) ^ 0xedb88320u : crc >> 1;
	}
	return ~crc;
}

static const struct fx_key_text_form secret_form = {
	.prefix = "DHHC-1:",
	.max_hash = 3,
	.max_len = 64,
	/* Linux takes any length under any HH: the transform's output length
	 * is the hash's, whatever the key's */
	.hash_sets_len = false,
	.missing = "no secret given (a DH-HMAC-CHAP secret starts with \"DHHC-1:\")",
	.bad_prefix = "a DH-HMAC-CHAP secret starts with \"DHHC-1:\"",
	.bad_hash = "the secret's hash field (after \"DHHC-1:\") must be 00, 01, 02 or 03",
	.trailing = "the secret has text after its closing ':'",
	.bad_len = "the secret's key is not 32, 48 or 64 bytes (plus its CRC) in base64",
	.bad_base64 = "the secret's key is not valid base64",
	.len_hash = "the secret's key length does not match its hash field",
	.bad_crc = "the secret's CRC does not match its key (mistyped or truncated?)",
};

int fx_auth_key_parse(const char *text, struct fx_auth_key *key, const char **why)
{
	int rc;

	if (why)
		*why = NULL;
	if (!key)
		return -EINVAL;
	memset(key, 0, sizeof(*key));
	rc = fx_key_text_parse(text, &secret_form, &key->hash, key->key, sizeof(key->key),
			       &key->len, why);
	if (rc)
		fx_auth_key_wipe(key);
	return rc;
}

/* ----------------------------------------------------------- hashes, MACs */

struct piece {
	const void *p;
	size_t len;
};

static int hmac_pieces(uint8_t hash_id, const uint8_t *key, size_t key_len, const struct piece *pc,
		       int n, uint8_t *out)
{
	const char *md = fx_auth_hash_name(hash_id);
	size_t hl = fx_auth_hash_len(hash_id), outl = 0;
	EVP_MAC *mac;
	EVP_MAC_CTX *ctx = NULL;
	OSSL_PARAM params[2];
	int rc = -EIO;

	if (!md || !out || (!key && key_len))
		return -EINVAL;
	mac = EVP_MAC_fetch(NULL, "HMAC", NULL);
	if (!mac)
		return -EIO;
	ctx = EVP_MAC_CTX_new(mac);
	if (!ctx) {
		rc = -ENOMEM;
		goto out;
	}
	params[0] = OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, (char *)md, 0);
	params[1] = OSSL_PARAM_construct_end();
	/* HMAC takes an empty key, but a NULL one means "keep the old key" */
	static const uint8_t empty[1];

	if (!EVP_MAC_init(ctx, key_len ? key : empty, key_len, params))
		goto out;
	for (int i = 0; i < n; i++)
		if (pc[i].len && !EVP_MAC_update(ctx, pc[i].p, pc[i].len))
			goto out;
	if (!EVP_MAC_final(ctx, out, &outl, hl) || outl != hl)
		goto out;
	rc = 0;
out:
	EVP_MAC_CTX_free(ctx); /* cleanses its key schedule */
	EVP_MAC_free(mac);
	return rc;
}

int fx_auth_hmac(uint8_t hash_id, const uint8_t *key, size_t key_len, const void *data, size_t len,
		 uint8_t *out)
{
	struct piece pc = {data, len};

	if (!data && len)
		return -EINVAL;
	return hmac_pieces(hash_id, key, key_len, &pc, 1, out);
}

int fx_auth_hash(uint8_t hash_id, const void *data, size_t len, uint8_t *out)
{
	const char *md = fx_auth_hash_name(hash_id);
	unsigned int outl = 0;
	EVP_MD *m;
	int rc = -EIO;

	if (!md || !out || (!data && len))
		return -EINVAL;
	m = EVP_MD_fetch(NULL, md, NULL);
	if (!m)
		return -EIO;
	if (EVP_Digest(data, len, out, &outl, m, NULL) && outl == fx_auth_hash_len(hash_id))
		rc = 0;
	EVP_MD_free(m);
	return rc;
}

int fx_auth_key_transform(const struct fx_auth_key *key, const char *nqn, uint8_t *out)
{
	if (!key || !nqn || !out || key->len == 0 || key->len > FX_AUTH_MAX_KEY_LEN)
		return -EINVAL;
	if (key->hash == 0) {
		memcpy(out, key->key, key->len);
		return key->len;
	}
	struct piece pc[2] = {{nqn, strlen(nqn)}, {"NVMe-over-Fabrics", 17}};
	int rc = hmac_pieces(key->hash, key->key, key->len, pc, 2, out);

	return rc ? rc : (int)fx_auth_hash_len(key->hash);
}

int fx_auth_augmented_challenge(uint8_t hash_id, const uint8_t *sess, size_t sess_len,
				const uint8_t *c, uint8_t *out)
{
	uint8_t hk[FX_AUTH_MAX_HASH_LEN];
	size_t hl = fx_auth_hash_len(hash_id);
	int rc;

	if (!hl || !sess || !sess_len || !c || !out)
		return -EINVAL;
	rc = fx_auth_hash(hash_id, sess, sess_len, hk);
	if (rc == 0)
		rc = fx_auth_hmac(hash_id, hk, hl, c, hl, out);
	fx_auth_wipe(hk, sizeof(hk));
	return rc;
}

int fx_auth_response_mac(enum fx_auth_role role, uint8_t hash_id, const uint8_t *tkey,
			 size_t tkey_len, const uint8_t *chal, uint32_t seq, uint16_t t_id,
			 uint8_t sc_c, const char *hostnqn, const char *subnqn, uint8_t *out)
{
	size_t hl = fx_auth_hash_len(hash_id);
	uint8_t head[7] = {
		(uint8_t)seq,
		(uint8_t)(seq >> 8),
		(uint8_t)(seq >> 16),
		(uint8_t)(seq >> 24),
		(uint8_t)t_id,
		(uint8_t)(t_id >> 8),
		sc_c,
	};
	static const uint8_t zero[1];
	const char *first, *second, *label;

	if (!hl || !tkey || !tkey_len || !chal || !hostnqn || !subnqn || !out)
		return -EINVAL;
	if (role == FX_AUTH_ROLE_HOST) {
		label = "HostHost";
		first = hostnqn;
		second = subnqn;
	} else if (role == FX_AUTH_ROLE_CTRL) {
		label = "Controller";
		first = subnqn;
		second = hostnqn;
	} else {
		return -EINVAL;
	}
	struct piece pc[] = {
		{chal, hl},
		{head, sizeof(head)},
		{label, strlen(label)},
		{first, strlen(first)},
		{zero, 1},
		{second, strlen(second)},
	};

	return hmac_pieces(hash_id, tkey, tkey_len, pc, (int)(sizeof(pc) / sizeof(pc[0])), out);
}

int fx_auth_response(enum fx_auth_role role, uint8_t hash_id, const struct fx_auth_key *key,
		     const uint8_t *chal, const uint8_t *sess, size_t sess_len, uint32_t seq,
		     uint16_t t_id, uint8_t sc_c, const char *hostnqn, const char *subnqn,
		     uint8_t *out)
{
	uint8_t tkey[FX_AUTH_MAX_KEY_LEN], aug[FX_AUTH_MAX_HASH_LEN];
	const uint8_t *c = chal;
	int tlen, rc;

	if (!key || !hostnqn || !subnqn || !chal || !fx_auth_hash_len(hash_id))
		return -EINVAL;
	if (role != FX_AUTH_ROLE_HOST && role != FX_AUTH_ROLE_CTRL)
		return -EINVAL;
	tlen = fx_auth_key_transform(key, role == FX_AUTH_ROLE_HOST ? hostnqn : subnqn, tkey);
	if (tlen < 0)
		return tlen;
	rc = 0;
	if (sess_len) {
		rc = fx_auth_augmented_challenge(hash_id, sess, sess_len, chal, aug);
		c = aug;
	}
	if (rc == 0)
		rc = fx_auth_response_mac(role, hash_id, tkey, (size_t)tlen, c, seq, t_id, sc_c,
					  hostnqn, subnqn, out);
	fx_auth_wipe(tkey, sizeof(tkey));
	fx_auth_wipe(aug, sizeof(aug));
	return rc;
}

int fx_auth_mac_equal(const uint8_t *a, const uint8_t *b, size_t len)
{
	return CRYPTO_memcmp(a, b, len) == 0;
}

int fx_auth_random(void *buf, size_t len)
{
	if (len > INT_MAX || (!buf && len))
		return -EINVAL;
	if (len && RAND_bytes(buf, (int)len) != 1)
		return -EIO;
	return 0;
}

/* -------------------------------------------------------------------- DH */

struct fx_auth_dh {
	EVP_PKEY *pkey;
	uint8_t gid;
};

static int dh_group_ok(uint8_t dhgid)
{
	return dhgid != FX_AUTH_DHGROUP_NULL && fx_auth_dh_len(dhgid) != 0;
}

/* A key from group name and optional private and public values. */
static EVP_PKEY *dh_fromdata(uint8_t dhgid, const BIGNUM *priv, const BIGNUM *pub)
{
	OSSL_PARAM_BLD *bld = OSSL_PARAM_BLD_new();
	OSSL_PARAM *params = NULL;
	EVP_PKEY_CTX *ctx = NULL;
	EVP_PKEY *pkey = NULL;
	int sel = priv ? EVP_PKEY_KEYPAIR : pub ? EVP_PKEY_PUBLIC_KEY : EVP_PKEY_KEY_PARAMETERS;

	if (!bld)
		return NULL;
	if (!OSSL_PARAM_BLD_push_utf8_string(bld, OSSL_PKEY_PARAM_GROUP_NAME,
					     fx_auth_dhgroup_name(dhgid), 0))
		goto out;
	if (priv && !OSSL_PARAM_BLD_push_BN(bld, OSSL_PKEY_PARAM_PRIV_KEY, priv))
		goto out;
	if (pub && !OSSL_PARAM_BLD_push_BN(bld, OSSL_PKEY_PARAM_PUB_KEY, pub))
		goto out;
	params = OSSL_PARAM_BLD_to_param(bld);
	ctx = EVP_PKEY_CTX_new_from_name(NULL, "DH", NULL);
	if (!params || !ctx || EVP_PKEY_fromdata_init(ctx) <= 0)
		goto out;
	if (EVP_PKEY_fromdata(ctx, &pkey, sel, params) <= 0)
		pkey = NULL;
out:
	EVP_PKEY_CTX_free(ctx);
	OSSL_PARAM_free(params); /* built from secret BNs: freed, cleared by OpenSSL */
	OSSL_PARAM_BLD_free(bld);
	return pkey;
}

static BIGNUM *dh_prime(uint8_t dhgid)
{
	EVP_PKEY *params = dh_fromdata(dhgid, NULL, NULL);
	BIGNUM *p = NULL;

	if (params && !EVP_PKEY_get_bn_param(params, OSSL_PKEY_PARAM_FFC_P, &p))
		p = NULL;
	EVP_PKEY_free(params);
	return p;
}

int fx_auth_dh_new(uint8_t dhgid, struct fx_auth_dh **out)
{
	EVP_PKEY_CTX *ctx;
	EVP_PKEY *pkey = NULL;
	struct fx_auth_dh *dh;

	if (!out || !dh_group_ok(dhgid))
		return -EINVAL;
	*out = NULL;
	ctx = EVP_PKEY_CTX_new_from_name(NULL, "DH", NULL);
	if (!ctx)
		return -ENOMEM;
	if (EVP_PKEY_keygen_init(ctx) <= 0 ||
	    EVP_PKEY_CTX_set_group_name(ctx, fx_auth_dhgroup_name(dhgid)) <= 0 ||
	    EVP_PKEY_generate(ctx, &pkey) <= 0) {
		EVP_PKEY_CTX_free(ctx);
		return -EIO;
	}
	EVP_PKEY_CTX_free(ctx);
	dh = calloc(1, sizeof(*dh));
	if (!dh) {
		EVP_PKEY_free(pkey);
		return -ENOMEM;
	}
	dh->pkey = pkey;
	dh->gid = dhgid;
	*out = dh;
	return 0;
}

int fx_auth_dh_new_priv(uint8_t dhgid, const uint8_t *priv, size_t priv_len,
			struct fx_auth_dh **out)
{
	BIGNUM *p = NULL, *x = NULL, *y = NULL, *g = NULL, *pm1 = NULL;
	BN_CTX *bn = NULL;
	EVP_PKEY *pkey = NULL;
	struct fx_auth_dh *dh;
	int rc = -EIO;

	if (!out || !priv || !priv_len || priv_len > FX_AUTH_MAX_DH_LEN || !dh_group_ok(dhgid))
		return -EINVAL;
	*out = NULL;
	p = dh_prime(dhgid);
	x = BN_secure_new();
	y = BN_new();
	g = BN_new();
	pm1 = BN_new();
	bn = BN_CTX_new();
	if (!p || !x || !y || !g || !pm1 || !bn)
		goto out;
	if (!BN_bin2bn(priv, (int)priv_len, x) || !BN_set_word(g, 2) || !BN_copy(pm1, p) ||
	    !BN_sub_word(pm1, 1))
		goto out;
	if (BN_cmp(x, BN_value_one()) <= 0 || BN_cmp(x, pm1) >= 0) {
		rc = -EINVAL;
		goto out;
	}
	BN_set_flags(x, BN_FLG_CONSTTIME);
	if (!BN_mod_exp(y, g, x, p, bn))
		goto out;
	pkey = dh_fromdata(dhgid, x, y);
	if (!pkey)
		goto out;
	dh = calloc(1, sizeof(*dh));
	if (!dh) {
		EVP_PKEY_free(pkey);
		rc = -ENOMEM;
		goto out;
	}
	dh->pkey = pkey;
	dh->gid = dhgid;
	*out = dh;
	rc = 0;
out:
	BN_free(p);
	BN_clear_free(x);
	BN_free(y);
	BN_free(g);
	BN_free(pm1);
	BN_CTX_free(bn);
	return rc;
}

uint8_t fx_auth_dh_group(const struct fx_auth_dh *dh)
{
	return dh ? dh->gid : FX_AUTH_DHGROUP_NULL;
}

int fx_auth_dh_pub(const struct fx_auth_dh *dh, uint8_t *out, size_t out_len)
{
	BIGNUM *y = NULL;
	int rc = -EIO;

	if (!dh || !out || out_len != fx_auth_dh_len(dh->gid))
		return -EINVAL;
	if (!EVP_PKEY_get_bn_param(dh->pkey, OSSL_PKEY_PARAM_PUB_KEY, &y))
		return -EIO;
	if (BN_bn2binpad(y, out, (int)out_len) == (int)out_len)
		rc = 0;
	BN_free(y);
	return rc;
}

static int dh_derive(struct fx_auth_dh *dh, const uint8_t *peer, size_t peer_len, uint8_t *out,
		     size_t out_len, int subgroup_check)
{
	BIGNUM *y = NULL, *p = NULL;
	EVP_PKEY *peerkey = NULL;
	EVP_PKEY_CTX *ctx = NULL;
	size_t plen, got;
	int rc = -EIO;

	if (!dh || !out || out_len != fx_auth_dh_len(dh->gid))
		return -EINVAL;
	plen = fx_auth_dh_len(dh->gid);
	if (!peer || peer_len == 0 || peer_len > plen)
		return -EPROTO;
	y = BN_bin2bn(peer, (int)peer_len, NULL);
	if (!EVP_PKEY_get_bn_param(dh->pkey, OSSL_PKEY_PARAM_FFC_P, &p))
		p = NULL;
	if (!y || !p)
		goto out;
	/* 1 < y < p-1: rules out 0, 1 and p-1 (small subgroup) and y >= p */
	if (!BN_sub_word(p, 1))
		goto out;
	if (BN_cmp(y, BN_value_one()) <= 0 || BN_cmp(y, p) >= 0) {
		rc = -EPROTO;
		goto out;
	}
	peerkey = dh_fromdata(dh->gid, NULL, y);
	if (!peerkey)
		goto out;
	ctx = EVP_PKEY_CTX_new_from_pkey(NULL, dh->pkey, NULL);
	if (!ctx)
		goto out;
	if (EVP_PKEY_derive_init(ctx) <= 0 || EVP_PKEY_CTX_set_dh_pad(ctx, 1) <= 0)
		goto out;
	/* validation also checks y's order (y^q == 1 mod p): a full-size
	 * modular exponentiation (see fx_auth_dh_derive_range_checked) */
	if (EVP_PKEY_derive_set_peer_ex(ctx, peerkey, subgroup_check) <= 0) {
		rc = -EPROTO;
		goto out;
	}
	got = out_len;
	if (EVP_PKEY_derive(ctx, out, &got) <= 0 || got != out_len) {
		fx_auth_wipe(out, out_len);
		goto out;
	}
	rc = 0;
out:
	EVP_PKEY_CTX_free(ctx);
	EVP_PKEY_free(peerkey);
	BN_free(y);
	BN_free(p);
	return rc;
}

int fx_auth_dh_derive(struct fx_auth_dh *dh, const uint8_t *peer, size_t peer_len, uint8_t *out,
		      size_t out_len)
{
	return dh_derive(dh, peer, peer_len, out, out_len, 1);
}

int fx_auth_dh_derive_range_checked(struct fx_auth_dh *dh, const uint8_t *peer, size_t peer_len,
				    uint8_t *out, size_t out_len)
{
	return dh_derive(dh, peer, peer_len, out, out_len, 0);
}

void fx_auth_dh_free(struct fx_auth_dh *dh)
{
	if (!dh)
		return;
	EVP_PKEY_free(dh->pkey);
	free(dh);
}
