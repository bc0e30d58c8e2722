/*
 * NVMe/TCP secure channel: TLS 1.3 PSK handshake on OpenSSL and our own
 * record layer (see tls.h).
 */
#include "nvme_tcp/tls.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/ssl.h>

#include "nvme_tcp/sock.h"

#define CT_ALERT 21
#define CT_HANDSHAKE 22
#define CT_APPDATA 23
#define HS_NEW_SESSION_TICKET 4
#define HS_KEY_UPDATE 24

/* ------------------------------------------------------------ records */

/* The sockets stay blocking for their other users: a send with a deadline
 * must not block past it, so it may not block at all (sock.c waits). */
static int send_flags(int64_t deadline)
{
	return deadline == FX_TCP_NO_DEADLINE ? 0 : MSG_DONTWAIT;
}

static size_t key_len(uint8_t hash)
{
	return hash == FX_TLS_HASH_SHA384 ? 32 : 16;
}

static size_t secret_len(uint8_t hash)
{
	return hash == FX_TLS_HASH_SHA384 ? 48 : 32;
}

int fx_tls_traffic_keys(uint8_t hash, const uint8_t *secret, uint8_t *key, uint8_t iv[12])
{
	int rc;

	if (hash != FX_TLS_HASH_SHA256 && hash != FX_TLS_HASH_SHA384)
		return -EINVAL;
	rc = fx_tls_expand_label(hash, secret, secret_len(hash), "key", NULL, 0, key,
				 key_len(hash));
	if (rc == 0)
		rc = fx_tls_expand_label(hash, secret, secret_len(hash), "iv", NULL, 0, iv, 12);
	return rc;
}

int fx_tls_secret_next(uint8_t hash, uint8_t *secret)
{
	uint8_t next[FX_TLS_PSK_MAX];
	size_t sl = secret_len(hash);
	int rc;

	if (hash != FX_TLS_HASH_SHA256 && hash != FX_TLS_HASH_SHA384)
		return -EINVAL;
	rc = fx_tls_expand_label(hash, secret, sl, "traffic upd", NULL, 0, next, sl);
	if (rc == 0)
		memcpy(secret, next, sl);
	OPENSSL_cleanse(next, sizeof(next));
	return rc;
}

int fx_tls_dir_init(struct fx_tls_dir *d, uint8_t hash, const uint8_t *secret)
{
	uint8_t key[32];
	int rc;

	if (!d || !secret || (hash != FX_TLS_HASH_SHA256 && hash != FX_TLS_HASH_SHA384))
		return -EINVAL;
	if (secret != d->secret)
		memcpy(d->secret, secret, secret_len(hash));
	d->hash = hash;
	rc = fx_tls_traffic_keys(hash, d->secret, key, d->iv);
	if (rc == 0) {
		if (!d->ctx)
			d->ctx = EVP_CIPHER_CTX_new();
		if (!d->ctx)
			rc = -ENOMEM;
	}
	if (rc == 0 &&
	    !EVP_CipherInit_ex(d->ctx,
			       hash == FX_TLS_HASH_SHA384 ? EVP_aes_256_gcm() : EVP_aes_128_gcm(),
			       NULL, key, NULL, -1))
		rc = -EIO;
	d->seq = 0;
	OPENSSL_cleanse(key, sizeof(key));
	return rc;
}

static void dir_fini(struct fx_tls_dir *d)
{
	EVP_CIPHER_CTX_free(d->ctx); /* cleanses the key schedule */
	OPENSSL_cleanse(d, sizeof(*d));
}

struct fx_tls *fx_tls_alloc(void)
{
	return calloc(1, sizeof(struct fx_tls));
}

void fx_tls_free(struct fx_tls *t)
{
	if (!t)
		return;
	dir_fini(&t->tx);
	dir_fini(&t->rx);
	if (t->bulk) {
		OPENSSL_cleanse(t->bulk, FX_TLS_SEND_RECORDS * sizeof(t->out));
		free(t->bulk);
	}
	OPENSSL_cleanse(t, sizeof(*t));
	free(t);
}

const char *fx_tls_why(const struct fx_tls *t)
{
	return t && t->why ? t->why : "";
}

size_t fx_tls_pending(const struct fx_tls *t)
{
	return t->plain_len - t->plain_pos;
}

static void nonce_of(const struct fx_tls_dir *d, uint8_t nonce[12])
{
	memcpy(nonce, d->iv, 12);
	for (int i = 0; i < 8; i++)
		nonce[4 + i] ^= (uint8_t)(d->seq >> (56 - 8 * i));
}

static int fail(struct fx_tls *t, int rc, const char *why)
{
	t->why = why;
	return rc;
}

/* The next record's sequence number; RFC 8446 5.3: never wraps. */
static int seq_next(struct fx_tls *t, struct fx_tls_dir *d)
{
	if (d->seq == UINT64_MAX)
		return fail(t, -EPROTO, "TLS record sequence number exhausted");
	d->seq++;
	return 0;
}

