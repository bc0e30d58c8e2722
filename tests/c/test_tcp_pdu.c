/*
 * nvme_tcp/pdu.c and nvme_tcp/xfer.c without a network: a table of good and
 * bad common headers for both directions and digest settings, the header
 * digest against a CRC32C computed independently, fx_tcp_hdr_init's output
 * fed back through fx_tcp_pdu_check (what one side builds, the other must
 * accept), and the PDUs fx_tcp_head_finish, fx_tcp_pdu_iov and
 * fx_tcp_term_build lay out.
 */
#include "nvme_tcp/pdu.h"
#include "nvme_tcp/xfer.h"
#include "auth/auth_msg.h"
#include "check.h"

#include <errno.h>
#include <string.h>

#define H2C 0 /* received by the controller */
#define C2H 1 /* received by the host */
#define MAXP 65536u

struct hcase {
	const char *what;
	int from_ctrl, hdgst, ddgst;
	uint8_t type, flags, hlen, pdo;
	uint32_t plen;
	int want; /* header bytes to read, or -EPROTO */
};

#define HD NVME_TCP_F_HDGST
#define DD NVME_TCP_F_DDGST
#define LAST NVME_TCP_F_DATA_LAST
#define SUCC NVME_TCP_F_DATA_SUCCESS

static const struct hcase cases[] = {
	/* initialize connection */
	{"icresp", C2H, 0, 0, NVME_TCP_ICRESP, 0, 128, 0, 128, 128},
	{"icresp digests ignored before negotiation", C2H, 1, 1, NVME_TCP_ICRESP, 0, 128, 0, 128,
	 128},
	{"icresp with HDGSTF", C2H, 0, 0, NVME_TCP_ICRESP, HD, 128, 0, 128, -EPROTO},
	{"icresp short plen", C2H, 0, 0, NVME_TCP_ICRESP, 0, 128, 0, 127, -EPROTO},
	{"icresp long plen", C2H, 0, 0, NVME_TCP_ICRESP, 0, 128, 0, 132, -EPROTO},
	{"icresp bad hlen", C2H, 0, 0, NVME_TCP_ICRESP, 0, 24, 0, 128, -EPROTO},
	{"icreq to the host", C2H, 0, 0, NVME_TCP_ICREQ, 0, 128, 0, 128, -EPROTO},
	{"icreq", H2C, 0, 0, NVME_TCP_ICREQ, 0, 128, 0, 128, 128},
	{"icresp to the controller", H2C, 0, 0, NVME_TCP_ICRESP, 0, 128, 0, 128, -EPROTO},
	/* unknown types */
	{"type 0x08 (reserved)", C2H, 0, 0, 0x08, 0, 24, 0, 24, -EPROTO},
	{"type 0xff", H2C, 0, 0, 0xff, 0, 24, 0, 24, -EPROTO},
	/* terminate */
	{"c2hterm bare", C2H, 0, 0, NVME_TCP_C2H_TERM, 0, 24, 0, 24, 24},
	{"c2hterm with 152 bytes of pdu", C2H, 1, 1, NVME_TCP_C2H_TERM, 0, 24, 0, 176, 24},
	{"c2hterm too long", C2H, 0, 0, NVME_TCP_C2H_TERM, 0, 24, 0, 177, -EPROTO},
	{"c2hterm with digest flag", C2H, 1, 0, NVME_TCP_C2H_TERM, HD, 24, 0, 28, -EPROTO},
	{"c2hterm plen < hlen", C2H, 0, 0, NVME_TCP_C2H_TERM, 0, 24, 0, 8, -EPROTO},
	{"h2cterm", H2C, 0, 0, NVME_TCP_H2C_TERM, 0, 24, 0, 40, 24},
	{"h2cterm to the host", C2H, 0, 0, NVME_TCP_H2C_TERM, 0, 24, 0, 24, -EPROTO},
	/* capsule response */
	{"rsp", C2H, 0, 0, NVME_TCP_RSP, 0, 24, 0, 24, 24},
	{"rsp hdgst", C2H, 1, 0, NVME_TCP_RSP, HD, 24, 0, 28, 28},
	{"rsp hdgst+ddgst (no data: no DDGSTF)", C2H, 1, 1, NVME_TCP_RSP, HD, 24, 0, 28, 28},
	{"rsp missing HDGSTF", C2H, 1, 0, NVME_TCP_RSP, 0, 24, 0, 28, -EPROTO},
	{"rsp unexpected HDGSTF", C2H, 0, 0, NVME_TCP_RSP, HD, 24, 0, 28, -EPROTO},
	{"rsp DDGSTF", C2H, 0, 1, NVME_TCP_RSP, DD, 24, 0, 28, -EPROTO},
	{"rsp trailing bytes", C2H, 0, 0, NVME_TCP_RSP, 0, 24, 24, 32, -EPROTO},
	{"rsp plen short of digest", C2H, 1, 0, NVME_TCP_RSP, HD, 24, 0, 24, -EPROTO},
	{"rsp bad hlen", C2H, 0, 0, NVME_TCP_RSP, 0, 72, 0, 72, -EPROTO},
	{"rsp to the controller", H2C, 0, 0, NVME_TCP_RSP, 0, 24, 0, 24, -EPROTO},
	/* r2t */
	{"r2t", C2H, 0, 0, NVME_TCP_R2T, 0, 24, 0, 24, 24},
	{"r2t hdgst", C2H, 1, 1, NVME_TCP_R2T, HD, 24, 0, 28, 28},
	{"r2t with data", C2H, 0, 0, NVME_TCP_R2T, 0, 24, 24, 40, -EPROTO},
	/* c2h data */
	{"c2hdata", C2H, 0, 0, NVME_TCP_C2H_DATA, LAST, 24, 24, 24 + 4096, 24},
	{"c2hdata success", C2H, 0, 0, NVME_TCP_C2H_DATA, LAST | SUCC, 24, 24, 25, 24},
	{"c2hdata digests", C2H, 1, 1, NVME_TCP_C2H_DATA, HD | DD | LAST, 24, 28, 28 + 512 + 4, 28},
	{"c2hdata ddgst only", C2H, 0, 1, NVME_TCP_C2H_DATA, DD, 24, 24, 24 + 8 + 4, 24},
	{"c2hdata aligned pdo", C2H, 1, 0, NVME_TCP_C2H_DATA, HD, 24, 32, 32 + 100, 28},
	{"c2hdata missing DDGSTF", C2H, 1, 1, NVME_TCP_C2H_DATA, HD, 24, 28, 28 + 512, -EPROTO},
	{"c2hdata unexpected DDGSTF", C2H, 0, 0, NVME_TCP_C2H_DATA, DD, 24, 24, 24 + 516, -EPROTO},
	{"c2hdata empty", C2H, 0, 0, NVME_TCP_C2H_DATA, LAST, 24, 24, 24, -EPROTO},
	{"c2hdata empty with digests", C2H, 1, 1, NVME_TCP_C2H_DATA, HD | DD, 24, 28, 28 + 4,
	 -EPROTO},
	{"c2hdata pdo inside header", C2H, 0, 0, NVME_TCP_C2H_DATA, 0, 24, 16, 24 + 64, -EPROTO},
	{"c2hdata pdo inside hdgst", C2H, 1, 0, NVME_TCP_C2H_DATA, HD, 24, 24, 28 + 64, -EPROTO},
	{"c2hdata pdo at plen", C2H, 0, 0, NVME_TCP_C2H_DATA, 0, 24, 88, 88, -EPROTO},
	{"c2hdata pdo past plen", C2H, 0, 0, NVME_TCP_C2H_DATA, 0, 24, 200, 88, -EPROTO},
	{"c2hdata pdo on ddgst", C2H, 0, 1, NVME_TCP_C2H_DATA, DD, 24, 84, 88, -EPROTO},
	{"c2hdata plen at max", C2H, 0, 0, NVME_TCP_C2H_DATA, 0, 24, 24, MAXP, 24},
	{"c2hdata plen over max", C2H, 0, 0, NVME_TCP_C2H_DATA, 0, 24, 24, MAXP + 1, -EPROTO},
	{"c2hdata plen 4 GiB-1", C2H, 0, 0, NVME_TCP_C2H_DATA, 0, 24, 24, 0xffffffffu, -EPROTO},
	{"c2hdata to the controller", H2C, 0, 0, NVME_TCP_C2H_DATA, 0, 24, 24, 64, -EPROTO},
	{"h2cdata to the host", C2H, 0, 0, NVME_TCP_H2C_DATA, 0, 24, 24, 64, -EPROTO},
	/* capsule command */
	{"cmd no data", H2C, 0, 0, NVME_TCP_CMD, 0, 72, 0, 72, 72},
	{"cmd no data hdgst+ddgst", H2C, 1, 1, NVME_TCP_CMD, HD, 72, 0, 76, 76},
	{"cmd in-capsule", H2C, 0, 0, NVME_TCP_CMD, 0, 72, 72, 72 + 1024, 72},
	{"cmd in-capsule digests", H2C, 1, 1, NVME_TCP_CMD, HD | DD, 72, 76, 76 + 1024 + 4, 76},
	{"cmd no data but DDGSTF", H2C, 1, 1, NVME_TCP_CMD, HD | DD, 72, 0, 76, -EPROTO},
	{"cmd bad hlen", H2C, 0, 0, NVME_TCP_CMD, 0, 24, 0, 72, -EPROTO},
	{"cmd to the host", C2H, 0, 0, NVME_TCP_CMD, 0, 72, 0, 72, -EPROTO},
	/* h2c data */
	{"h2cdata", H2C, 0, 0, NVME_TCP_H2C_DATA, LAST, 24, 24, 24 + 8192, 24},
	{"h2cdata digests", H2C, 1, 1, NVME_TCP_H2C_DATA, HD | DD, 24, 28, 28 + 8192 + 4, 28},
	{"h2cdata missing HDGSTF", H2C, 1, 0, NVME_TCP_H2C_DATA, 0, 24, 28, 28 + 8192, -EPROTO},
};

