/*
 * How a request cut into pieces reports its pieces' failures (csrc/reqs.c,
 * fx_req_piece_done): a piece with an NVMe status says its command did not
 * run; a piece lost to a timeout or a dropped connection says nothing.  A
 * caller (the multipath layer) re-issues a write at once on a status alone,
 * so a request with any lost piece must complete with that piece's errno and
 * no status, whatever order the pieces end in.  Requests whose failed pieces
 * all carry a status keep the first status.
 */
#include "fx100io.h"
#include "internal.h"
#include "reqs.h"
#include "check.h"

#include <errno.h>
#include <string.h>

#define ANA_TRANSITION 0x0303 /* SCT 3h, SC 03h: ANA transition */
#define ANA_INACCESSIBLE 0x0302

struct piece {
	int err;
	uint16_t status;
};

/* One request of n pieces of 4 KiB, ending as given; its completion. */
static struct fx_cqe run(struct req_table *t, const struct piece *p, unsigned n)
{
	static char buf[16 * 4096];
	/* a store, as Python sends writes: its pieces count against write_depth */
	struct fx_req fr = {.tag = 9,
			    .op = FX_OP_WRITE,
			    .prio = FX_PRIO_STORE,
			    .addr = buf,
			    .len = (uint64_t)n * 4096};
	struct fx_cqe c;

	CHECK(n <= 16);
	CHECK_EQ(fx_reqs_accept(t, &fr, 1), 1);
	int64_t nx = fx_reqs_fifo_next(t);
	CHECK(nx >= 0);
	uint32_t ri = (uint32_t)nx;
	struct req *r = &t->reqs[ri];
	for (unsigned i = 0; i < n; i++) { /* n pieces of 4 KiB, as a transport makes them */
		CHECK_EQ(fx_reqs_fifo_next(t), nx);
		r->issued += 4096;
		r->inflight++;
		fx_reqs_piece_issued(t, ri);
	}
	CHECK_EQ(t->wr_inflight, n);
	for (unsigned i = 0; i < n; i++)
		fx_req_piece_done(t, ri, p[i].err, p[i].err ? 0 : 4096, p[i].status);
	/* every piece's end, failed or not, gave back its write_depth slot */
	CHECK_EQ(t->wr_inflight, 0);
	CHECK_EQ(fx_reqs_pop_done(t, &c, 1), 1);
	CHECK_EQ(c.tag, 9);
	return c;
}

int main(void)
{
	struct req_table t;
	struct fx_cqe c;

	CHECK_EQ(fx_reqs_init(&t, 4), 0);
	/* all good */
	c = run(&t, (struct piece[]){{0, 0}, {0, 0}, {0, 0}}, 3);
	CHECK_EQ(c.res, 3 * 4096);
	CHECK_EQ(c.status, 0);
	/* an ANA status, then a piece lost to a timeout: may have run */
	c = run(&t, (struct piece[]){{0, 0}, {-EIO, ANA_TRANSITION}, {-ETIMEDOUT, 0}}, 3);
	CHECK_EQ(c.res, -ETIMEDOUT);
	CHECK_EQ(c.status, 0);
	/* the same in the other order, and a dropped connection */
	c = run(&t, (struct piece[]){{-ECONNRESET, 0}, {-EIO, ANA_INACCESSIBLE}, {0, 0}}, 3);
	CHECK_EQ(c.res, -ECONNRESET);
	CHECK_EQ(c.status, 0);
	/* several lost pieces: the first one's errno */
	c = run(&t,
		(struct piece[]){{-EIO, ANA_TRANSITION},
				 {-ECONNRESET, 0},
				 {-ECONNRESET, 0},
				 {-EIO, ANA_INACCESSIBLE}},
		4);
	CHECK_EQ(c.res, -ECONNRESET);
	CHECK_EQ(c.status, 0);
	/* only statuses: did not run, and the first status is kept */
	c = run(&t, (struct piece[]){{0, 0}, {-EIO, ANA_INACCESSIBLE}, {-EIO, ANA_TRANSITION}}, 3);
	CHECK_EQ(c.res, -EIO);
	CHECK_EQ(c.status, ANA_INACCESSIBLE);
	/* one piece, lost */
	c = run(&t, (struct piece[]){{-ETIMEDOUT, 0}}, 1);
	CHECK_EQ(c.res, -ETIMEDOUT);
	CHECK_EQ(c.status, 0);
	/* one piece with a status */
	c = run(&t, (struct piece[]){{-EIO, ANA_TRANSITION}}, 1);
	CHECK_EQ(c.res, -EIO);
	CHECK_EQ(c.status, ANA_TRANSITION);
	fx_reqs_fini(&t);
	printf("test_reqs_status: ok\n");
	return 0;
}