/* A record of len bytes of plaintext starts at rec: its header written,
 * the cipher set to its nonce with the header as associated data. */
static int seal_begin(struct fx_tls *t, uint8_t *rec, size_t len)
{
	struct fx_tls_dir *d = &t->tx;
	size_t rlen = len + 1 + FX_TLS_TAG;
	uint8_t nonce[12];
	int n;

	if (len > FX_TLS_MAX_PLAINTEXT || !d->ctx)
		return -EINVAL;
	rec[0] = CT_APPDATA;
	rec[1] = 3;
	rec[2] = 3;
	rec[3] = (uint8_t)(rlen >> 8);
	rec[4] = (uint8_t)rlen;
	nonce_of(d, nonce);
	if (!EVP_EncryptInit_ex(d->ctx, NULL, NULL, NULL, nonce) ||
	    !EVP_EncryptUpdate(d->ctx, NULL, &n, rec, FX_TLS_HEADER))
		return fail(t, -EIO, "TLS record encryption failed");
	return 0;
}

int fx_tls_record_seal(struct fx_tls *t, uint8_t type, const struct iovec *iov, int cnt, size_t len)
{
	return fx_tls_seal_to(t, t->out, type, iov, cnt, len);
}

int fx_tls_seal_to(struct fx_tls *t, uint8_t *dst, uint8_t type, const struct iovec *iov, int cnt,
		   size_t len)
{
	struct fx_tls_dir *d = &t->tx;
	uint8_t *p = dst + FX_TLS_HEADER;
	size_t rlen = len + 1 + FX_TLS_TAG;
	int n = seal_begin(t, dst, len);

	if (n)
		return n;
	for (int i = 0, left = (int)len; i < cnt && left > 0; i++) {
		int take = iov[i].iov_len < (size_t)left ? (int)iov[i].iov_len : left;

		if (!EVP_EncryptUpdate(d->ctx, p, &n, iov[i].iov_base, take))
			return fail(t, -EIO, "TLS record encryption failed");
		p += n;
		left -= take;
	}
	if (!EVP_EncryptUpdate(d->ctx, p, &n, &type, 1))
		return fail(t, -EIO, "TLS record encryption failed");
	p += n;
	if (!EVP_EncryptFinal_ex(d->ctx, p, &n) ||
	    !EVP_CIPHER_CTX_ctrl(d->ctx, EVP_CTRL_AEAD_GET_TAG, FX_TLS_TAG, p + n))
		return fail(t, -EIO, "TLS record encryption failed");
	n = seq_next(t, d);
	return n ? n : (int)(FX_TLS_HEADER + rlen);
}

int fx_tls_seal_in_place(struct fx_tls *t, uint8_t *rec, size_t len)
{
	struct fx_tls_dir *d = &t->tx;
	uint8_t *p = rec + FX_TLS_HEADER;
	size_t rlen = len + 1 + FX_TLS_TAG;
	int n = seal_begin(t, rec, len), m;

	if (n)
		return n;
	p[len] = CT_APPDATA; /* the inner type, encrypted with the data */
	/* (GCM encrypts in place when out is in) */
	if (!EVP_EncryptUpdate(d->ctx, p, &n, p, (int)len + 1) ||
	    !EVP_EncryptFinal_ex(d->ctx, p + n, &m) ||
	    !EVP_CIPHER_CTX_ctrl(d->ctx, EVP_CTRL_AEAD_GET_TAG, FX_TLS_TAG, p + n + m))
		return fail(t, -EIO, "TLS record encryption failed");
	if ((size_t)(n + m) != len + 1)
		return fail(t, -EIO, "TLS record encryption failed");
	n = seq_next(t, d);
	return n ? n : (int)(FX_TLS_HEADER + rlen);
}

/* A record's header: application data, TLS 1.2 on the wire, a length a
 * record may have.  Returns the body's length or -EPROTO. */
static int header_ok(struct fx_tls *t, const uint8_t *h)
{
	size_t len = (size_t)h[3] << 8 | h[4];

	if (h[0] != CT_APPDATA)
		return fail(t, -EPROTO,
			    h[0] == CT_ALERT
				    ? "the TLS peer sent a clear-text alert (it refused the "
				      "connection)"
				    : "the TLS peer sent a record that is not encrypted "
				      "application data");
	if (h[1] != 3 || h[2] != 3)
		return fail(t, -EPROTO, "the TLS peer sent a record with a bad version");
	if (len < 1 + FX_TLS_TAG || len > FX_TLS_MAX_CIPHERTEXT)
		return fail(t, -EPROTO, "the TLS peer sent a record of a size TLS 1.3 forbids");
	return (int)len;
}

