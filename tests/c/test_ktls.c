/*
 * The secure channel on the kernel's record layer (csrc/nvme_tcp/ktls.c):
 * our TLS 1.3 PSK client hands its keys to the kernel after the handshake,
 * over a real loopback TCP connection (kTLS takes TCP sockets only), and
 * our server on the userspace record layer sends it what a peer may send
 * after the handshake: data both ways, a NewSessionTicket (dropped), a
 * KeyUpdate (followed where the kernel can take a new key, else a clear
 * error), an alert, close_notify, a record with a bad tag.
 *
 * Where the kernel has no tls ULP (this build machine), fx_ktls_start says
 * so (-ENOPROTOOPT) and the channel goes on in userspace: checked too.  The
 * lab guest runs the rest (tests/guest/test_ktls.py runs this binary).
 * Prints "ktls: kernel" or "ktls: userspace" for the caller to check.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "check.h"
#include "nvme_tcp/ktls.h"
#include "nvme_tcp/sock.h"
#include "nvme_tcp/tls.h"

#define HOST "nqn.2014-08.org.nvmexpress:uuid:host-1"
#define SUBSYS "nqn.2024-01.io.fx100io:ktls"
#define K32 "NVMeTLSkey-1:01:VRLbtnN9AQb2WXW3c9+wEf/DRLz0QuLdbYvEhwtdWwNf9LrZ:"
#define K48                                                                                       \
	"NVMeTLSkey-1:02:VRLbtnN9AQb2WXW3c9+wEf/DRLz0QuLdbYvEhwtdWwP/w0S89ELi3W2LxIcLXVsDn8kXZQ=" \
	"=:"

/* what the server does after the handshake */
enum act { ECHO, TICKET, KEY_UPDATE, ALERT, CLOSE_NOTIFY, BAD_TAG, EMPTY_ALERT, EMPTY_HANDSHAKE };

struct srv {
	int fd;
	const char *key;
	enum act act;
	int rc;
	struct fx_tls *t;
};

static int lookup(void *arg, const struct fx_tls_identity *id, struct fx_tls_psk *psk,
		  const char **why)
{
	struct srv *s = arg;
	struct fx_tls_key k;

	(void)why;
	CHECK_EQ(fx_tls_key_parse(s->key, &k, NULL), 0);
	CHECK_EQ(fx_tls_psk_derive(&k, id->hostnqn, SUBSYS, id->version, FX_TLS_KDF_RFC, psk), 0);
	fx_tls_key_wipe(&k);
	return 0;
}

/* One record of type (inner) with len bytes, sealed by our layer, sent raw. */
static void send_record(struct srv *s, uint8_t type, const void *data, size_t len, int flip)
{
	static uint8_t rec[FX_TLS_HEADER + FX_TLS_MAX_PLAINTEXT + 1 + FX_TLS_TAG];
	struct iovec v = {(void *)data, len};
	int n = fx_tls_seal_to(s->t, rec, type, &v, 1, len);

	CHECK(n > 0);
	if (flip)
		rec[FX_TLS_HEADER + 2] ^= 1;
	v.iov_base = rec;
	v.iov_len = (size_t)n;
	CHECK_EQ(fx_tcp_sendv(s->fd, &v, 1, 0, fx_tcp_now_ms() + 5000, -1, NULL), 0);
}

static void *server(void *arg)
{
	struct srv *s = arg;
	int64_t dl = fx_tcp_now_ms() + 5000;
	uint8_t buf[64];

	s->rc = fx_tls_server(s->fd, lookup, NULL, s, dl, -1, &s->t, NULL, NULL);
	if (s->rc)
		return NULL;
	/* the client's first bytes, sealed by the kernel (or by us) */
	s->rc = fx_tls_recv_full(s->t, s->fd, buf, 5, dl, -1);
	if (s->rc || memcmp(buf, "hello", 5) != 0) {
		s->rc = s->rc ? s->rc : -EBADMSG;
		return NULL;
	}
	switch (s->act) {
	case ECHO:
		send_record(s, FX_TLS_CT_APPDATA, "world", 5, 0);
		break;
	case TICKET: {
		/* a NewSessionTicket (SPDK's target sends one), then data */
		static const uint8_t nst[] = {4, 0, 0, 14, 0, 0, 0, 60, 1,
					      2, 3, 4, 0,  0, 1, 9, 0,  0};

		send_record(s, 22, nst, sizeof(nst), 0);
		send_record(s, FX_TLS_CT_APPDATA, "world", 5, 0);
		break;
	}
	case KEY_UPDATE: {
		static const uint8_t ku[] = {24, 0, 0, 1, 0};

		send_record(s, 22, ku, sizeof(ku), 0);
		CHECK_EQ(fx_tls_secret_next(s->t->tx.hash, s->t->tx.secret), 0);
		CHECK_EQ(fx_tls_dir_init(&s->t->tx, s->t->tx.hash, s->t->tx.secret), 0);
		send_record(s, FX_TLS_CT_APPDATA, "world", 5, 0);
		break;
	}
	case ALERT: {
		static const uint8_t al[] = {2, 40}; /* fatal handshake_failure */

		send_record(s, 21, al, sizeof(al), 0);
		break;
	}
	case CLOSE_NOTIFY:
		CHECK_EQ(fx_tls_close_notify(s->t, s->fd, dl), 0);
		break;
	case BAD_TAG:
		send_record(s, FX_TLS_CT_APPDATA, "world", 5, 1);
		break;
	case EMPTY_ALERT:
		send_record(s, 21, "", 0, 0);
		break;
	case EMPTY_HANDSHAKE:
		send_record(s, 22, "", 0, 0);
		break;
	}
	return NULL;
}

