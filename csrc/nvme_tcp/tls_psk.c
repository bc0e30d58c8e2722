/*
 * NVMe/TCP secure channel key material on OpenSSL 3 libcrypto (see
 * tls_psk.h).
 */
#include "nvme_tcp/tls_psk.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/kdf.h>
#include <openssl/params.h>

#include "auth/auth_crypto.h"
#include "auth/key_text.h"

static const char *hash_name(uint8_t hash)
{
	return hash == FX_TLS_HASH_SHA256 ? "SHA256" : hash == FX_TLS_HASH_SHA384 ? "SHA384" : NULL;
}

static size_t hash_len(uint8_t hash)
{
	return hash == FX_TLS_HASH_SHA256 ? 32 : hash == FX_TLS_HASH_SHA384 ? 48 : 0;
}

void fx_tls_key_wipe(struct fx_tls_key *key)
{
	if (key)
		OPENSSL_cleanse(key, sizeof(*key));
}

void fx_tls_psk_wipe(struct fx_tls_psk *psk)
{
	if (psk)
		OPENSSL_cleanse(psk, sizeof(*psk));
}

static const struct fx_key_text_form tls_key_form = {
	.prefix = "NVMeTLSkey-1:",
	.max_hash = 2,
	.max_len = 48,
	/* libnvme and SPDK refuse a key whose length is not its hash's */
	.hash_sets_len = true,
	.missing = "no TLS key given",
	.bad_prefix = "a TLS key starts with \"NVMeTLSkey-1:\" (as nvme gen-tls-key prints it)",
	.bad_hash = "the TLS key's hash field (after \"NVMeTLSkey-1:\") must be 00, 01 or 02",
	.trailing = "the TLS key has text after its closing ':'",
	.bad_len = "the TLS key is not 32 or 48 bytes (plus its CRC) in base64",
	.bad_base64 = "the TLS key is not valid base64",
	.len_hash = "the TLS key's length does not match its hash field (01: 32 bytes, 02: 48 "
		    "bytes)",
	.bad_crc = "the TLS key's CRC does not match its key (mistyped or truncated?)",
};

int fx_tls_key_parse(const char *text, struct fx_tls_key *key, const char **why)
{
	int rc;

	if (why)
		*why = NULL;
	if (!key)
		return -EINVAL;
	memset(key, 0, sizeof(*key));
	rc = fx_key_text_parse(text, &tls_key_form, &key->hash, key->key, sizeof(key->key),
			       &key->len, why);
	if (rc)
		fx_tls_key_wipe(key);
	return rc;
}

uint8_t fx_tls_key_suite(const struct fx_tls_key *key)
{
	if (!key)
		return 0;
	if (key->hash)
		return key->hash;
	return key->len == 48 ? FX_TLS_HASH_SHA384 : FX_TLS_HASH_SHA256;
}

/* One HKDF step (extract or expand) through EVP_KDF, the info passed once
 * whole: OpenSSL 3.0.0..3.0.13 kept only the last of several added infos. */
static int hkdf(uint8_t hash, int mode, const uint8_t *key, size_t key_len, const uint8_t *info,
		size_t info_len, uint8_t *out, size_t out_len)
{
	const char *md = hash_name(hash);
	EVP_KDF *kdf;
	EVP_KDF_CTX *ctx;
	OSSL_PARAM params[5], *p = params;
	static const uint8_t zero[FX_TLS_PSK_MAX];
	int rc = -EIO;

	if (!md)
		return -EINVAL;
	kdf = EVP_KDF_fetch(NULL, "HKDF", NULL);
	if (!kdf)
		return -EIO;
	ctx = EVP_KDF_CTX_new(kdf);
	EVP_KDF_free(kdf);
	if (!ctx)
		return -ENOMEM;
	*p++ = OSSL_PARAM_construct_utf8_string(OSSL_KDF_PARAM_DIGEST, (char *)md, 0);
	*p++ = OSSL_PARAM_construct_int(OSSL_KDF_PARAM_MODE, &mode);
	*p++ = OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_KEY, (void *)key, key_len);
	if (mode == EVP_KDF_HKDF_MODE_EXTRACT_ONLY)
		/* the specification's salt of 0: HashLen zero bytes */
		*p++ = OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_SALT, (void *)zero,
							 hash_len(hash));
	else
		*p++ = OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_INFO, (void *)info,
							 info_len);
	*p = OSSL_PARAM_construct_end();
	if (EVP_KDF_derive(ctx, out, out_len, params) > 0)
		rc = 0;
	EVP_KDF_CTX_free(ctx);
	return rc;
}