int fx_tls_post_handshake(const uint8_t *p, size_t len, int *key_update, const char **why)
{
	*key_update = 0;
	if (!len) { /* RFC 8446 5.1: no zero-length handshake fragments */
		*why = "an empty TLS handshake record";
		return -EPROTO;
	}
	while (len) {
		if (len < 4)
			goto split;
		size_t mlen = (size_t)p[1] << 16 | (size_t)p[2] << 8 | p[3];

		if (mlen > len - 4)
			goto split;
		if (p[0] == HS_KEY_UPDATE) {
			if (mlen != 1 || p[4] > 1) {
				*why = "a malformed TLS KeyUpdate";
				return -EPROTO;
			}
			if (p[4] == 1) {
				*why = "the TLS peer asked for a key update (NVMe/TCP peers do not; "
				       "we never send one)";
				return -EPROTO;
			}
			/* the key changes after this record: no message may follow in it */
			if (len != 4 + mlen) {
				*why = "data after a TLS KeyUpdate in its record";
				return -EPROTO;
			}
			*key_update = 1;
		} else if (p[0] != HS_NEW_SESSION_TICKET) {
			*why = "the TLS peer sent a handshake message after the handshake";
			return -EPROTO;
		}
		p += 4 + mlen;
		len -= 4 + mlen;
	}
	return 0;
split:
	*why = "a TLS handshake message split across records";
	return -EPROTO;
}

int fx_tls_alert(const uint8_t *p, size_t len, const char **why)
{
	if (len != 2) {
		*why = "a malformed TLS alert";
		return -EPROTO;
	}
	if (p[1] == 0) {
		*why = "the TLS peer closed the connection (close_notify)";
		return -ECONNRESET;
	}
	*why = "the TLS peer sent an alert and ended the connection";
	return -EPROTO;
}

/* Post-handshake messages in one record: tickets dropped, a KeyUpdate that
 * asks nothing of us moves the receive key on. */
static int handshake_msgs(struct fx_tls *t, const uint8_t *p, size_t len)
{
	const char *why = NULL;
	int ku, rc = fx_tls_post_handshake(p, len, &ku, &why);

	if (rc)
		return fail(t, rc, why);
	if (!ku)
		return 0;
	rc = fx_tls_secret_next(t->rx.hash, t->rx.secret);
	if (rc == 0)
		rc = fx_tls_dir_init(&t->rx, t->rx.hash, t->rx.secret);
	return rc ? fail(t, rc, "TLS key update failed") : 0;
}

int fx_tls_record_len(struct fx_tls *t, const uint8_t *hdr)
{
	return header_ok(t, hdr);
}

/* Open record rec[0..len) (header checked, len its whole size): its first
 * k plaintext bytes into dst, the rest into out + k (out may be rec +
 * FX_TLS_HEADER: GCM decrypts in place), and act on it: the application
 * data's length, 0 for a dropped ticket or a key update, or the error. */
static int open_into(struct fx_tls *t, uint8_t *rec, size_t len, uint8_t *out, size_t h,
		     fx_tls_dest_fn where, void *arg, uint8_t **pdst, size_t *pk);

int fx_tls_open_split(struct fx_tls *t, uint8_t *rec, size_t len, uint8_t *dst, size_t k,
		      uint8_t **rest)
{
	int blen;

	if (!t->rx.ctx || len < FX_TLS_HEADER || (k && !dst))
		return -EINVAL;
	blen = header_ok(t, rec);
	if (blen < 0)
		return blen;
	if ((size_t)blen != len - FX_TLS_HEADER)
		return -EINVAL;
	if (k > (size_t)blen - FX_TLS_TAG)
		k = (size_t)blen - FX_TLS_TAG;
	*rest = rec + FX_TLS_HEADER + k;
	return open_into(t, rec, len, rec + FX_TLS_HEADER, 0, NULL, NULL, &dst, &k);
}

int fx_tls_open_head(struct fx_tls *t, uint8_t *rec, size_t len, size_t h, fx_tls_dest_fn where,
		     void *arg, uint8_t **dst, size_t *k)
{
	int blen;

	*dst = NULL;
	*k = 0;
	if (!t->rx.ctx || len < FX_TLS_HEADER || !where)
		return -EINVAL;
	blen = header_ok(t, rec);
	if (blen < 0)
		return blen;
	if ((size_t)blen != len - FX_TLS_HEADER)
		return -EINVAL;
	return open_into(t, rec, len, rec + FX_TLS_HEADER, h, where, arg, dst, k);
}

int fx_tls_open(struct fx_tls *t, uint8_t *rec, size_t len, uint8_t **plain)
{
	return fx_tls_open_split(t, rec, len, NULL, 0, plain);
}

int fx_tls_record_in(struct fx_tls *t, uint8_t *rec, size_t len)
{
	int blen, n;

	if (!t->rx.ctx || len < FX_TLS_HEADER)
		return -EINVAL;
	blen = header_ok(t, rec);
	if (blen < 0)
		return blen;
	if ((size_t)blen != len - FX_TLS_HEADER)
		return -EINVAL;
	/* the plaintext buffer holds at most one record's: the caller empties it first */
	if (t->plain_pos == t->plain_len)
		t->plain_pos = t->plain_len = 0;
	if (t->plain_len + (size_t)blen > sizeof(t->plain)) {
		memmove(t->plain, t->plain + t->plain_pos, t->plain_len - t->plain_pos);
		t->plain_len -= t->plain_pos;
		t->plain_pos = 0;
		if (t->plain_len + (size_t)blen > sizeof(t->plain))
			return -EINVAL;
	}
	uint8_t *none = NULL;
	size_t zero = 0;

	n = open_into(t, rec, len, t->plain + t->plain_len, 0, NULL, NULL, &none, &zero);
	if (n > 0)
		t->plain_len += (size_t)n;
	return n;
}

