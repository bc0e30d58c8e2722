/*
 * The priority scheduler of the request table (csrc/reqs.c), driven by a
 * simulated device that takes `depth` pieces at a time and finishes them
 * first come, first served (what a disk's own queue does).  Orders and
 * counts only, no clocks:
 *  - a load queued behind stores overtakes them: it completes before every
 *    store that was not at the device yet, and while it waits no more than
 *    write_depth writes are in flight once those drained;
 *  - stores still complete while loads keep coming (a share of one piece
 *    in FX_PRIO_SHARE), and background work while stores keep coming;
 *  - two load streams take turns piece by piece, so a small batch behind a
 *    huge one finishes first;
 *  - a request that fails while queued leaves its chain intact and its slot
 *    is not reused while a queue still points at it;
 *  - a bad class is refused.
 */
#include "fx100io.h"
#include "internal.h"
#include "reqs.h"
#include "check.h"

#include <errno.h>
#include <string.h>

#define PIECE 4096u
#define CAP 256

struct flight {
	uint32_t ri;
	uint64_t len;
};

struct sim {
	struct req_table t;
	struct flight fl[CAP];
	unsigned head, n, depth;
	uint64_t issued_tags[4096];
	unsigned nissued;
	uint64_t done_tags[4096];
	int64_t done_res[4096];
	unsigned ndone;
	unsigned max_wr_while_load; /* most capped writes in flight seen while a load read waited */
};

static char buf[64 * PIECE];

static void sim_init(struct sim *s, unsigned depth, unsigned write_depth, unsigned slots)
{
	memset(s, 0, sizeof(*s));
	CHECK_EQ(fx_reqs_init(&s->t, slots), 0);
	s->t.write_depth = write_depth;
	s->depth = depth;
}

static void sim_issue(struct sim *s)
{
	for (int64_t nx; s->n < s->depth && (nx = fx_reqs_fifo_next(&s->t)) >= 0;) {
		struct req *r = &s->t.reqs[nx];
		uint64_t k = r->len - r->issued;
		if (k > PIECE)
			k = PIECE;
		r->issued += k;
		r->inflight++;
		fx_reqs_piece_issued(&s->t, (uint32_t)nx);
		s->fl[(s->head + s->n) % CAP] = (struct flight){(uint32_t)nx, k};
		s->n++;
		s->issued_tags[s->nissued++] = r->tag;
	}
}

static void sim_reap(struct sim *s)
{
	struct fx_cqe c;
	while (fx_reqs_pop_done(&s->t, &c, 1) == 1) {
		s->done_res[s->ndone] = c.res;
		s->done_tags[s->ndone++] = c.tag;
	}
}

/* The device finishes its oldest piece (with err, or whole). */
static void sim_step(struct sim *s, int err)
{
	CHECK(s->n > 0);
	struct flight f = s->fl[s->head];
	s->head = (s->head + 1) % CAP;
	s->n--;
	fx_req_piece_done(&s->t, f.ri, err, err ? 0 : f.len, 0);
	sim_reap(s);
	sim_issue(s);
	if (s->t.load_reads && s->t.wr_inflight > s->max_wr_while_load)
		s->max_wr_while_load = s->t.wr_inflight;
}

static void sim_submit(struct sim *s, uint64_t tag, uint8_t op, uint8_t prio, uint32_t stream,
		       unsigned pieces)
{
	struct fx_req r = {.tag = tag,
			   .addr = buf,
			   .len = (uint64_t)pieces * PIECE,
			   .op = op,
			   .prio = prio,
			   .stream = stream};
	CHECK_EQ(fx_reqs_accept(&s->t, &r, 1), 1);
	sim_issue(s);
}

static int done_at(const struct sim *s, uint64_t tag)
{
	for (unsigned i = 0; i < s->ndone; i++)
		if (s->done_tags[i] == tag)
			return (int)i;
	return -1;
}

static void drain(struct sim *s)
{
	while (s->n)
		sim_step(s, 0);
}

/* Tags: 100+i stores, 200+i loads, 300+i background. */
static void load_overtakes_stores(void)
{
	struct sim s;

	sim_init(&s, 8, 2, 64);
	for (unsigned i = 0; i < 8; i++)
		sim_submit(&s, 100 + i, FX_OP_WRITE, FX_PRIO_STORE, 1, 8);
	CHECK_EQ(s.n, 8); /* the device is full of writes */
	sim_submit(&s, 200, FX_OP_READ, FX_PRIO_LOAD, 2, 4);
	s.max_wr_while_load = 0;
	drain(&s);
	CHECK_EQ(s.ndone, 9);
	/* the load came after 64 pieces of stores and finished before all of
	 * them but the first, whose 8 pieces were at the device already */
	CHECK_EQ(s.done_tags[0], 100);
	CHECK_EQ(done_at(&s, 200), 1);
	/* once the 8 writes already at the device drained below write_depth,
	 * never more than write_depth writes were in flight while it waited */
	unsigned pos = 0;
	while (s.issued_tags[pos] != 200)
		pos++;
	CHECK(pos <= 8); /* its first piece went as soon as pieces came back */
	CHECK(s.max_wr_while_load <= 8);
	/* every store completed, each with every byte */
	for (unsigned i = 0; i < 8; i++) {
		int at = done_at(&s, 100 + i);
		CHECK(at >= 0);
		CHECK_EQ(s.done_res[at], 8 * PIECE);
	}
	fx_reqs_fini(&s.t);
}

