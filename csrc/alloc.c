/*
 * Extent allocator for the chunk store's device space.
 *
 * Only free space is tracked, as a sorted array of disjoint, non-adjacent
 * extents.  Chunks are large (tens of MiB) and few, so the free list stays
 * short and an array beats a tree: free and reserve find their place by
 * binary search and shift the tail with memmove; alloc scans for the best
 * fit, which keeps big holes intact for big chunks.  Allocated extents are
 * not recorded: the on-device index owns them, and free() checks against the
 * free list that the whole range is in use (catches double frees).
 */
#include "fx100io.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

struct extent {
	uint64_t off;
	uint64_t len;
};

struct fx_alloc {
	uint64_t base;
	uint64_t end;  /* exclusive; aligned */
	uint64_t mask; /* align - 1 */
	uint64_t free_bytes;
	struct extent *ext; /* sorted by off, disjoint, never adjacent */
	size_t n;
	size_t cap;
};

int fx_alloc_create(uint64_t base, uint64_t size, uint32_t align, struct fx_alloc **out)
{
	struct fx_alloc *a;

	if (!out || align == 0 || (align & (align - 1)))
		return -EINVAL;
	if ((base & (align - 1)) || size > UINT64_MAX - base)
		return -EINVAL;
	a = calloc(1, sizeof(*a));
	if (!a)
		return -ENOMEM;
	a->mask = align - 1;
	a->base = base;
	/* a partial unit at the end could never be handed out whole */
	a->end = base + (size & ~a->mask);
	a->cap = 16;
	a->ext = malloc(a->cap * sizeof(*a->ext));
	if (!a->ext) {
		free(a);
		return -ENOMEM;
	}
	if (a->end > a->base) {
		a->ext[0].off = a->base;
		a->ext[0].len = a->end - a->base;
		a->n = 1;
		a->free_bytes = a->ext[0].len;
	}
	*out = a;
	return 0;
}

void fx_alloc_destroy(struct fx_alloc *a)
{
	if (!a)
		return;
	free(a->ext);
	free(a);
}

/* Index of the first free extent starting after off (n if none). */
static size_t first_after(const struct fx_alloc *a, uint64_t off)
{
	size_t lo = 0, hi = a->n;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (a->ext[mid].off <= off)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

/* Make room for one extent at index i. */
static int insert_at(struct fx_alloc *a, size_t i, uint64_t off, uint64_t len)
{
	if (a->n == a->cap) {
		struct extent *e;
		size_t cap = a->cap * 2;

		if (cap > SIZE_MAX / sizeof(*e))
			return -ENOMEM;
		e = realloc(a->ext, cap * sizeof(*e));
		if (!e)
			return -ENOMEM;
		a->ext = e;
		a->cap = cap;
	}
	memmove(&a->ext[i + 1], &a->ext[i], (a->n - i) * sizeof(a->ext[0]));
	a->ext[i].off = off;
	a->ext[i].len = len;
	a->n++;
	return 0;
}

static void remove_at(struct fx_alloc *a, size_t i)
{
	memmove(&a->ext[i], &a->ext[i + 1], (a->n - i - 1) * sizeof(a->ext[0]));
	a->n--;
}

/*
 * Validate a caller's extent and round its length up to the unit.  The
 * rounded length cannot overflow: end - off is a multiple of the unit, so
 * len <= end - off implies roundup(len) <= end - off.
 */
static int check_range(const struct fx_alloc *a, uint64_t off, uint64_t len, uint64_t *rlen)
{
	if (len == 0 || (off & a->mask))
		return -EINVAL;
	if (off < a->base || off >= a->end || len > a->end - off)
		return -EINVAL;
	*rlen = (len + a->mask) & ~a->mask;
	return 0;
}

int fx_alloc_alloc(struct fx_alloc *a, uint64_t len, uint64_t *off)
{
	size_t best = a->n;

	if (len == 0)
		return -EINVAL;
	if (len > UINT64_MAX - a->mask)
		return -ENOSPC;
	len = (len + a->mask) & ~a->mask;
	for (size_t i = 0; i < a->n; i++) {
		if (a->ext[i].len < len)
			continue;
		if (best == a->n || a->ext[i].len < a->ext[best].len) {
			best = i;
			if (a->ext[i].len == len)
				break;
		}
	}
	if (best == a->n)
		return -ENOSPC;
	*off = a->ext[best].off;
	if (a->ext[best].len == len) {
		remove_at(a, best);
	} else {
		a->ext[best].off += len;
		a->ext[best].len -= len;
	}
	a->free_bytes -= len;
	return 0;
}

int fx_alloc_free(struct fx_alloc *a, uint64_t off, uint64_t len)
{
	size_t i;
	int merge_prev, merge_next, rc;

	rc = check_range(a, off, len, &len);
	if (rc < 0)
		return rc;
	/* ext[i-1] starts at or before off, ext[i] after it */
	i = first_after(a, off);
	if (i > 0 && a->ext[i - 1].off + a->ext[i - 1].len > off)
		return -EINVAL;
	if (i < a->n && a->ext[i].off < off + len)
		return -EINVAL;
	merge_prev = i > 0 && a->ext[i - 1].off + a->ext[i - 1].len == off;
	merge_next = i < a->n && a->ext[i].off == off + len;
	if (merge_prev && merge_next) {
		a->ext[i - 1].len += len + a->ext[i].len;
		remove_at(a, i);
	} else if (merge_prev) {
		a->ext[i - 1].len += len;
	} else if (merge_next) {
		a->ext[i].off = off;
		a->ext[i].len += len;
	} else {
		rc = insert_at(a, i, off, len);
		if (rc < 0)
			return rc;
	}
	a->free_bytes += len;
	return 0;
}

int fx_alloc_reserve(struct fx_alloc *a, uint64_t off, uint64_t len)
{
	struct extent *e;
	uint64_t head, tail;
	size_t i;
	int rc;

	rc = check_range(a, off, len, &len);
	if (rc < 0)
		return rc;
	/* only the free extent starting at or before off can contain it */
	i = first_after(a, off);
	if (i == 0)
		return -EEXIST;
	e = &a->ext[i - 1];
	if (e->off + e->len < off + len)
		return -EEXIST;
	head = off - e->off;
	tail = e->off + e->len - (off + len);
	if (head && tail) {
		rc = insert_at(a, i, off + len, tail);
		if (rc < 0)
			return rc;
		a->ext[i - 1].len = head; /* insert_at may have moved ext */
	} else if (head) {
		e->len = head;
	} else if (tail) {
		e->off = off + len;
		e->len = tail;
	} else {
		remove_at(a, i - 1);
	}
	a->free_bytes -= len;
	return 0;
}

uint64_t fx_alloc_free_bytes(const struct fx_alloc *a)
{
	return a->free_bytes;
}

uint64_t fx_alloc_largest_free(const struct fx_alloc *a)
{
	uint64_t best = 0;

	for (size_t i = 0; i < a->n; i++)
		if (a->ext[i].len > best)
			best = a->ext[i].len;
	return best;
}

uint64_t fx_alloc_free_extents(const struct fx_alloc *a)
{
	return a->n;
}
