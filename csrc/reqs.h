/*
 * The table of caller requests every queue keeps: a slab
 * (docs/architecture.md rule 5:
 * user_data is an index, never a pointer), a FIFO of requests with bytes
 * left to issue, and a ring of finished ones waiting to be reaped.
 */
#ifndef FX100IO_REQS_H
#define FX100IO_REQS_H

#include "internal.h"

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
	uint16_t status; /* raw NVMe status field of the first failed command */
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

struct req_table {
	struct req *reqs;
	uint32_t *free;
	uint32_t nfree;
	uint32_t nslots;
	uint32_t *fifo;
	uint32_t fifo_head, nfifo;
	struct fx_cqe *done;
	uint32_t done_head, ndone;
	uint32_t pending; /* accepted and not reaped */
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

void fx_reqs_fifo_push(struct req_table *t, uint32_t i);

/* Every byte of r (its one command, for a flush) has gone to a command. */
static inline int fx_req_all_issued(const struct req *r)
{
	return r->op == FX_OP_FLUSH ? r->issued != 0 : r->issued >= r->len;
}

/* The request at the FIFO's head that still has bytes to issue, after
 * dropping those that have none left or failed; -1 when there is none.
 * It stays at the head until fully issued or failed. */
int64_t fx_reqs_fifo_next(struct req_table *t);

/* Fail the head request with err (nothing can carry it): off the FIFO, and
 * complete at once unless pieces of it are still in flight. */
void fx_reqs_fifo_fail_head(struct req_table *t, int err);

/* One piece (command) of request ri is over: err/status (first ones win)
 * and bytes moved; completes the request when it was its last. */
void fx_req_piece_done(struct req_table *t, uint32_t ri, int err, uint64_t bytes, uint16_t status);

/* Add the bytes [p, p+n) of request r (moved, so in the caller's buffer) to
 * its CRC32C; a no-op without FX_REQ_CRC32C. */
void fx_req_crc_add(struct req *r, const char *p, uint64_t n);

#endif
