/*
 * The I/O engine of one live I/O queue: many Read and Write commands in
 * flight at once, their disk I/O on an io_uring, their answers sent by a
 * second thread of the connection as each one's I/O completes.
 *
 * Two threads per queue, each doing what it is for:
 *   - the connection's thread (conn.c) reads PDUs, checks them as before,
 *     and starts each command here: a slot, a buffer from the queue's
 *     budget, then the disk read (or an R2T, for a write);
 *     (what it starts goes to the kernel together before it could wait,
 *     so that neighbouring reads merge at the block layer: queue_locked);
 *   - the engine's thread waits on the ring's completions and, for each
 *     command whose I/O is done, sends its C2HData and CapsuleResp (one
 *     command's PDUs together, under the connection's send lock), then
 *     frees the buffer: a buffer is reused only once its send returned.
 *     (Sends are plain blocking sendmsg(): the data is in the socket once
 *     it returns.  A zero-copy send would only move that point to a later
 *     completion; over loopback the kernel copies anyway.)
 *
 * Where the data comes from: a Read whose range is all in the page cache
 * (mincore() on a mapping of the namespace) is sent with sendfile() as
 * before, no buffer and no copy of ours; one that is not is read with
 * O_DIRECT into the command's buffer when the offset and length are
 * FX_TGT_DIO_ALIGN-aligned and the namespace could be opened so (else
 * buffered, through io_uring's workers).  Writes go to the disk the same
 * way (O_DIRECT when aligned), RWF_DSYNC for FUA.  O_DIRECT and buffered
 * I/O of the same file stay coherent (the kernel writes back and drops the
 * cached pages a direct I/O covers), so no command sees stale data that a
 * completed one wrote.
 *
 * Order: commands run concurrently, as on any NVMe controller; a Read
 * submitted after a Write to the same blocks sees the write only when the
 * host waited for the write's completion before sending the read.  Each
 * command's C2HData precede its CapsuleResp; different commands' answers
 * come in the order their I/O completes.
 *
 * Memory: buffers held by a queue total at most FX_TGT_IO_BUDGET (32 MiB:
 * 8 commands of the 4 MiB MDTS, 16 of 1 MiB; each buffer is the power of
 * two at or above its command's length, so 2 MiB + 512 bytes counts 4 MiB,
 * and from 1 MiB up whole 2 MiB huge pages where the kernel has them, so
 * 1 MiB counts 2 MiB: see buf_alloc), and those of all queues together at
 * most the target's budget (--io-buffer-budget), of which each peer
 * address gets a fair share (tgt.h, FX_TGT_IO_BUFFER_BUDGET): a host that
 * opens many queues and never reads its socket holds its reads' buffers
 * until the stall timeout, and must not make anyone else wait that long.
 * A command that does not fit waits in its queue's FIFO, holding only its
 * slot (the queue's depth bounds slots), and starts when a buffer of its
 * queue is freed, or when the target's budget frees room (any queue's
 * release wakes the queues waiting on it through their eventfd, whose
 * read the engine keeps on its ring).  A write's buffer is taken before
 * its R2T goes out, so a host can never make us hold data we have no room
 * for, and its data is due within 2 x stall_ms of the R2T (conn.c); while
 * any queue waits for room, within FX_TGT_SQUEEZE_MS for a connection whose
 * address holds more than its share (tgt.h).
 * Ended commands' buffers are kept for the next command of any queue,
 * within the budget (a room-seeking command frees them first); every
 * 100 ms the cache is trimmed to what the last 100 ms used beyond what is
 * in use, FX_TGT_IO_IDLE_CACHE at least (tgt_iobufs_tick).
 *
 * Known limit: a read found cached by mincore() is sent with sendfile()
 * on the engine's thread; pages evicted in between are read from the disk
 * there, synchronously, holding up that queue's other answers for as long
 * (never wrong, only slower).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <liburing.h>
#include <stddef.h>
#include <stdio.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "tgt.h"

/* (not all ones: liburing keeps that tag for its own timeouts on kernels
 * without IORING_FEAT_EXT_ARG and drops their completions) */
#define STOP_TAG 0xFFFFFFFFFFFFFFFEull
/* Buffer classes: commands up to 64 KiB, 128 KiB, ... FX_TGT_MAX_XFER. */
#define BUF_MIN_SHIFT 16
#define BUF_CLASSES FX_TGT_BUF_CLASSES
_Static_assert((1u << (BUF_MIN_SHIFT + BUF_CLASSES - 1)) == FX_TGT_MAX_XFER, "buffer classes");
/* The read of the queue's wake eventfd: room in the target's budget. */
#define WAKE_TAG 0xFFFFFFFFFFFFFFFDull

enum tgt_io_state {
	TGT_IO_FREE,
	TGT_IO_WAIT_BUF,  /* in the FIFO, waiting for room in the budget */
	TGT_IO_WAIT_DATA, /* write: R2T sent, its H2CData coming in */
	TGT_IO_DISK, /* its ring operation submitted (a NOP hands over a cached read or an error) */
};

static const char *tgt_io_state_str(enum tgt_io_state s)
{
	switch (s) {
	case TGT_IO_FREE:
		return "free";
	case TGT_IO_WAIT_BUF:
		return "wait-buffer";
	case TGT_IO_WAIT_DATA:
		return "wait-data";
	case TGT_IO_DISK:
		return "disk";
	}
	return "?";
}

struct tgt_io {
	enum tgt_io_state state;
	int write;
	int fua;
	int direct; /* the disk I/O goes through ns->dfd */
	int cached; /* read: sent from the page cache (sendfile), no buffer */
	uint16_t cid;
	uint16_t err; /* status of the response (digest error, read or write fault) */
	struct tgt_ns *ns;
	uint64_t off;
	uint32_t len;
	uint32_t done;   /* write in WAIT_DATA: bytes received; in DISK: bytes moved */
	uint32_t cap;    /* the buffer's size (its class), what the budget counts */
	uint64_t r2t_ms; /* write: when its R2T went out (its data is due within 2 x stall_ms) */
	uint8_t *buf;
	int next; /* FIFO link */
};

