/*
 * transport/tcp.c's connection state machine without a network: the
 * receive path fed controller byte streams through the fuzz harness's fake
 * io_uring (tests/fuzz/fuzz_tcp_rx.c, included), deterministic cases for
 * each write-path rule, the ring refusing SQEs or submits, and a replay of
 * the fuzz corpus (tests/fuzz/corpus/tcp_rx) as regression inputs.
 *
 *   test_tcp_conn                  run the cases and the corpus
 *   test_tcp_conn --write-seeds D  write the cases' streams as seeds into D
 */
#include "../fuzz/fuzz_tcp_rx.c"

#include <dirent.h>

#include "check.h"

/* ------------------------------------------------------- stream builder */

struct stream {
	uint8_t *b;
	size_t n, cap;
	uint8_t cfg;
};

static void st_put(struct stream *s, const void *p, size_t n)
{
	if (s->n + n > s->cap) {
		s->cap = (s->n + n) * 2;
		s->b = realloc(s->b, s->cap);
		CHECK(s->b);
	}
	memcpy(s->b + s->n, p, n);
	s->n += n;
}

static void st_init(struct stream *s, uint8_t cfg)
{
	memset(s, 0, sizeof(*s));
	s->cfg = cfg;
	st_put(s, &cfg, 1);
}

/* Bytes from the controller, in socket-chunks of at most 256. */
static void st_recv(struct stream *s, const void *p, size_t n)
{
	const uint8_t *q = p;

	while (n) {
		size_t k = n < 256 ? n : 256;
		uint8_t op[2] = {0, (uint8_t)(k - 1)};

		st_put(s, op, 2);
		st_put(s, q, k);
		q += k;
		n -= k;
	}
}

/* The pending sendmsg completes in full (a no-op if none is pending). */
static void st_send(struct stream *s)
{
	uint8_t op[2] = {2, 0};

	st_put(s, op, 2);
}

static void st_send_part(struct stream *s)
{
	uint8_t op[2] = {2, 200};

	st_put(s, op, 2);
}

static void st_tick(struct stream *s)
{
	uint8_t op = 3;

	st_put(s, &op, 1);
}

/* A PDU as the controller would send it with this stream's digests. */
static void st_pdu(struct stream *s, void *hdr, uint8_t type, const void *data, uint32_t dlen,
		   uint8_t extra_flags)
{
	struct nvme_tcp_hdr *h = hdr;
	int hd = s->cfg & 1, dd = !!(s->cfg & 2);
	unsigned hlen = fx_tcp_pdu_hlen(type);
	unsigned pdo = fx_tcp_hdr_init(h, type, dlen, hd, dd, 0);
	uint8_t out[64];
	unsigned n;

	h->flags |= extra_flags;
	memcpy(out, hdr, hlen);
	n = hlen;
	if (hd) {
		uint32_t d = fx_tcp_hdgst(hdr, hlen);

		memcpy(out + n, &d, 4);
		n += 4;
	}
	while (dlen && n < pdo)
		out[n++] = 0;
	st_recv(s, out, n);
	if (dlen) {
		st_recv(s, data, dlen);
		if (dd) {
			uint32_t d = fx_crc32c(0, data, dlen);

			st_recv(s, &d, 4);
		}
	}
}

static void st_rsp(struct stream *s, uint16_t cid, uint16_t sf)
{
	uint8_t pdu[24];
	struct nvme_cqe cqe;

	memset(pdu, 0, sizeof(pdu));
	memset(&cqe, 0, sizeof(cqe));
	cqe.cid = cid;
	cqe.status = (uint16_t)(sf << 1);
	memcpy(pdu + 8, &cqe, sizeof(cqe));
	st_pdu(s, pdu, NVME_TCP_RSP, NULL, 0, 0);
}

static uint8_t pattern[1 << 16];

