/*
 * The NVMe/TCP secure channel on the kernel's record layer (see ktls.h).
 */
#ifndef _GNU_SOURCE /* tests/c/Makefile passes -D_GNU_SOURCE */
#define _GNU_SOURCE
#endif
#include "nvme_tcp/ktls.h"

#include <errno.h>
#include <linux/tls.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include <openssl/crypto.h>

#include "nvme_tcp/sock.h"

#ifndef SOL_TLS
#define SOL_TLS 282
#endif
#ifndef TLS_RX_EXPECT_NO_PAD
#define TLS_RX_EXPECT_NO_PAD 4
#endif

#define CT_ALERT 21
#define CT_HANDSHAKE 22
#define CT_APPDATA 23

/* One direction's keys as the kernel takes them: TLS 1.3, AES-GCM with
 * the suite's key size, the 12-byte IV as salt (4) and iv (8), the next
 * record's sequence number big-endian. */
union crypto_info {
	struct tls_crypto_info info;
	struct tls12_crypto_info_aes_gcm_128 g128;
	struct tls12_crypto_info_aes_gcm_256 g256;
};

static int info_of(uint8_t hash, const uint8_t *secret, uint64_t seq, union crypto_info *ci,
		   socklen_t *len)
{
	uint8_t key[32], iv[12], rs[8];
	int rc = fx_tls_traffic_keys(hash, secret, key, iv);

	memset(ci, 0, sizeof(*ci));
	for (int i = 0; i < 8; i++)
		rs[i] = (uint8_t)(seq >> (56 - 8 * i));
	if (rc == 0 && hash == FX_TLS_HASH_SHA384) {
		ci->g256.info.version = TLS_1_3_VERSION;
		ci->g256.info.cipher_type = TLS_CIPHER_AES_GCM_256;
		memcpy(ci->g256.key, key, sizeof(ci->g256.key));
		memcpy(ci->g256.salt, iv, sizeof(ci->g256.salt));
		memcpy(ci->g256.iv, iv + 4, sizeof(ci->g256.iv));
		memcpy(ci->g256.rec_seq, rs, sizeof(ci->g256.rec_seq));
		*len = sizeof(ci->g256);
	} else if (rc == 0) {
		ci->g128.info.version = TLS_1_3_VERSION;
		ci->g128.info.cipher_type = TLS_CIPHER_AES_GCM_128;
		memcpy(ci->g128.key, key, sizeof(ci->g128.key));
		memcpy(ci->g128.salt, iv, sizeof(ci->g128.salt));
		memcpy(ci->g128.iv, iv + 4, sizeof(ci->g128.iv));
		memcpy(ci->g128.rec_seq, rs, sizeof(ci->g128.rec_seq));
		*len = sizeof(ci->g128);
	}
	OPENSSL_cleanse(key, sizeof(key));
	OPENSSL_cleanse(iv, sizeof(iv));
	return rc;
}

int fx_ktls_start(int fd, struct fx_tls *t, struct fx_ktls **out, const char **why)
{
	union crypto_info ci;
	socklen_t len = 0;
	struct fx_ktls *k;
	int rc, one = 1;

	*out = NULL;
	/* a record our layer already opened would be lost to the kernel's */
	if (fx_tls_pending(t)) {
		*why = "plaintext already received in userspace";
		return -ENOPROTOOPT;
	}
	if (setsockopt(fd, IPPROTO_TCP, TCP_ULP, "tls", sizeof("tls")) < 0) {
		*why = errno == ENOENT ? "the kernel has no tls module"
				       : "the kernel refused the tls ULP on this socket";
		return -ENOPROTOOPT;
	}
	k = calloc(1, sizeof(*k));
	if (!k) {
		/* the ULP alone changes nothing: records still go through us */
		*why = "out of memory";
		return -ENOPROTOOPT;
	}
	/* (a refused key leaves that direction as it was: with TX refused
	 * the socket is plain TCP still, and our layer goes on) */
	rc = info_of(t->tx.hash, t->tx.secret, t->tx.seq, &ci, &len);
	if (rc || setsockopt(fd, SOL_TLS, TLS_TX, &ci, len) < 0) {
		OPENSSL_cleanse(&ci, sizeof(ci));
		free(k);
		*why = "the kernel refused our send key (no AES-GCM for kTLS?)";
		return -ENOPROTOOPT;
	}
	rc = info_of(t->rx.hash, t->rx.secret, t->rx.seq, &ci, &len);
	if (rc || setsockopt(fd, SOL_TLS, TLS_RX, &ci, len) < 0) {
		OPENSSL_cleanse(&ci, sizeof(ci));
		free(k);
		*why = "the kernel took our send key and refused the receive key (use ktls=off)";
		return rc ? rc : -EIO;
	}
	OPENSSL_cleanse(&ci, sizeof(ci));
	/* our peers send no padding: the kernel may then decrypt a record
	 * straight into the caller's buffer (it decrypts again where one has
	 * padding); a kernel without the option copies, which is only slower */
	(void)setsockopt(fd, SOL_TLS, TLS_RX_EXPECT_NO_PAD, &one, sizeof(one));
	k->hash = t->rx.hash;
	memcpy(k->rx_secret, t->rx.secret, sizeof(k->rx_secret));
	*out = k;
	return 0;
}

