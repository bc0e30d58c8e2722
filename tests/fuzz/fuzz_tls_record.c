/*
 * The NVMe/TCP secure channel's record layer (csrc/nvme_tcp/tls.c) on the
 * receive side: the byte stream a TLS peer could send after the handshake,
 * read through fx_tls_recv_full() from a socket as the connections read it.
 *
 * Random bytes never pass AES-GCM's tag, so the input describes records that
 * the harness seals with the peer's key, some of them broken:
 *   byte 0: bit 0 the suite (AES-128-GCM/SHA-256 or AES-256-GCM/SHA-384),
 *           bits 1-7 the receiver's read size (1..128 bytes, times 97 when
 *           bit 7 is set: reads that span records)
 *   then records: ctl, len (1 byte, times 67 when ctl bit 3 is set:
 *   records up to 2^14), len bytes of content
 *     ctl & 7: 0-3 application data, 4 a NewSessionTicket built around the
 *              content, 5 an alert of the content's first two bytes, 6 a
 *              KeyUpdate (request_update from the content), 7 the content
 *              sent raw, as a whole record with its own header
 *     ctl & 0x10: flip bit (content[0] & 7) of byte content[1] of the
 *                 sealed record (header or body)
 *     ctl & 0x20: send only the first half of the sealed record, then stop
 * At the end of the input the peer closes.
 *
 * Invariants (beyond ASan/UBSan): the plaintext handed out is exactly the
 * application data of the records before the first broken one, in order;
 * a stream with no broken record ends with -ECONNRESET (end of stream) once
 * all of it was read, and a broken one with an error before any byte after
 * it is handed out.
 *
 * The same stream then goes through the io_uring data path's way in
 * (transport/tcp.c's tls_rx): chunks of the read size appended to a stage,
 * each whole record's length checked from its header (fx_tls_record_len)
 * and the record opened there (fx_tls_open_split: its first k plaintext
 * bytes into another buffer, k varying with the position, the rest in
 * place; or fx_tls_open_head: the first h in place, the next k, chosen
 * after them, into another buffer, the rest in place), a partial one moved
 * to the stage's start.  The same invariants hold, and neither writes past
 * the record's ciphertext size or the k bytes it was given.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "nvme_tcp/sock.h"
#include "nvme_tcp/tls.h"

#define FAIL(...)                                                 \
	do {                                                      \
		fprintf(stderr, "fuzz_tls_record: " __VA_ARGS__); \
		fprintf(stderr, "\n");                            \
		abort();                                          \
	} while (0)

#define STREAM_MAX (256 << 10)

static uint8_t stream[STREAM_MAX], want[STREAM_MAX], got[STREAM_MAX];
/* as transport/tcp.c's: room for a partial record and a whole one after it */
static uint8_t stage[2 * (FX_TLS_HEADER + FX_TLS_MAX_CIPHERTEXT)];
/* where the split open puts a record's first k plaintext bytes, with a
 * guard after what it may write */
static uint8_t direct[FX_TLS_MAX_CIPHERTEXT + 64];

/* fx_tls_open_head's choice: direct, head_k bytes of what is left (none
 * when head_k is a multiple of 5: a header that is not a C2HData's). */
static size_t head_k;

static int pick_dest(void *arg, const uint8_t *head, size_t h, size_t left, uint8_t **dst,
		     size_t *k)
{
	(void)arg;
	(void)head;
	(void)h;
	if (head_k % 5 == 0)
		return -1;
	*dst = direct;
	*k = head_k % (left + 1);
	return 0;
}

/* The data path's receive over stream[0..slen) in chunks of rsize: 0 with
 * *glen the plaintext in got once the stream is used up (whole records
 * only), or the first error. */