static void write_depth_holds(void)
{
	struct sim s;

	/* a load first, then writes: while the load waits, at most 2 go */
	sim_init(&s, 16, 2, 64);
	sim_submit(&s, 200, FX_OP_READ, FX_PRIO_LOAD, 2, 32);
	for (unsigned i = 0; i < 4; i++)
		sim_submit(&s, 100 + i, FX_OP_WRITE, FX_PRIO_STORE, 1, 8);
	CHECK(s.t.wr_inflight <= 2);
	s.max_wr_while_load = 0;
	while (s.n) {
		sim_step(&s, 0);
		CHECK(!s.t.load_reads || s.t.wr_inflight <= 2);
	}
	CHECK_EQ(s.ndone, 5);
	/* with no load waiting, writes use the whole depth */
	for (unsigned i = 0; i < 4; i++)
		sim_submit(&s, 110 + i, FX_OP_WRITE, FX_PRIO_STORE, 1, 8);
	CHECK_EQ(s.t.wr_inflight, 16);
	drain(&s);
	fx_reqs_fini(&s.t);
}

static void stores_not_starved(void)
{
	struct sim s;
	unsigned next_load = 0, stores_done = 0;

	sim_init(&s, 4, 2, 256);
	for (unsigned i = 0; i < 4; i++)
		sim_submit(&s, 100 + i, FX_OP_WRITE, FX_PRIO_STORE, 1, 8);
	/* loads keep coming, more than the device takes: always some queued */
	for (unsigned step = 0; step < 4000 && stores_done < 4; step++) {
		while (s.t.load_reads < 3 && next_load < 3000) {
			sim_submit(&s, 1000 + next_load, FX_OP_READ, FX_PRIO_LOAD,
				   10 + next_load % 3, 16);
			next_load++;
		}
		sim_step(&s, 0);
		stores_done = 0;
		for (unsigned i = 0; i < 4; i++)
			stores_done += done_at(&s, 100 + i) >= 0;
	}
	CHECK_EQ(stores_done, 4);
	/* past the 4 pieces that went before any load, the stores went mostly
	 * on their share: one piece in FX_PRIO_SHARE, so 28 store pieces
	 * waited behind at most 7 load pieces each */
	CHECK_EQ(s.t.pieces[FX_PRIO_STORE], 32);
	CHECK(s.t.shares >= 20);
	CHECK(s.t.pieces[FX_PRIO_LOAD] <= 28 * (FX_PRIO_SHARE - 1) + 8);
	drain(&s);
	fx_reqs_fini(&s.t);
}

static void background_below_store(void)
{
	struct sim s;

	sim_init(&s, 1, 4, 64);
	/* background and store reads, no load: the store goes first, the
	 * background work still gets its share */
	sim_submit(&s, 300, FX_OP_READ, FX_PRIO_BACKGROUND, 3, 8);
	sim_submit(&s, 100, FX_OP_READ, FX_PRIO_STORE, 1, 32);
	drain(&s);
	CHECK_EQ(s.ndone, 2);
	CHECK_EQ(s.issued_tags[0], 300); /* it was alone then */
	unsigned bg_before_store_done = 0;
	for (unsigned i = 1; i < s.nissued; i++) {
		if (s.issued_tags[i] == 300)
			bg_before_store_done++;
	}
	/* 31 store pieces after the first: background went 1 in FX_PRIO_SHARE */
	CHECK(bg_before_store_done >= 3);
	CHECK_EQ(done_at(&s, 100), 0);
	fx_reqs_fini(&s.t);
}

static void loads_take_turns(void)
{
	struct sim s;

	sim_init(&s, 1, 4, 64);
	/* a huge batch (stream 1: 4 chunks of 16 pieces), then a small one
	 * (stream 2: 2 chunks of 2) */
	for (unsigned i = 0; i < 4; i++)
		sim_submit(&s, 200 + i, FX_OP_READ, FX_PRIO_LOAD, 1, 16);
	sim_submit(&s, 210, FX_OP_READ, FX_PRIO_LOAD, 2, 2);
	sim_submit(&s, 211, FX_OP_READ, FX_PRIO_LOAD, 2, 2);
	drain(&s);
	CHECK_EQ(s.ndone, 6);
	/* the small batch finished first, then the huge one in its order */
	CHECK_EQ(done_at(&s, 210), 0);
	CHECK_EQ(done_at(&s, 211), 1);
	for (unsigned i = 0; i < 4; i++)
		CHECK_EQ(done_at(&s, 200 + i), 2 + (int)i);
	/* after the first piece, the streams alternated */
	for (unsigned i = 1; i < 8; i++)
		CHECK_EQ(s.issued_tags[i] >= 210, i % 2 == 1);
	fx_reqs_fini(&s.t);
}