/* A connected loopback TCP pair. */
static void tcp_pair(int sv[2])
{
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	socklen_t al = sizeof(a);
	int l = socket(AF_INET, SOCK_STREAM, 0);

	CHECK(l >= 0);
	CHECK_EQ(bind(l, (struct sockaddr *)&a, sizeof(a)), 0);
	CHECK_EQ(listen(l, 1), 0);
	CHECK_EQ(getsockname(l, (struct sockaddr *)&a, &al), 0);
	sv[0] = socket(AF_INET, SOCK_STREAM, 0);
	CHECK(sv[0] >= 0);
	CHECK_EQ(connect(sv[0], (struct sockaddr *)&a, sizeof(a)), 0);
	sv[1] = accept(l, NULL, NULL);
	CHECK(sv[1] >= 0);
	close(l);
}

/* One session: handshake, the client on kTLS (when the kernel has it),
 * "hello" out, then what act makes the server send.  Returns what the
 * client's receive of 5 bytes gave (0 with "world" checked); *kernel says
 * whether kTLS took the channel. */
static int session(const char *key, enum act act, int *kernel, const char **why_out)
{
	int sv[2], rc;
	struct srv s = {0};
	pthread_t th;
	struct fx_tls_key k;
	struct fx_tls_psk p;
	struct fx_tls *t = NULL;
	struct fx_ktls *kt = NULL;
	const char *why = NULL;
	int64_t dl = fx_tcp_now_ms() + 5000;
	uint8_t in[5];

	tcp_pair(sv);
	s.fd = sv[1];
	s.key = key;
	s.act = act;
	CHECK_EQ(pthread_create(&th, NULL, server, &s), 0);
	CHECK_EQ(fx_tls_key_parse(key, &k, NULL), 0);
	CHECK_EQ(fx_tls_psk_derive(&k, HOST, SUBSYS, 0, FX_TLS_KDF_RFC, &p), 0);
	fx_tls_key_wipe(&k);
	CHECK_EQ(fx_tls_client(sv[0], &p, dl, -1, &t, &why), 0);
	fx_tls_psk_wipe(&p);
	rc = fx_ktls_start(sv[0], t, &kt, &why);
	if (rc == -ENOPROTOOPT) {
		/* the socket is as it was: our layer carries on */
		CHECK(why && why[0]);
		*kernel = 0;
		struct iovec v = {"hello", 5};

		CHECK_EQ(fx_tls_sendv(t, sv[0], &v, 1, dl, -1), 0);
		rc = fx_tls_recv_full(t, sv[0], in, 5, dl, -1);
		*why_out = fx_tls_why(t);
	} else {
		CHECK_EQ(rc, 0);
		*kernel = 1;
		fx_tls_free(t);
		t = NULL;
		/* clear bytes on the socket: the kernel seals them */
		struct iovec v = {"hello", 5};

		CHECK_EQ(fx_tcp_sendv(sv[0], &v, 1, MSG_DONTWAIT, dl, -1, NULL), 0);
		rc = fx_ktls_recv_full(kt, sv[0], in, 5, dl, -1);
		*why_out = fx_ktls_why(kt);
		/* the review's case: the peer's close_notify, then a send that
		 * fails with EBADMSG (6.12's word for a broken pipe) is a
		 * broken connection, no tampering */
		if (act == CLOSE_NOTIFY) {
			CHECK_EQ(fx_ktls_send_error(kt, -EBADMSG), -ECONNRESET);
			CHECK(!strstr(fx_ktls_send_why(kt), "integrity"));
		}
	}
	if (rc == 0)
		CHECK(memcmp(in, "world", 5) == 0);
	CHECK_EQ(pthread_join(th, NULL), 0);
	CHECK_EQ(s.rc, 0);
	fx_tls_free(s.t);
	fx_tls_free(t);
	fx_ktls_free(kt);
	close(sv[0]);
	close(sv[1]);
	return rc;
}