/* HkdfLabel of RFC 8446 7.1, or libnvme 1.7..1.15's form of it, into buf;
 * returns its length or -EINVAL when it does not fit. */
static int hkdf_label(enum fx_tls_kdf kdf, size_t L, const char *label, const void *ctx,
		      size_t ctx_len, uint8_t *buf, size_t cap)
{
	size_t ll = 6 + strlen(label), n = 0;

	if (ll > 255 || ctx_len > 255 || 4 + ll + ctx_len > cap)
		return -EINVAL;
	if (kdf == FX_TLS_KDF_COMPAT) {
		/* the length as a host-order (little-endian) u16, nothing prefixed */
		buf[n++] = (uint8_t)L;
		buf[n++] = (uint8_t)(L >> 8);
	} else {
		buf[n++] = (uint8_t)(L >> 8);
		buf[n++] = (uint8_t)L;
		buf[n++] = (uint8_t)ll;
	}
	memcpy(buf + n, "tls13 ", 6);
	memcpy(buf + n + 6, label, ll - 6);
	n += ll;
	if (kdf != FX_TLS_KDF_COMPAT)
		buf[n++] = (uint8_t)ctx_len;
	if (ctx_len)
		memcpy(buf + n, ctx, ctx_len);
	return (int)(n + ctx_len);
}

static int expand_label(enum fx_tls_kdf kdf, uint8_t hash, const uint8_t *secret, size_t secret_len,
			const char *label, const void *ctx, size_t ctx_len, uint8_t *out, size_t L)
{
	uint8_t info[4 + 255 + 255];
	int n = hkdf_label(kdf, L, label, ctx, ctx_len, info, sizeof(info));

	if (n < 0)
		return n;
	return hkdf(hash, EVP_KDF_HKDF_MODE_EXPAND_ONLY, secret, secret_len, info, (size_t)n, out,
		    L);
}

int fx_tls_expand_label(uint8_t hash, const uint8_t *secret, size_t secret_len, const char *label,
			const void *ctx, size_t ctx_len, uint8_t *out, size_t L)
{
	if (!secret || !label || !out || (!ctx && ctx_len) || !L || L > 255)
		return -EINVAL;
	return expand_label(FX_TLS_KDF_RFC, hash, secret, secret_len, label, ctx, ctx_len, out, L);
}

/* Extract, then expand with a label: both derivation steps have this shape. */
static int extract_expand(enum fx_tls_kdf kdf, uint8_t hash, const uint8_t *ikm, size_t ikm_len,
			  const char *label, const void *ctx, size_t ctx_len, uint8_t *out,
			  size_t L)
{
	uint8_t prk[FX_TLS_PSK_MAX];
	size_t hl = hash_len(hash);
	int rc = hkdf(hash, EVP_KDF_HKDF_MODE_EXTRACT_ONLY, ikm, ikm_len, NULL, 0, prk, hl);

	if (rc == 0)
		rc = expand_label(kdf, hash, prk, hl, label, ctx, ctx_len, out, L);
	OPENSSL_cleanse(prk, sizeof(prk));
	return rc;
}

static int nqn_ok(const char *nqn)
{
	size_t n;

	if (!nqn || !*nqn)
		return -EINVAL;
	n = strlen(nqn);
	if (n > FX_TLS_NQN_MAX)
		return -ENAMETOOLONG;
	for (size_t i = 0; i < n; i++)
		if ((unsigned char)nqn[i] <= ' ' || (unsigned char)nqn[i] >= 0x7f)
			return -EINVAL;
	return 0;
}

int fx_tls_retained(const struct fx_tls_key *key, const char *hostnqn, enum fx_tls_kdf kdf,
		    uint8_t *out)
{
	int rc;

	if (!key || !out || (key->len != 32 && key->len != 48) || key->hash > 2)
		return -EINVAL;
	rc = nqn_ok(hostnqn);
	if (rc)
		return rc;
	if (key->hash == 0) {
		memcpy(out, key->key, key->len);
		return key->len;
	}
	rc = extract_expand(kdf, key->hash, key->key, key->len, "HostNQN", hostnqn, strlen(hostnqn),
			    out, key->len);
	return rc ? rc : key->len;
}