struct tgt_ioq {
	struct tgt_conn *c;
	struct io_uring ring;
	pthread_t thread;
	/* Slots, budget, FIFO, and the ring's submission side. */
	pthread_mutex_t lock;
	pthread_mutex_t send_lock; /* c->send_lock (recursive) */
	struct tgt_io *io;
	uint16_t *free_idx;
	unsigned n, nfree;
	size_t used; /* bytes of buffers held */
	int fifo_head, fifo_tail;
	unsigned sqes;       /* prepared, not yet reaped */
	unsigned unsent;     /* prepared, not yet handed to the kernel (queue_locked) */
	size_t unsent_bytes; /* their bytes (about: what an error left counts until the next flush) */
	int stopping;        /* the connection ends: no more sends or submissions */
	uint8_t *chunk;      /* the engine thread's staging (cached reads with a digest) */
	/* Commands waiting for room in the target's budget (not only the
	 * queue's own): whichever thread frees room writes wake_fd, whose
	 * read the engine keeps armed on its ring (WAKE_TAG). */
	int wake_fd;
	uint64_t wake_val;
	struct tgt_ioq *pool_next; /* in the budget's waiters (under its lock) */
	int pool_waiting;
	uint32_t pool_need; /* what its next command needs */
};

/* Hand the operations prepared so far to the kernel.  Under q->lock.  The
 * kernel may take part of them (short of memory for requests): the rest is
 * offered again, for a while (the CQ has room for every operation, so the
 * engine never needs this lock to make room); what is still left stays
 * counted in unsent, for the next kick. */
static void flush_locked(struct tgt_ioq *q)
{
	for (unsigned tries = 0; q->unsent && tries < 1000; tries++) {
		int r = io_uring_submit(&q->ring);

		if (r == -EINTR || r == -EAGAIN || r == -EBUSY ||
		    (r == 0 && io_uring_sq_ready(&q->ring))) {
			if (r != -EINTR)
				usleep(100);
		} else if (r < 0) {
			tgt_log(q->c->t, "%s qid %u: io_uring submit: %s", q->c->peer, q->c->qid,
				strerror(-r));
			break;
		}
		q->unsent = io_uring_sq_ready(&q->ring);
	}
	q->unsent_bytes = q->unsent ? q->unsent_bytes : 0;
}

/*
 * Prepare op for slot idx (or the stop marker) on the ring; it goes to the
 * kernel at the next flush_locked.  Under q->lock; cannot run out of
 * entries: the ring has room for every slot and the stop marker.
 *
 * Why not submit each at once: reads of neighbouring blocks handed to the
 * kernel in one io_uring_enter go down under one block plug, where the
 * block layer merges them (up to the disk's max_sectors_kb), and a disk
 * that is fast only with large requests (a cloud volume) reads a host's
 * sequential 1 MiB commands merged into 4 MiB requests at nearly twice the
 * speed.  One submit per command never merges.  So each thread prepares
 * what it has and submits before it could wait: the connection's thread
 * before a receive that would block, a send, or a command it serves in
 * line (tgt_ioq_kick), and at FLUSH_BATCH prepared; the engine's thread
 * after each batch of completions, or within one once FX_TGT_MAX_XFER
 * bytes are prepared (the disk takes no larger request, and the reads
 * should not wait for the rest of the batch's sends).
 */
#define FLUSH_BATCH 32
static void queue_locked(struct tgt_ioq *q, uint64_t tag)
{
	struct io_uring_sqe *sqe = io_uring_get_sqe(&q->ring);

	if (!sqe) { /* (cannot happen; see tgt_ioq_start) */
		flush_locked(q);
		sqe = io_uring_get_sqe(&q->ring);
		if (!sqe)
			abort();
	}
	if (tag == STOP_TAG) {
		io_uring_prep_nop(sqe);
	} else {
		struct tgt_io *io = &q->io[tag];
		int fd = io->direct ? io->ns->dfd : io->ns->fd;
		uint32_t left = io->len - io->done;

		if (io->cached || io->err) {
			io_uring_prep_nop(sqe);
			left = 0;
		} else if (io->write) {
			io_uring_prep_write(sqe, fd, io->buf + io->done, left, io->off + io->done);
			if (io->fua)
				sqe->rw_flags = RWF_DSYNC;
		} else {
			io_uring_prep_read(sqe, fd, io->buf + io->done, left, io->off + io->done);
		}
		q->unsent_bytes += left;
	}
	io_uring_sqe_set_data64(sqe, tag);
	q->sqes++;
	if (++q->unsent >= FLUSH_BATCH)
		flush_locked(q);
}

/* Keep a read of the wake eventfd on the ring (under q->lock): it
 * completes when another thread frees room in the target's budget. */
static void arm_wake_locked(struct tgt_ioq *q)
{
	struct io_uring_sqe *sqe = io_uring_get_sqe(&q->ring);

	if (!sqe) { /* (cannot happen: the ring has room for it too) */
		flush_locked(q);
		sqe = io_uring_get_sqe(&q->ring);
		if (!sqe)
			abort();
	}
	io_uring_prep_read(sqe, q->wake_fd, &q->wake_val, sizeof(q->wake_val), 0);
	io_uring_sqe_set_data64(sqe, WAKE_TAG);
	q->sqes++;
	q->unsent++;
}

/*
 * Where buffers of 1 MiB and more come from.  A direct read goes to the
 * disk as one request only if its buffer needs few segments: the block
 * layer splits a request at max_segments (254 on virtio-blk), so a 1 MiB
 * buffer of scattered 4 KiB pages becomes two or more requests, and a
 * disk that is fast only with large ones (a cloud volume) serves such a
 * queue at under half its speed.  Where the kernel gives this process
 * 2 MiB transparent huge pages, those buffers are their own 2 MiB-aligned
 * mappings (advised MADV_HUGEPAGE when THP is in madvise mode), whole
 * 2 MiB pages: one segment per 2 MiB.  A 1 MiB command then takes a
 * 2 MiB buffer (the 1 MiB class is folded into the 2 MiB one) and the
 * budget counts it so: the budget bounds memory, not command bytes.  In
 * madvise mode with defrag=madvise (the default), the first touch of a
 * fresh buffer may compact memory to find a huge page; buffers are kept
 * and reused, so that is paid once per buffer, not per command.
 */
#define HUGE_BYTES (2u << 20)
#define HUGE_FROM_CLASS 4 /* 64 KiB << 4 = 1 MiB */

static pthread_once_t huge_once = PTHREAD_ONCE_INIT;
static int huge_on;      /* buffers from 1 MiB up are whole huge pages */
static int huge_madvise; /* ... and must ask for them (madvise mode) */

/* The [selected] word of a sysfs mode file, or "" where it is missing. */
static void sysfs_mode(const char *path, char *out, size_t n)
{
	char line[160] = "";
	FILE *f = fopen(path, "re");
	char *a, *b;

	out[0] = 0;
	if (!f)
		return;
	if (!fgets(line, sizeof(line), f))
		line[0] = 0;
	fclose(f);
	a = strchr(line, '[');
	b = a ? strchr(a, ']') : NULL;
	if (a && b && (size_t)(b - a - 1) < n) {
		memcpy(out, a + 1, (size_t)(b - a - 1));
		out[b - a - 1] = 0;
	}
}

