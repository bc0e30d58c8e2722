/*
 * The request table shared by every queue implementation.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

#include "reqs.h"

int fx_reqs_init(struct req_table *t, unsigned slots)
{
	/* every count and index starts at 0, wherever the table lives (a
	 * table on the stack holds garbage until here) */
	memset(t, 0, sizeof(*t));
	t->nslots = slots;
	t->reqs = calloc(slots, sizeof(*t->reqs));
	t->free = malloc(slots * sizeof(*t->free));
	t->done = malloc(slots * sizeof(*t->done));
	t->fifo = malloc(slots * sizeof(*t->fifo));
	if (!t->reqs || !t->free || !t->done || !t->fifo) {
		fx_reqs_fini(t);
		return -ENOMEM;
	}
	for (unsigned i = 0; i < slots; i++)
		t->free[i] = slots - 1 - i;
	t->nfree = slots;
	return 0;
}

void fx_reqs_fini(struct req_table *t)
{
	free(t->reqs);
	free(t->free);
	free(t->done);
	free(t->fifo);
	memset(t, 0, sizeof(*t));
}

/* Validate a caller's request before it takes a slot. */
int fx_req_check(const struct fx_dev *d, const struct fx_req *r)
{
	if (r->op > FX_OP_FLUSH || (r->flags & ~FX_REQ_CRC32C))
		return -EINVAL;
	if (r->op == FX_OP_FLUSH)
		return r->flags ? -EINVAL : 0;
	if (!r->addr && r->len)
		return -EFAULT;
	if (r->len > (uint64_t)SSIZE_MAX || r->off > (uint64_t)LLONG_MAX ||
	    r->len > (uint64_t)LLONG_MAX - r->off)
		return -EINVAL;
	(void)d;
	return 0;
}

/* Take a slot for a request; the caller has checked nfree > 0. */
uint32_t fx_req_take(struct req_table *t, const struct fx_req *src)
{
	uint32_t i = t->free[--t->nfree];
	struct req *r = &t->reqs[i];

	memset(r, 0, sizeof(*r));
	r->tag = src->tag;
	r->op = src->op;
	r->flags = src->flags;
	r->addr = src->addr;
	r->len = src->len;
	r->off = src->off;
	t->pending++;
	return i;
}

/* Finish a request: record its completion and free its slot. */
void fx_req_complete(struct req_table *t, uint32_t i)
{
	struct req *r = &t->reqs[i];
	struct fx_cqe *c = &t->done[(t->done_head + t->ndone) % t->nslots];

	c->tag = r->tag;
	c->res = r->err ? r->err : (int64_t)r->done;
	c->status = r->lost ? 0 : r->status;
	c->crc32c = 0;
	if ((r->flags & FX_REQ_CRC32C) && !r->err && r->done == r->len)
		/* the inversions of a standard CRC, applied once for the whole:
		 * crc = ~(raw(M) ^ ~0 advanced over len bytes) */
		c->crc32c = ~(r->crc_raw ^ fx_crc32c_shift(0xffffffffu, r->len));
	t->ndone++;
	t->free[t->nfree++] = i;
}

void fx_req_crc_add(struct req *r, const char *p, uint64_t n)
{
	if (!(r->flags & FX_REQ_CRC32C) || !n)
		return;
	uint64_t end = (uint64_t)(p - r->addr) + n;
	r->crc_raw ^= fx_crc32c_shift(fx_crc32c_raw(0, p, n), r->len - end);
}

int64_t fx_reqs_fifo_next(struct req_table *t)
{
	while (t->nfifo) {
		uint32_t ri = t->fifo[t->fifo_head];
		struct req *r = &t->reqs[ri];
		if (!fx_req_all_issued(r) && !r->err)
			return ri;
		t->fifo_head = (t->fifo_head + 1) % t->nslots;
		t->nfifo--;
	}
	return -1;
}

void fx_reqs_fifo_fail_head(struct req_table *t, int err)
{
	uint32_t ri = t->fifo[t->fifo_head];
	struct req *r = &t->reqs[ri];

	r->err = err;
	t->fifo_head = (t->fifo_head + 1) % t->nslots;
	t->nfifo--;
	if (!r->inflight)
		fx_req_complete(t, ri);
}

void fx_req_piece_done(struct req_table *t, uint32_t ri, int err, uint64_t bytes, uint16_t status)
{
	struct req *r = &t->reqs[ri];

	/* A status says its command did not run (or ran and failed); a piece
	 * lost to a timeout or a dropped connection says nothing about its
	 * command, so for the whole request "may have run" wins: its errno
	 * replaces a status piece's, and the completion carries no status (a
	 * caller that re-issues a write on a status alone must not re-issue
	 * one whose other pieces may still land). */
	if (err && !status && !r->lost) {
		r->err = err;
		r->lost = 1;
	} else if (err && !r->err) {
		r->err = err;
	}
	if (status && !r->status)
		r->status = status;
	r->done += bytes;
	r->inflight--;
	if (!r->inflight && (fx_req_all_issued(r) || r->err))
		fx_req_complete(t, ri);
}

void fx_reqs_fifo_push(struct req_table *t, uint32_t i)
{
	t->fifo[(t->fifo_head + t->nfifo) % t->nslots] = i;
	t->nfifo++;
}

int fx_reqs_pop_done(struct req_table *t, struct fx_cqe *out, unsigned max)
{
	unsigned n = 0;

	while (n < max && t->ndone) {
		out[n++] = t->done[t->done_head];
		t->done_head = (t->done_head + 1) % t->nslots;
		t->ndone--;
		t->pending--;
	}
	return (int)n;
}

unsigned fx_reqs_accept(struct req_table *t, const struct fx_req *reqs, unsigned n)
{
	unsigned k;

	/* pending, not only nfree: an empty request completes here and gives
	 * its slot back at once, but its completion still takes a place in the
	 * done ring until it is reaped */
	for (k = 0; k < n && t->nfree && t->pending < t->nslots; k++) {
		uint32_t i = fx_req_take(t, &reqs[k]);
		if (reqs[k].op != FX_OP_FLUSH && reqs[k].len == 0)
			fx_req_complete(t, i);
		else
			fx_reqs_fifo_push(t, i);
	}
	return k;
}