void fx_ktls_free(struct fx_ktls *k)
{
	if (!k)
		return;
	OPENSSL_cleanse(k, sizeof(*k));
	free(k);
}

const char *fx_ktls_why(const struct fx_ktls *k)
{
	return k && k->rx_why ? k->rx_why : "";
}

const char *fx_ktls_send_why(const struct fx_ktls *k)
{
	return k && k->tx_why ? k->tx_why : "";
}

/* (the receive side's only: the send side has its own reason) */
static int fail(struct fx_ktls *k, int rc, const char *why)
{
	k->rx_why = why;
	return rc;
}

static const char *const why_bad_tag =
	"a TLS record failed its integrity check (bad tag: tampered, or not from the peer "
	"we keyed)";
static const char *const why_too_large = "the TLS peer sent a record of a size TLS 1.3 forbids";

/* The peer's KeyUpdate: the kernel paused decryption after it (6.14 and
 * later) and takes the next key by TLS_RX again, sequence numbers from 0;
 * an older kernel refuses a second TLS_RX and would open the next record
 * with the old key. */
static int key_update(struct fx_ktls *k, int fd)
{
	union crypto_info ci;
	socklen_t len = 0;
	int rc = fx_tls_secret_next(k->hash, k->rx_secret);

	if (rc == 0)
		rc = info_of(k->hash, k->rx_secret, 0, &ci, &len);
	if (rc == 0 && setsockopt(fd, SOL_TLS, TLS_RX, &ci, len) < 0)
		rc = -EPROTO;
	OPENSSL_cleanse(&ci, sizeof(ci));
	if (rc)
		return fail(k, -EPROTO,
			    "the TLS peer updated its key and this kernel's kTLS cannot take a "
			    "new one (Linux 6.14 can; or use ktls=off)");
	return 0;
}

int fx_ktls_record(struct fx_ktls *k, int fd)
{
	char cbuf[CMSG_SPACE(sizeof(uint8_t))];
	struct iovec v = {k->rec, sizeof(k->rec)};
	struct msghdr m = {.msg_iov = &v,
			   .msg_iovlen = 1,
			   .msg_control = cbuf,
			   .msg_controllen = sizeof(cbuf)};
	const char *why = NULL;
	uint8_t type = 0;
	ssize_t n;
	int rc, ku;

	do
		n = recvmsg(fd, &m, MSG_DONTWAIT);
	while (n < 0 && errno == EINTR);
	if (n < 0)
		return fx_ktls_recv_error(k, errno == EAGAIN ? -EIO : -errno);
	for (struct cmsghdr *c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c))
		if (c->cmsg_level == SOL_TLS && c->cmsg_type == TLS_GET_RECORD_TYPE &&
		    c->cmsg_len >= CMSG_LEN(sizeof(uint8_t)))
			type = *CMSG_DATA(c);
	/* the end of the stream has no record type; 0 bytes with one is an
	 * empty record, which the rules below judge as our layer does */
	if (n == 0 && !type && !(m.msg_flags & MSG_CTRUNC))
		return fail(k, -ECONNRESET, "the TLS peer closed the connection");
	/* (a record is at most 2^14 bytes of plaintext: k->rec takes it whole) */
	if (type == CT_APPDATA || (m.msg_flags & MSG_CTRUNC))
		return type == CT_APPDATA
			       ? (int)n
			       : fail(k, -EPROTO, "kTLS: a record type we could not read");
	if (type == CT_ALERT) {
		rc = fx_tls_alert(k->rec, (size_t)n, &why);
		return fail(k, rc, why);
	}
	if (type == CT_HANDSHAKE) {
		rc = fx_tls_post_handshake(k->rec, (size_t)n, &ku, &why);
		if (rc)
			return fail(k, rc, why);
		return ku ? key_update(k, fd) : 0;
	}
	return fail(k, -EPROTO, "a TLS record of an unknown content type");
}