static void st_c2h(struct stream *s, uint16_t cid, uint32_t datao, uint32_t datal, uint8_t flags)
{
	struct nvme_tcp_data_pdu d;

	memset(&d, 0, sizeof(d));
	d.cccid = cid;
	d.datao = datao;
	d.datal = datal;
	st_pdu(s, &d, NVME_TCP_C2H_DATA, pattern + datao, datal, flags);
}

static void st_r2t(struct stream *s, uint16_t cid, uint32_t r2to, uint32_t r2tl)
{
	struct nvme_tcp_r2t_pdu r;

	memset(&r, 0, sizeof(r));
	r.cccid = cid;
	r.ttag = 9;
	r.r2to = r2to;
	r.r2tl = r2tl;
	st_pdu(s, &r, NVME_TCP_R2T, NULL, 0, 0);
}

/* CIDs of the harness's commands (see h_reqs) */
#define CID(slot) ((uint16_t)(0x400 | (slot)))
enum { C_RD0, C_WR_INCAP, C_RD2A, C_RD2B, C_RD2C, C_WR3A, C_WR3B, C_FLUSH, C_RD5 };
/* request index of each command */
enum { R_RD0, R_WR_INCAP, R_RD2, R_WR3, R_FLUSH, R_RD5 };

/* Everything answered correctly: reads in two C2HData (the last one with
 * SUCCESS for one of them), writes by R2T split at MAXH2CDATA, responses. */
static void good_stream(struct stream *s, int partial_sends)
{
	/* the nine capsules go out in one batch (the second send finds none) */
	for (int i = 0; i < 2; i++) {
		if (s->cfg & 0x10)
			st_tick(s); /* let them out through the one-entry SQ */
		st_send(s);
	}
	st_c2h(s, CID(C_RD0), 0, 1024, 0);
	st_c2h(s, CID(C_RD0), 1024, 3072, NVME_TCP_F_DATA_LAST);
	st_rsp(s, CID(C_RD0), 0);
	st_rsp(s, CID(C_WR_INCAP), 0);
	st_c2h(s, CID(C_RD2A), 0, 8192, NVME_TCP_F_DATA_LAST | NVME_TCP_F_DATA_SUCCESS);
	st_c2h(s, CID(C_RD2B), 0, 8192, NVME_TCP_F_DATA_LAST);
	st_rsp(s, CID(C_RD2B), 0);
	st_c2h(s, CID(C_RD2C), 0, 4096, NVME_TCP_F_DATA_LAST);
	st_rsp(s, CID(C_RD2C), 0);
	st_r2t(s, CID(C_WR3A), 0, 4096);
	if (s->cfg & 0x10)
		st_tick(s);
	if (partial_sends)
		st_send_part(s);
	st_send(s);
	st_r2t(s, CID(C_WR3A), 4096, 4096);
	if (s->cfg & 0x10)
		st_tick(s);
	st_send(s);
	st_rsp(s, CID(C_WR3A), 0);
	st_r2t(s, CID(C_WR3B), 0, 4096);
	if (s->cfg & 0x10)
		st_tick(s);
	if (partial_sends)
		st_send_part(s);
	st_send(s);
	st_send(s);
	st_rsp(s, CID(C_WR3B), 0);
	st_rsp(s, CID(C_FLUSH), 0);
	st_c2h(s, CID(C_RD5), 0, 512, NVME_TCP_F_DATA_LAST | NVME_TCP_F_DATA_SUCCESS);
}

static void run(const struct stream *s, const char *what)
{
	printf("  %-52s", what);
	fflush(stdout);
	h_run(s->b, s->n);
}

static void expect_all_ok(const char *what)
{
	for (unsigned i = 0; i < H_NREQ; i++)
		CHECK_EQ(H.reqs[i].res, h_reqs[i].len);
	(void)what;
	printf(" all %zu requests done\n", H_NREQ);
}

/* The write request failed with -EPROTO and the connection went down
 * (so every other request still in flight failed too, none was lost). */