int fx_tls_psk_derive(const struct fx_tls_key *key, const char *hostnqn, const char *subnqn,
		      int idver, enum fx_tls_kdf kdf, struct fx_tls_psk *out)
{
	uint8_t retained[FX_TLS_PSK_MAX], mac[FX_TLS_PSK_MAX];
	char msg[2 * FX_TLS_NQN_MAX + 20], digest[72], ctx[80];
	const char *c;
	size_t clen;
	int rc, rlen, n;

	if (!out)
		return -EINVAL;
	memset(out, 0, sizeof(*out));
	if (!key || (idver != 0 && idver != 1))
		return -EINVAL;
	rc = nqn_ok(subnqn);
	if (rc)
		return rc;
	rlen = fx_tls_retained(key, hostnqn, kdf, retained);
	if (rlen < 0)
		return rlen;
	out->hash = fx_tls_key_suite(key);
	out->len = (uint8_t)hash_len(out->hash);
	rc = -EIO;
	if (idver == 0) {
		n = snprintf(out->identity, sizeof(out->identity), "NVMe0R%02u %s %s", out->hash,
			     hostnqn, subnqn);
		c = out->identity;
		clen = (size_t)n;
	} else {
		n = snprintf(msg, sizeof(msg), "%s %s NVMe-over-Fabrics", hostnqn, subnqn);
		if (fx_auth_hmac(out->hash, retained, (size_t)rlen, msg, (size_t)n, mac) != 0)
			goto out;
		if (EVP_EncodeBlock((unsigned char *)digest, mac, (int)out->len) <= 0)
			goto out;
		n = snprintf(out->identity, sizeof(out->identity), "NVMe1R%02u %s %s %s", out->hash,
			     hostnqn, subnqn, digest);
		clen = (size_t)snprintf(ctx, sizeof(ctx), "%02u %s", out->hash, digest);
		c = ctx;
	}
	rc = extract_expand(kdf, out->hash, retained, (size_t)rlen, "nvme-tls-psk", c, clen,
			    out->psk, out->len);
out:
	OPENSSL_cleanse(retained, sizeof(retained));
	OPENSSL_cleanse(mac, sizeof(mac));
	if (rc)
		fx_tls_psk_wipe(out);
	return rc;
}

int fx_tls_identity_parse(const void *wire, size_t len, struct fx_tls_identity *id)
{
	char *p, *sp;

	if (!id)
		return -EINVAL;
	memset(id, 0, sizeof(*id));
	id->digest = "";
	if (!wire || len < 10 || len >= sizeof(id->text))
		return -EINVAL;
	memcpy(id->text, wire, len);
	id->text[len] = '\0';
	for (size_t i = 0; i < len; i++)
		if ((unsigned char)id->text[i] < ' ' || (unsigned char)id->text[i] >= 0x7f)
			goto bad;
	p = id->text;
	if (strncmp(p, "NVMe", 4) != 0 || (p[4] != '0' && p[4] != '1') || p[5] != 'R' ||
	    p[6] != '0' || (p[7] != '1' && p[7] != '2') || p[8] != ' ')
		goto bad;
	id->version = p[4] - '0';
	id->hash = (uint8_t)(p[7] - '0');
	p += 9;
	id->hostnqn = p;
	sp = strchr(p, ' ');
	if (!sp)
		goto bad;
	*sp = '\0';
	id->subnqn = p = sp + 1;
	sp = strchr(p, ' ');
	if (id->version == 1) {
		if (!sp)
			goto bad;
		*sp = '\0';
		id->digest = sp + 1;
		if (!*id->digest || strchr(id->digest, ' '))
			goto bad;
	} else if (sp) {
		goto bad;
	}
	if (nqn_ok(id->hostnqn) || nqn_ok(id->subnqn))
		goto bad;
	return 0;
bad:
	memset(id, 0, sizeof(*id));
	id->digest = "";
	return -EINVAL;
}