static void test_table(void)
{
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		const struct hcase *c = &cases[i];
		struct nvme_tcp_hdr h = {
			.type = c->type,
			.flags = c->flags,
			.hlen = c->hlen,
			.pdo = c->pdo,
			.plen = c->plen,
		};
		int r = fx_tcp_pdu_check(&h, c->from_ctrl, c->hdgst, c->ddgst, MAXP);

		if (r != c->want) {
			fprintf(stderr, "case %zu \"%s\": got %d want %d\n", i, c->what, r,
				c->want);
			CHECK_EQ(r, c->want);
		}
	}
	printf("header table: %zu cases\n", sizeof(cases) / sizeof(cases[0]));
}

static void test_hlen(void)
{
	CHECK_EQ(fx_tcp_pdu_hlen(NVME_TCP_ICREQ), 128);
	CHECK_EQ(fx_tcp_pdu_hlen(NVME_TCP_ICRESP), 128);
	CHECK_EQ(fx_tcp_pdu_hlen(NVME_TCP_H2C_TERM), 24);
	CHECK_EQ(fx_tcp_pdu_hlen(NVME_TCP_C2H_TERM), 24);
	CHECK_EQ(fx_tcp_pdu_hlen(NVME_TCP_CMD), 72);
	CHECK_EQ(fx_tcp_pdu_hlen(NVME_TCP_RSP), 24);
	CHECK_EQ(fx_tcp_pdu_hlen(NVME_TCP_H2C_DATA), 24);
	CHECK_EQ(fx_tcp_pdu_hlen(NVME_TCP_C2H_DATA), 24);
	CHECK_EQ(fx_tcp_pdu_hlen(NVME_TCP_R2T), 24);
	CHECK_EQ(fx_tcp_pdu_hlen(0x08), 0);
	CHECK_EQ(fx_tcp_pdu_hlen(0x0a), 0);
	CHECK_EQ(fx_tcp_pdu_hlen(0xff), 0);
}

