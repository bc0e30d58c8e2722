/*
 * The NVMe/TCP secure channel (csrc/nvme_tcp/tls.c): our TLS 1.3 PSK
 * client against our server over a socketpair (the handshake through
 * OpenSSL, the records through our own layer), and the record layer against
 * what a hostile peer sends: a bad tag, an oversized record, clear text,
 * alerts, tickets, key updates, a peer that stops mid-record or never
 * answers.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "check.h"
#include "nvme_tcp/sock.h"
#include "nvme_tcp/tls.h"

#define HOST "nqn.2014-08.org.nvmexpress:uuid:host-1"
#define SUBSYS "nqn.2024-01.io.fx100io:tls"
#define K32 "NVMeTLSkey-1:01:VRLbtnN9AQb2WXW3c9+wEf/DRLz0QuLdbYvEhwtdWwNf9LrZ:"
#define K48                                                                                       \
	"NVMeTLSkey-1:02:VRLbtnN9AQb2WXW3c9+wEf/DRLz0QuLdbYvEhwtdWwP/w0S89ELi3W2LxIcLXVsDn8kXZQ=" \
	"=:"
/* SPDK's documented key: another 32-byte key */
#define KOTHER "NVMeTLSkey-1:01:MDAxMTIyMzM0NDU1NjY3Nzg4OTlhYWJiY2NkZGVlZmZwJEiQ:"

/* the target's table: one host, one key */
struct srv {
	int fd;
	const char *key_text; /* NULL: knows no host */
	int rc;
	const char *why;
	struct fx_tls *t;
	struct fx_tls_identity peer;
	size_t echo; /* bytes to read and send back */
	int64_t deadline_ms;
};

static int lookup(void *arg, const struct fx_tls_identity *id, struct fx_tls_psk *psk,
		  const char **why)
{
	struct srv *s = arg;
	struct fx_tls_key k;

	if (!s->key_text || strcmp(id->hostnqn, HOST) != 0) {
		*why = "no TLS key for this host";
		return -EACCES;
	}
	CHECK_EQ(fx_tls_key_parse(s->key_text, &k, NULL), 0);
	CHECK_EQ(fx_tls_psk_derive(&k, id->hostnqn, SUBSYS, id->version, FX_TLS_KDF_RFC, psk), 0);
	fx_tls_key_wipe(&k);
	return 0;
}

static void *server(void *arg)
{
	struct srv *s = arg;
	int64_t dl = fx_tcp_now_ms() + (s->deadline_ms ? s->deadline_ms : 5000);

	s->rc = fx_tls_server(s->fd, lookup, NULL, s, dl, -1, &s->t, &s->peer, &s->why);
	if (s->rc == 0 && s->echo) {
		uint8_t *buf = malloc(s->echo);

		CHECK(buf);
		s->rc = fx_tls_recv_full(s->t, s->fd, buf, s->echo, dl, -1);
		if (s->rc == 0) {
			struct iovec v = {buf, s->echo};

			s->rc = fx_tls_sendv(s->t, s->fd, &v, 1, dl, -1);
		}
		free(buf);
	}
	return NULL;
}

static void psk_for(const char *text, int idver, struct fx_tls_psk *p)
{
	struct fx_tls_key k;

	CHECK_EQ(fx_tls_key_parse(text, &k, NULL), 0);
	CHECK_EQ(fx_tls_psk_derive(&k, HOST, SUBSYS, idver, FX_TLS_KDF_RFC, p), 0);
}