static void huge_probe(void)
{
	const char *dir = "/sys/kernel/mm/transparent_hugepage";
	char path[128], mode[32], size_mode[32];
	unsigned long pmd = 0;
	FILE *f;

	snprintf(path, sizeof(path), "%s/hpage_pmd_size", dir);
	if ((f = fopen(path, "re"))) {
		if (fscanf(f, "%lu", &pmd) != 1)
			pmd = 0;
		fclose(f);
	}
	if (pmd != HUGE_BYTES || prctl(PR_GET_THP_DISABLE, 0, 0, 0, 0) > 0)
		return; /* huge pages of another size (arm64 64K), or THP off for us */
	snprintf(path, sizeof(path), "%s/enabled", dir);
	sysfs_mode(path, mode, sizeof(mode));
	/* kernels with per-size controls (6.8+): the 2 MiB size's own mode */
	snprintf(path, sizeof(path), "%s/hugepages-2048kB/enabled", dir);
	sysfs_mode(path, size_mode, sizeof(size_mode));
	if (size_mode[0] && strcmp(size_mode, "inherit") != 0)
		memcpy(mode, size_mode, sizeof(mode));
	huge_on = !strcmp(mode, "always") || !strcmp(mode, "madvise");
	huge_madvise = !strcmp(mode, "madvise");
}

static int huge_buffers(void)
{
	pthread_once(&huge_once, huge_probe);
	return huge_on;
}

static unsigned buf_class(uint32_t len)
{
	unsigned k = 0;

	while (k + 1 < BUF_CLASSES && (1u << (BUF_MIN_SHIFT + k)) < len)
		k++;
	if (k == HUGE_FROM_CLASS && huge_buffers())
		k++; /* a 1 MiB buffer would take a whole 2 MiB page anyway */
	return k;
}

static int huge_class(unsigned k)
{
	return k >= HUGE_FROM_CLASS && huge_buffers();
}

/* The bytes a class-k buffer takes (what the budget counts). */
static uint32_t class_bytes(unsigned k)
{
	return 1u << (BUF_MIN_SHIFT + k);
}

static uint32_t buf_cap(uint32_t len)
{
	return class_bytes(buf_class(len));
}

