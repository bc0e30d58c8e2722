/*
 * NVMe/TCP secure channel (TLS 1.3 with an external PSK), one module for our
 * initiator and our target: the handshake before ICReq and the record layer
 * that carries every PDU after it.
 *
 * Handshake: OpenSSL 3 over memory BIOs, fed one TLS record at a time from
 * the socket so that no byte after the handshake is read into OpenSSL;
 * TLS 1.3 only, psk_dhe_ke, the one suite the PSK's hash names
 * (TLS_AES_128_GCM_SHA256 for SHA-256, TLS_AES_256_GCM_SHA384 for SHA-384),
 * no certificates, no session tickets, no early data.  The traffic secrets
 * come from OpenSSL's keylog callback; the SSL object is freed at the end.
 *
 * Records: our own (RFC 8446 5): AES-GCM through EVP, a nonce from the
 * sequence number, the 5-byte header as AAD, the inner content type after
 * the content.  What a peer may send after the handshake: application data;
 * a NewSessionTicket (dropped: SPDK's target sends one); a KeyUpdate that
 * does not ask for ours (the receive key moves on); close_notify (the end
 * of the stream).  Anything else ends the connection with a reason:
 * another alert, a KeyUpdate asking for ours, a handshake message split
 * across records, a record over 2^14+256 bytes or with a plaintext over
 * 2^14, a bad tag, a clear-text record.
 *
 * Functions return 0 (or a count) or -errno: -EINVAL a bad argument,
 * -EACCES the peer's key or identity was refused (wrong key, unknown host),
 * -EPROTO the peer broke TLS (fx_tls_why() says how), -ECONNRESET the peer
 * ended the stream, -ETIMEDOUT, -ECANCELED, -ENOMEM, -EIO OpenSSL failed.
 */
#ifndef FX100IO_NVME_TCP_TLS_H
#define FX100IO_NVME_TCP_TLS_H

#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include "nvme_tcp/tls_psk.h"

/* RFC 8446 5.1, 5.2: the largest plaintext and ciphertext of a record */
#define FX_TLS_MAX_PLAINTEXT 16384
#define FX_TLS_MAX_CIPHERTEXT (16384 + 256)
#define FX_TLS_HEADER 5
#define FX_TLS_TAG 16
#define FX_TLS_CT_APPDATA 23 /* the record content type of application data */

/* One direction's record protection. */
struct fx_tls_dir {
	void *ctx; /* EVP_CIPHER_CTX with the key schedule */
	uint8_t hash;
	uint8_t secret[FX_TLS_PSK_MAX]; /* the traffic secret (a KeyUpdate moves it) */
	uint8_t iv[12];
	uint64_t seq;
};

struct fx_tls {
	struct fx_tls_dir tx, rx;
	const char *why; /* the reason of the last failure, a static sentence */
	/* received: one record's ciphertext, then its plaintext handed out */
	uint8_t rec[FX_TLS_HEADER + FX_TLS_MAX_CIPHERTEXT];
	uint8_t plain[FX_TLS_MAX_CIPHERTEXT];
	size_t plain_pos, plain_len;
	/* sent: one record at a time */
	uint8_t out[FX_TLS_HEADER + FX_TLS_MAX_PLAINTEXT + 1 + FX_TLS_TAG];
	/* fx_tls_sendv of more than a record: FX_TLS_SEND_RECORDS sealed
	 * records per send (allocated on first need; NULL: one at a time) */
	uint8_t *bulk;
};
#define FX_TLS_SEND_RECORDS 8

/* The target's PSK for a peer's identity: 0 with *psk filled (its
 * identity field need not be), -EACCES (with *why a static sentence for
 * the log) when this host has no key or may not connect. */
typedef int (*fx_tls_lookup_fn)(void *arg, const struct fx_tls_identity *id, struct fx_tls_psk *psk,
				const char **why);

/*
 * Handshake as the client on connected socket fd, offering psk's identity,
 * before the deadline (fx_tcp_now_ms() clock) or cancel_fd.  *out gets the
 * record state (free with fx_tls_free).  *why (may be NULL) gets a static
 * sentence on failure.
 */
int fx_tls_client(int fd, const struct fx_tls_psk *psk, int64_t deadline, int cancel_fd,
		  struct fx_tls **out, const char **why);
/* The same as the server, finding the PSK with lookup; *peer (may be NULL)
 * gets the identity the client offered, when it parsed.  waiting (may be
 * NULL) is called on this thread before each read of a record from the
 * client, with whether the client has by then shown that it holds the PSK
 * lookup gave (its binder verified; our ServerHello is out). */
int fx_tls_server(int fd, fx_tls_lookup_fn lookup, void (*waiting)(void *arg, int proven),
		  void *arg, int64_t deadline, int cancel_fd, struct fx_tls **out,
		  struct fx_tls_identity *peer, const char **why);
/* Send close_notify (best effort, never blocks past the deadline) is the
 * caller's choice; free wipes the keys. */
void fx_tls_free(struct fx_tls *t);
const char *fx_tls_why(const struct fx_tls *t);

/* Encrypt iov[0..cnt) into records and send them all (the iovecs are
 * consumed) before the deadline. */
int fx_tls_sendv(struct fx_tls *t, int fd, struct iovec *iov, int cnt, int64_t deadline,
		 int cancel_fd);
/* Receive exactly len plaintext bytes before the deadline. */
int fx_tls_recv_full(struct fx_tls *t, int fd, void *buf, size_t len, int64_t deadline,
		     int cancel_fd);
