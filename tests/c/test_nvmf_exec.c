/*
 * transport/tcp_ctrl.c's handling of what a controller sends, against a
 * scripted peer: the things the Linux target in the fabric lab (test_fabric)
 * never does on purpose.  Malformed or out-of-range PDUs must fail with -EPROTO without a
 * byte written outside the caller's buffer, a TermReq must end the command
 * with a clear errno, digests must be checked, deadlines must hold, and
 * ICResp/Connect answers must map to the documented errnos.
 *
 * fx_tcp_exec runs over a socketpair; fx_tcp_connect over TCP on
 * 127.0.0.1 (no other network).  Every fx_tcp_exec case runs a second time
 * inside a TLS secure channel (nvme_tcp/tls.c, the peer its server side),
 * and fx_tcp_connect is tried with TLS against a TLS controller, one with
 * another key and one without TLS.
 */
#include "transport/tcp_ctrl.h"
#include "host/ana.h"
#include "nvme_tcp/pdu.h"
#include "nvme_tcp/sock.h"
#include "nvme_tcp/tls.h"
#include "nvme_tcp/xfer.h"
#include "check.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "fx100io.h"

#define GUARD 64
#define GUARD_BYTE 0xa5

struct peer {
	int fd;
	int hdgst, ddgst;
	/* the command the host sent */
	struct nvme_sqe sqe;
	uint8_t incap[65536];
	uint32_t incap_len;
	/* what the host sent after the peer's script ended */
	int term_fes; /* -1: no H2CTermReq seen */
	/* per-case knobs */
	uint32_t len;
	const uint8_t *expect; /* write data the host should send */
	int ok;
	struct fx_tls *tls; /* the secure channel's server side, when on */
};

/* the secure channel: on for the second pass of the exec cases */
static int use_tls;
#define TLS_HOST "nqn.2014-08.io.fx100:test-host"
#define TLS_SUB "nqn.2014-08.io.fx100:test-sub"
#define TLS_KEY "NVMeTLSkey-1:01:VRLbtnN9AQb2WXW3c9+wEf/DRLz0QuLdbYvEhwtdWwNf9LrZ:"
#define TLS_KEY2 "NVMeTLSkey-1:01:MDAxMTIyMzM0NDU1NjY3Nzg4OTlhYWJiY2NkZGVlZmZwJEiQ:"

/* The scripted controller's key table: TLS_KEY for TLS_HOST (arg: the key
 * text it holds). */
static int tls_lookup(void *arg, const struct fx_tls_identity *id, struct fx_tls_psk *psk,
		      const char **why)
{
	struct fx_tls_key k;

	if (strcmp(id->hostnqn, TLS_HOST) != 0 || strcmp(id->subnqn, TLS_SUB) != 0) {
		*why = "unknown host";
		return -EACCES;
	}
	CHECK_EQ(fx_tls_key_parse(arg, &k, NULL), 0);
	CHECK_EQ(fx_tls_psk_derive(&k, id->hostnqn, id->subnqn, id->version, FX_TLS_KDF_RFC, psk),
		 0);
	return 0;
}

static int peer_tls_accept(struct peer *p, const char *key)
{
	const char *why = NULL;

	return fx_tls_server(p->fd, tls_lookup, NULL, (void *)key, fx_tcp_now_ms() + 5000, -1,
			     &p->tls, NULL, &why);
}

typedef void (*script_fn)(struct peer *p);

static void p_send(struct peer *p, const void *b, size_t n)
{
	const uint8_t *q = b;

	if (p->tls) {
		struct iovec v = {(void *)b, n};

		/* the host went away: the case checks the result */
		(void)fx_tls_sendv(p->tls, p->fd, &v, 1, fx_tcp_now_ms() + 10000, -1);
		return;
	}

	while (n) {
		ssize_t k = send(p->fd, q, n, MSG_NOSIGNAL);

		if (k <= 0)
			return; /* host went away: the case checks the result */
		q += k;
		n -= (size_t)k;
	}
}

static int p_recv(struct peer *p, void *b, size_t n)
{
	uint8_t *q = b;

	if (p->tls)
		return fx_tls_recv_full(p->tls, p->fd, b, n, fx_tcp_now_ms() + 10000, -1) ? -1 : 0;

	while (n) {
		ssize_t k = recv(p->fd, q, n, 0);

		if (k <= 0)
			return -1;
		q += k;
		n -= (size_t)k;
	}
	return 0;
}

/* Send a PDU whose type-specific header fields are already in hdr; the
 * common header is (re)built here unless raw.  corrupt: 1 header digest,
 * 2 data digest. */
static void p_pdu(struct peer *p, void *hdr, uint8_t type, const void *data, uint32_t dlen,
		  uint8_t extra_flags, int corrupt)
{
	struct nvme_tcp_hdr *h = hdr;
	unsigned hlen = fx_tcp_pdu_hlen(type);
	unsigned pdo = fx_tcp_hdr_init(h, type, dlen, p->hdgst, p->ddgst, 0);
	uint8_t out[256];
	unsigned n = 0;

	h->flags |= extra_flags;
	memcpy(out, hdr, hlen);
	n = hlen;
	if (h->flags & NVME_TCP_F_HDGST) {
		uint32_t d = fx_tcp_hdgst(hdr, hlen) ^ (corrupt == 1 ? 1u : 0u);

		memcpy(out + n, &d, 4);
		n += 4;
	}
	if (dlen)
		while (n < pdo)
			out[n++] = 0;
	p_send(p, out, n);
	if (dlen) {
		p_send(p, data, dlen);
		if (h->flags & NVME_TCP_F_DDGST) {
			uint32_t d = fx_crc32c(0, data, dlen) ^ (corrupt == 2 ? 1u : 0u);

			p_send(p, &d, 4);
		}
	}
}

/* Receive one host PDU: header bytes into hdr, data into data.  Returns the
 * data length, or -1 at EOF. */
static int p_recv_pdu(struct peer *p, uint8_t *hdr, uint8_t *data, uint32_t max)
{
	static uint8_t tmp[1 << 20];
	struct nvme_tcp_hdr *h = (void *)hdr;

	if (p_recv(p, hdr, 8))
		return -1;
	CHECK(h->plen >= 8 && h->plen - 8 <= sizeof(tmp));
	if (p_recv(p, tmp, h->plen - 8))
		return -1;
	memcpy(hdr + 8, tmp, h->hlen - 8u);
	if (h->type == NVME_TCP_H2C_TERM)
		return 0;
	unsigned hd = (h->flags & NVME_TCP_F_HDGST) ? 4 : 0;
	unsigned dd = (h->flags & NVME_TCP_F_DDGST) ? 4 : 0;

	if (hd) {
		uint32_t got;

		memcpy(&got, tmp + h->hlen - 8, 4);
		CHECK_EQ(got, fx_tcp_hdgst(hdr, h->hlen));
	}
	if (h->plen == h->hlen + hd)
		return 0;
	uint32_t dl = h->plen - h->pdo - dd;

	CHECK(dl <= max);
	memcpy(data, tmp + h->pdo - 8, dl);
	if (dd) {
		uint32_t got;

		memcpy(&got, tmp + h->pdo - 8 + dl, 4);
		CHECK_EQ(got, fx_crc32c(0, data, dl));
	}
	return (int)dl;
}

static void p_rsp(struct peer *p, uint16_t cid, uint16_t sf, uint32_t dw0)
{
	uint8_t pdu[24];
	struct nvme_cqe cqe;

	memset(pdu, 0, sizeof(pdu));
	memset(&cqe, 0, sizeof(cqe));
	cqe.cid = cid;
	cqe.status = (uint16_t)(sf << 1);
	cqe.dw0 = dw0;
	memcpy(pdu + 8, &cqe, sizeof(cqe));
	p_pdu(p, pdu, NVME_TCP_RSP, NULL, 0, 0, 0);
}

static void p_c2h(struct peer *p, uint16_t cccid, uint32_t datao, const void *data, uint32_t datal,
		  uint8_t flags, int corrupt)
{
	struct nvme_tcp_data_pdu d;

	memset(&d, 0, sizeof(d));
	d.cccid = cccid;
	d.datao = datao;
	d.datal = datal;
	p_pdu(p, &d, NVME_TCP_C2H_DATA, data, datal, flags, corrupt);
}

static void p_r2t(struct peer *p, uint16_t cccid, uint16_t ttag, uint32_t r2to, uint32_t r2tl)
{
	struct nvme_tcp_r2t_pdu r;

	memset(&r, 0, sizeof(r));
	r.cccid = cccid;
	r.ttag = ttag;
	r.r2to = r2to;
	r.r2tl = r2tl;
	p_pdu(p, &r, NVME_TCP_R2T, NULL, 0, 0, 0);
}

static uint8_t pattern[1 << 20];

/* ------------------------------------------------------------ scripts */

static void s_read_ok(struct peer *p)
{
	uint32_t half = p->len / 2;

	p_c2h(p, p->sqe.cid, 0, pattern, half, 0, 0);
	p_c2h(p, p->sqe.cid, half, pattern + half, p->len - half, NVME_TCP_F_DATA_LAST, 0);
	p_rsp(p, p->sqe.cid, 0, 0);
}