/* A whole session: handshake, len bytes each way through several records. */
static void test_session(const char *key, int idver, size_t len)
{
	int sv[2];
	struct srv s = {0};
	pthread_t th;
	struct fx_tls_psk p;
	struct fx_tls *t = NULL;
	const char *why = NULL;
	uint64_t seed = test_seed();

	CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
	s.fd = sv[1];
	s.key_text = key;
	s.echo = len;
	CHECK_EQ(pthread_create(&th, NULL, server, &s), 0);
	psk_for(key, idver, &p);
	int64_t dl = fx_tcp_now_ms() + 5000;

	CHECK_EQ(fx_tls_client(sv[0], &p, dl, -1, &t, &why), 0);
	uint8_t *out = malloc(len), *in = malloc(len);

	CHECK(out && in);
	for (size_t i = 0; i < len; i++)
		out[i] = (uint8_t)test_rand(&seed);
	/* three iovecs of odd sizes: records cut across them */
	struct iovec v[3] = {{out, 1}, {out + 1, len / 3}, {out + 1 + len / 3, len - 1 - len / 3}};

	CHECK_EQ(fx_tls_sendv(t, sv[0], v, 3, dl, -1), 0);
	CHECK_EQ(fx_tls_recv_full(t, sv[0], in, len, dl, -1), 0);
	CHECK(memcmp(in, out, len) == 0);
	CHECK_EQ(pthread_join(th, NULL), 0);
	CHECK_EQ(s.rc, 0);
	CHECK_EQ(s.peer.version, idver);
	CHECK(strcmp(s.peer.hostnqn, HOST) == 0);
	/* close_notify ends the server's stream cleanly */
	CHECK_EQ(fx_tls_close_notify(t, sv[0], dl), 0);
	CHECK_EQ(fx_tls_recv_full(s.t, sv[1], in, 1, dl, -1), -ECONNRESET);
	CHECK(strstr(fx_tls_why(s.t), "close_notify"));
	fx_tls_free(t);
	fx_tls_free(s.t);
	free(out);
	free(in);
	close(sv[0]);
	close(sv[1]);
}

/* A handshake that must fail on both ends with these reasons. */
static void test_refused(const char *client_key, const char *server_key, int want_c,
			 const char *why_c, int want_s, const char *why_s)
{
	int sv[2];
	struct srv s = {0};
	pthread_t th;
	struct fx_tls_psk p;
	struct fx_tls *t = NULL;
	const char *why = NULL;

	CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
	s.fd = sv[1];
	s.key_text = server_key;
	CHECK_EQ(pthread_create(&th, NULL, server, &s), 0);
	psk_for(client_key, 0, &p);
	int rc = fx_tls_client(sv[0], &p, fx_tcp_now_ms() + 5000, -1, &t, &why);

	/* the server closes after its alert: the client then sees EOF if not the alert */
	CHECK_EQ(pthread_join(th, NULL), 0);
	if (rc != want_c || !why || !strstr(why, why_c))
		fprintf(stderr, "client: %d %s\n", rc, why ? why : "(null)");
	CHECK_EQ(rc, want_c);
	CHECK(why && strstr(why, why_c));
	CHECK(t == NULL);
	if (s.rc != want_s || !s.why || !strstr(s.why, why_s))
		fprintf(stderr, "server: %d %s\n", s.rc, s.why ? s.why : "(null)");
	CHECK_EQ(s.rc, want_s);
	CHECK(s.why && strstr(s.why, why_s));
	CHECK(s.t == NULL);
	close(sv[0]);
	close(sv[1]);
}

static void *clear_icreq(void *arg)
{
	uint8_t icreq[128] = {0x00, 0x00, 128, 0, 128, 0, 0, 0};
	struct iovec v = {icreq, sizeof(icreq)};

	fx_tcp_sendv(*(int *)arg, &v, 1, 0, fx_tcp_now_ms() + 2000, -1, NULL);
	return NULL;
}