int main(void)
{
	int kernel = 0, k2;
	const char *why = "";

	CHECK_EQ(session(K32, ECHO, &kernel, &why), 0);
	CHECK_EQ(session(K48, ECHO, &k2, &why), 0);
	CHECK_EQ(k2, kernel);
	printf("ktls: %s\n", kernel ? "kernel" : "userspace");
	CHECK_EQ(session(K32, TICKET, &k2, &why), 0);
	/* close_notify ends the stream; an alert is a protocol error; a bad
	 * tag fails as on our layer */
	CHECK_EQ(session(K32, CLOSE_NOTIFY, &k2, &why), -ECONNRESET);
	CHECK(strstr(why, "close_notify"));
	CHECK_EQ(session(K32, ALERT, &k2, &why), -EPROTO);
	CHECK(strstr(why, "alert"));
	CHECK_EQ(session(K48, BAD_TAG, &k2, &why), -EBADMSG);
	CHECK(strstr(why, "integrity"));
	/* an empty alert or handshake record is a protocol error on both
	 * layers (the kernel's recvmsg returns 0 for it: not the end) */
	CHECK_EQ(session(K32, EMPTY_ALERT, &k2, &why), -EPROTO);
	CHECK(strstr(why, "a malformed TLS alert"));
	CHECK_EQ(session(K32, EMPTY_HANDSHAKE, &k2, &why), -EPROTO);
	CHECK(strstr(why, "an empty TLS handshake record"));
	/* a send on a socket whose receive the kernel aborted: that receive's
	 * error, explained as it is there */
	{
		struct fx_ktls *kk = calloc(1, sizeof(*kk));

		CHECK(kk);
		CHECK_EQ(fx_ktls_send_error(kk, -EPIPE), -EPIPE);
		CHECK(!fx_ktls_why(kk)[0]);
		/* no receive failed first: a broken connection, no tampering
		 * claimed (kernels before 6.13 say EBADMSG for any TCP error) */
		CHECK_EQ(fx_ktls_send_error(kk, -EBADMSG), -ECONNRESET);
		CHECK(strstr(fx_ktls_send_why(kk), "connection is broken"));
		/* (the send's reason is its own: the receive side's stays empty) */
		CHECK(!fx_ktls_why(kk)[0]);
		free(kk);
		kk = calloc(1, sizeof(*kk));
		CHECK(kk);
		CHECK_EQ(fx_ktls_recv_error(kk, -EMSGSIZE), -EPROTO);
		/* the socket aborted with the receive's error: any send after
		 * says that one, whichever code it came back with */
		CHECK_EQ(fx_ktls_send_error(kk, -EMSGSIZE), -EPROTO);
		CHECK(strstr(fx_ktls_send_why(kk), "size TLS 1.3 forbids"));
		CHECK_EQ(fx_ktls_send_error(kk, -EBADMSG), -EPROTO);
		CHECK(strstr(fx_ktls_send_why(kk), "size TLS 1.3 forbids"));
		CHECK(!strstr(fx_ktls_send_why(kk), "integrity"));
		free(kk);
		kk = calloc(1, sizeof(*kk));
		CHECK(kk);
		CHECK_EQ(fx_ktls_recv_error(kk, -EBADMSG), -EBADMSG);
		CHECK_EQ(fx_ktls_send_error(kk, -EBADMSG), -EBADMSG);
		CHECK(strstr(fx_ktls_send_why(kk), "integrity"));
		free(kk);
		/* a receive that ended for a reason other than a refused record
		 * (here the kernel's -EKEYEXPIRED; the same for close_notify or
		 * an alert, which set only the receive's reason): a later send's
		 * EBADMSG (what 6.12 says for a plain broken pipe) claims no
		 * tampering, and a later socket error on receive stays itself */
		kk = calloc(1, sizeof(*kk));
		CHECK(kk);
		CHECK_EQ(fx_ktls_recv_error(kk, -EKEYEXPIRED), -EPROTO);
		CHECK(fx_ktls_why(kk)[0]);
		CHECK_EQ(fx_ktls_send_error(kk, -EBADMSG), -ECONNRESET);
		CHECK(strstr(fx_ktls_send_why(kk), "connection is broken"));
		CHECK(!strstr(fx_ktls_send_why(kk), "integrity"));
		CHECK_EQ(fx_ktls_recv_error(kk, -ETIMEDOUT), -ETIMEDOUT);
		free(kk);
		/* a bad header (EINVAL) is a refusal too, but the kernel's send
		 * on that socket does not say it: no tampering claimed either */
		kk = calloc(1, sizeof(*kk));
		CHECK(kk);
		CHECK_EQ(fx_ktls_recv_error(kk, -EINVAL), -EPROTO);
		CHECK_EQ(fx_ktls_send_error(kk, -EBADMSG), -ECONNRESET);
		CHECK(!strstr(fx_ktls_send_why(kk), "integrity"));
		free(kk);
	}
	/* a KeyUpdate: followed by our layer; by the kernel's where it takes
	 * a new receive key (Linux 6.14), else a clear error, never the next
	 * record opened with the old key */
	int rc = session(K32, KEY_UPDATE, &k2, &why);

	if (!kernel || rc == 0) {
		CHECK_EQ(rc, 0);
		printf("key update: followed\n");
	} else {
		CHECK_EQ(rc, -EPROTO);
		CHECK(strstr(why, "cannot take a new one"));
		printf("key update: refused: %s\n", why);
	}
	printf("test_ktls: ok\n");
	return 0;
}