static void s_read_success_flag(struct peer *p)
{
	p_c2h(p, p->sqe.cid, 0, pattern, p->len, NVME_TCP_F_DATA_LAST | NVME_TCP_F_DATA_SUCCESS, 0);
}

static void s_success_without_last(struct peer *p)
{
	p_c2h(p, p->sqe.cid, 0, pattern, p->len, NVME_TCP_F_DATA_SUCCESS, 0);
}

static void s_c2h_past_end(struct peer *p)
{
	p_c2h(p, p->sqe.cid, 0, pattern, p->len + 16, NVME_TCP_F_DATA_LAST, 0);
	p_rsp(p, p->sqe.cid, 0, 0);
}

static void s_c2h_offset_past_end(struct peer *p)
{
	p_c2h(p, p->sqe.cid, p->len - 8, pattern, 16, NVME_TCP_F_DATA_LAST, 0);
}

static void s_c2h_gap(struct peer *p)
{
	p_c2h(p, p->sqe.cid, 0, pattern, 512, 0, 0);
	p_c2h(p, p->sqe.cid, 1024, pattern, 512, NVME_TCP_F_DATA_LAST, 0);
}

static void s_c2h_wrong_cid(struct peer *p)
{
	p_c2h(p, (uint16_t)(p->sqe.cid + 1), 0, pattern, p->len, NVME_TCP_F_DATA_LAST, 0);
}

static void s_c2h_after_last(struct peer *p)
{
	p_c2h(p, p->sqe.cid, 0, pattern, 512, NVME_TCP_F_DATA_LAST, 0);
	p_c2h(p, p->sqe.cid, 512, pattern, 512, NVME_TCP_F_DATA_LAST, 0);
}

static void s_short_then_success(struct peer *p)
{
	p_c2h(p, p->sqe.cid, 0, pattern, p->len / 2, NVME_TCP_F_DATA_LAST, 0);
	p_rsp(p, p->sqe.cid, 0, 0);
}

static void s_rsp_wrong_cid(struct peer *p)
{
	p_rsp(p, (uint16_t)(p->sqe.cid ^ 0x100), 0, 0);
}

static void s_rsp_error(struct peer *p)
{
	p_rsp(p, p->sqe.cid, NVME_DNR | NVME_SC_LBA_RANGE, 0);
}

static void s_term_proto(struct peer *p)
{
	struct nvme_tcp_term_pdu t;
	uint8_t pdu[24 + 24];

	memset(&t, 0, sizeof(t));
	fx_tcp_hdr_init(&t.hdr, NVME_TCP_C2H_TERM, 0, 0, 0, 0);
	t.hdr.plen = sizeof(pdu);
	t.fes = NVME_TCP_FES_INVALID_PDU_HDR;
	t.feil = 3;
	memcpy(pdu, &t, sizeof(t));
	memset(pdu + 24, 0x11, 24);
	p_send(p, pdu, sizeof(pdu));
	shutdown(p->fd, SHUT_WR);
}

static void s_term_other(struct peer *p)
{
	struct nvme_tcp_term_pdu t;

	memset(&t, 0, sizeof(t));
	fx_tcp_hdr_init(&t.hdr, NVME_TCP_C2H_TERM, 0, 0, 0, 0);
	t.fes = 0x7f;
	p_send(p, &t, sizeof(t));
	shutdown(p->fd, SHUT_WR);
}

static void s_bad_hdgst(struct peer *p)
{
	p_c2h(p, p->sqe.cid, 0, pattern, p->len, NVME_TCP_F_DATA_LAST, 1);
}

static void s_bad_ddgst(struct peer *p)
{
	p_c2h(p, p->sqe.cid, 0, pattern, p->len, NVME_TCP_F_DATA_LAST, 2);
	p_rsp(p, p->sqe.cid, 0, 0);
}

static void s_icresp_midway(struct peer *p)
{
	struct nvme_tcp_icresp_pdu ic;

	memset(&ic, 0, sizeof(ic));
	fx_tcp_hdr_init(&ic.hdr, NVME_TCP_ICRESP, 0, 0, 0, 0);
	ic.maxdata = 65536;
	p_send(p, &ic, sizeof(ic));
}

static void s_huge_plen(struct peer *p)
{
	struct nvme_tcp_data_pdu d;

	memset(&d, 0, sizeof(d));
	fx_tcp_hdr_init(&d.hdr, NVME_TCP_C2H_DATA, 1, 0, 0, 0);
	d.hdr.plen = 0x7fffffff;
	d.cccid = p->sqe.cid;
	d.datal = 0x7fffffff - 24;
	p_send(p, &d, sizeof(d));
}

static void s_close_midway(struct peer *p)
{
	p_c2h(p, p->sqe.cid, 0, pattern, p->len / 2, 0, 0);
	shutdown(p->fd, SHUT_WR);
}

static void s_silent(struct peer *p)
{
	(void)p;
}

/* Write by R2T: the host must answer with H2CData covering exactly the
 * requested range, split at maxh2cdata, LAST on the final PDU. */
static void s_write_r2t(struct peer *p)
{
	uint8_t hdr[160];
	static uint8_t got[1 << 20];
	uint32_t off = 0;

	p_r2t(p, p->sqe.cid, 7, 0, p->len);
	p->ok = 1;
	while (off < p->len) {
		int n = p_recv_pdu(p, hdr, got + off, p->len - off);
		struct nvme_tcp_data_pdu *d = (void *)hdr;

		if (n <= 0 || d->hdr.type != NVME_TCP_H2C_DATA || d->cccid != p->sqe.cid ||
		    d->ttag != 7 || d->datao != off || d->datal != (uint32_t)n || n > 1000) {
			p->ok = 0;
			return;
		}
		off += (uint32_t)n;
		if (!!(d->hdr.flags & NVME_TCP_F_DATA_LAST) != (off == p->len)) {
			p->ok = 0;
			return;
		}
	}
	if (memcmp(got, p->expect, p->len))
		p->ok = 0;
	p_rsp(p, p->sqe.cid, 0, 0);
}

/* Two R2Ts for halves of the data, second half first. */
static void s_write_two_r2t(struct peer *p)
{
	uint8_t hdr[160];
	static uint8_t got[1 << 20];
	uint32_t half = p->len / 2;

	p->ok = 1;
	p_r2t(p, p->sqe.cid, 1, half, p->len - half);
	for (uint32_t off = half; off < p->len;) {
		int n = p_recv_pdu(p, hdr, got + off, p->len - off);

		if (n <= 0) {
			p->ok = 0;
			return;
		}
		off += (uint32_t)n;
	}
	p_r2t(p, p->sqe.cid, 2, 0, half);
	for (uint32_t off = 0; off < half;) {
		int n = p_recv_pdu(p, hdr, got + off, half - off);

		if (n <= 0) {
			p->ok = 0;
			return;
		}
		off += (uint32_t)n;
	}
	if (memcmp(got, p->expect, p->len))
		p->ok = 0;
	p_rsp(p, p->sqe.cid, 0, 0);
}

/* Two R2Ts for halves of the data, in order. */
static void s_write_two_r2t_in_order(struct peer *p)
{
	uint8_t hdr[160];
	static uint8_t got[1 << 20];
	uint32_t half = p->len / 2;

	p->ok = 1;
	p_r2t(p, p->sqe.cid, 1, 0, half);
	for (uint32_t off = 0; off < half;) {
		int n = p_recv_pdu(p, hdr, got + off, half - off);

		if (n <= 0) {
			p->ok = 0;
			return;
		}
		off += (uint32_t)n;
	}
	p_r2t(p, p->sqe.cid, 2, half, p->len - half);
	for (uint32_t off = half; off < p->len;) {
		int n = p_recv_pdu(p, hdr, got + off, p->len - off);

		if (n <= 0) {
			p->ok = 0;
			return;
		}
		off += (uint32_t)n;
	}
	if (memcmp(got, p->expect, p->len))
		p->ok = 0;
	p_rsp(p, p->sqe.cid, 0, 0);
}

/* Receive the H2CData answering an R2T of len bytes (content not checked). */
static int p_take_h2c(struct peer *p, uint32_t len)
{
	uint8_t hdr[160];
	static uint8_t sink[1 << 20];

	for (uint32_t off = 0; off < len;) {
		int n = p_recv_pdu(p, hdr, sink, sizeof(sink));

		if (n <= 0 || hdr[0] != NVME_TCP_H2C_DATA)
			return -1;
		off += (uint32_t)n;
	}
	return 0;
}

/* The whole range requested again once it was sent. */
static void s_r2t_repeat(struct peer *p)
{
	p_r2t(p, p->sqe.cid, 1, 0, p->len);
	if (p_take_h2c(p, p->len) == 0)
		p_r2t(p, p->sqe.cid, 2, 0, p->len);
	p_rsp(p, p->sqe.cid, 0, 0);
}