/* Bitwise CRC32C, independent of fx_crc32c's table/SSE paths. */
static uint32_t ref_crc32c(const uint8_t *p, size_t n)
{
	uint32_t c = ~0u;

	while (n--) {
		c ^= *p++;
		for (int k = 0; k < 8; k++)
			c = (c & 1) ? (c >> 1) ^ 0x82f63b78u : c >> 1;
	}
	return ~c;
}

static void test_hdgst(void)
{
	/* The NVMe/TCP header digest is plain CRC32C over the header bytes. */
	CHECK_EQ(fx_tcp_hdgst("123456789", 9), 0xE3069283u);

	uint8_t buf[128];
	uint64_t s = test_seed();

	for (size_t i = 0; i < sizeof(buf); i++)
		buf[i] = (uint8_t)test_rand(&s);
	for (unsigned n = 0; n <= sizeof(buf); n++)
		CHECK_EQ(fx_tcp_hdgst(buf, n), ref_crc32c(buf, n));
}

/* What hdr_init builds is what check accepts on the other side. */
static void test_init_roundtrip(void)
{
	static const uint8_t types[] = {NVME_TCP_CMD, NVME_TCP_H2C_DATA, NVME_TCP_C2H_DATA,
					NVME_TCP_RSP, NVME_TCP_R2T};
	static const uint32_t lens[] = {0, 1, 512, 4096, 8192};

	for (size_t t = 0; t < sizeof(types); t++) {
		uint8_t type = types[t];
		int to_host = type == NVME_TCP_C2H_DATA || type == NVME_TCP_RSP ||
			      type == NVME_TCP_R2T;
		int carries = type != NVME_TCP_RSP && type != NVME_TCP_R2T;

		for (int hd = 0; hd <= 1; hd++)
			for (int dd = 0; dd <= 1; dd++)
				for (size_t l = 0; l < sizeof(lens) / sizeof(lens[0]); l++)
					for (unsigned pda = 0; pda < 32; pda += 7) {
						uint32_t len = carries ? lens[l] : 0;
						struct nvme_tcp_hdr h;
						unsigned hlen = fx_tcp_pdu_hlen(type);
						unsigned hdl = hd ? 4 : 0;
						unsigned pdo = fx_tcp_hdr_init(&h, type, len, hd,
									       dd, (uint8_t)pda);

						CHECK_EQ(h.type, type);
						CHECK_EQ(h.hlen, hlen);
						CHECK_EQ(!!(h.flags & HD), hd);
						CHECK_EQ(!!(h.flags & DD), dd && len);
						if (len) {
							CHECK_EQ(pdo, h.pdo);
							CHECK(pdo >= hlen + hdl);
							CHECK_EQ(pdo % ((pda + 1) * 4), 0);
							CHECK(pdo < hlen + hdl + (pda + 1) * 4);
							CHECK_EQ(h.plen, pdo + len + (dd ? 4 : 0));
						} else {
							CHECK_EQ(pdo, 0);
							CHECK_EQ(h.pdo, 0);
							CHECK_EQ(h.plen, hlen + hdl);
						}
						/* Data PDUs must carry data. */
						if (!len && (type == NVME_TCP_H2C_DATA ||
							     type == NVME_TCP_C2H_DATA))
							continue;
						CHECK_EQ(
							fx_tcp_pdu_check(&h, to_host, hd, dd, MAXP),
							(int)(hlen + hdl));
						/* ...and the other direction refuses it. */
						CHECK_EQ(fx_tcp_pdu_check(&h, !to_host, hd, dd,
									  MAXP),
							 -EPROTO);
						/* ...as does a peer with other digests. */
						CHECK_EQ(fx_tcp_pdu_check(&h, to_host, !hd, dd,
									  MAXP),
							 -EPROTO);
					}
	}

	/* IC and Term PDUs never get digest flags, even when asked. */
	struct nvme_tcp_hdr h;

	CHECK_EQ(fx_tcp_hdr_init(&h, NVME_TCP_ICREQ, 0, 1, 1, 0), 0);
	CHECK_EQ(h.flags, 0);
	CHECK_EQ(h.plen, 128);
	CHECK_EQ(fx_tcp_pdu_check(&h, 0, 1, 1, MAXP), 128);
	CHECK_EQ(fx_tcp_hdr_init(&h, NVME_TCP_H2C_TERM, 0, 1, 1, 0), 0);
	CHECK_EQ(h.flags, 0);
	CHECK_EQ(h.plen, 24);
	CHECK_EQ(fx_tcp_pdu_check(&h, 0, 1, 1, MAXP), 24);
}

