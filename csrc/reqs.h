/*
 * The table of caller requests every queue keeps: a slab
 * (docs/architecture.md rule 5:
 * user_data is an index, never a pointer), the queues of requests with
 * bytes left to issue, one per priority class (enum fx_prio), and a ring of
 * finished ones waiting to be reaped.
 *
 * The scheduler that picks the next request to cut a piece from lives here,
 * once, for every transport (docs/architecture.md rule 13): a transport
 * asks fx_reqs_fifo_next() which request, makes one piece (command) of it,
 * and reports it with fx_reqs_piece_issued(); every piece's end goes through
 * fx_reqs_piece_end() (fx_req_piece_done() calls it).
 */
#ifndef FX100IO_REQS_H
#define FX100IO_REQS_H

#include "internal.h"

#define FX_REQ_NONE UINT32_MAX

/* One caller request, tracked until its completion is reaped. */
struct req {
	uint64_t tag;
	char *addr;
	uint64_t len;
	uint64_t off;
	uint64_t issued; /* bytes handed to pieces so far */
	uint64_t done;   /* bytes transferred */
	int err;         /* first error, 0 if none */
	uint32_t inflight;
	uint8_t op;
	uint8_t flags; /* FX_REQ_* */
	uint8_t eof;
	uint8_t prio;    /* enum fx_prio */
	uint8_t queued;  /* in its class's queue (a chain of one) */
	uint8_t zombie;  /* completed while queued: its slot is freed when it leaves */
	uint16_t status; /* raw NVMe status field of the first failed command */
	uint32_t stream;
	uint32_t next; /* the next request of its chain (same class and stream), or FX_REQ_NONE */
	/* a piece failed with no NVMe status (a timeout, a dropped or broken
	 * connection): its command may or may not have run, so the request
	 * completes with that errno and no status (see fx_req_piece_done) */
	uint8_t lost;
	/* FX_REQ_CRC32C: XOR of every finished range's raw CRC, each shifted
	 * to where it ends in the request (order-free: pieces land in any
	 * order); crc_pending counts ranges a transport has yet to add */
	uint32_t crc_raw;
	uint32_t crc_pending;
};

/* The requests of one class with bytes left to issue: a ring of chains.
 * Each ring entry is a chain of requests of one stream, in arrival order;
 * the load class turns the ring after every piece (round robin between
 * streams), the others keep it first come, first served. */
struct prio_queue {
	uint32_t *ring; /* chain heads */
	uint32_t *tail; /* the last request of each entry's chain */
	uint32_t head, n;
	uint32_t starve; /* pieces of higher classes issued while this one waited */
	uint8_t served;  /* its one entry just had a turn (the load class) */
};

struct req_table {
	struct req *reqs;
	uint32_t *free;
	uint32_t nfree;
	uint32_t nslots;
	struct prio_queue cls[FX_PRIO_CLASSES];
	uint32_t nfifo; /* requests queued with bytes to issue, every class */
	/* the slots the last fx_reqs_accept queued (a transport stamps them) */
	uint32_t *accepted;
	uint32_t naccepted;
	uint32_t load_reads;  /* load-class reads accepted and not complete */
	uint32_t wr_inflight; /* store and background write pieces in flight */
	uint32_t write_depth; /* their cap while load_reads (FX_WRITE_DEPTH_DEFAULT) */
	uint8_t picked;       /* class of what fx_reqs_fifo_next last returned */
	uint8_t waiting;      /* classes that could have gone then (bit per class) */
	uint8_t by_share;     /* and it went on its class's guaranteed share */
	struct fx_cqe *done;
	uint32_t done_head, ndone;
	uint32_t pending; /* accepted and not reaped */
	/* counters for tests: pieces issued per class, and how many pieces a
	 * lower class took on its guaranteed share */
	uint64_t pieces[FX_PRIO_CLASSES];
	uint64_t shares;
};

int fx_reqs_init(struct req_table *t, unsigned slots);
void fx_reqs_fini(struct req_table *t);
int fx_req_check(const struct fx_dev *d, const struct fx_req *r);
uint32_t fx_req_take(struct req_table *t, const struct fx_req *src);
void fx_req_complete(struct req_table *t, uint32_t i);
int fx_reqs_pop_done(struct req_table *t, struct fx_cqe *out, unsigned max);
/* Take up to n checked requests (as many as there are free slots and room
 * for their completions): empty ones complete at once, the rest join the
 * FIFO.  Returns how many. */
unsigned fx_reqs_accept(struct req_table *t, const struct fx_req *reqs, unsigned n);

/* Every byte of r (its one command, for a flush) has gone to a command. */
static inline int fx_req_all_issued(const struct req *r)
{
	return r->op == FX_OP_FLUSH ? r->issued != 0 : r->issued >= r->len;
}

/* Which request the next piece comes from: the head of the highest class
 * that may go, unless a lower class has waited FX_PRIO_SHARE - 1 pieces
 * (then it goes); store and background writes wait while a load read does
 * and write_depth of them are in flight.  Drops requests that have nothing
 * left to issue or failed.  -1 when nothing may go now.  Calling it again
 * without issuing a piece returns the same request. */
int64_t fx_reqs_fifo_next(struct req_table *t);
/* The same, leaving out the classes in skip (bit c: class c) for this pass:
 * a transport that cannot issue the request of one class now (no connection
 * may carry it, no bounce buffer) still issues the others'. */
int64_t fx_reqs_fifo_next_skip(struct req_table *t, unsigned skip);

/* A piece of ri (what fx_reqs_fifo_next returned) was made: the class
 * accounting, the write count, the round robin; ri leaves its queue once
 * every byte of it is issued. */
void fx_reqs_piece_issued(struct req_table *t, uint32_t ri);

/* A piece of ri ended (whatever its result), before ri may complete. */
void fx_reqs_piece_end(struct req_table *t, uint32_t ri);

/* Fail what fx_reqs_fifo_next returned with err (nothing can carry it):
 * out of its queue, and complete at once unless pieces of it are still in
 * flight. */
void fx_reqs_fifo_fail_head(struct req_table *t, int err);

/* One piece (command) of request ri is over: err/status (first ones win)
 * and bytes moved; completes the request when it was its last. */
void fx_req_piece_done(struct req_table *t, uint32_t ri, int err, uint64_t bytes, uint16_t status);

/* Add the bytes [p, p+n) of request r (moved, so in the caller's buffer) to
 * its CRC32C; a no-op without FX_REQ_CRC32C. */
void fx_req_crc_add(struct req *r, const char *p, uint64_t n);

#endif