/* Many R2Ts for the same range (each answer costs a full resend). */
static void s_r2t_flood(struct peer *p)
{
	for (int i = 0; i < 200; i++)
		p_r2t(p, p->sqe.cid, (uint16_t)i, 0, p->len);
	p_rsp(p, p->sqe.cid, 0, 0);
}

/* Success after only half the data was requested. */
static void s_write_early_success(struct peer *p)
{
	p_r2t(p, p->sqe.cid, 1, 0, p->len / 2);
	if (p_take_h2c(p, p->len / 2) == 0)
		p_rsp(p, p->sqe.cid, 0, 0);
}

/* Success without asking for any of the data. */
static void s_write_success_no_r2t(struct peer *p)
{
	p_rsp(p, p->sqe.cid, 0, 0);
}

/* r2to + r2tl wraps a u32. */
static void s_r2t_wraps(struct peer *p)
{
	uint32_t half = p->len / 2;

	p_r2t(p, p->sqe.cid, 1, 0, half);
	if (p_take_h2c(p, half) == 0)
		p_r2t(p, p->sqe.cid, 2, half, 0xffffffffu - half + 16);
}

static void s_r2t_past_end(struct peer *p)
{
	p_r2t(p, p->sqe.cid, 1, p->len - 512, 1024);
}

static void s_r2t_zero(struct peer *p)
{
	p_r2t(p, p->sqe.cid, 1, 0, 0);
}

static void s_r2t_for_read(struct peer *p)
{
	p_r2t(p, p->sqe.cid, 1, 0, p->len);
}

static void s_incap_write(struct peer *p)
{
	p->ok = p->incap_len == p->len && !memcmp(p->incap, p->expect, p->len) &&
		p->sqe.dptr.type == NVME_SGL_DATA_BLOCK_OFFSET && p->sqe.dptr.length == p->len;
	p_rsp(p, p->sqe.cid, 0, 0);
}

static void s_incap_then_r2t(struct peer *p)
{
	p_r2t(p, p->sqe.cid, 1, 0, p->len);
}

/* ----------------------------------------------------------- harness */

struct run {
	struct peer p;
	script_fn fn;
};

static void *peer_main(void *arg)
{
	struct run *r = arg;
	struct peer *p = &r->p;
	uint8_t hdr[160];

	if (use_tls)
		CHECK_EQ(peer_tls_accept(p, TLS_KEY), 0);
	int n = p_recv_pdu(p, hdr, p->incap, sizeof(p->incap));

	if (n >= 0) {
		CHECK_EQ(hdr[0], NVME_TCP_CMD);
		memcpy(&p->sqe, hdr + 8, sizeof(p->sqe));
		p->incap_len = (uint32_t)n;
		r->fn(p);
	}
	/* Drain until the host closes, noting any H2CTermReq. */
	for (;;) {
		static uint8_t sink[1 << 20];

		n = p_recv_pdu(p, hdr, sink, sizeof(sink));
		if (n < 0)
			break;
		if (hdr[0] == NVME_TCP_H2C_TERM)
			p->term_fes = ((struct nvme_tcp_term_pdu *)hdr)->fes;
	}
	fx_tls_free(p->tls);
	p->tls = NULL;
	return NULL;
}

struct case_opts {
	int hdgst, ddgst, write;
	uint32_t len, incap_max, maxh2c;
	int timeout_ms;
};

static int run_case(const char *name, script_fn fn, struct case_opts o, uint8_t *buf,
		    struct nvme_cqe *cqe, int *term_fes, int *peer_ok)
{
	int sv[2];
	struct run r;
	pthread_t th;
	struct fx_tcp_conn c;
	struct nvme_sqe sqe;

	CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
	memset(&r, 0, sizeof(r));
	r.p.fd = sv[1];
	r.p.hdgst = o.hdgst;
	r.p.ddgst = o.ddgst;
	r.p.term_fes = -1;
	r.p.len = o.len;
	r.p.expect = pattern;
	r.fn = fn;
	memset(&c, 0, sizeof(c));
	c.fd = sv[0];
	c.hdgst = o.hdgst;
	c.ddgst = o.ddgst;
	c.qid = 1;
	c.next_cid = 0x2a;
	c.maxh2cdata = o.maxh2c ? o.maxh2c : 1 << 20;
	c.timeout_ms = o.timeout_ms ? o.timeout_ms : 3000;
	c.incap_max = o.incap_max;
	memset(&sqe, 0, sizeof(sqe));
	sqe.opcode = o.write ? NVME_CMD_WRITE : NVME_CMD_READ;
	sqe.nsid = 1;

	CHECK_EQ(pthread_create(&th, NULL, peer_main, &r), 0);
	if (use_tls) {
		struct fx_tls_key k;
		struct fx_tls_psk psk;
		const char *why = NULL;

		CHECK_EQ(fx_tls_key_parse(TLS_KEY, &k, NULL), 0);
		CHECK_EQ(fx_tls_psk_derive(&k, TLS_HOST, TLS_SUB, 0, FX_TLS_KDF_RFC, &psk), 0);
		CHECK_EQ(fx_tls_client(c.fd, &psk, fx_tcp_now_ms() + 5000, -1, &c.tls, &why), 0);
	}
	if (o.write)
		memcpy(buf, pattern, o.len);
	int ret = fx_tcp_exec(&c, &sqe, buf, o.len, o.write, cqe);

	/* a second command on a connection that failed must fail too */
	if (ret == -EPROTO || ret == -ECONNRESET || ret == -ETIMEDOUT) {
		struct nvme_sqe s2;
		struct nvme_cqe c2;

		memset(&s2, 0, sizeof(s2));
		s2.opcode = NVME_ADMIN_KEEP_ALIVE;
		CHECK(fx_tcp_exec(&c, &s2, NULL, 0, 0, &c2) < 0);
	}
	fx_tcp_conn_close(&c);
	pthread_join(th, NULL);
	close(sv[1]);
	if (term_fes)
		*term_fes = r.p.term_fes;
	if (peer_ok)
		*peer_ok = r.p.ok;
	printf("  %-36s -> %d (%s)%s\n", name, ret, ret ? strerror(-ret) : "ok",
	       r.p.term_fes >= 0 ? " [H2CTermReq sent]" : "");
	return ret;
}

static void guard_ok(const uint8_t *buf, uint32_t len)
{
	for (uint32_t i = 0; i < GUARD; i++)
		CHECK_EQ(buf[len + i], GUARD_BYTE);
}