/* Open record rec[0..len) (header checked, len its whole size): its first
 * h plaintext bytes into out, then (where, when given, chooses *pdst and
 * *pk from them) the next *pk into *pdst, the rest into out + h + *pk
 * (out may be rec + FX_TLS_HEADER: GCM decrypts in place), and act on it:
 * the application data's length, 0 for a dropped ticket or a key update,
 * or the error. */
static int open_into(struct fx_tls *t, uint8_t *rec, size_t len, uint8_t *out, size_t h,
		     fx_tls_dest_fn where, void *arg, uint8_t **pdst, size_t *pk)
{
	struct fx_tls_dir *d = &t->rx;
	uint8_t nonce[12], *dst = *pdst;
	size_t clen, plen, k = *pk;
	int n, rc;

	clen = len - FX_TLS_HEADER - FX_TLS_TAG;
	if (h > clen)
		h = clen;
	nonce_of(d, nonce);
	/* (GCM is a stream: the plaintext may go to three places) */
	if (!EVP_DecryptInit_ex(d->ctx, NULL, NULL, NULL, nonce) ||
	    !EVP_DecryptUpdate(d->ctx, NULL, &n, rec, FX_TLS_HEADER) ||
	    (h && !EVP_DecryptUpdate(d->ctx, out, &n, rec + FX_TLS_HEADER, (int)h)))
		return fail(t, -EIO, "TLS record decryption failed");
	if (where) {
		/* (out[0..h) is not authenticated yet: only a choice of
		 * where the rest goes may depend on it) */
		dst = NULL;
		k = 0;
		if (where(arg, out, h, clen - h, &dst, &k) != 0 || !dst)
			k = 0;
		if (k > clen - h)
			k = clen - h;
		*pdst = dst;
		*pk = k;
	}
	/* dst is the caller's buffer, seldom in cache: its lines are asked
	 * for ahead of the AEAD's stores, which otherwise wait on each one
	 * (a decrypt into a buffer not in L2 cost 1.6x one into a hot one
	 * here; 1.35x with this) */
	for (size_t i = 0; i < k; i += 64)
		__builtin_prefetch(dst + i, 1, 3);
	if ((k && !EVP_DecryptUpdate(d->ctx, dst, &n, rec + FX_TLS_HEADER + h, (int)k)) ||
	    !EVP_DecryptUpdate(d->ctx, out + h + k, &n, rec + FX_TLS_HEADER + h + k,
			       (int)(clen - h - k)) ||
	    !EVP_CIPHER_CTX_ctrl(d->ctx, EVP_CTRL_AEAD_SET_TAG, FX_TLS_TAG,
				 rec + FX_TLS_HEADER + clen))
		return fail(t, -EIO, "TLS record decryption failed");
	if (EVP_DecryptFinal_ex(d->ctx, out + clen, &n) <= 0) {
		OPENSSL_cleanse(out, h);
		OPENSSL_cleanse(out + h + k, clen - h - k);
		if (k)
			OPENSSL_cleanse(dst, k);
		return fail(t, -EBADMSG,
			    "a TLS record failed its integrity check (bad tag: "
			    "tampered, or not from the peer we keyed)");
	}
	rc = seq_next(t, d);
	if (rc)
		return rc;
	/* the inner type is the last non-zero byte; zeros after it are padding */
	plen = clen;
	while (plen && (plen - 1 >= h && plen - 1 < h + k ? dst[plen - 1 - h] : out[plen - 1]) == 0)
		plen--;
	if (!plen)
		return fail(t, -EPROTO, "a TLS record with no content type");
	--plen;
	uint8_t type = plen >= h && plen < h + k ? dst[plen - h] : out[plen];

	if (type != CT_APPDATA && k)
		memcpy(out + h, dst, k); /* not data: in one piece for what follows */
	/* what of dst is not application data (the inner type, padding, or a
	 * whole record of another type) is zeroed: the caller's buffer holds
	 * only data or zeros, even when the record that would have written
	 * over those bytes never comes (a broken stream fails the read) */
	if (k) {
		size_t from = type != CT_APPDATA ? 0 : plen > h ? plen - h : 0;

		if (from < k)
			memset(dst + from, 0, k - from);
	}

	if (plen > FX_TLS_MAX_PLAINTEXT)
		return fail(t, -EPROTO, "a TLS record over 2^14 plaintext bytes");
	if (type == CT_APPDATA)
		return (int)plen; /* RFC 8446 5.1: zero-length application data is allowed */
	if (type == CT_ALERT) {
		const char *why = NULL;

		rc = fx_tls_alert(out, plen, &why);
		return fail(t, rc, why);
	}
	if (type == CT_HANDSHAKE)
		return handshake_msgs(t, out, plen);
	return fail(t, -EPROTO, "a TLS record of an unknown content type");
}