static void expect_proto(const char *what, unsigned req)
{
	CHECK_EQ(H.reqs[req].res, -EPROTO);
	CHECK_EQ(H.c->state, CONN_DOWN);
	CHECK_EQ(H.c->err, -EPROTO);
	(void)what;
	printf(" -> request %u: %s\n", req, strerror((int)-H.reqs[req].res));
}

/* Streams worth keeping as fuzz seeds. */
static struct {
	const char *name;
	struct stream s;
} seeds[16];
static unsigned nseeds;

static void keep(const char *name, struct stream *s)
{
	seeds[nseeds].name = name;
	seeds[nseeds++].s = *s;
	s->b = NULL;
}

/* good_stream() sends each read command's data from pattern[0]: a request
 * cut into commands of H_MAX_XFER holds that prefix once per command. */
static unsigned reads_checked;

static void check_read(unsigned req, const char *buf, uint32_t len)
{
	for (uint32_t off = 0; off < len; off += H_MAX_XFER) {
		uint32_t n = len - off < H_MAX_XFER ? len - off : H_MAX_XFER;

		CHECK(memcmp(buf + off, pattern, n) == 0);
	}
	(void)req;
	reads_checked++;
}

static void test_good(void)
{
	static const struct {
		uint8_t cfg;
		int partial;
		const char *name, *seed;
	} v[] = {
		{0x00, 0, "good stream", "good"},
		{0x03, 0, "good stream, header and data digests", "good-digests"},
		{0x01, 1, "good stream, header digest, short sends", "good-short-sends"},
		{0x14, 0, "good stream, one-entry SQ (get_sqe NULL)", "good-one-sqe"},
		{0x80, 0, "good stream, bulk receives", "good-staged"},
		{0x83, 0, "good stream, bulk receives, digests", "good-staged-digests"},
		{0x81, 1, "good stream, bulk receives, short sends", "good-staged-short-sends"},
		{0x94, 0, "good stream, bulk receives, one-entry SQ", "good-staged-one-sqe"},
	};
	for (unsigned i = 0; i < sizeof(v) / sizeof(v[0]); i++) {
		struct stream s;

		st_init(&s, v[i].cfg);
		good_stream(&s, v[i].partial);
		reads_checked = 0;
		h_read_check = check_read;
		run(&s, v[i].name);
		h_read_check = NULL;
		expect_all_ok(v[i].name);
		CHECK_EQ(reads_checked, 3); /* every read's bytes as sent */
		h_teardown();
		keep(v[i].seed, &s);
	}
}

/* The write of 12288 bytes is commands C_WR3A (8192) and C_WR3B (4096);
 * each case breaks a rule on C_WR3A (MAXH2CDATA 4096). */