static void test_exec(void)
{
	static uint8_t buf[(1 << 20) + GUARD];
	struct nvme_cqe cqe;
	int fes, ok;
	const uint32_t L = 4096;
	struct case_opts rd = {.len = L};
	struct case_opts wr = {.len = 3000, .write = 1, .maxh2c = 1000};

	printf("fx_tcp_exec against a scripted controller:\n");
#define FRESH() memset(buf, GUARD_BYTE, sizeof(buf))

	for (int hd = 0; hd <= 1; hd++)
		for (int dd = 0; dd <= 1; dd++) {
			struct case_opts o = rd;

			o.hdgst = hd;
			o.ddgst = dd;
			FRESH();
			CHECK_EQ(run_case("read, two C2HData + CapsuleResp", s_read_ok, o, buf,
					  &cqe, NULL, NULL),
				 0);
			CHECK(memcmp(buf, pattern, L) == 0);
			guard_ok(buf, L);
			CHECK_EQ(cqe.cid, 0x2a);

			o = wr;
			o.hdgst = hd;
			o.ddgst = dd;
			FRESH();
			CHECK_EQ(run_case("write, R2T, 3 H2CData", s_write_r2t, o, buf, &cqe, NULL,
					  &ok),
				 0);
			CHECK(ok);
		}

	FRESH();
	CHECK_EQ(run_case("read, C2HData SUCCESS, no resp", s_read_success_flag, rd, buf, &cqe,
			  NULL, NULL),
		 0);
	CHECK(memcmp(buf, pattern, L) == 0);
	CHECK_EQ(cqe.cid, 0x2a);
	CHECK_EQ(cqe.status, 0);

	FRESH();
	CHECK_EQ(
		run_case("SUCCESS without LAST", s_success_without_last, rd, buf, &cqe, NULL, NULL),
		-EPROTO);

	FRESH();
	CHECK_EQ(run_case("C2HData longer than the buffer", s_c2h_past_end, rd, buf, &cqe, &fes,
			  NULL),
		 -EPROTO);
	guard_ok(buf, L);
	CHECK_EQ(fes, NVME_TCP_FES_DATA_OUT_OF_RANGE);

	FRESH();
	CHECK_EQ(run_case("C2HData offset past the end", s_c2h_offset_past_end, rd, buf, &cqe, &fes,
			  NULL),
		 -EPROTO);
	guard_ok(buf, L);
	for (uint32_t i = 0; i < L; i++)
		CHECK_EQ(buf[i], GUARD_BYTE); /* nothing landed at all */

	FRESH();
	CHECK_EQ(run_case("C2HData with a gap", s_c2h_gap, rd, buf, &cqe, NULL, NULL), -EPROTO);
	FRESH();
	CHECK_EQ(
		run_case("C2HData for another command", s_c2h_wrong_cid, rd, buf, &cqe, &fes, NULL),
		-EPROTO);
	CHECK_EQ(fes, NVME_TCP_FES_PDU_SEQ_ERR);
	FRESH();
	CHECK_EQ(run_case("C2HData after LAST_PDU", s_c2h_after_last, rd, buf, &cqe, NULL, NULL),
		 -EPROTO);
	FRESH();
	CHECK_EQ(run_case("success after half the data", s_short_then_success, rd, buf, &cqe, NULL,
			  NULL),
		 -EPROTO);
	FRESH();
	CHECK_EQ(
		run_case("CapsuleResp for another cid", s_rsp_wrong_cid, rd, buf, &cqe, NULL, NULL),
		-EPROTO);

	FRESH();
	CHECK_EQ(run_case("NVMe error status", s_rsp_error, rd, buf, &cqe, &fes, NULL), -EIO);
	CHECK_EQ(NVME_STATUS_FIELD(cqe.status), NVME_DNR | NVME_SC_LBA_RANGE);
	CHECK_EQ(fes, -1); /* not a transport error */

	FRESH();
	CHECK_EQ(run_case("C2HTermReq (invalid header)", s_term_proto, rd, buf, &cqe, NULL, NULL),
		 -EPROTO);
	FRESH();
	CHECK_EQ(run_case("C2HTermReq (unknown FES)", s_term_other, rd, buf, &cqe, NULL, NULL),
		 -ECONNRESET);

	{
		struct case_opts o = rd;

		o.hdgst = 1;
		FRESH();
		CHECK_EQ(run_case("header digest mismatch", s_bad_hdgst, o, buf, &cqe, &fes, NULL),
			 -EPROTO);
		CHECK_EQ(fes, NVME_TCP_FES_HDR_DIGEST_ERR);
		o.hdgst = 0;
		o.ddgst = 1;
		FRESH();
		CHECK_EQ(run_case("data digest mismatch", s_bad_ddgst, o, buf, &cqe, &fes, NULL),
			 -EIO);
		CHECK_EQ(NVME_STATUS_FIELD(cqe.status), NVME_SC_DATA_XFER_ERROR);
		CHECK_EQ(fes, -1); /* the stream itself is fine */
	}

	FRESH();
	CHECK_EQ(run_case("ICResp during a command", s_icresp_midway, rd, buf, &cqe, NULL, NULL),
		 -EPROTO);
	FRESH();
	CHECK_EQ(run_case("plen 2 GiB", s_huge_plen, rd, buf, &cqe, &fes, NULL), -EPROTO);
	CHECK_EQ(fes, NVME_TCP_FES_INVALID_PDU_HDR);
	guard_ok(buf, L);
	FRESH();
	CHECK_EQ(run_case("controller closes midway", s_close_midway, rd, buf, &cqe, NULL, NULL),
		 -ECONNRESET);
	{
		struct case_opts o = rd;

		o.timeout_ms = 200;
		FRESH();
		CHECK_EQ(run_case("controller silent (200 ms)", s_silent, o, buf, &cqe, NULL, NULL),
			 -ETIMEDOUT);
	}

	{
		struct case_opts o = wr;

		o.len = 4096;
		o.maxh2c = 600;
		FRESH();
		CHECK_EQ(run_case("write, two R2Ts in order", s_write_two_r2t_in_order, o, buf,
				  &cqe, NULL, &ok),
			 0);
		CHECK(ok);
		/* R2Ts must ask for the data in order (nvme_tcp/xfer.c's rule) */
		FRESH();
		CHECK_EQ(run_case("write, two R2Ts out of order", s_write_two_r2t, o, buf, &cqe,
				  NULL, NULL),
			 -EPROTO);
	}
	FRESH();
	CHECK_EQ(run_case("R2T repeating sent data", s_r2t_repeat, wr, buf, &cqe, &fes, NULL),
		 -EPROTO);
	CHECK_EQ(fes, NVME_TCP_FES_DATA_OUT_OF_RANGE);
	FRESH();
	CHECK_EQ(run_case("200 R2Ts for the same range", s_r2t_flood, wr, buf, &cqe, NULL, NULL),
		 -EPROTO);
	FRESH();
	CHECK_EQ(run_case("write success after half the data", s_write_early_success, wr, buf, &cqe,
			  NULL, NULL),
		 -EPROTO);
	FRESH();
	CHECK_EQ(run_case("write success without an R2T", s_write_success_no_r2t, wr, buf, &cqe,
			  NULL, NULL),
		 -EPROTO);
	FRESH();
	CHECK_EQ(run_case("R2T whose end wraps 32 bits", s_r2t_wraps, wr, buf, &cqe, &fes, NULL),
		 -EPROTO);
	CHECK_EQ(fes, NVME_TCP_FES_DATA_OUT_OF_RANGE);
	FRESH();
	CHECK_EQ(run_case("R2T past the end", s_r2t_past_end, wr, buf, &cqe, &fes, NULL), -EPROTO);
	CHECK_EQ(fes, NVME_TCP_FES_DATA_OUT_OF_RANGE);
	FRESH();
	CHECK_EQ(run_case("R2T of length 0", s_r2t_zero, wr, buf, &cqe, NULL, NULL), -EPROTO);
	FRESH();
	CHECK_EQ(run_case("R2T for a read", s_r2t_for_read, rd, buf, &cqe, NULL, NULL), -EPROTO);
	for (int dd = 0; dd <= 1; dd++) {
		struct case_opts o = wr;

		o.incap_max = 8192;
		o.ddgst = dd;
		FRESH();
		CHECK_EQ(run_case("write in-capsule", s_incap_write, o, buf, &cqe, NULL, &ok), 0);
		CHECK(ok);
	}
	{
		struct case_opts o = wr;

		o.incap_max = 8192;
		FRESH();
		CHECK_EQ(run_case("R2T for an in-capsule write", s_incap_then_r2t, o, buf, &cqe,
				  NULL, NULL),
			 -EPROTO);
	}
#undef FRESH
}

/* ------------------------------------------------ connect over loopback */

struct ctl {
	int lfd;
	/* ICResp */
	uint16_t pfv;
	uint8_t digest, cpda;
	uint32_t maxdata;
	int send_term; /* C2HTermReq instead of ICResp */
	/* Connect response */
	uint16_t sf;
	uint16_t cntlid;
	/* the secure channel: the key the controller holds (NULL: no TLS) */
	const char *tls_key;
	/* seen */
	int connect_ok;
	uint8_t asked;
	int tls_rc;
};

static void *ctl_main(void *arg)
{
	struct ctl *t = arg;
	struct peer p;
	int fd = accept(t->lfd, NULL, NULL);

	CHECK(fd >= 0);
	memset(&p, 0, sizeof(p));
	p.fd = fd;
	if (t->tls_key) {
		t->tls_rc = peer_tls_accept(&p, t->tls_key);
		if (t->tls_rc)
			goto out;
	}

	struct nvme_tcp_icreq_pdu req;

	if (p_recv(&p, &req, sizeof(req)))
		goto out;
	if (req.hdr.type != NVME_TCP_ICREQ) {
		/* a controller without TLS given a ClientHello: it refuses the
		 * "PDU" as Linux does, with a C2HTermReq, and closes */
		struct nvme_tcp_term_pdu term;

		memset(&term, 0, sizeof(term));
		fx_tcp_hdr_init(&term.hdr, NVME_TCP_C2H_TERM, 0, 0, 0, 0);
		term.fes = NVME_TCP_FES_INVALID_PDU_HDR;
		p_send(&p, &term, sizeof(term));
		t->asked = 0xff;
		goto out;
	}
	CHECK_EQ(req.hdr.type, NVME_TCP_ICREQ);
	CHECK_EQ(req.hdr.plen, 128);
	CHECK_EQ(req.pfv, 0);
	CHECK_EQ(req.hpda, 0);
	CHECK_EQ(req.maxr2t, 0);
	t->asked = req.digest;
	if (t->send_term) {
		struct nvme_tcp_term_pdu term;

		memset(&term, 0, sizeof(term));
		fx_tcp_hdr_init(&term.hdr, NVME_TCP_C2H_TERM, 0, 0, 0, 0);
		term.fes = NVME_TCP_FES_UNSUPPORTED_PARAM;
		p_send(&p, &term, sizeof(term));
		goto out;
	}
	struct nvme_tcp_icresp_pdu ic;

	memset(&ic, 0, sizeof(ic));
	fx_tcp_hdr_init(&ic.hdr, NVME_TCP_ICRESP, 0, 0, 0, 0);
	ic.pfv = t->pfv;
	ic.cpda = t->cpda;
	ic.digest = t->digest;
	ic.maxdata = t->maxdata;
	p_send(&p, &ic, sizeof(ic));
	p.hdgst = !!(t->digest & 1);
	p.ddgst = !!(t->digest & 2);

	uint8_t hdr[160];
	static uint8_t data[4096];
	int n = p_recv_pdu(&p, hdr, data, sizeof(data));

	if (n < 0)
		goto out;
	struct nvmf_connect_cmd cc;
	struct nvmf_connect_data cd;

	memcpy(&cc, hdr + 8, sizeof(cc));
	memcpy(&cd, data, sizeof(cd));
	/* In-capsule data must start where cpda puts it. */
	unsigned align = (t->cpda + 1u) * 4;

	t->connect_ok = n == 1024 && cc.opcode == 0x7f && cc.fctype == 1 && cc.qid == 0 &&
			cc.sqsize == 31 && cc.kato == 4000 && cc.dptr.type == 0x01 &&
			cc.dptr.length == 1024 && cc.dptr.addr == 0 &&
			((struct nvme_tcp_hdr *)hdr)->pdo % align == 0 && cd.cntlid == 0xffff &&
			!strcmp(cd.hostnqn, "nqn.2014-08.io.fx100:test-host") &&
			!strcmp(cd.subsysnqn, "nqn.2014-08.io.fx100:test-sub") &&
			cd.hostid[0] == 0x42;
	p_rsp(&p, cc.cid, t->sf, t->cntlid);
	/* wait for the host to close */
	while (p_recv_pdu(&p, hdr, data, sizeof(data)) >= 0)
		;
out:
	fx_tls_free(p.tls);
	close(fd);
	return NULL;
}