/* Read one whole record from fd into t->rec and take it in. */
static int read_record(struct fx_tls *t, int fd, int64_t deadline, int cancel_fd)
{
	int rc = fx_tcp_recv_full(fd, t->rec, FX_TLS_HEADER, deadline, cancel_fd);
	int blen;

	if (rc)
		return rc;
	blen = header_ok(t, t->rec);
	if (blen < 0)
		return blen;
	rc = fx_tcp_recv_full(fd, t->rec + FX_TLS_HEADER, (size_t)blen, deadline, cancel_fd);
	if (rc)
		return rc == -ECONNRESET ? fail(t, rc, "the TLS peer closed mid-record") : rc;
	return fx_tls_record_in(t, t->rec, FX_TLS_HEADER + (size_t)blen);
}

int fx_tls_recv_full(struct fx_tls *t, int fd, void *buf, size_t len, int64_t deadline,
		     int cancel_fd)
{
	uint8_t *p = buf;

	while (len) {
		size_t have = t->plain_len - t->plain_pos;

		if (!have) {
			int rc = read_record(t, fd, deadline, cancel_fd);

			if (rc < 0)
				return rc;
			continue;
		}
		if (have > len)
			have = len;
		memcpy(p, t->plain + t->plain_pos, have);
		t->plain_pos += have;
		p += have;
		len -= have;
	}
	return 0;
}

static int send_buf(const uint8_t *buf, int fd, size_t n, int64_t deadline, int cancel_fd)
{
	struct iovec v = {(void *)buf, n};

	return fx_tcp_sendv(fd, &v, 1, send_flags(deadline), deadline, cancel_fd, NULL);
}

static int send_out(struct fx_tls *t, int fd, size_t n, int64_t deadline, int cancel_fd)
{
	return send_buf(t->out, fd, n, deadline, cancel_fd);
}

int fx_tls_sendv(struct fx_tls *t, int fd, struct iovec *iov, int cnt, int64_t deadline,
		 int cancel_fd)
{
	size_t total = 0;

	for (int i = 0; i < cnt; i++)
		total += iov[i].iov_len;
	/* more than a record: several sealed per send (a send per 16 KiB
	 * record was most of a 1 MiB read's cost on our target) */
	if (total > FX_TLS_MAX_PLAINTEXT && !t->bulk)
		t->bulk = malloc(FX_TLS_SEND_RECORDS * sizeof(t->out));
	while (total) {
		uint8_t *dst = t->bulk ? t->bulk : t->out;
		int nrec = t->bulk ? FX_TLS_SEND_RECORDS : 1;
		size_t len = 0;

		for (int r = 0; r < nrec && total; r++) {
			size_t take = total < FX_TLS_MAX_PLAINTEXT ? total : FX_TLS_MAX_PLAINTEXT;
			int n = fx_tls_seal_to(t, dst + len, CT_APPDATA, iov, cnt, take);

			if (n < 0)
				return n;
			len += (size_t)n;
			iov = fx_iov_consume(iov, &cnt, take);
			total -= take;
		}
		int rc = send_buf(dst, fd, len, deadline, cancel_fd);
		if (rc)
			return rc;
	}
	return 0;
}

int fx_tls_close_notify(struct fx_tls *t, int fd, int64_t deadline)
{
	static const uint8_t alert[2] = {1, 0};
	struct iovec v = {(void *)alert, 2};
	int n = fx_tls_record_seal(t, CT_ALERT, &v, 1, 2);
	if (n < 0)
		return n;
	return send_out(t, fd, (size_t)n, deadline, -1);
}

/* ------------------------------------------------------------ handshake */

/* What a handshake in progress keeps (reached from the SSL's ex data). */
struct hs {
	struct fx_tls *t;
	int server;
	const struct fx_tls_psk *psk; /* client: what we offer */
	struct fx_tls_psk found;      /* server: what lookup gave */
	fx_tls_lookup_fn lookup;
	void *arg;
	struct fx_tls_identity *peer;
	const char *why; /* set by the callbacks */
	int refused;     /* lookup refused the identity */
	/* server: told before each wait for a record from the client, and
	 * whether its binder has verified by then (OpenSSL derives the
	 * handshake keys only after that) */
	void (*waiting)(void *arg, int proven);
	int hs_keys;
	uint8_t hash; /* the suite's hash */
	uint8_t c_secret[FX_TLS_PSK_MAX], s_secret[FX_TLS_PSK_MAX];
	int have_c, have_s;
};

static int ex_idx = -1;
static SSL_CTX *ctx_client, *ctx_server;
static pthread_once_t once = PTHREAD_ONCE_INIT;