/* Plaintext already decrypted and not yet handed out. */
size_t fx_tls_pending(const struct fx_tls *t);
/* Send close_notify (one record). */
int fx_tls_close_notify(struct fx_tls *t, int fd, int64_t deadline);

/*
 * The record layer without a socket (the fuzzer and the tests drive it):
 * open one whole record rec[0..len) (header included; rec is decrypted in
 * place) and handle it: application data lands in t->plain; returns the
 * plaintext bytes added (0 for a dropped ticket or a key update),
 * -ECONNRESET for close_notify, -EPROTO / -EBADMSG (bad tag) otherwise.
 * seal: one record of type 23 with len <= FX_TLS_MAX_PLAINTEXT bytes of
 * data into t->out; returns the record's size.
 */
int fx_tls_record_in(struct fx_tls *t, uint8_t *rec, size_t len);
int fx_tls_record_seal(struct fx_tls *t, uint8_t type, const struct iovec *iov, int cnt,
		       size_t len);
/*
 * The same for a caller with its own buffers (the io_uring data path):
 * record_len checks a record's 5-byte header and returns its body's length
 * (-EPROTO: not a record a peer may send); open decrypts the whole record
 * rec[0..len) in place and handles it like record_in, with *plain pointing
 * at the application data inside rec (valid until rec is reused); seal_to
 * seals like record_seal into dst, which has room for
 * FX_TLS_HEADER + len + 1 + FX_TLS_TAG bytes.
 */
int fx_tls_record_len(struct fx_tls *t, const uint8_t *hdr);
int fx_tls_open(struct fx_tls *t, uint8_t *rec, size_t len, uint8_t **plain);
/* The same with the first k plaintext bytes decrypted into dst (the data
 * path: payload straight into the caller's buffer) and the rest in place
 * at *rest = rec + FX_TLS_HEADER + k.  Returns the application data's
 * length n as fx_tls_open: bytes [0, min(k, n)) are in dst, [k, n) at
 * *rest.  dst[0..min(k, record's ciphertext)) is written before the tag
 * is checked (cleansed when it fails) and, past n, the record's inner
 * type and padding (zeroed before the return): the caller must own that
 * range and use none of it before the return. */
int fx_tls_open_split(struct fx_tls *t, uint8_t *rec, size_t len, uint8_t *dst, size_t k,
		      uint8_t **rest);
/*
 * The same for a record whose start says where the rest goes (a PDU header
 * and its payload in one record): the first h plaintext bytes are
 * decrypted in place at rec + FX_TLS_HEADER, then where(arg, head, h,
 * left, &dst, &k) picks dst and k (k <= left, the ciphertext bytes after
 * them; return non-zero or leave dst NULL for none), the next k bytes are
 * decrypted into dst and the rest in place after them.  head is not
 * authenticated when where sees it: it may choose a destination, nothing
 * else.  Returns n as fx_tls_open, with *dst and *k what where chose:
 * plaintext [0, min(h, n)) at rec + FX_TLS_HEADER, [h, h + k) in *dst
 * (as fx_tls_open_split's dst: written before the tag is checked, zeros
 * past n), [h + k, n) after it in rec.
 */
typedef int (*fx_tls_dest_fn)(void *arg, const uint8_t *head, size_t h, size_t left, uint8_t **dst,
			      size_t *k);
int fx_tls_open_head(struct fx_tls *t, uint8_t *rec, size_t len, size_t h, fx_tls_dest_fn where,
		     void *arg, uint8_t **dst, size_t *k);
int fx_tls_seal_to(struct fx_tls *t, uint8_t *dst, uint8_t type, const struct iovec *iov, int cnt,
		   size_t len);
/*
 * Seal a record of application data whose plaintext the caller has
 * already put in place, len bytes (<= FX_TLS_MAX_PLAINTEXT) at
 * rec + FX_TLS_HEADER, with room for FX_TLS_HEADER + len + 1 + FX_TLS_TAG
 * bytes: header, inner type and tag are written around it and the data is
 * encrypted where it is (one pass over it: our target reads a read's data
 * from the page cache straight into its records).  Returns the record's
 * size as fx_tls_seal_to.
 */
int fx_tls_seal_in_place(struct fx_tls *t, uint8_t *rec, size_t len);
/*
 * What both record layers (ours and the kernel's, nvme_tcp/ktls.c) do with
 * a record that is not application data, one rule each:
 * post_handshake checks the handshake messages of one record (tickets are
 * dropped; *key_update set for a KeyUpdate that asks nothing of us, which
 * must end its record); alert says what an alert means (-ECONNRESET for
 * close_notify, -EPROTO otherwise).  Both -EPROTO with *why for the rest.
 */
int fx_tls_post_handshake(const uint8_t *p, size_t len, int *key_update, const char **why);
int fx_tls_alert(const uint8_t *p, size_t len, const char **why);
/* A traffic secret's key (16 or 32 bytes, as the hash says) and IV; and
 * the secret after a KeyUpdate, in place (RFC 8446 7.1, 7.2). */
int fx_tls_traffic_keys(uint8_t hash, const uint8_t *secret, uint8_t *key, uint8_t iv[12]);
int fx_tls_secret_next(uint8_t hash, uint8_t *secret);
/* Install a direction's traffic secret (tests: both ends from one). */
int fx_tls_dir_init(struct fx_tls_dir *d, uint8_t hash, const uint8_t *secret);
struct fx_tls *fx_tls_alloc(void);

#endif