static int connect_case_tls(const char *name, struct ctl t, int want_hd, int want_dd,
			    const char *host_key, struct fx_tcp_conn *c, uint16_t *status,
			    struct ctl *seen)
{
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	socklen_t sl = sizeof(sa);
	struct fx_nvmf_addr a;
	struct fx_nvmf_params p;
	pthread_t th;

	t.lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	CHECK(t.lfd >= 0);
	CHECK_EQ(bind(t.lfd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	CHECK_EQ(listen(t.lfd, 1), 0);
	CHECK_EQ(getsockname(t.lfd, (struct sockaddr *)&sa, &sl), 0);
	memset(&a, 0, sizeof(a));
	memset(&p, 0, sizeof(p));
	snprintf(a.host, sizeof(a.host), "127.0.0.1");
	snprintf(a.port, sizeof(a.port), "%u", ntohs(sa.sin_port));
	snprintf(p.hostnqn, sizeof(p.hostnqn), "nqn.2014-08.io.fx100:test-host");
	snprintf(p.subnqn, sizeof(p.subnqn), "nqn.2014-08.io.fx100:test-sub");
	p.hostid[0] = 0x42;
	p.hdgst = want_hd;
	p.ddgst = want_dd;
	p.kato_ms = 4000;
	p.timeout_ms = 3000;
	if (host_key) {
		p.tls = 1;
		CHECK_EQ(fx_nvmf_params_set_tls_key(&p, host_key, NULL), 0);
	}
	CHECK_EQ(pthread_create(&th, NULL, ctl_main, &t), 0);
	int r = fx_tcp_connect(&a, &p, 0, 31, 0xffff, c, status);

	if (!r)
		fx_tcp_conn_close(c);
	pthread_join(th, NULL);
	close(t.lfd);
	*seen = t;
	printf("  %-36s -> %d (%s) status 0x%x\n", name, r, r ? strerror(-r) : "ok", *status);
	fx_nvmf_params_wipe(&p);
	return r;
}

static int connect_case(const char *name, struct ctl t, int want_hd, int want_dd,
			struct fx_tcp_conn *c, uint16_t *status, struct ctl *seen)
{
	return connect_case_tls(name, t, want_hd, want_dd, NULL, c, status, seen);
}

static void test_connect(void)
{
	struct fx_tcp_conn c;
	uint16_t st;
	struct ctl seen;
	struct ctl good = {.maxdata = 65536, .cntlid = 7};
	struct ctl t;

	printf("fx_tcp_connect against a scripted controller on 127.0.0.1:\n");
	/* the secure channel before ICReq: the same key, another key, no TLS there */
	t = good;
	t.tls_key = TLS_KEY;
	t.digest = 3;
	CHECK_EQ(connect_case_tls("TLS, digests", t, 1, 1, TLS_KEY, &c, &st, &seen), 0);
	CHECK(seen.connect_ok);
	CHECK_EQ(seen.tls_rc, 0);
	CHECK_EQ(seen.asked, 3);
	t.tls_key = TLS_KEY2;
	CHECK_EQ(connect_case_tls("TLS, the controller has another key", t, 0, 0, TLS_KEY, &c, &st,
				  &seen),
		 -EACCES);
	CHECK_EQ(seen.tls_rc, -EACCES);
	CHECK(strstr(fx_nvmf_auth_error(), "TLS handshake failed") &&
	      strstr(fx_nvmf_auth_error(), "wrong key"));
	CHECK(c.fd == -1 && c.tls == NULL);
	t.tls_key = NULL;
	CHECK_EQ(connect_case_tls("TLS, the controller has none", t, 0, 0, TLS_KEY, &c, &st, &seen),
		 -EPROTO);
	CHECK_EQ(seen.asked, 0xff); /* it saw our ClientHello, not an ICReq */
	CHECK(strstr(fx_nvmf_auth_error(), "did not answer with TLS"));

	CHECK_EQ(connect_case("good", good, 0, 0, &c, &st, &seen), 0);
	CHECK(seen.connect_ok);
	CHECK_EQ(c.cntlid, 7);
	CHECK_EQ(c.maxh2cdata, 65536);
	CHECK_EQ(c.incap_max, 8192);
	CHECK_EQ(seen.asked, 0);

	t = good;
	t.digest = 3;
	t.cpda = 3; /* in-capsule Connect data at a 16-byte boundary */
	CHECK_EQ(connect_case("digests granted, cpda 3", t, 1, 1, &c, &st, &seen), 0);
	CHECK(seen.connect_ok);
	CHECK_EQ(seen.asked, 3);
	CHECK(c.hdgst && c.ddgst);
	CHECK_EQ(c.cpda, 3);

	t = good;
	t.digest = 1;
	CHECK_EQ(connect_case("asked both, granted header only", t, 1, 1, &c, &st, &seen), 0);
	CHECK(c.hdgst && !c.ddgst);

	t = good;
	t.digest = 2;
	CHECK_EQ(connect_case("digest granted, not asked", t, 1, 0, &c, &st, &seen), -EPROTO);
	t = good;
	t.pfv = 1;
	CHECK_EQ(connect_case("ICResp pfv 1", t, 0, 0, &c, &st, &seen), -EPROTO);
	t = good;
	t.maxdata = 2048;
	CHECK_EQ(connect_case("ICResp maxh2cdata 2048", t, 0, 0, &c, &st, &seen), -EPROTO);
	t = good;
	t.cpda = 32;
	CHECK_EQ(connect_case("ICResp cpda 32", t, 0, 0, &c, &st, &seen), -EPROTO);
	t = good;
	t.send_term = 1;
	CHECK_EQ(connect_case("C2HTermReq instead of ICResp", t, 0, 0, &c, &st, &seen), -EPROTO);

	t = good;
	t.sf = NVME_DNR | 0x100 | NVME_SC_CONNECT_INVALID_HOST;
	CHECK_EQ(connect_case("Connect: host not allowed", t, 0, 0, &c, &st, &seen), -EACCES);
	CHECK_EQ(st, t.sf);
	t.sf = NVME_DNR | 0x100 | NVME_SC_CONNECT_INVALID_PARAM;
	CHECK_EQ(connect_case("Connect: no such subsystem", t, 0, 0, &c, &st, &seen), -ENOENT);
	CHECK_EQ(st, t.sf);
	t.sf = 0x100 | NVME_SC_CONNECT_CTRL_BUSY;
	CHECK_EQ(connect_case("Connect: controller busy", t, 0, 0, &c, &st, &seen), -EIO);
	CHECK_EQ(st, t.sf);
	t.sf = NVME_SC_INTERNAL;
	CHECK_EQ(connect_case("Connect: internal error", t, 0, 0, &c, &st, &seen), -EIO);
	CHECK_EQ(st, NVME_SC_INTERNAL);
	CHECK_EQ(c.fd, -1);

	/* Nothing listening: refused, fast. */
	{
		struct fx_nvmf_addr a = {.host = "127.0.0.1", .port = "1"};
		struct fx_nvmf_params p;

		memset(&p, 0, sizeof(p));
		snprintf(p.hostnqn, sizeof(p.hostnqn), "nqn.2014-08.io.fx100:h");
		snprintf(p.subnqn, sizeof(p.subnqn), "nqn.2014-08.io.fx100:s");
		p.timeout_ms = 2000;
		CHECK_EQ(fx_tcp_connect(&a, &p, 0, 31, 0xffff, &c, &st), -ECONNREFUSED);
		p.subnqn[0] = 0;
		CHECK_EQ(fx_tcp_connect(&a, &p, 0, 31, 0xffff, &c, &st), -EINVAL);
	}
}

/* ------------------------------------- controller open, keep alive, discovery */

/* A minimal admin controller: enough for fx_tcp_ctrl_open, ns_info, close
 * and discovery, with knobs to fail keep alive and churn the discovery
 * log's generation counter. */
struct mini {
	int lfd;
	int ka_fail_after;  /* answer keep alive with an error after this many (-1: never) */
	int genctr_changes; /* header reads whose GENCTR differs from the previous */
	uint32_t numrec;
	/* identify/CAP overrides (0: the defaults below) */
	unsigned mpsmin, mdts;
	uint32_t ioccsz;
	uint64_t nsze;
	/* CNS 03h (Namespace Identification Descriptors): 0 a UUID descriptor,
	 * 1 refused with Invalid Field, 2 the connection dropped instead */
	int desc_mode;
	/* seen */
	int ka_count, hdr_reads, shn_seen, conns;
	uint32_t cc;
};

static void mini_log(struct mini *m, uint8_t *out, uint64_t off, uint32_t len, uint64_t genctr)
{
	uint32_t total = 1024 * (1 + m->numrec);

	for (uint32_t i = 0; i < len; i++) {
		uint64_t o = off + i;
		uint8_t b = 0;

		if (o < 1024) {
			struct nvmf_disc_log_hdr h;

			memset(&h, 0, sizeof(h));
			h.genctr = genctr;
			h.numrec = m->numrec;
			b = ((uint8_t *)&h)[o];
		} else if (o < total) {
			uint32_t rec = (uint32_t)(o / 1024 - 1), at = (uint32_t)(o % 1024);
			struct nvmf_disc_log_entry e;

			memset(&e, 0, sizeof(e));
			e.trtype = NVMF_TRTYPE_TCP;
			e.adrfam = NVMF_ADRFAM_IPV4;
			e.subtype = NVMF_SUBTYPE_NVME;
			e.portid = (uint16_t)rec;
			snprintf(e.trsvcid, sizeof(e.trsvcid), "4420");
			snprintf(e.traddr, sizeof(e.traddr), "127.0.0.1");
			snprintf(e.subnqn, sizeof(e.subnqn), "nqn.2014-08.io.fx100:sub%u", rec);
			b = ((uint8_t *)&e)[at];
		}
		out[i] = b;
	}
}

static void *mini_main(void *arg)
{
	struct mini *m = arg;
	static uint8_t data[1 << 16], hdr[160];
	uint64_t genctr = 100;

	for (;;) {
		int fd = accept(m->lfd, NULL, NULL);

		if (fd < 0)
			return NULL;
		m->conns++;
		struct peer p;
		struct nvme_tcp_icreq_pdu req;
		struct nvme_tcp_icresp_pdu ic;

		memset(&p, 0, sizeof(p));
		p.fd = fd;
		if (p_recv(&p, &req, sizeof(req))) {
			close(fd);
			continue;
		}
		memset(&ic, 0, sizeof(ic));
		fx_tcp_hdr_init(&ic.hdr, NVME_TCP_ICRESP, 0, 0, 0, 0);
		ic.maxdata = 65536;
		ic.digest = req.digest;
		p_send(&p, &ic, sizeof(ic));
		p.hdgst = !!(req.digest & 1);
		p.ddgst = !!(req.digest & 2);
		m->cc = 0;

		while (p_recv_pdu(&p, hdr, data, sizeof(data)) >= 0) {
			struct nvme_sqe q;

			if (hdr[0] != NVME_TCP_CMD)
				break;
			memcpy(&q, hdr + 8, sizeof(q));
			if (q.opcode == NVME_FABRICS_OPCODE) {
				struct nvmf_property_cmd pc;

				memcpy(&pc, &q, sizeof(pc));
				if (pc.fctype == NVMF_FCTYPE_CONNECT) {
					p_rsp(&p, q.cid, 0, 5);
				} else if (pc.fctype == NVMF_FCTYPE_PROP_GET) {
					uint64_t v = 0;

					if (pc.offset == NVME_REG_CAP)
						v = 1023 | (2ULL << 24) | /* MQES 1024, TO 1 s */
						    (uint64_t)m->mpsmin << 48; /* MPSMIN 4K */
					else if (pc.offset == NVME_REG_VS)
						v = 0x10400;
					else if (pc.offset == NVME_REG_CC)
						v = m->cc;
					else if (pc.offset == NVME_REG_CSTS)
						v = ((m->cc & 1) ? NVME_CSTS_RDY : 0) |
						    ((m->cc >> 14 & 3) ? NVME_CSTS_SHST_CMPLT : 0);
					struct nvme_cqe cqe;
					uint8_t pdu[24];

					memset(pdu, 0, sizeof(pdu));
					memset(&cqe, 0, sizeof(cqe));
					cqe.cid = q.cid;
					cqe.dw0 = (uint32_t)v;
					cqe.dw1 = (uint32_t)(v >> 32);
					memcpy(pdu + 8, &cqe, sizeof(cqe));
					p_pdu(&p, pdu, NVME_TCP_RSP, NULL, 0, 0, 0);
				} else if (pc.fctype == NVMF_FCTYPE_PROP_SET) {
					if (pc.offset == NVME_REG_CC) {
						m->cc = (uint32_t)pc.value;
						if (m->cc >> 14 & 3)
							m->shn_seen = 1;
					}
					p_rsp(&p, q.cid, 0, 0);
				} else {
					p_rsp(&p, q.cid, NVME_SC_INVALID_OPCODE, 0);
				}
			} else if (q.opcode == NVME_ADMIN_IDENTIFY) {
				memset(data, 0, 4096);
				if ((q.cdw10 & 0xff) == NVME_ID_CNS_NS_DESC_LIST) {
					if (m->desc_mode == 2)
						break;
					if (m->desc_mode == 1) {
						p_rsp(&p, q.cid, 0x02, 0); /* Invalid Field */
						continue;
					}
					data[0] = NVME_NIDT_UUID;
					data[1] = 16;
					memset(data + 4, 0x5a, 16);
				} else if (q.cdw10 == NVME_ID_CNS_CTRL) {
					data[NVME_IDC_MDTS] = (uint8_t)(m->mdts ? m->mdts
										: 1); /* 8 KiB */
					uint32_t io = m->ioccsz ? m->ioccsz : 4;

					memcpy(data + NVME_IDC_IOCCSZ, &io, 4);
					data[NVME_IDC_NN] = 1;
					data[NVME_IDC_MAXCMD] = 32;
				} else if (q.nsid == 1) {
					uint64_t nsze = m->nsze ? m->nsze : 1000;

					memcpy(data + NVME_IDNS_NSZE, &nsze, 8);
					data[NVME_IDNS_NLBAF] = 1;
					data[NVME_IDNS_FLBAS] =
						0x11; /* format 1, high bits ignored */
					data[NVME_IDNS_LBAF + 2] = 9;
					data[NVME_IDNS_LBAF + 4 + 2] = 12;
				}
				p_c2h(&p, q.cid, 0, data, 4096, NVME_TCP_F_DATA_LAST, 0);
				p_rsp(&p, q.cid, 0, 0);
			} else if (q.opcode == NVME_ADMIN_SET_FEATURES) {
				p_rsp(&p, q.cid, 0, 3 | 3 << 16);
			} else if (q.opcode == NVME_ADMIN_KEEP_ALIVE) {
				m->ka_count++;
				int fail = m->ka_fail_after >= 0 && m->ka_count > m->ka_fail_after;

				p_rsp(&p, q.cid, fail ? NVME_SC_INTERNAL : 0, 0);
			} else if (q.opcode == NVME_ADMIN_GET_LOG_PAGE) {
				uint32_t numd = (q.cdw10 >> 16 | q.cdw11 << 16) + 1;
				uint64_t off = q.cdw12 | (uint64_t)q.cdw13 << 32;
				uint32_t len = numd * 4;

				CHECK_EQ(q.cdw10 & 0xff, NVME_LOG_DISCOVERY);
				CHECK(len <= 8192); /* MDTS */
				if (off == 0 && m->genctr_changes > 0) {
					genctr++;
					m->genctr_changes--;
				}
				if (off == 0)
					m->hdr_reads++;
				mini_log(m, data, off, len, genctr);
				p_c2h(&p, q.cid, 0, data, len, NVME_TCP_F_DATA_LAST, 0);
				p_rsp(&p, q.cid, 0, 0);
			} else {
				p_rsp(&p, q.cid, NVME_SC_INVALID_OPCODE, 0);
			}
		}
		close(fd);
	}
}

static void mini_start(struct mini *m, pthread_t *th, struct fx_nvmf_addr *a,
		       struct fx_nvmf_params *p)
{
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	socklen_t sl = sizeof(sa);

	m->lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	CHECK(m->lfd >= 0);
	CHECK_EQ(bind(m->lfd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	CHECK_EQ(listen(m->lfd, 4), 0);
	CHECK_EQ(getsockname(m->lfd, (struct sockaddr *)&sa, &sl), 0);
	memset(a, 0, sizeof(*a));
	memset(p, 0, sizeof(*p));
	snprintf(a->host, sizeof(a->host), "127.0.0.1");
	snprintf(a->port, sizeof(a->port), "%u", ntohs(sa.sin_port));
	snprintf(p->hostnqn, sizeof(p->hostnqn), "nqn.2014-08.io.fx100:test-host");
	snprintf(p->subnqn, sizeof(p->subnqn), "nqn.2014-08.io.fx100:sub0");
	p->timeout_ms = 3000;
	CHECK_EQ(pthread_create(th, NULL, mini_main, m), 0);
}

static void mini_stop(struct mini *m, pthread_t th)
{
	shutdown(m->lfd, SHUT_RDWR); /* wakes accept() */
	pthread_join(th, NULL);
	close(m->lfd);
}

static void test_ctrl(void)
{
	struct mini m;
	pthread_t th;
	struct fx_nvmf_addr a;
	struct fx_nvmf_params p;
	struct fx_nvmf_ctrl *c;
	uint16_t st;
	uint64_t nsze;
	uint32_t bs;

	printf("controller open / keep alive / close against a scripted admin controller:\n");
	memset(&m, 0, sizeof(m));
	m.ka_fail_after = 3;
	mini_start(&m, &th, &a, &p);
	p.kato_ms = 300; /* keep alive every 100 ms */
	CHECK_EQ(fx_tcp_ctrl_open(&a, &p, 8, &c, &st), 0);
	CHECK_EQ(c->cntlid, 5);
	CHECK_EQ(c->vs, 0x10400);
	CHECK_EQ(c->mdts_bytes, 8192);
	CHECK_EQ(c->ioccsz_bytes, 64);
	CHECK_EQ(c->nn, 1);
	CHECK_EQ(c->io_queues, 4);
	CHECK_EQ(c->io_sqsize, 31); /* MAXCMD 32 */
	CHECK_EQ(fx_nvmf_ctrl_ns_info(c, 1, &nsze, &bs), 0);
	CHECK_EQ(nsze, 1000);
	CHECK_EQ(bs, 4096);
	CHECK_EQ(fx_nvmf_ctrl_ns_info(c, 2, &nsze, &bs), -ENODEV);
	CHECK_EQ(fx_nvmf_ctrl_ns_info(c, 0, &nsze, &bs), -EINVAL);
	/* no NGUID or EUI-64 in Identify Namespace: the UUID from CNS 03h */
	struct fx_nvmf_ns_ids ids;
	CHECK_EQ(fx_nvmf_ctrl_ns_info_ids(c, 1, &nsze, &bs, &ids), 0);
	CHECK_EQ(ids.uuid[0], 0x5a);
	CHECK_EQ(ids.uuid[15], 0x5a);
	/* refused with a status: no UUID, and still a namespace */
	m.desc_mode = 1;
	CHECK_EQ(fx_nvmf_ctrl_ns_info_ids(c, 1, &nsze, &bs, &ids), 0);
	CHECK_EQ(ids.uuid[0], 0);
	printf("  namespace UUID from CNS 03h; a refused CNS 03h leaves it unreported\n");
	/* three keep alives succeed, the fourth fails: the controller is lost */
	for (int i = 0; i < 100 && !__atomic_load_n(&c->ka_failed, __ATOMIC_ACQUIRE); i++)
		usleep(20000);
	printf("  keep alives sent: %d, ka_failed %d\n", m.ka_count, c->ka_failed);
	CHECK_EQ(m.ka_count, 4);
	CHECK_EQ(c->ka_failed, 1);
	CHECK_EQ(fx_nvmf_ctrl_ns_info(c, 1, &nsze, &bs), -ECONNRESET);
	fx_nvmf_ctrl_close(c);
	CHECK_EQ(m.shn_seen, 0); /* nothing to shut down on a lost controller */

	/* CNS 03h lost with its connection: the call fails (retryable), it
	 * never reports a namespace with its UUID zeroed */
	m.ka_fail_after = -1;
	m.desc_mode = 2;
	CHECK_EQ(fx_tcp_ctrl_open(&a, &p, 1, &c, &st), 0);
	int lost = fx_nvmf_ctrl_ns_info_ids(c, 1, &nsze, &bs, &ids);
	CHECK(lost < 0);
	printf("  CNS 03h lost with the connection: %d (not a zero UUID)\n", lost);
	fx_nvmf_ctrl_close(c);
	m.desc_mode = 0;
	m.ka_fail_after = 3;

	/* a healthy controller is shut down on close */
	m.ka_fail_after = -1;
	m.ka_count = 0;
	CHECK_EQ(fx_tcp_ctrl_open(&a, &p, 1, &c, &st), 0);
	usleep(250000);
	CHECK(m.ka_count >= 1);
	CHECK_EQ(c->ka_failed, 0);
	fx_nvmf_ctrl_close(c);
	CHECK_EQ(m.shn_seen, 1);
	printf("  close: CC.SHN written, CSTS.SHST seen\n");

	/* discovery: 20 records need three 8 KiB (MDTS) reads; GENCTR moves
	 * twice, so the log is read three times */
	struct nvmf_disc_log_entry *e;
	uint32_t n;

	m.numrec = 20;
	m.genctr_changes = 3;
	m.hdr_reads = 0;
	CHECK_EQ(fx_tcp_discover(&a, &p, &e, &n, &st), 0);
	printf("  discovery: %u records after %d header reads\n", n, m.hdr_reads);
	CHECK_EQ(n, 20);
	CHECK_EQ(m.hdr_reads, 4);
	for (uint32_t i = 0; i < n; i++) {
		char want[64];

		snprintf(want, sizeof(want), "nqn.2014-08.io.fx100:sub%u", i);
		CHECK(!strcmp(e[i].subnqn, want));
		CHECK_EQ(e[i].portid, i);
		CHECK_EQ(e[i].trtype, NVMF_TRTYPE_TCP);
	}
	free(e);

	m.numrec = 0;
	CHECK_EQ(fx_tcp_discover(&a, &p, &e, &n, &st), 0);
	CHECK_EQ(n, 0);
	free(e);

	/* Identify fields whose arithmetic can leave its width: MPSMIN 128 MiB
	 * pages << MDTS 37 is 2^64 bytes (clamped, not wrapped to "no
	 * limit"), IOCCSZ 2^28 units is 4 GiB (clamped, not wrapped to 0),
	 * and 2^53 blocks of 4 KiB do not fit 64 bits (refused). */
	m.mpsmin = 15;
	m.mdts = 37;
	m.ioccsz = 1u << 28;
	m.nsze = 1ULL << 53;
	CHECK_EQ(fx_tcp_ctrl_open(&a, &p, 1, &c, &st), 0);
	CHECK_EQ(c->mdts_bytes, 0x80000000u);
	CHECK_EQ(c->ioccsz_bytes, UINT32_MAX);
	CHECK_EQ(fx_nvmf_ctrl_ns_info(c, 1, &nsze, &bs), -EPROTO);
	fx_nvmf_ctrl_close(c);
	m.mpsmin = 0;
	m.mdts = 3;
	m.nsze = (1ULL << 52) - 1; /* the largest that fits with 4 KiB blocks */
	CHECK_EQ(fx_tcp_ctrl_open(&a, &p, 1, &c, &st), 0);
	CHECK_EQ(c->mdts_bytes, 32768);
	CHECK_EQ(fx_nvmf_ctrl_ns_info(c, 1, &nsze, &bs), 0);
	CHECK_EQ(nsze, (1ULL << 52) - 1);
	fx_nvmf_ctrl_close(c);
	m.mdts = m.ioccsz = 0;
	m.nsze = 0;
	printf("  MDTS, IOCCSZ and namespace size overflows: clamped or refused\n");

	m.numrec = 2;
	m.genctr_changes = 1000; /* never settles */
	CHECK_EQ(fx_tcp_discover(&a, &p, &e, &n, &st), -EAGAIN);
	CHECK(e == NULL);
	printf("  discovery with a log that never settles: -EAGAIN\n");
	mini_stop(&m, th);
}

/* The ANA log page parser against pages a controller could send, the
 * hostile ones included: every count is held to the page's length. */
static void put_le32(uint8_t *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static void test_ana_log(void)
{
	uint8_t log[16 + 2 * 32 + 2 * 4] = {0};
	uint8_t st = 0;
	uint64_t cnt = 0;

	log[8] = 2;            /* NGRPS */
	put_le32(log + 16, 5); /* group 5 */
	put_le32(log + 20, 2); /* two NSIDs follow */
	log[24] = 7;           /* CHGCNT */
	log[32] = NVME_ANA_NON_OPTIMIZED;
	put_le32(log + 48, 1);
	put_le32(log + 52, 2);
	put_le32(log + 56, 9);                  /* group 9 */
	log[72] = 0xf0 | NVME_ANA_INACCESSIBLE; /* reserved bits ignored */
	CHECK_EQ(fx_nvmf_ana_find(log, sizeof(log), 5, &st, &cnt), 0);
	CHECK_EQ(st, NVME_ANA_NON_OPTIMIZED);
	CHECK_EQ(cnt, 7);
	CHECK_EQ(fx_nvmf_ana_find(log, sizeof(log), 9, &st, &cnt), 0);
	CHECK_EQ(st, NVME_ANA_INACCESSIBLE);
	CHECK_EQ(fx_nvmf_ana_find(log, sizeof(log), 4, &st, &cnt), -ENOENT);
	/* cut anywhere inside: never read past len */
	CHECK_EQ(fx_nvmf_ana_find(log, 10, 5, &st, &cnt), -EPROTO);
	CHECK_EQ(fx_nvmf_ana_find(log, 40, 5, &st, &cnt), -EMSGSIZE);
	CHECK_EQ(fx_nvmf_ana_find(log, 60, 9, &st, &cnt), -EMSGSIZE);
	/* an NSID count that runs past the page */
	put_le32(log + 20, 0xffffffffu);
	CHECK_EQ(fx_nvmf_ana_find(log, sizeof(log), 9, &st, &cnt), -EMSGSIZE);
	CHECK_EQ(fx_nvmf_ana_find(log, sizeof(log), 5, &st, &cnt), 0);
}

/* A controller's ANA log as fx_nvmf_ana_read sees it: a page of page_len
 * bytes (read past it: zeroes), every byte asked for counted, and a CHGCNT
 * that moves after each chunk past the first while torn is set. */
struct fake_ana {
	uint8_t page[64 << 10];
	uint32_t page_len;
	uint64_t bytes;     /* asked for, over every command */
	uint32_t max_chunk; /* the largest one command asked for */
	unsigned torn;      /* chunks left that tear the page */
	int fail;           /* answer -EIO with this status */
	int rgo_invalid;    /* an LSP other than 0 is an Invalid Field */
	uint8_t lsp;        /* the last one asked for */
};

static int fake_ana_read(void *ctx, uint8_t lsp, uint64_t off, void *buf, uint32_t len,
			 uint16_t *status)
{
	struct fake_ana *f = ctx;

	CHECK(len % 4 == 0 && len > 0);
	f->bytes += len;
	if (len > f->max_chunk)
		f->max_chunk = len;
	f->lsp = lsp;
	if (f->fail) {
		*status = (uint16_t)f->fail;
		return -EIO;
	}
	if (f->rgo_invalid && lsp) {
		*status = NVME_SC_INVALID_FIELD;
		return -EIO;
	}
	memset(buf, 0, len);
	if (off < f->page_len)
		memcpy(buf, f->page + off, f->page_len - off < len ? f->page_len - off : len);
	if (off && f->torn) {
		f->torn--;
		f->page[0]++; /* the page changed while it was read */
	}
	return 0;
}

/* A page whose ngrps groups (ids 1..ngrps, no NSIDs: RGO) are all
 * non-optimized except group want, optimized, with CHGCNT cnt. */
static void fake_ana_page(struct fake_ana *f, unsigned ngrps, unsigned have, uint64_t cnt)
{
	memset(f->page, 0, sizeof(f->page));
	for (int i = 0; i < 8; i++)
		f->page[i] = (uint8_t)(cnt >> (8 * i));
	f->page[8] = (uint8_t)ngrps;
	f->page[9] = (uint8_t)(ngrps >> 8);
	for (unsigned g = 0; g < have; g++) {
		uint8_t *d = f->page + 16 + 32 * g;

		put_le32(d, g + 1);
		d[16] = NVME_ANA_NON_OPTIMIZED;
	}
	f->page_len = 16 + 32 * have;
	CHECK(f->page_len <= sizeof(f->page));
	f->bytes = 0;
	f->max_chunk = 0;
}

/* The bounded reader (review item 14): a hostile page cannot make every poll
 * re-read megabytes, a length that sufficed is kept, MDTS chunks are
 * checked for a page torn between them. */
static void test_ana_read(void)
{
	static struct fake_ana f;
	struct fx_nvmf_ana_reader r = {0};
	uint8_t st = 0;
	uint64_t cnt = 0;
	uint16_t sf = 0;
	const uint64_t grow = 4096 + 16384 + 65536 + (256 << 10);

	/* NGRPS 65535 on a page of one group: grown up to the cap once... */
	fake_ana_page(&f, 65535, 1, 7);
	CHECK_EQ(fx_nvmf_ana_read(&r, fake_ana_read, &f, 0, 9, &st, &cnt, &sf), -EPROTO);
	CHECK_EQ(f.bytes, grow);
	CHECK_EQ(f.max_chunk, FX_NVMF_ANA_LOG_MAX);
	/* ...then, while its CHGCNT stays, each poll reads 4 KiB only */
	for (int i = 0; i < 3; i++) {
		f.bytes = 0;
		CHECK_EQ(fx_nvmf_ana_read(&r, fake_ana_read, &f, 0, 9, &st, &cnt, &sf), -EPROTO);
		CHECK_EQ(f.bytes, 4096);
	}
	/* a new CHGCNT may be a page that now fits: grown once more */
	f.page[0]++;
	f.bytes = 0;
	CHECK_EQ(fx_nvmf_ana_read(&r, fake_ana_read, &f, 0, 9, &st, &cnt, &sf), -EPROTO);
	CHECK_EQ(f.bytes, grow);

	/* group 300 of 400 (a 12.8 KiB page): 4 KiB, then 16 KiB, and the
	 * next poll starts at 16 KiB */
	memset(&r, 0, sizeof(r));
	fake_ana_page(&f, 400, 400, 3);
	f.page[16 + 32 * 299 + 16] = NVME_ANA_OPTIMIZED;
	f.page[16 + 32 * 299 + 8] = 42;
	CHECK_EQ(fx_nvmf_ana_read(&r, fake_ana_read, &f, 0, 300, &st, &cnt, &sf), 0);
	CHECK_EQ(st, NVME_ANA_OPTIMIZED);
	CHECK_EQ(cnt, 42);
	CHECK_EQ(f.bytes, 4096 + 16384);
	f.bytes = 0;
	CHECK_EQ(fx_nvmf_ana_read(&r, fake_ana_read, &f, 0, 300, &st, &cnt, &sf), 0);
	CHECK_EQ(f.bytes, 16384);
	CHECK_EQ(fx_nvmf_ana_read(&r, fake_ana_read, &f, 0, 401, &st, &cnt, &sf), -ENOENT);

	/* MDTS 4 KiB: four chunks of at most 4 KiB, then the header again */
	f.bytes = 0;
	f.max_chunk = 0;
	CHECK_EQ(fx_nvmf_ana_read(&r, fake_ana_read, &f, 4096, 300, &st, &cnt, &sf), 0);
	CHECK_EQ(f.max_chunk, 4096);
	CHECK_EQ(f.bytes, 16384 + 16);
	/* torn between chunks once: read again, and the answer is right */
	f.bytes = 0;
	f.torn = 1;
	CHECK_EQ(fx_nvmf_ana_read(&r, fake_ana_read, &f, 4096, 300, &st, &cnt, &sf), 0);
	CHECK_EQ(st, NVME_ANA_OPTIMIZED);
	CHECK_EQ(f.bytes, 2 * (16384 + 16));
	/* torn every time: -EAGAIN after the second read, no third */
	f.bytes = 0;
	f.torn = 100;
	CHECK_EQ(fx_nvmf_ana_read(&r, fake_ana_read, &f, 4096, 300, &st, &cnt, &sf), -EAGAIN);
	CHECK_EQ(f.bytes, 2 * (16384 + 16));
	f.torn = 0;

	CHECK_EQ(f.lsp, NVME_ANA_LSP_RGO);
	/* a controller that refuses RGO: asked once with it, then without */
	f.rgo_invalid = 1;
	f.bytes = 0;
	CHECK_EQ(fx_nvmf_ana_read(&r, fake_ana_read, &f, 0, 300, &st, &cnt, &sf), 0);
	CHECK_EQ(st, NVME_ANA_OPTIMIZED);
	CHECK_EQ(f.bytes, 2 * 16384);
	CHECK_EQ(f.lsp, 0);
	f.bytes = 0;
	CHECK_EQ(fx_nvmf_ana_read(&r, fake_ana_read, &f, 0, 300, &st, &cnt, &sf), 0);
	CHECK_EQ(f.bytes, 16384);
	CHECK_EQ(f.lsp, 0);
	f.rgo_invalid = 0;
	/* the controller's error comes back with its status */
	f.fail = 0x0109;
	CHECK_EQ(fx_nvmf_ana_read(&r, fake_ana_read, &f, 0, 300, &st, &cnt, &sf), -EIO);
	CHECK_EQ(sf, 0x0109);
	f.fail = 0;
	/* a remembered length out of range (never stored so, but held to
	 * bounds all the same) starts at 4 KiB */
	r.len = 1u << 30;
	f.bytes = 0;
	CHECK_EQ(fx_nvmf_ana_read(&r, fake_ana_read, &f, 0, 300, &st, &cnt, &sf), 0);
	CHECK_EQ(f.bytes, 4096 + 16384);
}

int main(void)
{
	uint64_t s = test_seed();

	for (size_t i = 0; i < sizeof(pattern); i++)
		pattern[i] = (uint8_t)test_rand(&s);
	test_exec();
	use_tls = 1;
	printf("(again, inside a TLS secure channel)\n");
	test_exec();
	use_tls = 0;
	test_connect();
	test_ctrl();
	test_ana_log();
	test_ana_read();
	printf("test_nvmf_exec: ok\n");
	return 0;
}