static void test_clear_text_peers(void)
{
	int sv[2];
	pthread_t th;
	struct fx_tls_psk p;
	struct fx_tls *t = NULL;
	const char *why = NULL;
	struct srv s = {0};

	/* a target without TLS answers our ClientHello... with its ICReq-sized view of
	 * it; here a peer that sends clear NVMe/TCP bytes */
	CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
	CHECK_EQ(pthread_create(&th, NULL, clear_icreq, &sv[1]), 0);
	psk_for(K32, 0, &p);
	CHECK_EQ(fx_tls_client(sv[0], &p, fx_tcp_now_ms() + 2000, -1, &t, &why), -EPROTO);
	CHECK(strstr(why, "did not answer with TLS"));
	pthread_join(th, NULL);
	close(sv[0]);
	close(sv[1]);

	/* a host without TLS sends its ICReq to a target that requires TLS */
	CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
	CHECK_EQ(pthread_create(&th, NULL, clear_icreq, &sv[0]), 0);
	s.fd = sv[1];
	s.key_text = K32;
	server(&s);
	CHECK_EQ(s.rc, -EPROTO);
	CHECK(strstr(s.why, "did not answer with TLS"));
	pthread_join(th, NULL);
	close(sv[0]);
	close(sv[1]);

	/* a peer that never answers: the deadline ends it */
	CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
	int64_t t0 = fx_tcp_now_ms();

	CHECK_EQ(fx_tls_client(sv[0], &p, t0 + 300, -1, &t, &why), -ETIMEDOUT);
	CHECK(fx_tcp_now_ms() - t0 < 3000);
	/* a peer that closes mid-handshake */
	close(sv[1]);
	int rc = fx_tls_client(sv[0], &p, fx_tcp_now_ms() + 1000, -1, &t, &why);

	CHECK(rc == -EPIPE || rc == -ECONNRESET);
	close(sv[0]);
}

/* Two record states keyed from one secret per direction, as after a handshake. */
static void pair(struct fx_tls **a, struct fx_tls **b, uint8_t hash)
{
	uint8_t s1[48], s2[48];

	memset(s1, 0x11, sizeof(s1));
	memset(s2, 0x22, sizeof(s2));
	*a = fx_tls_alloc();
	*b = fx_tls_alloc();
	CHECK(*a && *b);
	CHECK_EQ(fx_tls_dir_init(&(*a)->tx, hash, s1), 0);
	CHECK_EQ(fx_tls_dir_init(&(*b)->rx, hash, s1), 0);
	CHECK_EQ(fx_tls_dir_init(&(*b)->tx, hash, s2), 0);
	CHECK_EQ(fx_tls_dir_init(&(*a)->rx, hash, s2), 0);
}

static int seal(struct fx_tls *a, uint8_t type, const void *data, size_t len, uint8_t *rec)
{
	struct iovec v = {(void *)data, len};
	int n = fx_tls_record_seal(a, type, &v, 1, len);

	CHECK(n > 0);
	memcpy(rec, a->out, (size_t)n);
	return n;
}