static void test_write_rules(void)
{
	struct stream s;

	/* An R2T flood: the same range requested 65536 times before any of
	 * our sends completes.  With a 16-bit count of queued sends, 65536
	 * H2CData items wrapped it to 0, the response completed the command
	 * (and its request, reported written) while they still pointed into
	 * the buffer the caller then freed: the sends read freed memory. */
	st_init(&s, 0);
	st_send(&s);
	st_send(&s);
	st_r2t(&s, CID(C_WR3A), 0, 8192);
	st_send(&s);
	st_rsp(&s, CID(C_WR3A), 0);
	for (int i = 0; i < 65536; i++)
		st_r2t(&s, CID(C_WR3B), 0, 4096);
	st_rsp(&s, CID(C_WR3B), 0);
	for (int i = 0; i < 8; i++)
		st_send(&s);
	run(&s, "65536 R2Ts for the same range, then success");
	expect_proto("65536 R2Ts for the same range, then success", R_WR3);
	h_teardown();
	free(s.b);

	st_init(&s, 0);
	st_send(&s);
	st_send(&s);
	st_r2t(&s, CID(C_WR3A), 0, 8192);
	st_send(&s);
	st_rsp(&s, CID(C_WR3A), 0);
	for (int i = 0; i < 50; i++)
		st_r2t(&s, CID(C_WR3B), 0, 4096);
	st_rsp(&s, CID(C_WR3B), 0);
	keep("r2t-flood", &s);

	st_init(&s, 0);
	st_send(&s);
	st_send(&s);
	st_r2t(&s, CID(C_WR3A), 0, 8192);
	st_send(&s);
	st_r2t(&s, CID(C_WR3A), 0, 8192);
	st_send(&s);
	st_rsp(&s, CID(C_WR3A), 0);
	run(&s, "R2T repeating data already sent");
	expect_proto("R2T repeating data already sent", R_WR3);
	h_teardown();
	free(s.b);

	/* our H2CData for the first R2T has not gone out yet */
	st_init(&s, 0);
	st_send(&s);
	st_send(&s);
	st_r2t(&s, CID(C_WR3A), 0, 4096);
	st_r2t(&s, CID(C_WR3A), 4096, 4096);
	st_send(&s);
	st_send(&s);
	st_rsp(&s, CID(C_WR3A), 0);
	run(&s, "second R2T while the first is outstanding");
	expect_proto("second R2T while the first is outstanding", R_WR3);
	h_teardown();
	free(s.b);

	st_init(&s, 0);
	st_send(&s);
	st_send(&s);
	st_r2t(&s, CID(C_WR3A), 4096, 4096);
	st_send(&s);
	st_r2t(&s, CID(C_WR3A), 0, 4096);
	st_send(&s);
	st_rsp(&s, CID(C_WR3A), 0);
	run(&s, "R2Ts out of order");
	expect_proto("R2Ts out of order", R_WR3);
	h_teardown();
	free(s.b);

	st_init(&s, 0);
	st_send(&s);
	st_send(&s);
	st_r2t(&s, CID(C_WR3A), 0, 8192 + 512);
	run(&s, "R2T past the end");
	expect_proto("R2T past the end", R_WR3);
	h_teardown();
	free(s.b);

	st_init(&s, 0);
	st_send(&s);
	st_send(&s);
	st_r2t(&s, CID(C_WR3A), 0, 4096);
	st_send(&s);
	st_r2t(&s, CID(C_WR3A), 4096, 0xffffffffu - 4096 + 512);
	run(&s, "R2T whose end wraps 32 bits");
	expect_proto("R2T whose end wraps 32 bits", R_WR3);
	h_teardown();
	free(s.b);

	st_init(&s, 0);
	st_send(&s);
	st_send(&s);
	st_r2t(&s, CID(C_WR3A), 0, 4096);
	st_send(&s);
	st_rsp(&s, CID(C_WR3A), 0);
	run(&s, "success after half the data");
	expect_proto("success after half the data", R_WR3);
	h_teardown();
	free(s.b);

	st_init(&s, 0);
	st_send(&s);
	st_send(&s);
	st_rsp(&s, CID(C_WR3A), 0);
	run(&s, "success without any R2T");
	expect_proto("success without any R2T", R_WR3);
	h_teardown();
	free(s.b);

	/* the response arrives before our H2CData went out, then the
	 * sends complete: still only half the data was asked for */
	st_init(&s, 0);
	st_send(&s);
	st_send(&s);
	st_r2t(&s, CID(C_WR3A), 0, 4096);
	st_rsp(&s, CID(C_WR3A), 0);
	st_send(&s);
	run(&s, "early success while H2CData is queued");
	expect_proto("early success while H2CData is queued", R_WR3);
	h_teardown();
	free(s.b);

	st_init(&s, 0);
	st_send(&s);
	st_send(&s);
	st_r2t(&s, CID(C_WR_INCAP), 0, 1024);
	st_send(&s);
	st_rsp(&s, CID(C_WR_INCAP), 0);
	run(&s, "R2T for data sent in the capsule");
	expect_proto("R2T for data sent in the capsule", R_WR_INCAP);
	h_teardown();
	free(s.b);

	st_init(&s, 0);
	st_send(&s);
	st_send(&s);
	st_r2t(&s, CID(C_RD0), 0, 4096);
	run(&s, "R2T for a read");
	expect_proto("R2T for a read", R_RD0);
	h_teardown();
	free(s.b);

	st_init(&s, 0);
	st_send(&s);
	st_send(&s);
	st_c2h(&s, CID(C_RD0), 0, 4096, NVME_TCP_F_DATA_SUCCESS);
	st_rsp(&s, CID(C_RD0), 0);
	run(&s, "C2HData SUCCESS without LAST_PDU");
	expect_proto("C2HData SUCCESS without LAST_PDU", R_RD0);
	h_teardown();
	free(s.b);

	st_init(&s, 0);
	st_send(&s);
	st_send(&s);
	st_c2h(&s, CID(C_WR3A), 0, 4096, NVME_TCP_F_DATA_LAST | NVME_TCP_F_DATA_SUCCESS);
	run(&s, "C2HData answering a write");
	expect_proto("C2HData answering a write", R_WR3);
	h_teardown();
	free(s.b);
}

