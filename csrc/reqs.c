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
	t->write_depth = FX_WRITE_DEPTH_DEFAULT;
	t->reqs = calloc(slots, sizeof(*t->reqs));
	t->free = malloc(slots * sizeof(*t->free));
	t->done = malloc(slots * sizeof(*t->done));
	t->accepted = malloc(slots * sizeof(*t->accepted));
	int ok = t->reqs && t->free && t->done && t->accepted;
	for (unsigned c = 0; c < FX_PRIO_CLASSES; c++) {
		/* a chain holds at least one request: a ring never needs more
		 * entries than there are slots */
		t->cls[c].ring = malloc(slots * sizeof(uint32_t));
		t->cls[c].tail = malloc(slots * sizeof(uint32_t));
		ok = ok && t->cls[c].ring && t->cls[c].tail;
	}
	if (!ok) {
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
	free(t->accepted);
	for (unsigned c = 0; c < FX_PRIO_CLASSES; c++) {
		free(t->cls[c].ring);
		free(t->cls[c].tail);
	}
	memset(t, 0, sizeof(*t));
}

/* Validate a caller's request before it takes a slot. */
int fx_req_check(const struct fx_dev *d, const struct fx_req *r)
{
	if (r->op > FX_OP_FLUSH || (r->flags & ~FX_REQ_CRC32C) || r->prio >= FX_PRIO_CLASSES)
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

static int is_load_read(const struct req *r)
{
	return r->prio == FX_PRIO_LOAD && r->op == FX_OP_READ;
}

/* Whether a piece of r counts against write_depth. */
static int is_capped_write(const struct req *r)
{
	return r->prio != FX_PRIO_LOAD && r->op == FX_OP_WRITE;
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
	r->prio = src->prio;
	r->stream = src->stream;
	r->next = FX_REQ_NONE;
	if (is_load_read(r))
		t->load_reads++;
	t->pending++;
	return i;
}

/* Finish a request: record its completion and free its slot (once it has
 * left its queue: a queue never points at a slot that was reused). */
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
	if (is_load_read(r))
		t->load_reads--;
	if (r->queued)
		r->zombie = 1;
	else
		t->free[t->nfree++] = i;
}

void fx_req_crc_add(struct req *r, const char *p, uint64_t n)
{
	if (!(r->flags & FX_REQ_CRC32C) || !n)
		return;
	uint64_t end = (uint64_t)(p - r->addr) + n;
	r->crc_raw ^= fx_crc32c_shift(fx_crc32c_raw(0, p, n), r->len - end);
}

/* Nothing of r is left to issue. */
static int spent(const struct req *r)
{
	return fx_req_all_issued(r) || r->err || r->eof || r->zombie;
}

/* r (the head of the chain at the head of class c) leaves the queue: the
 * next request of its chain takes its place, or the entry goes. */
static void drop_head(struct req_table *t, unsigned c)
{
	struct prio_queue *pq = &t->cls[c];
	uint32_t ri = pq->ring[pq->head];
	struct req *r = &t->reqs[ri];

	if (r->next != FX_REQ_NONE) {
		pq->ring[pq->head] = r->next;
	} else {
		pq->head = (pq->head + 1) % t->nslots;
		pq->n--;
	}
	r->queued = 0;
	r->next = FX_REQ_NONE;
	t->nfifo--;
	if (r->zombie)
		t->free[t->nfree++] = ri;
}

/* The first request of class c with bytes to issue, after dropping the
 * spent ones at its head; -1 if none. */
static int64_t class_head(struct req_table *t, unsigned c)
{
	struct prio_queue *pq = &t->cls[c];

	while (pq->n) {
		uint32_t ri = pq->ring[pq->head];
		if (!spent(&t->reqs[ri]))
			return ri;
		drop_head(t, c);
	}
	return -1;
}

int64_t fx_reqs_fifo_next(struct req_table *t)
{
	return fx_reqs_fifo_next_skip(t, 0);
}