static void test_records(void)
{
	static uint8_t rec[FX_TLS_HEADER + FX_TLS_MAX_CIPHERTEXT + 64];
	static uint8_t big[FX_TLS_MAX_PLAINTEXT];
	struct fx_tls *a, *b;
	int n;

	for (uint8_t hash = 1; hash <= 2; hash++) {
		pair(&a, &b, hash);
		/* a full record */
		memset(big, 0x5a, sizeof(big));
		n = seal(a, 23, big, sizeof(big), rec);
		CHECK_EQ(n, FX_TLS_HEADER + FX_TLS_MAX_PLAINTEXT + 1 + FX_TLS_TAG);
		CHECK_EQ(fx_tls_record_in(b, rec, (size_t)n), FX_TLS_MAX_PLAINTEXT);
		CHECK(memcmp(b->plain, big, sizeof(big)) == 0);
		b->plain_pos = b->plain_len;
		/* a ticket is dropped, then data still flows */
		static const uint8_t nst[] = {4, 0, 0, 4, 1, 2, 3, 4};

		n = seal(a, 22, nst, sizeof(nst), rec);
		CHECK_EQ(fx_tls_record_in(b, rec, (size_t)n), 0);
		n = seal(a, 23, "abc", 3, rec);
		CHECK_EQ(fx_tls_record_in(b, rec, (size_t)n), 3);
		CHECK(memcmp(b->plain + b->plain_pos, "abc", 3) == 0);
		/* a KeyUpdate that asks nothing: both ends move on */
		static const uint8_t ku0[] = {24, 0, 0, 1, 0};

		n = seal(a, 22, ku0, sizeof(ku0), rec);
		CHECK_EQ(fx_tls_record_in(b, rec, (size_t)n), 0);
		uint8_t next[48];
		size_t sl = hash == 2 ? 48 : 32;

		CHECK_EQ(fx_tls_expand_label(hash, a->tx.secret, sl, "traffic upd", NULL, 0, next,
					     sl),
			 0);
		CHECK_EQ(fx_tls_dir_init(&a->tx, hash, next), 0);
		n = seal(a, 23, "def", 3, rec);
		CHECK_EQ(fx_tls_record_in(b, rec, (size_t)n), 3);
		/* a bad tag, and a flipped ciphertext bit */
		n = seal(a, 23, "ghi", 3, rec);
		rec[n - 1] ^= 1;
		CHECK_EQ(fx_tls_record_in(b, rec, (size_t)n), -EBADMSG);
		fx_tls_free(a);
		fx_tls_free(b);

		pair(&a, &b, hash);
		n = seal(a, 23, "ghi", 3, rec);
		rec[FX_TLS_HEADER] ^= 0x80;
		CHECK_EQ(fx_tls_record_in(b, rec, (size_t)n), -EBADMSG);
		fx_tls_free(a);
		fx_tls_free(b);

		/* a KeyUpdate asking for ours, an alert, close_notify, unknown types */
		static const struct {
			uint8_t type;
			uint8_t data[8];
			size_t len;
			int want;
			const char *why;
		} bad[] = {
			{22, {24, 0, 0, 1, 1}, 5, -EPROTO, "asked for a key update"},
			{22, {24, 0, 0, 1, 0, 23}, 6, -EPROTO, "data after a TLS KeyUpdate"},
			{22, {4, 0, 0, 9, 1}, 5, -EPROTO, "split across records"},
			{22, {1, 0, 0, 0}, 4, -EPROTO, "after the handshake"},
			{21, {2, 40}, 2, -EPROTO, "alert"},
			{21, {1, 0}, 2, -ECONNRESET, "close_notify"},
			{20, {1}, 1, -EPROTO, "unknown content type"},
		};
		for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
			pair(&a, &b, hash);
			n = seal(a, bad[i].type, bad[i].data, bad[i].len, rec);
			CHECK_EQ(fx_tls_record_in(b, rec, (size_t)n), bad[i].want);
			if (!strstr(fx_tls_why(b), bad[i].why))
				fprintf(stderr, "case %zu: %s\n", i, fx_tls_why(b));
			CHECK(strstr(fx_tls_why(b), bad[i].why));
			fx_tls_free(a);
			fx_tls_free(b);
		}
	}

	/* headers a record may not have: read from a socket, refused before the body */
	static const uint8_t hdrs[][5] = {
		{23, 3, 3, 0x41, 0x01}, /* 2^14 + 257: over the limit */
		{23, 3, 3, 0, 16},      /* shorter than a tag and a type */
		{22, 3, 1, 0, 10},      /* a clear handshake record */
		{21, 3, 3, 0, 2},       /* a clear alert */
		{23, 3, 1, 0, 40},      /* a bad version */
	};
	for (size_t i = 0; i < sizeof(hdrs) / sizeof(hdrs[0]); i++) {
		int sv[2];
		uint8_t x;

		pair(&a, &b, 1);
		CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
		CHECK_EQ(write(sv[0], hdrs[i], 5), 5);
		CHECK_EQ(fx_tls_recv_full(b, sv[1], &x, 1, fx_tcp_now_ms() + 1000, -1), -EPROTO);
		close(sv[0]);
		close(sv[1]);
		fx_tls_free(a);
		fx_tls_free(b);
	}

	/* a peer that stops mid-record, and one that goes silent */
	{
		int sv[2];
		uint8_t x;

		pair(&a, &b, 1);
		n = seal(a, 23, "hello", 5, rec);
		CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
		CHECK_EQ(write(sv[0], rec, (size_t)n - 3), n - 3);
		CHECK_EQ(fx_tls_recv_full(b, sv[1], &x, 1, fx_tcp_now_ms() + 200, -1), -ETIMEDOUT);
		fx_tls_free(a);
		fx_tls_free(b);
		close(sv[0]);
		close(sv[1]);
		/* the same record split in two writes arrives whole */
		CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
		pair(&a, &b, 1);
		n = seal(a, 23, "hello", 5, rec);
		CHECK_EQ(write(sv[0], rec, 3), 3);
		CHECK_EQ(write(sv[0], rec + 3, (size_t)n - 3), n - 3);
		char got[5];

		CHECK_EQ(fx_tls_recv_full(b, sv[1], got, 5, fx_tcp_now_ms() + 1000, -1), 0);
		CHECK(memcmp(got, "hello", 5) == 0);
		/* then half a record and a close */
		n = seal(a, 23, "world", 5, rec);
		CHECK_EQ(write(sv[0], rec, 8), 8);
		close(sv[0]);
		CHECK_EQ(fx_tls_recv_full(b, sv[1], got, 5, fx_tcp_now_ms() + 1000, -1),
			 -ECONNRESET);
		CHECK(strstr(fx_tls_why(b), "mid-record"));
		close(sv[1]);
		fx_tls_free(a);
		fx_tls_free(b);
	}
}