/* Every single-field corruption of a valid C2HData header either stays
 * valid by the rules or is refused: never a length that escapes plen. */
static void test_fuzz(void)
{
	uint64_t s = test_seed();
	unsigned accepted = 0;

	for (int i = 0; i < 200000; i++) {
		struct nvme_tcp_hdr h;
		uint64_t r = test_rand(&s);
		int hd = r & 1, dd = (r >> 1) & 1, fc = (r >> 2) & 1;

		h.type = (uint8_t)(r >> 8) % 12;
		h.flags = (uint8_t)(r >> 16) & 0x0f;
		h.hlen = (r >> 24) & 1 ? (uint8_t)(r >> 32) : (uint8_t)fx_tcp_pdu_hlen(h.type);
		h.pdo = (uint8_t)(r >> 40);
		h.plen = (r >> 48) & 1 ? (uint32_t)test_rand(&s) : (uint32_t)(r >> 49) & 0x3ff;

		int n = fx_tcp_pdu_check(&h, fc, hd, dd, MAXP);

		if (n < 0) {
			CHECK_EQ(n, -EPROTO);
			continue;
		}
		accepted++;
		CHECK(n >= (int)sizeof(h));
		CHECK_EQ(n % 4, 0);
		CHECK((uint32_t)n <= h.plen);
		CHECK(h.plen <= MAXP);
		CHECK_EQ(h.hlen, fx_tcp_pdu_hlen(h.type));
		if (h.plen > (uint32_t)n && h.type != NVME_TCP_C2H_TERM &&
		    h.type != NVME_TCP_H2C_TERM) {
			unsigned dl = (h.flags & DD) ? 4 : 0;

			CHECK(h.pdo >= n);
			CHECK(h.pdo + dl < h.plen);
		}
	}
	printf("fuzz: %u of 200000 random headers accepted\n", accepted);
	CHECK(accepted > 0);
}