static void *buf_alloc(unsigned k)
{
	size_t n = class_bytes(k);
	void *p;

	if (huge_class(k)) {
		/* over-map by one huge page, keep the aligned middle (n is a
		 * multiple of HUGE_BYTES, so the tail piece is never empty) */
		uint8_t *m = mmap(NULL, n + HUGE_BYTES, PROT_READ | PROT_WRITE,
				  MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		uintptr_t a;

		if (m == MAP_FAILED)
			return NULL;
		a = ((uintptr_t)m + HUGE_BYTES - 1) & ~(uintptr_t)(HUGE_BYTES - 1);
		if (a > (uintptr_t)m)
			(void)munmap(m, a - (uintptr_t)m);
		(void)munmap((void *)(a + n), (uintptr_t)m + n + HUGE_BYTES - (a + n));
		if (huge_madvise)
			(void)madvise((void *)a, n,
				      MADV_HUGEPAGE); /* a hint: small pages still work */
		return (void *)a;
	}
	if (posix_memalign(&p, FX_TGT_DIO_ALIGN, n) != 0)
		return NULL;
	return p;
}

static void buf_free(void *p, unsigned k)
{
	if (huge_class(k))
		munmap(p, class_bytes(k));
	else
		free(p);
}

/* ------------------------------------------- the target's buffer budget */

/* Peer p's bytes held and queues waiting change (under b->lock): the
 * count of active peers follows. */
static void peer_change_locked(struct tgt_iobufs *b, struct tgt_iopeer *p, size_t add, size_t sub,
			       int wait)
{
	int was = p->held || p->waiting;

	p->held = p->held + add - sub;
	p->waiting = (unsigned)((int)p->waiting + wait);
	atomic_store(&b->nwait, (unsigned)((int)atomic_load(&b->nwait) + wait));
	if (was && !(p->held || p->waiting))
		b->active--;
	else if (!was && (p->held || p->waiting))
		b->active++;
}

/* The most peer p may hold now (under b->lock): an equal part for each
 * peer with buffers or waiting for them, and three quarters of the budget
 * for a lone one, so that room is left for whoever comes next; never less
 * than one command of the largest size. */
static size_t share_locked(const struct tgt_iobufs *b, const struct tgt_iopeer *p)
{
	unsigned n = b->active + !(p->held || p->waiting);
	size_t share = n <= 1 ? b->budget - b->budget / 4 : b->budget / n;

	return share < FX_TGT_MAX_XFER ? FX_TGT_MAX_XFER : share;
}

/* Free cached buffers, the largest first, until at most keep bytes are
 * cached (under b->lock). */
static void cache_trim_locked(struct tgt_iobufs *b, size_t keep)
{
	for (unsigned k = BUF_CLASSES; k-- > 0 && b->cached > keep;)
		while (b->ncache[k] && b->cached > keep) {
			buf_free(b->cache[k][--b->ncache[k]], k);
			b->cached -= class_bytes(k);
		}
}

/* Reserve n bytes for peer p (under b->lock): 1, or 0 when that would
 * take the target past its budget or p past its share. */
static int pool_take_locked(struct tgt_iobufs *b, struct tgt_iopeer *p, size_t n)
{
	if (b->used + n > b->budget || p->held + n > share_locked(b, p))
		return 0;
	if (b->used + b->cached + n > b->budget)
		cache_trim_locked(b, b->budget - b->used - n);
	b->used += n;
	if (b->used > b->peak)
		b->peak = b->used;
	peer_change_locked(b, p, n, 0, 0);
	return 1;
}

/* The queues waiting for room whose next command now fits try again
 * (under b->lock).  Only those: a host whose queues wait above their share
 * must not make every other host's completion wake them all in vain. */
static void wake_waiters_locked(struct tgt_iobufs *b)
{
	struct tgt_ioq **pp = &b->waiters;

	while (*pp) {
		struct tgt_ioq *q = *pp;
		struct tgt_iopeer *p = q->c->iopeer;
		uint64_t one = 1;

		if (b->used + q->pool_need > b->budget ||
		    p->held + q->pool_need > share_locked(b, p)) {
			pp = &q->pool_next;
			continue;
		}
		*pp = q->pool_next;
		q->pool_next = NULL;
		q->pool_waiting = 0;
		peer_change_locked(b, p, 0, 0, -1);
		if (write(q->wake_fd, &one, sizeof(one)) < 0) {
			/* (cannot fail but for a counter at its maximum, which
			 * is a pending wake-up too) */
		}
	}
}

static void pool_give_locked(struct tgt_iobufs *b, struct tgt_iopeer *p, size_t n)
{
	b->used -= n;
	peer_change_locked(b, p, 0, n, 0);
	wake_waiters_locked(b);
}

/* q is no longer waiting for room (under b->lock). */
static void pool_unwait_locked(struct tgt_iobufs *b, struct tgt_ioq *q)
{
	struct tgt_ioq **pp;

	if (!q->pool_waiting)
		return;
	for (pp = &b->waiters; *pp && *pp != q; pp = &(*pp)->pool_next)
		;
	if (*pp)
		*pp = q->pool_next;
	q->pool_next = NULL;
	q->pool_waiting = 0;
	peer_change_locked(b, q->c->iopeer, 0, 0, -1);
	/* (its peer may have gone idle: the others' shares grew) */
	wake_waiters_locked(b);
}

/* Room for a buffer of cap bytes in the queue's budget and the target's
 * (under q->lock): 1, or 0, and then the queue is woken once the
 * target's budget frees room (its own completions wake it anyway). */
static int reserve_locked(struct tgt_ioq *q, uint32_t cap)
{
	struct tgt_iobufs *b = &q->c->t->iobufs;
	int ok;

	if (q->used + cap > FX_TGT_IO_BUDGET)
		return 0;
	pthread_mutex_lock(&b->lock);
	ok = pool_take_locked(b, q->c->iopeer, cap);
	if (ok) {
		pool_unwait_locked(b, q);
	} else if (!q->pool_waiting) {
		q->pool_need = cap;
		q->pool_waiting = 1;
		q->pool_next = b->waiters;
		b->waiters = q;
		peer_change_locked(b, q->c->iopeer, 0, 0, 1);
	}
	pthread_mutex_unlock(&b->lock);
	if (ok)
		q->used += cap;
	return ok;
}

/* Give back a reservation whose buffer never came (under q->lock). */
static void unreserve_locked(struct tgt_ioq *q, uint32_t cap)
{
	struct tgt_iobufs *b = &q->c->t->iobufs;

	q->used -= cap;
	pthread_mutex_lock(&b->lock);
	pool_give_locked(b, q->c->iopeer, cap);
	pthread_mutex_unlock(&b->lock);
}

/* A buffer of class k for a reserved command: cached or new. */
static void *buf_get(struct tgt_ioq *q, uint32_t len)
{
	struct tgt_iobufs *b = &q->c->t->iobufs;
	unsigned k = buf_class(len);
	void *p = NULL;

	pthread_mutex_lock(&b->lock);
	if (b->ncache[k]) {
		p = b->cache[k][--b->ncache[k]];
		b->cached -= class_bytes(k);
	}
	pthread_mutex_unlock(&b->lock);
	return p ? p : buf_alloc(k);
}

/* A command's buffer (class k, cap bytes reserved) is done with: kept
 * for the next command of any queue (a fresh one costs page faults and
 * zeroing, a large part of the CPU a read takes), and its room given back.
 * Under q->lock. */
static void buf_put_locked(struct tgt_ioq *q, void *p, unsigned k, uint32_t cap)
{
	struct tgt_iobufs *b = &q->c->t->iobufs;
	int keep;

	q->used -= cap;
	pthread_mutex_lock(&b->lock);
	keep = b->ncache[k] < b->cache_max[k];
	if (keep) {
		b->cache[k][b->ncache[k]++] = p;
		b->cached += class_bytes(k);
	}
	pool_give_locked(b, q->c->iopeer, cap);
	pthread_mutex_unlock(&b->lock);
	if (!keep)
		buf_free(p, k);
}

int tgt_iobufs_init(struct fx_target *t, size_t budget)
{
	struct tgt_iobufs *b = &t->iobufs;

	pthread_mutex_init(&b->lock, NULL);
	b->budget = budget;
	for (unsigned k = 0; k < BUF_CLASSES; k++) {
		/* (used + cached <= budget: never more of a class than fit) */
		b->cache_max[k] = (unsigned)(budget / class_bytes(k));
		b->cache[k] = calloc(b->cache_max[k] ? b->cache_max[k] : 1, sizeof(void *));
		if (!b->cache[k])
			return -ENOMEM;
	}
	return 0;
}

void tgt_iobufs_fini(struct fx_target *t)
{
	struct tgt_iobufs *b = &t->iobufs;

	if (!b->budget)
		return; /* (never set up) */
	cache_trim_locked(b, 0);
	for (unsigned k = 0; k < BUF_CLASSES; k++)
		free(b->cache[k]);
	pthread_mutex_destroy(&b->lock);
}

int tgt_iopeer_get(struct tgt_conn *c)
{
	struct tgt_iobufs *b = &c->t->iobufs;
	struct tgt_iopeer *p;

	pthread_mutex_lock(&b->lock);
	for (p = b->peers; p && strcmp(p->key, c->peer_key) != 0; p = p->next)
		;
	if (!p && (p = calloc(1, sizeof(*p))) != NULL) {
		snprintf(p->key, sizeof(p->key), "%s", c->peer_key);
		p->next = b->peers;
		b->peers = p;
	}
	if (p)
		p->conns++;
	pthread_mutex_unlock(&b->lock);
	c->iopeer = p;
	return p ? 0 : -ENOMEM;
}

void tgt_iopeer_put(struct tgt_conn *c)
{
	struct tgt_iobufs *b = &c->t->iobufs;
	struct tgt_iopeer *p = c->iopeer, **pp;

	if (!p)
		return;
	c->iopeer = NULL;
	pthread_mutex_lock(&b->lock);
	if (--p->conns == 0) {
		for (pp = &b->peers; *pp && *pp != p; pp = &(*pp)->next)
			;
		if (*pp)
			*pp = p->next;
		free(p);
	}
	pthread_mutex_unlock(&b->lock);
}

int tgt_iobufs_try(struct tgt_conn *c, size_t n)
{
	struct tgt_iobufs *b = &c->t->iobufs;
	int ok;

	pthread_mutex_lock(&b->lock);
	ok = pool_take_locked(b, c->iopeer, n);
	pthread_mutex_unlock(&b->lock);
	return ok ? 0 : -ENOBUFS;
}

/* The connection's address holds more than its share while some queue
 * waits for room (tgt.h, FX_TGT_SQUEEZE_MS). */
int tgt_iobufs_over_share(struct tgt_conn *c)
{
	struct tgt_iobufs *b = &c->t->iobufs;
	int over;

	if (!c->iopeer || !atomic_load(&b->nwait))
		return 0;
	pthread_mutex_lock(&b->lock);
	over = b->waiters && c->iopeer->held > share_locked(b, c->iopeer);
	pthread_mutex_unlock(&b->lock);
	return over;
}

/* One more write waits for its data; the first starts the clock of
 * data_overdue's squeeze (conn.c). */
void tgt_h2c_wait_add(struct tgt_conn *c)
{
	if (atomic_fetch_add(&c->h2c_wait, 1) == 0)
		atomic_store(&c->h2c_last_ms, tgt_now_ms());
}

void tgt_iobufs_give(struct tgt_conn *c, size_t n)
{
	struct tgt_iobufs *b = &c->t->iobufs;

	pthread_mutex_lock(&b->lock);
	pool_give_locked(b, c->iopeer, n);
	pthread_mutex_unlock(&b->lock);
}

/* Every 100 ms: the cache keeps what the last 100 ms needed beyond what is
 * in use now (FX_TGT_IO_IDLE_CACHE at least), not the whole budget after a
 * burst.  (Not at once when a queue goes idle: buffers freed and faulted
 * in again whenever a few commands leave the target empty for an instant
 * would cost most of a cold read's CPU.) */
void tgt_iobufs_tick(struct fx_target *t)
{
	struct tgt_iobufs *b = &t->iobufs;
	size_t keep;

	pthread_mutex_lock(&b->lock);
	keep = b->peak - b->used;
	if (keep < FX_TGT_IO_IDLE_CACHE)
		keep = FX_TGT_IO_IDLE_CACHE;
	cache_trim_locked(b, keep);
	b->peak = b->used;
	pthread_mutex_unlock(&b->lock);
}

static __thread int on_engine; /* this thread is a queue's engine */

/* Give slot idx back (its I/O is over, its answer sent or abandoned).
 * Under q->lock. */
static void release_locked(struct tgt_ioq *q, unsigned idx)
{
	struct tgt_io *io = &q->io[idx];

	if (io->buf)
		buf_put_locked(q, io->buf, buf_class(io->len), io->cap);
	if (io->state == TGT_IO_WAIT_DATA)
		atomic_fetch_sub(&q->c->h2c_wait, 1);
	memset(io, 0, sizeof(*io));
	io->next = -1;
	q->free_idx[q->nfree++] = (uint16_t)idx;
	atomic_fetch_sub(&q->c->r2t_busy, 1);
}

static int is_stopping(struct tgt_ioq *q);

/* Start slot idx whose budget is reserved (q->used counts it): its buffer,
 * then the disk read, or the R2T of a write.  0, or -errno when the
 * connection broke. */
static int start_io(struct tgt_ioq *q, unsigned idx)
{
	struct tgt_io *io = &q->io[idx];
	struct tgt_conn *c = q->c;
	uint8_t *buf = buf_get(q, io->len);

	pthread_mutex_lock(&q->lock);
	if (!buf) {
		uint16_t cid = io->cid;
		uint32_t len = io->len;
		int ret = 0;

		unreserve_locked(q, io->cap); /* (release frees no buffer) */
		release_locked(q, idx);
		pthread_mutex_unlock(&q->lock);
		tgt_log_must(c->t, c->peer_key, "internal error: out of memory",
			     "%s qid %u: out of memory for a %u-byte command buffer", c->peer,
			     c->qid, len);
		/* (checked under the send lock, as every send of ours: a stopping
		 * queue sends nothing, and its thread's join waits for no send) */
		tgt_send_lock(c);
		if (!is_stopping(q))
			ret = tgt_send_resp(c, cid, TGT_SF(0, NVME_SC_INTERNAL), 0, 0);
		tgt_send_unlock(c);
		return ret;
	}
	io->buf = buf;
	if (io->write) {
		uint16_t cid = io->cid;
		uint32_t len = io->len;

		int ret = 0;

		/* WAIT_DATA before the R2T leaves: its H2CData may come at once */
		io->state = TGT_IO_WAIT_DATA;
		io->done = 0;
		io->r2t_ms = tgt_now_ms();
		tgt_h2c_wait_add(c);
		pthread_mutex_unlock(&q->lock);
		/* (checked under the send lock: nothing follows a quiesce) */
		tgt_send_lock(c);
		if (!is_stopping(q))
			ret = tgt_send_r2t(c, cid, (uint16_t)(TGT_TTAG_IO | idx), len);
		tgt_send_unlock(c);
		return ret;
	}
	io->state = TGT_IO_DISK;
	io->done = 0;
	queue_locked(q, idx);
	pthread_mutex_unlock(&q->lock);
	return 0;
}

static int is_stopping(struct tgt_ioq *q)
{
	int s;

	pthread_mutex_lock(&q->lock);
	s = q->stopping;
	pthread_mutex_unlock(&q->lock);
	return s;
}

/* Reserve room for slot idx and start it, or queue it behind those
 * already waiting (first come, first served). */
static int reserve_and_start(struct tgt_ioq *q, unsigned idx)
{
	struct tgt_io *io = &q->io[idx];

	pthread_mutex_lock(&q->lock);
	io->cap = buf_cap(io->len);
	if (!q->stopping && q->fifo_head < 0 && reserve_locked(q, io->cap)) {
		pthread_mutex_unlock(&q->lock);
		return start_io(q, idx);
	}
	io->state = TGT_IO_WAIT_BUF;
	io->next = -1;
	if (q->fifo_tail >= 0)
		q->io[q->fifo_tail].next = (int)idx;
	else
		q->fifo_head = (int)idx;
	q->fifo_tail = (int)idx;
	pthread_mutex_unlock(&q->lock);
	return 0;
}

/* Engine thread: a send failed, the connection broke (or a fault was
 * injected).  The connection's thread sees the shut socket, says why
 * (err: a quiet -ECONNRESET when we shut it on purpose, see send_errno)
 * and stops us. */
static void send_failed(struct tgt_ioq *q, int err)
{
	int none = 0;

	atomic_compare_exchange_strong(&q->c->engine_err, &none, err);
	pthread_mutex_lock(&q->lock);
	q->stopping = 1;
	pthread_mutex_unlock(&q->lock);
	shutdown(q->c->fd, SHUT_RDWR);
}

/* Engine thread, after a buffer was freed: start the waiting commands
 * that now fit, in order. */
static void start_waiting(struct tgt_ioq *q)
{
	for (;;) {
		int idx;

		pthread_mutex_lock(&q->lock);
		idx = q->fifo_head;
		if (idx < 0 || q->stopping || !reserve_locked(q, q->io[idx].cap)) {
			pthread_mutex_unlock(&q->lock);
			return;
		}
		q->fifo_head = q->io[idx].next;
		if (q->fifo_head < 0)
			q->fifo_tail = -1;
		pthread_mutex_unlock(&q->lock);
		int ret = start_io(q, (unsigned)idx);

		if (ret < 0)
			send_failed(q, ret);
	}
}

/* Slot idx's disk I/O is over: answer it, free it, start who waits. */
static void finish(struct tgt_ioq *q, unsigned idx)
{
	struct tgt_io *io = &q->io[idx];
	struct tgt_conn *c = q->c;
	int ret = 0;

	/* stopping is read under the send lock: once the connection's thread
	 * quiesced us (C2HTermReq, Disconnect) no PDU of ours follows */
	tgt_send_lock(c);
	if (!is_stopping(q)) {
		if (io->write)
			ret = tgt_send_resp(c, io->cid, io->err, 0, 0);
		else if (io->cached)
			ret = tgt_send_read(c, q->chunk, io->cid, io->ns, io->off, io->len);
		else
			ret = tgt_send_data(c, io->cid, io->buf, io->len, io->err);
	}
	tgt_send_unlock(c);
	if (ret < 0)
		send_failed(q, ret);
	pthread_mutex_lock(&q->lock);
	release_locked(q, idx);
	pthread_mutex_unlock(&q->lock);
	start_waiting(q);
}

/* A completion of slot idx's ring operation, res as io_uring reports it. */
static void on_cqe(struct tgt_ioq *q, unsigned idx, int res)
{
	struct tgt_io *io;
	struct tgt_conn *c = q->c;
	int stopping;

	if (idx >= q->n || q->io[idx].state != TGT_IO_DISK)
		return; /* (cannot happen) */
	io = &q->io[idx];
	pthread_mutex_lock(&q->lock);
	stopping = q->stopping;
	pthread_mutex_unlock(&q->lock);
	if (!io->cached && !io->err && !stopping) {
		int again = 0;

		if (res == -EINTR || res == -EAGAIN) {
			again = 1;
		} else if (res == -EINVAL && io->direct) {
			/* the filesystem refuses this direct I/O: buffered */
			io->direct = 0;
			again = 1;
		} else if (res > 0) {
			io->done += (uint32_t)res;
			if (io->done < io->len) {
				if (io->direct && (io->done % FX_TGT_DIO_ALIGN))
					io->direct = 0;
				again = 1;
			}
		}
		if (again) {
			pthread_mutex_lock(&q->lock);
			queue_locked(q, idx);
			pthread_mutex_unlock(&q->lock);
			return;
		}
		if (io->done < io->len) {
			/* EOF (the file shrank) or an I/O error: a read sends
			 * zeros so the stream stays whole, and both fail */
			if (c->t->verbose)
				tgt_log(c->t, "%s qid %u: cid %u %s at %llu failed: %s", c->peer,
					c->qid, io->cid, io->write ? "write" : "read",
					(unsigned long long)io->off,
					res < 0 ? strerror(-res) : "end of file");
			if (io->write) {
				io->err = TGT_SF(2, TGT_SC_WRITE_FAULT);
			} else {
				memset(io->buf + io->done, 0, io->len - io->done);
				io->err = TGT_SF(2, TGT_SC_UNRECOVERED_READ);
			}
		}
	}
	finish(q, idx);
}

int tgt_ioq_on_engine_thread(void)
{
	return on_engine;
}

int tgt_ioq_unsent(struct tgt_conn *c)
{
	struct tgt_ioq *q = c->ioq;
	int n;

	if (!q)
		return 0;
	pthread_mutex_lock(&q->lock);
	n = (int)q->unsent;
	pthread_mutex_unlock(&q->lock);
	return n;
}

void tgt_ioq_kick(struct tgt_conn *c)
{
	struct tgt_ioq *q = c->ioq;

	if (!q)
		return;
	pthread_mutex_lock(&q->lock);
	flush_locked(q);
	pthread_mutex_unlock(&q->lock);
}

static void *ioq_main(void *arg)
{
	struct tgt_ioq *q = arg;
	int stop_seen = 0;
	sigset_t pipe;

	/* sendfile() has no MSG_NOSIGNAL: a host gone while a cached read
	 * is sent must fail the send (EPIPE), not kill the process. */
	sigemptyset(&pipe);
	sigaddset(&pipe, SIGPIPE);
	pthread_sigmask(SIG_BLOCK, &pipe, NULL);
	on_engine = 1;
	for (;;) {
		struct io_uring_cqe *cqe;
		uint64_t tag;
		unsigned left, batch;
		int r, res, woken = 0;

		r = io_uring_wait_cqe(&q->ring, &cqe);
		if (r < 0) {
			if (r != -EINTR && r != -EAGAIN && r != -ETIME) {
				tgt_log(q->c->t, "%s qid %u: io_uring wait: %s", q->c->peer,
					q->c->qid, strerror(-r));
				usleep(1000);
			}
			continue;
		}
		/* Every completion already there, then one submit of what they
		 * started: a merged disk request completes its commands
		 * together, and the commands that waited for their buffers are
		 * neighbours too, so they go down together and merge again.
		 * (Those there now only: completions that come in while these
		 * are answered would hold back what these started.) */
		batch = io_uring_cq_ready(&q->ring);
		do {
			tag = io_uring_cqe_get_data64(cqe);
			res = cqe->res;
			io_uring_cqe_seen(&q->ring, cqe);
			pthread_mutex_lock(&q->lock);
			q->sqes--;
			pthread_mutex_unlock(&q->lock);
			if (tag == STOP_TAG) {
				stop_seen = 1;
			} else if (tag == WAKE_TAG) {
				/* room in the target's budget: armed again, and
				 * the commands waiting for it try once the batch is
				 * answered */
				pthread_mutex_lock(&q->lock);
				if (!q->stopping)
					arm_wake_locked(q);
				pthread_mutex_unlock(&q->lock);
				woken = 1;
			} else {
				on_cqe(q, (unsigned)tag, res);
			}
			/* Enough for the largest request a disk takes whole: it
			 * goes now, not after the rest of the batch's sends. */
			pthread_mutex_lock(&q->lock);
			if (q->unsent_bytes >= FX_TGT_MAX_XFER)
				flush_locked(q);
			pthread_mutex_unlock(&q->lock);
		} while (--batch && io_uring_peek_cqe(&q->ring, &cqe) == 0);
		if (woken)
			start_waiting(q);
		pthread_mutex_lock(&q->lock);
		flush_locked(q);
		pthread_mutex_unlock(&q->lock);
		if (stop_seen) {
			pthread_mutex_lock(&q->lock);
			left = q->sqes;
			pthread_mutex_unlock(&q->lock);
			if (!left)
				break;
		}
	}
	return NULL;
}

static int ioq_cant(struct tgt_conn *c, const char *what, int err)
{
	if (!atomic_exchange(&c->t->ioq_cant_logged, 1))
		tgt_log(c->t, "%s qid %u: %s: %s; I/O queues serve one command at a time", c->peer,
			c->qid, what, strerror(err));
	return -err;
}

int tgt_ioq_start(struct tgt_conn *c)
{
	struct tgt_ioq *q = calloc(1, sizeof(*q));
	unsigned n = c->sqsize + 1u, entries = 8;
	pthread_mutexattr_t ma;
	pthread_attr_t attr;
	int r;

	if (!q)
		return -ENOMEM;
	q->c = c;
	q->n = n;
	q->fifo_head = q->fifo_tail = -1;
	q->wake_fd = -1;
	q->io = calloc(n, sizeof(*q->io));
	q->free_idx = calloc(n, sizeof(*q->free_idx));
	q->chunk = malloc(FX_TGT_CHUNK);
	if (!q->io || !q->free_idx || !q->chunk) {
		r = -ENOMEM;
		goto fail_mem;
	}
	for (unsigned i = n; i-- > 0;) {
		q->io[i].next = -1;
		q->free_idx[q->nfree++] = (uint16_t)i;
	}
	while (entries < n + 3) /* (the slots, the stop marker, the wake read) */
		entries <<= 1;
	/* (blocking: the ring's read waits on it rather than fail) */
	q->wake_fd = eventfd(0, EFD_CLOEXEC);
	if (q->wake_fd < 0) {
		r = -errno;
		ioq_cant(c, "no eventfd", -r);
		goto fail_mem;
	}
	r = io_uring_queue_init(entries, &q->ring, 0);
	if (r < 0) {
		ioq_cant(c, "no io_uring", -r);
		goto fail_mem;
	}
	{
		/* Buffered I/O the kernel cannot do at once runs on io_uring's
		 * workers: a few per queue, not one per command in flight.
		 * Workers belong to the thread that submitted, and both of
		 * the queue's threads submit (the connection's: reads,
		 * writes whose data is in; the engine's: retries, commands
		 * that waited for room), each with this limit for bounded
		 * and for unbounded work: a queue that moves data costs at
		 * most 2 + 2 x 2 x FX_TGT_IO_WORKERS threads, idle workers
		 * ending by themselves. */
		unsigned workers[2] = {FX_TGT_IO_WORKERS, FX_TGT_IO_WORKERS};

		io_uring_register_iowq_max_workers(&q->ring, workers);
	}
	pthread_mutex_init(&q->lock, NULL);
	arm_wake_locked(q); /* (no other thread has q yet) */
	flush_locked(q);
	pthread_mutexattr_init(&ma);
	pthread_mutexattr_settype(&ma, PTHREAD_MUTEX_RECURSIVE);
	pthread_mutex_init(&q->send_lock, &ma);
	pthread_mutexattr_destroy(&ma);
	pthread_attr_init(&attr);
	pthread_attr_setstacksize(&attr, FX_TGT_THREAD_STACK);
	r = pthread_create(&q->thread, &attr, ioq_main, q);
	pthread_attr_destroy(&attr);
	if (r) {
		ioq_cant(c, "no thread for the I/O engine", r);
		r = -r;
		io_uring_queue_exit(&q->ring);
		pthread_mutex_destroy(&q->lock);
		pthread_mutex_destroy(&q->send_lock);
		goto fail_mem;
	}
	c->send_lock = &q->send_lock;
	c->ioq = q;
	return 0;

fail_mem:
	if (q->wake_fd >= 0)
		close(q->wake_fd);
	free(q->io);
	free(q->free_idx);
	free(q->chunk);
	free(q);
	return r;
}

void tgt_ioq_stop(struct tgt_conn *c)
{
	struct tgt_ioq *q = c->ioq;

	if (!q)
		return;
	pthread_mutex_lock(&q->lock);
	q->stopping = 1;
	pthread_mutex_unlock(&q->lock);
	/* The engine sends nothing more once it sees stopping under the send
	 * lock; one in the middle of a send (a host that does not read) is
	 * woken by shutting the socket. */
	if (pthread_mutex_trylock(&q->send_lock) == 0)
		pthread_mutex_unlock(&q->send_lock);
	else
		tgt_conn_shut(c);
	pthread_mutex_lock(&q->lock);
	queue_locked(q, STOP_TAG);
	flush_locked(q);
	pthread_mutex_unlock(&q->lock);
	{
		/* the armed wake read completes (and is not armed again) */
		uint64_t one = 1;

		if (write(q->wake_fd, &one, sizeof(one)) < 0) {
			/* (a counter at its maximum: the read completes anyway) */
		}
	}
	/* (returns once every disk I/O submitted has completed) */
	pthread_join(q->thread, NULL);
	{
		struct tgt_iobufs *b = &c->t->iobufs;

		pthread_mutex_lock(&b->lock);
		pool_unwait_locked(b, q);
		pthread_mutex_unlock(&b->lock);
	}
	/* Only this thread now; the ring is idle.  Commands that never got
	 * to the disk (waiting for room or for their data) just go. */
	for (unsigned i = 0; i < q->n; i++)
		if (q->io[i].state != TGT_IO_FREE) {
			if (c->t->verbose)
				tgt_log(c->t, "%s qid %u: cid %u dropped (%s)", c->peer, c->qid,
					q->io[i].cid, tgt_io_state_str(q->io[i].state));
			release_locked(q, i);
		}
	io_uring_queue_exit(&q->ring);
	close(q->wake_fd);
	c->ioq = NULL;
	c->send_lock = NULL;
	pthread_mutex_destroy(&q->lock);
	pthread_mutex_destroy(&q->send_lock);
	free(q->io);
	free(q->free_idx);
	free(q->chunk);
	free(q);
}

void tgt_ioq_quiesce(struct tgt_conn *c)
{
	struct tgt_ioq *q = c->ioq;

	if (!q)
		return;
	pthread_mutex_lock(&q->lock);
	q->stopping = 1;
	pthread_mutex_unlock(&q->lock);
}

uint64_t tgt_ioq_oldest_r2t_ms(struct tgt_conn *c)
{
	struct tgt_ioq *q = c->ioq;
	uint64_t oldest = 0;

	if (!q)
		return 0;
	pthread_mutex_lock(&q->lock);
	for (unsigned i = 0; i < q->n; i++)
		if (q->io[i].state == TGT_IO_WAIT_DATA && (!oldest || q->io[i].r2t_ms < oldest))
			oldest = q->io[i].r2t_ms;
	pthread_mutex_unlock(&q->lock);
	return oldest;
}

/* A slot for a new command, or -1 when the host has more outstanding than
 * its queue holds. */
static int slot_alloc(struct tgt_ioq *q)
{
	int idx = -1;

	pthread_mutex_lock(&q->lock);
	if (q->nfree) {
		idx = q->free_idx[--q->nfree];
		atomic_fetch_add(&q->c->r2t_busy, 1);
	}
	pthread_mutex_unlock(&q->lock);
	return idx;
}

/* The whole range is in the page cache (as far as mincore() can tell). */
static int range_cached(const struct tgt_ns *ns, uint64_t off, uint32_t len)
{
	const long pg = sysconf(_SC_PAGESIZE); /* (glibc: a stored value, no system call) */
	unsigned char vec[(FX_TGT_MAX_XFER >> 12) + 2];
	uint64_t start, end;

	if (!ns->map)
		return 0;
	if (pg < 4096)
		return 0;
	start = off & ~((uint64_t)pg - 1);
	end = (off + len + (uint64_t)pg - 1) & ~((uint64_t)pg - 1);
	if (end > ns->map_len || (end - start) / (uint64_t)pg > sizeof(vec))
		return 0;
	if (mincore((uint8_t *)ns->map + start, end - start, vec) < 0)
		return 0;
	for (uint64_t i = 0; i < (end - start) / (uint64_t)pg; i++)
		if (!(vec[i] & 1))
			return 0;
	return 1;
}

static int aligned(const struct tgt_ns *ns, uint64_t off, uint32_t len)
{
	return ns->dfd >= 0 && off % FX_TGT_DIO_ALIGN == 0 && len % FX_TGT_DIO_ALIGN == 0;
}

int tgt_ioq_read(struct tgt_conn *c, uint16_t cid, struct tgt_ns *ns, uint64_t off, uint32_t len)
{
	struct tgt_ioq *q = c->ioq;
	int idx = slot_alloc(q);
	struct tgt_io *io;

	if (idx < 0) /* more commands outstanding than any queue may hold */
		return tgt_send_resp(c, cid, TGT_SF(0, NVME_SC_INTERNAL), 0, 0);
	io = &q->io[idx];
	io->cid = cid;
	io->ns = ns;
	io->off = off;
	io->len = len;
	io->cached = range_cached(ns, off, len);
	if (io->cached) {
		pthread_mutex_lock(&q->lock);
		io->state = TGT_IO_DISK;
		queue_locked(q, (uint64_t)idx);
		pthread_mutex_unlock(&q->lock);
		return 0;
	}
	io->direct = aligned(ns, off, len);
	return reserve_and_start(q, (unsigned)idx);
}

int tgt_ioq_write(struct tgt_conn *c, const struct nvme_sqe *sqe, struct tgt_ns *ns, uint64_t off,
		  uint32_t len)
{
	struct tgt_ioq *q = c->ioq;
	int idx = slot_alloc(q);
	struct tgt_io *io;

	if (idx < 0)
		return tgt_send_resp(c, sqe->cid, TGT_SF(0, NVME_SC_INTERNAL), 0, 0);
	io = &q->io[idx];
	io->write = 1;
	io->cid = sqe->cid;
	io->fua = !!(sqe->cdw12 & (1u << 30));
	io->ns = ns;
	io->off = off;
	io->len = len;
	io->direct = aligned(ns, off, len);
	return reserve_and_start(q, (unsigned)idx);
}

uint8_t *tgt_ioq_h2c_dest(struct tgt_conn *c, uint16_t ttag, uint16_t cccid, uint32_t datao,
			  uint32_t datal, const char **why, uint32_t *fei, uint16_t *fes)
{
	struct tgt_ioq *q = c->ioq;
	unsigned idx = ttag & ~TGT_TTAG_IO;
	uint8_t *dst = NULL;
	struct tgt_io *io;

	pthread_mutex_lock(&q->lock);
	io = idx < q->n ? &q->io[idx] : NULL;
	if (!io || io->state != TGT_IO_WAIT_DATA) {
		*why = "H2CData for no R2T of ours";
		*fes = NVME_TCP_FES_INVALID_PDU_HDR;
		*fei = offsetof(struct nvme_tcp_data_pdu, ttag);
	} else if (io->cid != cccid) {
		*why = "H2CData CCCID does not match its R2T";
		*fes = NVME_TCP_FES_INVALID_PDU_HDR;
		*fei = offsetof(struct nvme_tcp_data_pdu, cccid);
	} else if (datao != io->done || datal > io->len - io->done) {
		*why = "H2CData outside the R2T's range";
		*fes = NVME_TCP_FES_DATA_OUT_OF_RANGE;
		*fei = offsetof(struct nvme_tcp_data_pdu, datao);
	} else {
		dst = io->buf + io->done;
	}
	pthread_mutex_unlock(&q->lock);
	return dst;
}

int tgt_ioq_h2c_done(struct tgt_conn *c, uint16_t ttag, uint32_t datal, int bad)
{
	struct tgt_ioq *q = c->ioq;
	struct tgt_io *io = &q->io[ttag & ~TGT_TTAG_IO];

	/* (only this thread touches a slot in WAIT_DATA) */
	if (bad && !io->err)
		io->err = TGT_SF(0, TGT_SC_TRANSIENT_TRANSPORT);
	io->done += datal;
	atomic_store(&c->h2c_last_ms, tgt_now_ms());
	if (io->done < io->len)
		return 0;
	if (c->t->fault_disk_delay_ms) { /* (test knob: a slow disk under writes) */
		tgt_ioq_kick(c);
		usleep(c->t->fault_disk_delay_ms * 1000u);
	}
	pthread_mutex_lock(&q->lock);
	atomic_fetch_sub(&c->h2c_wait, 1);
	io->state = TGT_IO_DISK;
	io->done = 0;
	queue_locked(q, ttag & ~TGT_TTAG_IO);
	pthread_mutex_unlock(&q->lock);
	return 0;
}