int fx_ktls_recv_error(struct fx_ktls *k, int err)
{
	switch (err) {
	case -EBADMSG:
		atomic_store(&k->rx_err, EBADMSG);
		return fail(k, err, why_bad_tag);
	case -EMSGSIZE:
		atomic_store(&k->rx_err, EMSGSIZE);
		return fail(k, -EPROTO, why_too_large);
	case -EINVAL:
		atomic_store(&k->rx_err, EINVAL);
		return fail(k, -EPROTO, "the TLS peer sent a record with a bad header");
	case -EKEYEXPIRED:
	case -EIO:
		return fail(k, -EPROTO, "kTLS refused a record from the peer");
	default:
		return err;
	}
}

int fx_ktls_send_error(struct fx_ktls *k, int err)
{
	int rx;

	if (err != -EBADMSG && err != -EMSGSIZE)
		return err;
	/* A receive the kernel refused (a bad tag, an oversized record)
	 * aborts the whole socket with that error, and a send then returns
	 * it: where our receive has seen that refusal, it means what it
	 * meant there.  (Only the refusal's code crosses threads; the
	 * receive's reason string is its own.) */
	rx = atomic_load(&k->rx_err);
	if (rx == EBADMSG) {
		k->tx_why = why_bad_tag;
		return -EBADMSG;
	}
	if (rx == EMSGSIZE) {
		k->tx_why = why_too_large;
		return -EPROTO;
	}
	/* Otherwise it need not be the peer's doing: kernels before the fix
	 * of tls_sw_sendmsg's error handling (6.13, and the stable kernels
	 * that took it) report any TCP send failure, a reset or a broken
	 * pipe, as EBADMSG; a receive that ended otherwise (close_notify, an
	 * alert) proves no tampering either.  So none is claimed here. */
	k->tx_why = "a kTLS send failed: the connection is broken (the kernel said EBADMSG or "
		    "EMSGSIZE: a record it refused from the peer, or a TCP error on kernels "
		    "before 6.13)";
	return -ECONNRESET;
}

int fx_ktls_send_record(int fd, uint8_t type, const void *buf, size_t len)
{
	char cbuf[CMSG_SPACE(sizeof(uint8_t))];
	struct iovec v = {(void *)buf, len};
	struct msghdr m = {.msg_iov = &v,
			   .msg_iovlen = 1,
			   .msg_control = cbuf,
			   .msg_controllen = sizeof(cbuf)};
	struct cmsghdr *c;
	ssize_t n;

	memset(cbuf, 0, sizeof(cbuf));
	c = CMSG_FIRSTHDR(&m);
	c->cmsg_level = SOL_TLS;
	c->cmsg_type = TLS_SET_RECORD_TYPE;
	c->cmsg_len = CMSG_LEN(sizeof(uint8_t));
	*CMSG_DATA(c) = type;
	do
		n = sendmsg(fd, &m, MSG_NOSIGNAL);
	while (n < 0 && errno == EINTR);
	if (n < 0)
		return errno == EWOULDBLOCK ? -EAGAIN : -errno;
	/* (a rest sent without the cmsg would be data: the stream is broken) */
	return (size_t)n == len ? 0 : -EIO;
}

int fx_ktls_recv_full(struct fx_ktls *k, int fd, void *buf, size_t len, int64_t deadline,
		      int cancel_fd)
{
	char *p = buf;

	while (len) {
		ssize_t n = recv(fd, p, len, MSG_DONTWAIT);

		if (n > 0) {
			p += n;
			len -= (size_t)n;
			continue;
		}
		if (n == 0)
			return -ECONNRESET;
		if (errno == EINTR)
			continue;
		if (errno == EAGAIN || errno == EWOULDBLOCK) {
			int r = fx_tcp_wait(fd, POLLIN, deadline, cancel_fd);

			if (r)
				return r;
			continue;
		}
		if (errno != EIO)
			return fx_ktls_recv_error(k, -errno);
		int r = fx_ktls_record(k, fd);

		if (r < 0)
			return r;
		if (r > 0) {
			size_t take = (size_t)r < len ? (size_t)r : len;

			/* (recv fails only on a record that is not data: no
			 * data can come here, least of all more than asked) */
			if ((size_t)r > len)
				return fail(k, -EPROTO,
					    "kTLS: data where a record of another "
					    "type was");
			memcpy(p, k->rec, take);
			p += take;
			len -= take;
		}
	}
	return 0;
}