/* The per-command rules (fx_tcp_xfer_*) both initiators share. */
static void test_xfer(void)
{
	struct fx_tcp_xfer x;
	struct nvme_tcp_data_pdu d;

	/* a write by R2T: in order, one outstanding, inside, no repeats */
	fx_tcp_xfer_init(&x, 8192, 1, 0);
	CHECK_EQ(fx_tcp_xfer_rsp(&x, 0), -EPROTO);          /* nothing requested yet */
	CHECK_EQ(fx_tcp_xfer_rsp(&x, 0x4002), 0);           /* an error status may end it */
	CHECK_EQ(fx_tcp_xfer_r2t(&x, 4096, 4096), -EPROTO); /* skips data */
	CHECK_EQ(x.fes, NVME_TCP_FES_DATA_OUT_OF_RANGE);
	CHECK_EQ(fx_tcp_xfer_r2t(&x, 0, 0), -EPROTO);
	CHECK_EQ(fx_tcp_xfer_r2t(&x, 0, 8193), -EPROTO);
	CHECK_EQ(fx_tcp_xfer_r2t(&x, 0, 4096), 0);
	CHECK_EQ(fx_tcp_xfer_r2t(&x, 4096, 4096), -EPROTO); /* first still open */
	CHECK_EQ(x.fes, NVME_TCP_FES_R2T_LIMIT_EXCEEDED);
	CHECK_EQ(fx_tcp_xfer_rsp(&x, 0), -EPROTO);
	fx_tcp_xfer_r2t_sent(&x);
	CHECK_EQ(fx_tcp_xfer_r2t(&x, 0, 4096), -EPROTO);           /* repeat */
	CHECK_EQ(fx_tcp_xfer_r2t(&x, 4096, 0xfffff000u), -EPROTO); /* wraps 32 bits */
	CHECK_EQ(fx_tcp_xfer_rsp(&x, 0), -EPROTO);                 /* half the data */
	CHECK_EQ(fx_tcp_xfer_r2t(&x, 4096, 4096), 0);
	CHECK_EQ(fx_tcp_xfer_rsp(&x, 0), -EPROTO); /* requested, not sent yet */
	fx_tcp_xfer_r2t_sent(&x);
	CHECK_EQ(fx_tcp_xfer_rsp(&x, 0), 0);
	CHECK_EQ(fx_tcp_xfer_r2t(&x, 8192, 1), -EPROTO); /* past the end */

	/* in-capsule and read: no R2T at all */
	fx_tcp_xfer_init(&x, 1024, 1, 1);
	CHECK_EQ(fx_tcp_xfer_r2t(&x, 0, 1024), -EPROTO);
	CHECK_EQ(fx_tcp_xfer_rsp(&x, 0), 0);
	fx_tcp_xfer_init(&x, 4096, 0, 0);
	CHECK_EQ(fx_tcp_xfer_r2t(&x, 0, 4096), -EPROTO);

	/* a read: C2HData in order, inside, SUCCESS only with LAST at the end */
	memset(&d, 0, sizeof(d));
	fx_tcp_hdr_init(&d.hdr, NVME_TCP_C2H_DATA, 1024, 0, 0, 0);
	d.datal = 1024;
	CHECK_EQ(fx_tcp_xfer_rsp(&x, 0), -EPROTO);
	d.datao = 1024;
	CHECK_EQ(fx_tcp_xfer_c2h(&x, &d, 0), -EPROTO); /* gap */
	d.datao = 0;
	CHECK_EQ(fx_tcp_xfer_c2h(&x, &d, 1), -EPROTO); /* plen has no digest */
	d.hdr.flags |= NVME_TCP_F_DATA_SUCCESS | NVME_TCP_F_DATA_LAST;
	CHECK_EQ(fx_tcp_xfer_c2h(&x, &d, 0), -EPROTO); /* SUCCESS before the end */
	d.hdr.flags &= (uint8_t) ~(NVME_TCP_F_DATA_SUCCESS | NVME_TCP_F_DATA_LAST);
	CHECK_EQ(fx_tcp_xfer_c2h(&x, &d, 0), 0);
	CHECK_EQ(fx_tcp_xfer_c2h_done(&x, &d), 0);
	fx_tcp_hdr_init(&d.hdr, NVME_TCP_C2H_DATA, 3072, 0, 0, 0);
	d.datao = 1024;
	d.datal = 3072;
	d.hdr.flags |= NVME_TCP_F_DATA_SUCCESS;
	CHECK_EQ(fx_tcp_xfer_c2h(&x, &d, 0), -EPROTO); /* SUCCESS without LAST */
	d.hdr.flags |= NVME_TCP_F_DATA_LAST;
	CHECK_EQ(fx_tcp_xfer_c2h(&x, &d, 0), 0);
	CHECK_EQ(fx_tcp_xfer_c2h_done(&x, &d), 1);
	CHECK_EQ(fx_tcp_xfer_rsp(&x, 0), 0);
	CHECK_EQ(fx_tcp_xfer_c2h(&x, &d, 0), -EPROTO); /* after LAST */
	/* a C2HData for a write */
	fx_tcp_xfer_init(&x, 4096, 1, 0);
	CHECK_EQ(fx_tcp_xfer_c2h(&x, &d, 0), -EPROTO);

	/* Authentication Receive may end early (SPDK's target sends only its
	 * 1104-byte challenge for a 4096-byte allocation); a Read may not. */
	struct nvme_sqe sqe;
	struct nvmf_connect_cmd *f = (struct nvmf_connect_cmd *)&sqe;

	memset(&sqe, 0, sizeof(sqe));
	sqe.opcode = NVME_CMD_READ;
	fx_tcp_xfer_init(&x, 4096, 0, 0);
	fx_tcp_xfer_cmd(&x, &sqe);
	CHECK_EQ(x.short_ok, 0);
	f->opcode = NVME_FABRICS_OPCODE;
	f->fctype = NVMF_FCTYPE_AUTH_SEND;
	fx_tcp_xfer_cmd(&x, &sqe);
	CHECK_EQ(x.short_ok, 0);
	f->fctype = NVMF_FCTYPE_AUTH_RECV;
	fx_tcp_xfer_cmd(&x, &sqe);
	CHECK_EQ(x.short_ok, 1);
	memset(&d, 0, sizeof(d));
	fx_tcp_hdr_init(&d.hdr, NVME_TCP_C2H_DATA, 1104, 0, 0, 0);
	d.datal = 1104;
	CHECK_EQ(fx_tcp_xfer_c2h(&x, &d, 0), 0);
	CHECK_EQ(fx_tcp_xfer_c2h_done(&x, &d), 0);
	CHECK_EQ(fx_tcp_xfer_rsp(&x, 0), 0); /* then a CapsuleResp with success */
	fx_tcp_xfer_init(&x, 4096, 0, 0);
	fx_tcp_xfer_cmd(&x, &sqe);
	d.hdr.flags |= NVME_TCP_F_DATA_SUCCESS | NVME_TCP_F_DATA_LAST;
	CHECK_EQ(fx_tcp_xfer_c2h(&x, &d, 0), 0); /* or SUCCESS on its last C2HData */
	CHECK_EQ(fx_tcp_xfer_c2h_done(&x, &d), 1);
	d.datal = 4097; /* never past the allocation length */
	fx_tcp_hdr_init(&d.hdr, NVME_TCP_C2H_DATA, 4097, 0, 0, 0);
	fx_tcp_xfer_init(&x, 4096, 0, 0);
	fx_tcp_xfer_cmd(&x, &sqe);
	CHECK_EQ(fx_tcp_xfer_c2h(&x, &d, 0), -EPROTO);
	/* the same short read as a Read command is refused */
	sqe.opcode = NVME_CMD_READ;
	fx_tcp_xfer_init(&x, 4096, 0, 0);
	fx_tcp_xfer_cmd(&x, &sqe);
	d.datal = 1104;
	fx_tcp_hdr_init(&d.hdr, NVME_TCP_C2H_DATA, 1104, 0, 0, 0);
	CHECK_EQ(fx_tcp_xfer_c2h(&x, &d, 0), 0);
	CHECK_EQ(fx_tcp_xfer_c2h_done(&x, &d), 0);
	CHECK_EQ(fx_tcp_xfer_rsp(&x, 0), -EPROTO);
	printf("xfer rules: ok\n");
}