static int hexval(char c)
{
	return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

/* "CLIENT_TRAFFIC_SECRET_0 <client random> <secret>": the only way OpenSSL
 * 3.0 hands out TLS 1.3 traffic secrets. */
static void keylog_cb(const SSL *ssl, const char *line)
{
	struct hs *h = SSL_get_ex_data(ssl, ex_idx);
	static const char cl[] = "CLIENT_TRAFFIC_SECRET_0 ", sv[] = "SERVER_TRAFFIC_SECRET_0 ";
	uint8_t *dst;
	int *have;
	const char *hex;

	if (!h)
		return;
	if (!strncmp(line, "SERVER_HANDSHAKE_TRAFFIC_SECRET ", 32))
		h->hs_keys = 1;
	if (!strncmp(line, cl, sizeof(cl) - 1)) {
		dst = h->c_secret;
		have = &h->have_c;
	} else if (!strncmp(line, sv, sizeof(sv) - 1)) {
		dst = h->s_secret;
		have = &h->have_s;
	} else {
		return;
	}
	hex = strchr(line + sizeof(cl) - 1, ' ');
	if (!hex)
		return;
	hex++;
	size_t n = strlen(hex) / 2;

	if (n != 32 && n != 48)
		return;
	for (size_t i = 0; i < n; i++) {
		int a = hexval(hex[2 * i]), b = hexval(hex[2 * i + 1]);

		if (a < 0 || b < 0)
			return;
		dst[i] = (uint8_t)(a << 4 | b);
	}
	*have = (int)n;
}

static const SSL_CIPHER *suite_of(SSL *ssl, uint8_t hash)
{
	const unsigned char id[2] = {0x13, hash == FX_TLS_HASH_SHA384 ? 0x02 : 0x01};

	return SSL_CIPHER_find(ssl, id);
}

static SSL_SESSION *session_of(SSL *ssl, const struct fx_tls_psk *psk)
{
	const SSL_CIPHER *c = suite_of(ssl, psk->hash);
	SSL_SESSION *s = c ? SSL_SESSION_new() : NULL;

	if (s &&
	    (!SSL_SESSION_set1_master_key(s, psk->psk, psk->len) || !SSL_SESSION_set_cipher(s, c) ||
	     !SSL_SESSION_set_protocol_version(s, TLS1_3_VERSION))) {
		SSL_SESSION_free(s);
		s = NULL;
	}
	return s;
}

static int use_session_cb(SSL *ssl, const EVP_MD *md, const unsigned char **id, size_t *idlen,
			  SSL_SESSION **sess)
{
	struct hs *h = SSL_get_ex_data(ssl, ex_idx);
	const SSL_CIPHER *c;

	*sess = NULL;
	if (!h)
		return 0;
	c = suite_of(ssl, h->psk->hash);
	/* after a HelloRetryRequest the PSK's hash must be the suite's */
	if (!c ||
	    (md && EVP_MD_get_type(md) != EVP_MD_get_type(SSL_CIPHER_get_handshake_digest(c))))
		return 0;
	*sess = session_of(ssl, h->psk);
	if (!*sess)
		return 0;
	*id = (const unsigned char *)h->psk->identity;
	*idlen = strlen(h->psk->identity);
	return 1;
}

static int find_session_cb(SSL *ssl, const unsigned char *identity, size_t len, SSL_SESSION **sess)
{
	struct hs *h = SSL_get_ex_data(ssl, ex_idx);
	struct fx_tls_identity id;
	const char *why = NULL;

	*sess = NULL;
	if (!h)
		return 0;
	/* "no PSK" (return 1, no session) fails the handshake with an alert */
	if (fx_tls_identity_parse(identity, len, &id) != 0) {
		h->refused = 1;
		h->why = "the host offered a TLS PSK identity that is not an NVMe one "
			 "(NVMe0R0x/NVMe1R0x <hostnqn> <subnqn>)";
		return 1;
	}
	/* the identity's strings point into its own text: parse it again in place */
	if (h->peer)
		fx_tls_identity_parse(identity, len, h->peer);
	if (h->lookup(h->arg, &id, &h->found, &why) != 0 || h->found.hash != id.hash) {
		fx_tls_psk_wipe(&h->found);
		h->refused = 1;
		h->why = why ? why : "no TLS key for this host";
		return 1;
	}
	/* OpenSSL uses the PSK only when its hash is the chosen suite's; the
	 * check after the handshake holds the suite to it */
	h->hash = h->found.hash;
	*sess = session_of(ssl, &h->found);
	return *sess ? 1 : 0;
}

static SSL_CTX *ctx_new(int server)
{
	SSL_CTX *c = SSL_CTX_new(server ? TLS_server_method() : TLS_client_method());

	if (!c)
		return NULL;
	if (!SSL_CTX_set_min_proto_version(c, TLS1_3_VERSION) ||
	    !SSL_CTX_set_max_proto_version(c, TLS1_3_VERSION) ||
	    !SSL_CTX_set_ciphersuites(c, "TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384")) {
		SSL_CTX_free(c);
		return NULL;
	}
	/* no middlebox-compatibility ChangeCipherSpec records: less to read */
	SSL_CTX_clear_options(c, SSL_OP_ENABLE_MIDDLEBOX_COMPAT);
	SSL_CTX_set_keylog_callback(c, keylog_cb);
	if (server) {
		/* Linux hosts take nothing but application data after the
		 * handshake: no NewSessionTicket, and no resumption or 0-RTT */
		SSL_CTX_set_num_tickets(c, 0);
		SSL_CTX_set_options(c, SSL_OP_NO_TICKET);
		SSL_CTX_set_max_early_data(c, 0);
		SSL_CTX_set_psk_find_session_callback(c, find_session_cb);
	} else {
		SSL_CTX_set_psk_use_session_callback(c, use_session_cb);
	}
	return c;
}

static void init_once(void)
{
	ex_idx = SSL_get_ex_new_index(0, NULL, NULL, NULL, NULL);
	ctx_client = ctx_new(0);
	ctx_server = ctx_new(1);
}

static int flush_wbio(BIO *w, int fd, int64_t deadline, int cancel_fd)
{
	uint8_t buf[4096];
	int n;

	while ((n = BIO_read(w, buf, sizeof(buf))) > 0) {
		struct iovec v = {buf, (size_t)n};
		int rc = fx_tcp_sendv(fd, &v, 1, send_flags(deadline), deadline, cancel_fd, NULL);

		if (rc)
			return rc;
	}
	return 0;
}

/* One record from the socket into OpenSSL: during the handshake the
 * records are in clear (handshake, alert) or encrypted under the handshake
 * keys (application data as outer type). */
static int feed_record(BIO *r, int fd, int64_t deadline, int cancel_fd, const char **why)
{
	uint8_t rec[FX_TLS_HEADER + FX_TLS_MAX_CIPHERTEXT];
	size_t len;
	int rc = fx_tcp_recv_full(fd, rec, FX_TLS_HEADER, deadline, cancel_fd);

	if (rc) {
		if (rc == -ECONNRESET)
			*why = "the peer closed the connection during the TLS handshake (it may "
			       "not speak TLS, or refused us)";
		return rc;
	}
	len = (size_t)rec[3] << 8 | rec[4];
	if (rec[0] < 20 || rec[0] > 23 || rec[1] != 3 || len > FX_TLS_MAX_CIPHERTEXT) {
		*why = "the peer did not answer with TLS (is TLS on at its end?)";
		return -EPROTO;
	}
	rc = fx_tcp_recv_full(fd, rec + FX_TLS_HEADER, len, deadline, cancel_fd);
	if (rc) {
		if (rc == -ECONNRESET)
			*why = "the peer closed the connection mid-record during the TLS handshake";
		return rc;
	}
	if (BIO_write(r, rec, (int)(FX_TLS_HEADER + len)) != (int)(FX_TLS_HEADER + len))
		return -ENOMEM;
	return 0;
}

/* Why OpenSSL failed a handshake, in our words: -EACCES for a key the
 * peer (or we) refused, -EPROTO for the rest. */
static int ssl_why(int server, const char **why)
{
	int reason = ERR_GET_REASON(ERR_peek_last_error());

	switch (reason) {
	case SSL_R_BINDER_DOES_NOT_VERIFY:
	case SSL_R_DECRYPTION_FAILED:
	case SSL_R_DECRYPTION_FAILED_OR_BAD_RECORD_MAC:
	case SSL_R_TLSV1_ALERT_DECRYPT_ERROR:
	case SSL_R_SSLV3_ALERT_BAD_RECORD_MAC:
	/* what OpenSSL 3.0 answers a binder that does not verify */
	case SSL_R_SSLV3_ALERT_ILLEGAL_PARAMETER:
		*why = server ? "the host's TLS PSK does not match ours (wrong key)"
			      : "the target refused our TLS PSK (wrong key)";
		return -EACCES;
	case SSL_R_TLSV1_ALERT_UNKNOWN_PSK_IDENTITY:
	case SSL_R_SSLV3_ALERT_HANDSHAKE_FAILURE:
	case SSL_R_NO_SHARED_CIPHER:
		*why = server ? "the host offered no TLS PSK we have"
			      : "the target has no TLS PSK for our identity (host NQN, subsystem "
				"NQN, key hash)";
		return -EACCES;
	case SSL_R_UNSUPPORTED_PROTOCOL:
	case SSL_R_TLSV1_ALERT_PROTOCOL_VERSION:
		*why = "the peer does not do TLS 1.3";
		return -EPROTO;
	default:
		*why = "the TLS handshake failed";
		return -EPROTO;
	}
}

static int handshake(struct hs *h, int fd, int64_t deadline, int cancel_fd, struct fx_tls **out,
		     const char **why)
{
	SSL *ssl = NULL;
	BIO *r = NULL, *w = NULL;
	struct fx_tls *t = NULL;
	const char *dummy;
	int rc = -EIO;

	if (!why)
		why = &dummy;
	*why = NULL;
	*out = NULL;
	pthread_once(&once, init_once);
	if (ex_idx < 0 || !(h->server ? ctx_server : ctx_client)) {
		*why = "OpenSSL could not set up TLS 1.3 with PSKs";
		return -EIO;
	}
	ERR_clear_error();
	t = fx_tls_alloc();
	ssl = SSL_new(h->server ? ctx_server : ctx_client);
	r = BIO_new(BIO_s_mem());
	w = BIO_new(BIO_s_mem());
	if (!t || !ssl || !r || !w) {
		BIO_free(r);
		BIO_free(w);
		rc = -ENOMEM;
		goto out;
	}
	SSL_set_bio(ssl, r, w); /* ssl owns them now */
	SSL_set_ex_data(ssl, ex_idx, h);
	if (h->server) {
		SSL_set_accept_state(ssl);
	} else {
		SSL_set_connect_state(ssl);
		h->hash = h->psk->hash;
		if (!SSL_set_ciphersuites(ssl, h->hash == FX_TLS_HASH_SHA384
						       ? "TLS_AES_256_GCM_SHA384"
						       : "TLS_AES_128_GCM_SHA256"))
			goto out;
	}
	for (;;) {
		int ret = SSL_do_handshake(ssl);
		/* what OpenSSL wrote (our flight, or the alert of a failure) goes out first */
		int frc = flush_wbio(w, fd, deadline, cancel_fd);

		if (ret == 1) {
			if (frc) {
				rc = frc;
				goto out;
			}
			break;
		}
		int err = SSL_get_error(ssl, ret);

		if (err != SSL_ERROR_WANT_READ) {
			rc = ssl_why(h->server, why);
			if (h->refused) {
				*why = h->why;
				rc = -EACCES;
			}
			goto out;
		}
		if (frc) {
			rc = frc;
			goto out;
		}
		if (h->server && h->waiting)
			h->waiting(h->arg, h->hs_keys && h->hash);
		rc = feed_record(r, fd, deadline, cancel_fd, why);
		if (rc)
			goto out;
	}
	/* an external PSK, TLS 1.3, the pinned suite: anything else is not ours */
	const SSL_CIPHER *c = SSL_get_current_cipher(ssl);
	uint32_t want = h->hash == FX_TLS_HASH_SHA384 ? 0x03001302 : 0x03001301;

	if (SSL_version(ssl) != TLS1_3_VERSION || !SSL_session_reused(ssl) || !c ||
	    SSL_CIPHER_get_id(c) != want || h->have_c != (int)secret_len(h->hash) ||
	    h->have_s != (int)secret_len(h->hash)) {
		*why = "the TLS handshake ended without our PSK and suite";
		rc = -EPROTO;
		goto out;
	}
	/* records fed one by one: nothing of the peer's is left in OpenSSL */
	if (BIO_ctrl_pending(r) != 0 || SSL_pending(ssl) != 0) {
		*why = "the TLS peer sent data inside its handshake flight";
		rc = -EPROTO;
		goto out;
	}
	rc = fx_tls_dir_init(&t->tx, h->hash, h->server ? h->s_secret : h->c_secret);
	if (rc == 0)
		rc = fx_tls_dir_init(&t->rx, h->hash, h->server ? h->c_secret : h->s_secret);
	if (rc)
		*why = "TLS record keys could not be set up";
out:
	SSL_free(ssl);
	ERR_clear_error();
	OPENSSL_cleanse(h->c_secret, sizeof(h->c_secret));
	OPENSSL_cleanse(h->s_secret, sizeof(h->s_secret));
	fx_tls_psk_wipe(&h->found);
	if (rc) {
		if (!*why)
			*why = rc == -ETIMEDOUT ? "the TLS handshake timed out"
						: "the TLS handshake failed";
		fx_tls_free(t);
		return rc;
	}
	*out = t;
	return 0;
}

int fx_tls_client(int fd, const struct fx_tls_psk *psk, int64_t deadline, int cancel_fd,
		  struct fx_tls **out, const char **why)
{
	struct hs h = {0};

	if (!psk || !out || (psk->hash != FX_TLS_HASH_SHA256 && psk->hash != FX_TLS_HASH_SHA384) ||
	    !psk->identity[0])
		return -EINVAL;
	h.psk = psk;
	return handshake(&h, fd, deadline, cancel_fd, out, why);
}

int fx_tls_server(int fd, fx_tls_lookup_fn lookup, void (*waiting)(void *arg, int proven),
		  void *arg, int64_t deadline, int cancel_fd, struct fx_tls **out,
		  struct fx_tls_identity *peer, const char **why)
{
	struct hs h = {0};

	if (!lookup || !out)
		return -EINVAL;
	h.server = 1;
	h.lookup = lookup;
	h.waiting = waiting;
	h.arg = arg;
	h.peer = peer;
	return handshake(&h, fd, deadline, cancel_fd, out, why);
}
