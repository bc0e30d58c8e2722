/*
 * FX_REQ_CRC32C in the request table: a request's CRC32C is assembled from
 * the CRCs of its ranges as they land (fx_req_crc_add), in any order and in
 * pieces of any size, and fx_req_complete turns it into the CRC32C of the
 * whole request.  Checked against fx_crc32c over the same bytes: many pieces,
 * odd tails, one byte, short transfers that land in two parts, pieces landing
 * in a random order; a failed request carries no CRC; a byte changed in a
 * middle piece changes the request's CRC.
 */
#include "fx100io.h"
#include "internal.h"
#include "reqs.h"
#include "check.h"

#include <string.h>

static uint32_t one_request(struct req_table *t, char *buf, uint64_t len, uint64_t *rng, int fail)
{
	struct fx_req fr = {.tag = 7,
			    .op = FX_OP_READ,
			    .flags = FX_REQ_CRC32C,
			    .addr = buf,
			    .len = len,
			    .off = 0};
	uint64_t starts[4096], lens[4096];
	unsigned n = 0;
	struct fx_cqe c;

	CHECK_EQ(fx_reqs_accept(t, &fr, 1), 1);
	int64_t next = fx_reqs_fifo_next(t);
	CHECK(next >= 0);
	uint32_t ri = (uint32_t)next;
	struct req *r = &t->reqs[ri];
	/* cut into pieces: mostly 4 KiB multiples, some odd, the last a tail */
	for (uint64_t at = 0; at < len; n++) {
		uint64_t want = test_rand(rng) % 4 ? (1 + test_rand(rng) % 16) * 4096
						   : 1 + test_rand(rng) % 70000;
		uint64_t k = want < len - at ? want : len - at;
		CHECK(n < 4096);
		starts[n] = at;
		lens[n] = k;
		at += k;
	}
	/* they land in a random order */
	for (unsigned i = n; i > 1; i--) {
		unsigned j = (unsigned)(test_rand(rng) % i);
		uint64_t s = starts[i - 1], l = lens[i - 1];
		starts[i - 1] = starts[j];
		lens[i - 1] = lens[j];
		starts[j] = s;
		lens[j] = l;
	}
	r->issued = len;
	r->inflight = n;
	fx_reqs_piece_issued(t, ri); /* every byte issued: it leaves the queue */
	CHECK_EQ(t->nfifo, 0);
	for (unsigned i = 0; i < n; i++) {
		if (lens[i] > 1 && test_rand(rng) % 5 == 0) {
			/* a short transfer: the piece lands in two ranges */
			uint64_t half = 1 + test_rand(rng) % (lens[i] - 1);
			fx_req_crc_add(r, buf + starts[i], half);
			fx_req_crc_add(r, buf + starts[i] + half, lens[i] - half);
		} else {
			fx_req_crc_add(r, buf + starts[i], lens[i]);
		}
		fx_req_piece_done(t, ri, fail && i == n / 2 ? -EIO : 0,
				  fail && i == n / 2 ? 0 : lens[i], 0);
	}
	CHECK_EQ(fx_reqs_pop_done(t, &c, 1), 1);
	CHECK_EQ(c.tag, 7);
	CHECK_EQ(c.res, fail ? -EIO : (int64_t)len);
	return c.crc32c;
}

int main(void)
{
	static const uint64_t lens[] = {
		1, 7, 4095, 4096, 4097, 65536 + 17, 1 << 20, (3 << 20) + 4097, (9 << 20) + 777};
	uint64_t rng = 12345;
	struct req_table t;
	size_t max = (9 << 20) + 777;
	char *buf = malloc(max);

	CHECK(buf);
	for (size_t i = 0; i < max; i++)
		buf[i] = (char)test_rand(&rng);
	CHECK_EQ(fx_reqs_init(&t, 8), 0);
	for (unsigned li = 0; li < sizeof(lens) / sizeof(lens[0]); li++) {
		for (int round = 0; round < 4; round++) {
			uint32_t got = one_request(&t, buf, lens[li], &rng, 0);
			CHECK_EQ(got, fx_crc32c(0, buf, lens[li]));
		}
	}
	/* a failed request carries no CRC */
	CHECK_EQ(one_request(&t, buf, (3 << 20) + 4097, &rng, 1), 0);
	/* a byte changed in a middle piece changes the request's CRC */
	uint64_t len = (9 << 20) + 777;
	uint32_t good = one_request(&t, buf, len, &rng, 0);
	buf[len / 2] ^= 0x20;
	uint32_t bad = one_request(&t, buf, len, &rng, 0);
	CHECK(bad != good);
	CHECK_EQ(bad, fx_crc32c(0, buf, len));
	fx_reqs_fini(&t);
	free(buf);
	printf("test_reqs_crc: ok\n");
	return 0;
}