/* fx_tls_seal_in_place: the same record as fx_tls_seal_to from the same
 * plaintext, opened byte-exact by the peer, sizes 0 to 2^14; over 2^14
 * refused. */
static void test_seal_in_place(void)
{
	static uint8_t rec[FX_TLS_HEADER + FX_TLS_MAX_PLAINTEXT + 1 + FX_TLS_TAG];
	static uint8_t ref[sizeof(rec)], data[FX_TLS_MAX_PLAINTEXT];
	static const size_t sizes[] = {
		0, 1, 15, 16, 17, 4096, FX_TLS_MAX_PLAINTEXT - 1, FX_TLS_MAX_PLAINTEXT};
	struct fx_tls *a, *b, *a2, *b2;

	for (size_t i = 0; i < sizeof(data); i++)
		data[i] = (uint8_t)(i * 7 + 3);
	for (uint8_t hash = 1; hash <= 2; hash++) {
		pair(&a, &b, hash);
		pair(&a2, &b2, hash);
		for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
			size_t len = sizes[i];
			struct iovec v = {data, len};
			int n, m;

			memcpy(rec + FX_TLS_HEADER, data, len);
			n = fx_tls_seal_in_place(a, rec, len);
			CHECK_EQ(n, (int)(FX_TLS_HEADER + len + 1 + FX_TLS_TAG));
			m = fx_tls_seal_to(a2, ref, FX_TLS_CT_APPDATA, &v, 1, len);
			CHECK_EQ(m, n);
			CHECK(memcmp(rec, ref, (size_t)n) == 0);
			b->plain_pos = b->plain_len;
			CHECK_EQ(fx_tls_record_in(b, rec, (size_t)n), (int)len);
			CHECK(memcmp(b->plain + b->plain_pos, data, len) == 0);
		}
		CHECK_EQ(fx_tls_seal_in_place(a, rec, FX_TLS_MAX_PLAINTEXT + 1), -EINVAL);
		fx_tls_free(a);
		fx_tls_free(b);
		fx_tls_free(a2);
		fx_tls_free(b2);
	}
}

int main(void)
{
	test_records();
	test_seal_in_place();
	test_session(K32, 0, 3 << 20);
	test_session(K32, 1, 100000);
	test_session(K48, 0, 1 << 20);
	test_session(K48, 1, 5);
	/* wrong key: the server finds the identity, the binder does not verify */
	test_refused(K32, KOTHER, -EACCES, "wrong key", -EACCES, "does not match ours");
	/* a host the target has no key for */
	test_refused(K32, NULL, -EACCES, "no TLS PSK for our identity", -EACCES,
		     "no TLS key for this host");
	/* a SHA-384 identity where the target keeps a SHA-256 key */
	test_refused(K48, K32, -EACCES, "no TLS PSK", -EACCES, "no TLS key");
	test_clear_text_peers();
	printf("test_tls: ok\n");
	return 0;
}