static void failed_while_queued(void)
{
	struct sim s;

	sim_init(&s, 1, 4, 4);
	sim_submit(&s, 200, FX_OP_READ, FX_PRIO_LOAD, 1, 4);
	sim_submit(&s, 201, FX_OP_READ, FX_PRIO_LOAD, 1, 2); /* chained behind 200 */
	/* 200's first piece fails: it completes with bytes left unissued */
	sim_step(&s, -EIO);
	CHECK_EQ(s.ndone, 1);
	CHECK_EQ(s.done_tags[0], 200);
	CHECK_EQ(s.done_res[0], -EIO);
	/* its slot stays taken while the queue still points at it (here it
	 * left at once, at the next pick), and the chain goes on with 201 */
	sim_submit(&s, 202, FX_OP_READ, FX_PRIO_LOAD, 2, 1);
	drain(&s);
	CHECK_EQ(s.ndone, 3);
	CHECK(done_at(&s, 201) > 0);
	CHECK(done_at(&s, 202) > 0);
	CHECK_EQ(s.t.nfree, 4);
	CHECK_EQ(s.t.nfifo, 0);
	fx_reqs_fini(&s.t);

	/* a failing head in the middle of a long chain, slots all in use */
	sim_init(&s, 2, 4, 4);
	for (unsigned i = 0; i < 4; i++)
		sim_submit(&s, 200 + i, FX_OP_READ, FX_PRIO_LOAD, 1, 3);
	sim_step(&s, -EIO); /* 200 fails, one of its pieces still in flight */
	sim_step(&s, 0);
	drain(&s);
	CHECK_EQ(s.ndone, 4);
	CHECK_EQ(s.t.nfree, 4);
	CHECK_EQ(s.t.nfifo, 0);
	fx_reqs_fini(&s.t);
}

/* A class whose request cannot go this pass (no connection may carry it)
 * is skipped, and the next class's request goes instead of nothing. */
static void a_blocked_class_does_not_stop_the_others(void)
{
	struct sim s;

	sim_init(&s, 0, 4, 8); /* depth 0: the device takes nothing, all stay queued */
	sim_submit(&s, 100, FX_OP_WRITE, FX_PRIO_STORE, 1, 2);
	sim_submit(&s, 200, FX_OP_READ, FX_PRIO_LOAD, 2, 2);
	sim_submit(&s, 300, FX_OP_READ, FX_PRIO_BACKGROUND, 3, 2);
	int64_t ld = fx_reqs_fifo_next(&s.t);
	CHECK(ld >= 0 && s.t.reqs[ld].tag == 200);
	int64_t st = fx_reqs_fifo_next_skip(&s.t, 1u << FX_PRIO_LOAD);
	CHECK(st >= 0 && s.t.reqs[st].tag == 100);
	int64_t bg = fx_reqs_fifo_next_skip(&s.t, (1u << FX_PRIO_LOAD) | (1u << FX_PRIO_STORE));
	CHECK(bg >= 0 && s.t.reqs[bg].tag == 300);
	/* a blocked store: the load still goes */
	ld = fx_reqs_fifo_next_skip(&s.t, 1u << FX_PRIO_STORE);
	CHECK(ld >= 0 && s.t.reqs[ld].tag == 200);
	CHECK_EQ(fx_reqs_fifo_next_skip(&s.t, 7u), -1);
	s.depth = 8;
	sim_issue(&s);
	drain(&s);
	CHECK_EQ(s.ndone, 3);
	fx_reqs_fini(&s.t);
}

static void bad_class_refused(void)
{
	struct fx_req r = {.tag = 1, .addr = buf, .len = PIECE, .op = FX_OP_READ};

	r.prio = FX_PRIO_CLASSES;
	CHECK_EQ(fx_req_check(NULL, &r), -EINVAL);
	r.prio = FX_PRIO_BACKGROUND;
	CHECK_EQ(fx_req_check(NULL, &r), 0);
}

int main(void)
{
	load_overtakes_stores();
	write_depth_holds();
	stores_not_starved();
	background_below_store();
	loads_take_turns();
	failed_while_queued();
	a_blocked_class_does_not_stop_the_others();
	bad_class_refused();
	printf("test_reqs_prio: ok\n");
	return 0;
}