int64_t fx_reqs_fifo_next_skip(struct req_table *t, unsigned skip)
{
	int64_t heads[FX_PRIO_CLASSES];
	unsigned may = 0;
	int hold = t->load_reads && t->wr_inflight >= t->write_depth;

	for (unsigned c = 0; c < FX_PRIO_CLASSES; c++) {
		heads[c] = class_head(t, c);
		if (heads[c] < 0 || (skip & (1u << c)))
			continue;
		/* what is submitted to a device cannot be overtaken: keep few
		 * writes ahead of a load there */
		if (hold && is_capped_write(&t->reqs[heads[c]]))
			continue;
		may |= 1u << c;
	}
	if (!may)
		return -1;
	unsigned pick = FX_PRIO_CLASSES;
	for (unsigned c = 1; c < FX_PRIO_CLASSES; c++)
		if ((may & (1u << c)) && t->cls[c].starve >= FX_PRIO_SHARE - 1) {
			pick = c; /* its guaranteed share */
			break;
		}
	if (pick == FX_PRIO_CLASSES)
		pick = (unsigned)__builtin_ctz(may);
	/* (a share counts only where a higher class could have gone) */
	t->by_share = (uint8_t)((may & ((1u << pick) - 1)) != 0);
	t->picked = (uint8_t)pick;
	t->waiting = (uint8_t)may;
	return heads[pick];
}

void fx_reqs_piece_issued(struct req_table *t, uint32_t ri)
{
	struct req *r = &t->reqs[ri];
	unsigned c = r->prio;
	struct prio_queue *pq = &t->cls[c];

	if (t->by_share)
		t->shares++;
	for (unsigned d = c + 1; d < FX_PRIO_CLASSES; d++)
		if (t->waiting & (1u << d))
			t->cls[d].starve++;
	pq->starve = 0;
	t->pieces[c]++;
	if (is_capped_write(r))
		t->wr_inflight++;
	/* ri is the head of its class (fx_reqs_fifo_next said so) */
	int entry_left = 1; /* its chain still has requests at the head */
	if (spent(r)) {
		entry_left = r->next != FX_REQ_NONE;
		drop_head(t, c);
	}
	pq->served = 0;
	if (c != FX_PRIO_LOAD || !entry_left)
		return;
	if (pq->n > 1) {
		/* round robin between streams: its chain goes to the back */
		uint32_t at = (pq->head + pq->n) % t->nslots;
		pq->ring[at] = pq->ring[pq->head];
		pq->tail[at] = pq->tail[pq->head];
		pq->head = (pq->head + 1) % t->nslots;
	} else {
		/* alone, it stays first: a stream that comes next goes before it */
		pq->served = 1;
	}
}

void fx_reqs_piece_end(struct req_table *t, uint32_t ri)
{
	if (is_capped_write(&t->reqs[ri]) && t->wr_inflight)
		t->wr_inflight--;
}

void fx_reqs_fifo_fail_head(struct req_table *t, int err)
{
	unsigned c = t->picked;
	uint32_t ri = t->cls[c].ring[t->cls[c].head];
	struct req *r = &t->reqs[ri];

	r->err = err;
	drop_head(t, c);
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
	fx_reqs_piece_end(t, ri);
	if (!r->inflight && (fx_req_all_issued(r) || r->err))
		fx_req_complete(t, ri);
}

/* Queue request i in its class: at the end of the last (or first) entry's
 * chain when that is the same stream (a batch's requests arrive one after
 * the other), else as a new entry. */
static void enqueue(struct req_table *t, uint32_t i)
{
	struct req *r = &t->reqs[i];
	struct prio_queue *pq = &t->cls[r->prio];

	r->queued = 1;
	t->nfifo++;
	/* the last entry, or the first (where a stream that came while one
	 * entry was alone went, see below) */
	for (uint32_t k = 0; k < 2 && k < pq->n; k++) {
		uint32_t e = k ? pq->head : (pq->head + pq->n - 1) % t->nslots;
		struct req *tr = &t->reqs[pq->tail[e]];
		if (tr->queued && tr->stream == r->stream) {
			tr->next = i;
			pq->tail[e] = i;
			return;
		}
	}
	uint32_t at = (pq->head + pq->n) % t->nslots;
	if (pq->served) {
		/* the one entry there just had its turn: this one is next */
		pq->head = (pq->head + t->nslots - 1) % t->nslots;
		at = pq->head;
		pq->served = 0;
	}
	pq->ring[at] = i;
	pq->tail[at] = i;
	pq->n++;
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

	/* slots of requests that completed while queued come back as their
	 * queues' heads move on */
	for (unsigned c = 0; c < FX_PRIO_CLASSES; c++)
		class_head(t, c);
	t->naccepted = 0;
	/* pending, not only nfree: an empty request completes here and gives
	 * its slot back at once, but its completion still takes a place in the
	 * done ring until it is reaped */
	for (k = 0; k < n && t->nfree && t->pending < t->nslots; k++) {
		uint32_t i = fx_req_take(t, &reqs[k]);
		if (reqs[k].op != FX_OP_FLUSH && reqs[k].len == 0) {
			fx_req_complete(t, i);
		} else {
			enqueue(t, i);
			t->accepted[t->naccepted++] = i;
		}
	}
	return k;
}