static int stage_pass(struct fx_tls *rx, size_t slen, size_t rsize, size_t *glen)
{
	size_t have = 0, at = 0;

	*glen = 0;
	while (at < slen) {
		size_t n = slen - at, room = sizeof(stage) - have, pos = 0;

		if (n > rsize)
			n = rsize;
		if (n > room)
			n = room;
		if (!n)
			FAIL("the stage is full with no whole record in it");
		memcpy(stage + have, stream + at, n);
		at += n;
		have += n;
		while (have - pos >= FX_TLS_HEADER) {
			int blen = fx_tls_record_len(rx, stage + pos);
			uint8_t *plain;

			if (blen < 0)
				return blen;
			if (blen > FX_TLS_MAX_CIPHERTEXT)
				FAIL("record_len let %d bytes through", blen);
			size_t rlen = FX_TLS_HEADER + (size_t)blen;
			if (have - pos < rlen)
				break;
			/* the first k bytes elsewhere, as when a record starts
			 * inside a payload (k from the position: 0 too); or, on
			 * every other record, the first h in place and k after
			 * them elsewhere, as when it starts with a PDU header */
			size_t k = (at * 131 + pos * 7) % (FX_TLS_MAX_CIPHERTEXT + 1);
			size_t h = (at * 17 + pos) % 64;
			int head = ((at + pos) >> 3) & 1;
			uint8_t *hdst = NULL;

			memset(direct, 0xa5, sizeof(direct));
			head_k = k;
			int pl = head ? fx_tls_open_head(rx, stage + pos, rlen, h, pick_dest, NULL,
							 &hdst, &k)
				      : fx_tls_open_split(rx, stage + pos, rlen, k ? direct : NULL,
							  k, &plain);
			if (pl < 0)
				return pl;
			if (head) {
				if (k && hdst != direct)
					FAIL("open_head used another destination");
				if (k > (size_t)blen - FX_TLS_TAG -
						(h < (size_t)blen - FX_TLS_TAG ? h : 0))
					FAIL("open_head took more than the record holds");
				if (pl > FX_TLS_MAX_PLAINTEXT)
					FAIL("open handed out %d bytes", pl);
				if (*glen + (size_t)pl > STREAM_MAX)
					FAIL("more plaintext than was sent");
				for (size_t g = k; g < sizeof(direct); g++)
					if (direct[g] != 0xa5)
						FAIL("open_head wrote past k");
				/* [0, h) in place, [h, h + k) in direct, the rest after */
				uint8_t *in = stage + pos + FX_TLS_HEADER;
				for (size_t i = 0; i < (size_t)pl; i++)
					got[*glen + i] = i < h       ? in[i]
							 : i < h + k ? direct[i - h]
								     : in[i];
				*glen += (size_t)pl;
				pos += rlen;
				continue;
			}
			size_t d = k < (size_t)pl ? k : (size_t)pl;

			for (size_t g = (size_t)blen; g < sizeof(direct); g++)
				if (direct[g] != 0xa5)
					FAIL("split open wrote past the record's size");
			if (pl > FX_TLS_MAX_PLAINTEXT ||
			    ((size_t)pl > d &&
			     (plain < stage + pos || plain + (pl - (int)d) > stage + pos + rlen)))
				FAIL("open handed out %d bytes outside its record", pl);
			if (*glen + (size_t)pl > STREAM_MAX)
				FAIL("more plaintext than was sent");
			memcpy(got + *glen, direct, d);
			memcpy(got + *glen + d, plain, (size_t)pl - d);
			*glen += (size_t)pl;
			pos += rlen;
		}
		memmove(stage, stage + pos, have - pos);
		have -= pos;
	}
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const uint8_t s1[48] = {1, 2, 3}, s2[48] = {4, 5, 6};
	struct fx_tls *tx = fx_tls_alloc(), *rx = fx_tls_alloc();
	size_t slen = 0, wlen = 0, glen = 0, i = 1;
	int broken = 0, sv[2];
	uint8_t hash;
	size_t rsize;

	if (!tx || !rx)
		abort();
	if (size < 1)
		goto out;
	hash = (data[0] & 1) ? FX_TLS_HASH_SHA384 : FX_TLS_HASH_SHA256;
	rsize = (size_t)((data[0] >> 1) & 0x3f) + 1;
	if (data[0] & 0x80)
		rsize *= 97;
	if (fx_tls_dir_init(&tx->tx, hash, s1) || fx_tls_dir_init(&rx->rx, hash, s1) ||
	    fx_tls_dir_init(&tx->rx, hash, s2))
		abort();
	while (i + 2 <= size && !broken) {
		uint8_t ctl = data[i], kind = ctl & 7;
		size_t len = data[i + 1] * ((ctl & 8) ? 67u : 1u), n;
		const uint8_t *c = data + i + 2;
		uint8_t msg[FX_TLS_MAX_PLAINTEXT + 8];
		struct iovec v = {msg, 0};
		uint8_t type = 23;

		if (len > size - i - 2)
			len = size - i - 2;
		i += 2 + len;
		if (len > FX_TLS_MAX_PLAINTEXT)
			len = FX_TLS_MAX_PLAINTEXT;
		if (kind == 7) {
			/* raw bytes as a record: never passes the tag */
			n = len;
			if (slen + n > STREAM_MAX)
				break;
			memcpy(stream + slen, c, n);
			slen += n;
			broken = 1;
			continue;
		}
		if (kind <= 3) {
			memcpy(msg, c, len);
			v.iov_len = len;
		} else if (kind == 4) {
			size_t m = len < 4000 ? len : 4000;

			msg[0] = 4;
			msg[1] = 0;
			msg[2] = (uint8_t)(m >> 8);
			msg[3] = (uint8_t)m;
			memcpy(msg + 4, c, m);
			v.iov_len = 4 + m;
			type = 22;
		} else if (kind == 5) {
			msg[0] = len > 0 ? c[0] : 2;
			msg[1] = len > 1 ? c[1] : 0;
			v.iov_len = 2;
			type = 21;
			broken = 1; /* any alert ends the stream */
		} else {
			msg[0] = 24;
			msg[1] = msg[2] = 0;
			msg[3] = 1;
			msg[4] = len > 0 ? c[0] & 1 : 0;
			v.iov_len = 5;
			type = 22;
			if (msg[4])
				broken = 1; /* we never send a key update: asking for one ends it */
		}
		int r = fx_tls_record_seal(tx, type, &v, 1, v.iov_len);

		if (r < 0)
			FAIL("seal failed: %d", r);
		n = (size_t)r;
		if (kind == 6 && !msg[4]) {
			/* the sender moves on to its next key, as the receiver will */
			uint8_t next[48];
			size_t sl = hash == FX_TLS_HASH_SHA384 ? 48 : 32;

			if (fx_tls_expand_label(hash, tx->tx.secret, sl, "traffic upd", NULL, 0,
						next, sl) ||
			    fx_tls_dir_init(&tx->tx, hash, next))
				abort();
		}
		if (ctl & 0x10) {
			size_t at = (len > 1 ? c[1] : 0) % n;

			tx->out[at] ^= (uint8_t)(1u << ((len > 0 ? c[0] : 0) & 7));
			broken = 1;
		}
		if (ctl & 0x20) {
			n /= 2;
			broken = 1;
		}
		if (slen + n > STREAM_MAX)
			break;
		memcpy(stream + slen, tx->out, n);
		slen += n;
		if (!broken && type == 23) {
			memcpy(want + wlen, msg, v.iov_len);
			wlen += v.iov_len;
		}
	}

	if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv))
		abort();
	int sz = STREAM_MAX + 4096;

	setsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &sz, sizeof(sz));
	setsockopt(sv[1], SOL_SOCKET, SO_RCVBUF, &sz, sizeof(sz));
	/* the whole stream up front: one thread plays both ends (a socket buffer
	 * smaller than the stream cuts it short: then only the prefix is judged) */
	int cut = 0;

	for (size_t at = 0; at < slen;) {
		ssize_t w = send(sv[0], stream + at, slen - at, MSG_DONTWAIT);

		if (w <= 0) {
			cut = 1;
			break;
		}
		at += (size_t)w;
	}
	shutdown(sv[0], SHUT_WR);
	int rc;

	for (;;) {
		rc = fx_tls_recv_full(rx, sv[1], got + glen, rsize, fx_tcp_now_ms() + 1000, -1);
		if (rc)
			break;
		glen += rsize;
		if (glen + rsize > STREAM_MAX)
			FAIL("more plaintext than was sent");
	}
	if (glen > wlen || memcmp(got, want, glen) != 0)
		FAIL("handed out %zu bytes that are not the %zu sent", glen, wlen);
	if (rc == 0 || rc == -ETIMEDOUT)
		FAIL("the stream did not end with an error: %d", rc);
	/* unless the socket buffer cut the stream short, every good byte came out */
	if (!broken && !cut && wlen - glen >= rsize)
		FAIL("clean stream ended with %zu of %zu bytes read", glen, wlen);
	close(sv[0]);
	close(sv[1]);

	struct fx_tls *rx2 = fx_tls_alloc();

	if (!rx2 || fx_tls_dir_init(&rx2->rx, hash, s1))
		abort();
	rc = stage_pass(rx2, slen, rsize, &glen);
	fx_tls_free(rx2);
	if (glen > wlen || memcmp(got, want, glen) != 0)
		FAIL("the stage pass handed out %zu bytes that are not the %zu sent", glen, wlen);
	if (!broken && (rc != 0 || glen != wlen))
		FAIL("clean stream: the stage pass ended with %d after %zu of %zu bytes", rc, glen,
		     wlen);
out:
	fx_tls_free(tx);
	fx_tls_free(rx);
	return 0;
}