/* io_uring_submit fails for good (here -EBADF): the requests must all
 * complete with that error instead of waiting for I/O never started. */
static void test_submit_fails(void)
{
	struct stream s;

	st_init(&s, 0x20);
	st_tick(&s);
	run(&s, "io_uring_submit fails");
	for (unsigned i = 0; i < H_NREQ; i++)
		CHECK_EQ(H.reqs[i].res, -EBADF);
	CHECK_EQ(H.c->state, CONN_DOWN);
	printf(" all requests: %s\n", strerror(EBADF));
	h_teardown();
	keep("submit-fails", &s);
}

/* Every command past its deadline: the first tick takes the connection
 * down and every request fails with -ETIMEDOUT, even with sends queued. */
static void test_deadline(void)
{
	struct stream s;

	st_init(&s, 0x40);
	st_send(&s);
	st_tick(&s);
	run(&s, "commands past their deadline");
	for (unsigned i = 0; i < H_NREQ; i++)
		CHECK_EQ(H.reqs[i].res, -ETIMEDOUT);
	CHECK_EQ(H.c->state, CONN_DOWN);
	printf(" all requests: %s\n", strerror(ETIMEDOUT));
	h_teardown();
	keep("deadline", &s);
}

static void replay(const char *dir)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	unsigned n = 0;

	if (!d) {
		printf("  corpus %s: not found, skipped\n", dir);
		return;
	}
	while ((e = readdir(d))) {
		char path[4096];
		FILE *f;
		static uint8_t buf[1 << 22];
		size_t len;

		if (e->d_name[0] == '.')
			continue;
		snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
		f = fopen(path, "rb");
		if (!f)
			continue;
		len = fread(buf, 1, sizeof(buf), f);
		fclose(f);
		LLVMFuzzerTestOneInput(buf, len);
		n++;
	}
	closedir(d);
	printf("  corpus %s: %u inputs replayed\n", dir, n);
}

int main(int argc, char **argv)
{
	uint64_t seed = test_seed();

	for (size_t i = 0; i < sizeof(pattern); i++)
		pattern[i] = (uint8_t)test_rand(&seed);
	printf("tcp.c receive path against scripted controller streams:\n");
	test_good();
	test_write_rules();
	test_submit_fails();
	test_deadline();
	if (argc == 3 && !strcmp(argv[1], "--write-seeds")) {
		for (unsigned i = 0; i < nseeds; i++) {
			char path[4096];
			FILE *f;

			snprintf(path, sizeof(path), "%s/%s", argv[2], seeds[i].name);
			f = fopen(path, "wb");
			CHECK(f);
			CHECK_EQ(fwrite(seeds[i].s.b, 1, seeds[i].s.n, f), seeds[i].s.n);
			fclose(f);
		}
		printf("  %u seeds written to %s\n", nseeds, argv[2]);
	}
	replay(argc == 2 ? argv[1] : "../fuzz/corpus/tcp_rx");
	for (unsigned i = 0; i < nseeds; i++)
		free(seeds[i].s.b);
	printf("test_tcp_conn: ok\n");
	return 0;
}