/* Building PDUs to send (fx_tcp_head_finish, fx_tcp_pdu_iov,
 * fx_tcp_term_build): what goes on the wire, byte for byte, and that the
 * receiving side's checks accept it. */
static void test_build(void)
{
	uint8_t data[100], b[FX_TCP_HEAD_MAX];
	struct nvme_tcp_cmd_pdu *cmd = (struct nvme_tcp_cmd_pdu *)b;
	struct iovec iov[3];
	uint32_t dd = 0, want;
	int n, k;

	for (unsigned i = 0; i < sizeof(data); i++)
		data[i] = (uint8_t)(i * 7 + 1);
	CHECK_EQ(FX_TCP_CMD_HLEN, 72);
	CHECK_EQ(FX_TCP_RSP_HLEN, 24);
	CHECK_EQ(FX_TCP_DATA_HLEN, 24);

	/* a capsule with data, both digests, the peer's alignment 31 (128
	 * bytes): header, its digest, zeros up to pdo 128, data, data digest */
	memset(b, 0xAA, sizeof(b));
	fx_tcp_hdr_init(&cmd->hdr, NVME_TCP_CMD, sizeof(data), 1, 1, 31);
	memset(&cmd->sqe, 0x11, sizeof(cmd->sqe));
	n = fx_tcp_head_finish(b, sizeof(b));
	CHECK_EQ(n, 128);
	want = fx_tcp_hdgst(b, 72);
	CHECK_EQ(memcmp(b + 72, &want, 4), 0);
	for (int i = 76; i < 128; i++)
		CHECK_EQ(b[i], 0);
	CHECK_EQ(fx_tcp_hdgst_check(b, 76), 0);
	k = fx_tcp_pdu_iov(iov, b, (unsigned)n, data, sizeof(data), &dd);
	CHECK_EQ(k, 3);
	CHECK(iov[0].iov_base == b && iov[0].iov_len == 128);
	CHECK(iov[1].iov_base == data && iov[1].iov_len == sizeof(data));
	CHECK(iov[2].iov_base == &dd && iov[2].iov_len == 4);
	CHECK_EQ(dd, fx_tcp_ddgst(data, sizeof(data)));
	CHECK_EQ(cmd->hdr.plen, 128 + sizeof(data) + 4);
	CHECK_EQ(fx_tcp_pdu_check(&cmd->hdr, 0, 1, 1, MAXP), 76);
	/* one flipped header bit: the digest no longer matches */
	b[9] ^= 1;
	CHECK_EQ(fx_tcp_hdgst_check(b, 76), -EBADMSG);
	/* a buffer too small for the padding is refused, not overrun */
	fx_tcp_hdr_init(&cmd->hdr, NVME_TCP_CMD, sizeof(data), 1, 1, 31);
	CHECK_EQ(fx_tcp_head_finish(b, FX_TCP_CMD_HLEN + 4), -EPROTO);

	/* without data or digests: the header alone, no padding */
	fx_tcp_hdr_init(&cmd->hdr, NVME_TCP_CMD, 0, 0, 0, 31);
	n = fx_tcp_head_finish(b, sizeof(b));
	CHECK_EQ(n, 72);
	CHECK_EQ(fx_tcp_pdu_iov(iov, b, (unsigned)n, NULL, 0, &dd), 1);
	CHECK_EQ(fx_tcp_hdgst_check(b, 72), 0);

	/* data without a data digest: two iovecs */
	struct nvme_tcp_data_pdu *d = (struct nvme_tcp_data_pdu *)b;

	fx_tcp_hdr_init(&d->hdr, NVME_TCP_H2C_DATA, 10, 1, 0, 0);
	n = fx_tcp_head_finish(b, sizeof(b));
	CHECK_EQ(n, 28);
	CHECK_EQ(fx_tcp_pdu_iov(iov, b, (unsigned)n, data, 10, &dd), 2);
	CHECK_EQ(d->hdr.plen, 38);

	/* TermReq: at most 152 bytes of the offending header, no digests */
	uint8_t t[FX_TCP_TERM_MAX], big[200];
	const struct nvme_tcp_term_pdu *tp = (const struct nvme_tcp_term_pdu *)t;

	memset(big, 0x5C, sizeof(big));
	CHECK_EQ(fx_tcp_term_build(t, NVME_TCP_C2H_TERM, NVME_TCP_FES_HDR_DIGEST_ERR, 0x12345, big,
				   sizeof(big)),
		 24 + 152);
	CHECK_EQ(tp->hdr.type, NVME_TCP_C2H_TERM);
	CHECK_EQ(tp->hdr.hlen, 24);
	CHECK_EQ(tp->hdr.plen, 24 + 152);
	CHECK_EQ(tp->hdr.flags, 0);
	CHECK_EQ(tp->fes, NVME_TCP_FES_HDR_DIGEST_ERR);
	CHECK_EQ(tp->feil, 0x2345);
	CHECK_EQ(tp->feiu, 0x1);
	CHECK_EQ(memcmp(t + 24, big, 152), 0);
	CHECK_EQ(fx_tcp_pdu_check(&tp->hdr, 1, 1, 1, MAXP), 24);
	CHECK_EQ(fx_tcp_term_build(t, NVME_TCP_H2C_TERM, 1, 0, big, 8), 32);
	CHECK_EQ(fx_tcp_pdu_check(&tp->hdr, 0, 0, 0, MAXP), 24);
	CHECK_EQ(fx_tcp_term_build(t, NVME_TCP_H2C_TERM, 1, 0, NULL, 8), 24);
	CHECK_EQ(tp->hdr.plen, 24);
	printf("building PDUs: ok\n");
}

int main(void)
{
	test_hlen();
	test_table();
	test_hdgst();
	test_init_roundtrip();
	test_fuzz();
	test_xfer();
	test_build();
	printf("test_tcp_pdu: ok\n");
	return 0;
}
