/*
 * The file transport: regular files and block devices (including namespaces
 * the kernel attached over NVMe-oF), read and written through io_uring.
 *
 * A request is cut into pieces of at most max_io bytes and at most `depth`
 * pieces are in flight; the rest wait in a FIFO.  With O_DIRECT, the part of
 * a request that is block aligned (address, offset and length) goes to the
 * O_DIRECT descriptor; anything unaligned (a chunk's last partial block, a
 * caller's unaligned buffer) goes to a second, buffered descriptor of the
 * same file, which the kernel keeps coherent with direct I/O.  This keeps
 * every request correct without bounce buffers and leaves the fast path to
 * aligned buffers such as BufferPool's.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/fs.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <time.h>
#include <unistd.h>

#include "../internal.h"
#include "file_dev.h"

/* ------------------------------------------------------------- device */

static int open_fd(const char *path, int flags)
{
	int fd = open(path, flags | O_CLOEXEC, 0644);
	return fd < 0 ? -errno : fd;
}

/* The ioprio value of the realtime class (linux/ioprio.h), level 4. */
#define LOAD_IOPRIO ((1u << 13) | 4u)

/*
 * The I/O priority a load read carries: the realtime class where the block
 * device under the file orders requests by class (mq-deadline, bfq), so a
 * load also overtakes the writes already in the kernel's queue; none where
 * it would be ignored ("none", kyber), or where there is no block device
 * (tmpfs) or its scheduler cannot be read (docs/architecture.md, "Priority
 * and write admission").
 */
static uint16_t probe_load_ioprio(const struct stat *st)
{
	dev_t dev = S_ISBLK(st->st_mode) ? st->st_rdev : st->st_dev;
	char path[96], buf[256];
	int fd = -1;

	/* a partition has its disk's queue one level up */
	for (int up = 0; up < 2 && fd < 0; up++) {
		snprintf(path, sizeof(path), "/sys/dev/block/%u:%u/%squeue/scheduler", major(dev),
			 minor(dev), up ? "../" : "");
		fd = open(path, O_RDONLY | O_CLOEXEC);
	}
	if (fd < 0)
		return 0;
	ssize_t n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0)
		return 0;
	buf[n] = 0;
	if (strstr(buf, "[mq-deadline]") || strstr(buf, "[bfq]"))
		return (uint16_t)LOAD_IOPRIO;
	return 0;
}

int fx_file_dev_open(const struct fx_transport_ops *ops, const char *path,
		     const struct fx_dev_opts *o, struct fx_dev **out)
{
	struct file_dev *d;
	struct stat st;
	int acc = o->readonly ? O_RDONLY : O_RDWR;
	int ret;

	if (!path[0])
		return -EINVAL;
	d = calloc(1, sizeof(*d));
	if (!d)
		return -ENOMEM;
	d->base.ops = ops;
	d->fd_direct = -1;
	d->fd_buffered = open_fd(path, acc | (o->create ? O_CREAT : 0));
	if (d->fd_buffered < 0) {
		ret = d->fd_buffered;
		free(d);
		return ret;
	}
	if (fstat(d->fd_buffered, &st) < 0) {
		ret = -errno;
		goto fail;
	}
	if (S_ISBLK(st.st_mode)) {
		uint64_t bytes = 0;
		int lbs = 0;
		if (ioctl(d->fd_buffered, BLKGETSIZE64, &bytes) < 0 ||
		    ioctl(d->fd_buffered, BLKSSZGET, &lbs) < 0) {
			ret = -errno;
			goto fail;
		}
		d->base.info.size = bytes;
		d->base.info.block_size = (uint32_t)lbs;
		d->base.info.caps |= FX_CAP_BLOCKDEV;
	} else if (S_ISREG(st.st_mode)) {
		/* 4 KiB satisfies the direct-I/O alignment of every Linux
		 * filesystem and block size. */
		d->base.info.block_size = 4096;
		if (o->size > (uint64_t)st.st_size) {
			if (o->readonly) {
				ret = -EROFS;
				goto fail;
			}
			/* Reserve the blocks now: a full disk is reported at
			 * create, not as a failed put later. */
			if (fallocate(d->fd_buffered, 0, 0, (off_t)o->size) < 0) {
				ret = -errno;
				if (ret == -EOPNOTSUPP &&
				    ftruncate(d->fd_buffered, (off_t)o->size) == 0)
					ret = 0;
				else {
					/* Give back what a partial fallocate took. */
					if (ftruncate(d->fd_buffered, st.st_size)) {
					}
					goto fail;
				}
			}
			st.st_size = (off_t)o->size;
		}
		d->base.info.size = (uint64_t)st.st_size;
	} else {
		ret = -EINVAL; /* directories, sockets, character devices */
		goto fail;
	}
	d->base.info.caps |= FX_CAP_FLUSH;
	/* only the io_uring queue carries it (psync shares this open) */
	d->load_ioprio = ops == &fx_transport_file && !o->no_ioprio ? probe_load_ioprio(&st) : 0;
	if (d->load_ioprio)
		d->base.info.caps |= FX_CAP_IOPRIO;
	if (o->direct) {
		d->fd_direct = open_fd(path, acc | O_DIRECT);
		if (d->fd_direct == -EINVAL) {
			ret = -ENOTSUP; /* this filesystem has no O_DIRECT */
			goto fail;
		}
		if (d->fd_direct < 0) {
			ret = d->fd_direct;
			goto fail;
		}
		d->base.info.caps |= FX_CAP_DIRECT;
	}
	*out = &d->base;
	return 0;
fail:
	if (d->fd_direct >= 0)
		close(d->fd_direct);
	close(d->fd_buffered);
	free(d);
	return ret;
}

void fx_file_dev_close(struct fx_dev *dev)
{
	struct file_dev *d = (struct file_dev *)dev;

	if (d->fd_direct >= 0)
		close(d->fd_direct);
	close(d->fd_buffered);
	free(d);
}

/* ------------------------------------------------------ io_uring queue */

struct piece {
	uint32_t req;
	uint8_t fdi;     /* 0: direct, 1: buffered */
	uint8_t ioprio;  /* its SQE carried load_ioprio */
	uint8_t no_prio; /* retried without it after the first try was refused */
	char *addr;
	uint64_t len;
	uint64_t off;
};

struct file_queue {
	struct fx_queue base;
	struct fx_ring ring;
	int fds[2];      /* fd per fdi, -1 if absent */
	int fixed_files; /* fds are registered at fixed index = fdi */
	uint32_t bs;
	uint32_t depth;
	uint32_t max_io;
	uint16_t load_ioprio; /* of the device; 0 once the kernel refused it */
	int ioprio_ok;        /* a read with it completed: a later error is not its */
	struct req_table t;
	struct piece *pieces;
	uint32_t *free_pieces;
	uint32_t nfree_pieces;
	unsigned unsubmitted; /* SQEs prepared but not yet submitted */
	/* Closing (fq_quiesce): no new piece is issued and no SQE submitted,
	 * so what the kernel holds only shrinks. */
	int stopping;
	/* a quiesce already waited its whole time: destroy does not wait a
	 * second time */
	int gave_up;
	/* Ranges moved by the CQEs of this pass whose request wants its
	 * CRC32C: checksummed after the freed pieces are re-issued, so the
	 * device works on the next pieces while this thread checksums. */
	struct crc_work *work;
	uint32_t nwork;
};

struct crc_work {
	uint32_t req;
	uint32_t len; /* at most one piece, which max_io bounds */
	char *addr;
};

/* Prepare one SQE for piece pi. */
static void prep_piece(struct file_queue *q, uint32_t pi)
{
	struct piece *p = &q->pieces[pi];
	struct req *r = &q->t.reqs[p->req];
	struct io_uring_sqe *sqe = io_uring_get_sqe(&q->ring.uring);
	int fd = q->fixed_files ? p->fdi : q->fds[p->fdi];

	if (!sqe) {
		/* Cannot happen: pieces in flight never exceed ring size.
		 * Submitting frees SQ space if it ever does. */
		io_uring_submit(&q->ring.uring);
		q->unsubmitted = 0;
		sqe = io_uring_get_sqe(&q->ring.uring);
	}
	p->ioprio = 0;
	if (r->op == FX_OP_FLUSH) {
		io_uring_prep_fsync(sqe, fd, IORING_FSYNC_DATASYNC);
	} else {
		int bi = fx_ring_buf_index(&q->ring, p->addr, p->len);
		q->base.stats.ios++;
		if (bi >= 0)
			q->base.stats.fixed_ios++;
		/* One piece never exceeds max_io (a uint32), so the
		 * narrowing below is exact. */
		unsigned len = (unsigned)p->len;
		if (r->op == FX_OP_READ) {
			if (bi >= 0)
				io_uring_prep_read_fixed(sqe, fd, p->addr, len, p->off, bi);
			else
				io_uring_prep_read(sqe, fd, p->addr, len, p->off);
			p->ioprio = r->prio == FX_PRIO_LOAD && q->load_ioprio && !p->no_prio;
			if (p->ioprio)
				sqe->ioprio = q->load_ioprio;
		} else {
			if (bi >= 0)
				io_uring_prep_write_fixed(sqe, fd, p->addr, len, p->off, bi);
			else
				io_uring_prep_write(sqe, fd, p->addr, len, p->off);
		}
	}
	if (q->fixed_files)
		sqe->flags |= IOSQE_FIXED_FILE;
	io_uring_sqe_set_data64(sqe, pi);
	q->unsubmitted++;
}

/* Cut the next piece of request i.  Returns 0 when nothing is left. */
static int cut_piece(struct file_queue *q, uint32_t i, struct piece *p)
{
	struct req *r = &q->t.reqs[i];

	if (r->op == FX_OP_FLUSH) {
		if (r->issued)
			return 0;
		r->issued = 1;
		p->req = i;
		p->no_prio = 0;
		p->fdi = q->fds[1] >= 0 ? 1 : 0;
		p->addr = NULL;
		p->len = 0;
		p->off = 0;
		return 1;
	}
	if (r->issued >= r->len || r->err || r->eof)
		return 0;
	uint64_t mask = q->bs - 1;
	/* The O_DIRECT part is the aligned prefix of an aligned request. */
	uint64_t direct_end = 0;
	if (q->fds[0] >= 0 && !((uintptr_t)r->addr & mask) && !(r->off & mask))
		direct_end = r->len & ~mask;
	uint64_t end = r->issued < direct_end ? direct_end : r->len;
	uint64_t n = end - r->issued;
	if (n > q->max_io)
		n = q->max_io;
	p->req = i;
	p->no_prio = 0;
	p->fdi = r->issued < direct_end ? 0 : 1;
	p->addr = r->addr + r->issued;
	p->len = n;
	p->off = r->off + r->issued;
	r->issued += n;
	return 1;
}

/* Move work from the class queues into free pieces and SQEs, in the
 * order the scheduler gives (reqs.h). */
static void issue(struct file_queue *q)
{
	struct req_table *t = &q->t;

	if (q->stopping)
		return;
	for (int64_t next; q->nfree_pieces && (next = fx_reqs_fifo_next(t)) >= 0;) {
		uint32_t i = (uint32_t)next;
		uint32_t pi = q->free_pieces[q->nfree_pieces - 1];
		/* fx_reqs_fifo_next returns only requests with bytes to
		 * issue: the piece is always cut */
		if (!cut_piece(q, i, &q->pieces[pi]))
			break;
		q->nfree_pieces--;
		t->reqs[i].inflight++;
		fx_reqs_piece_issued(t, i);
		prep_piece(q, pi);
	}
}

static void maybe_complete(struct file_queue *q, uint32_t i);

/* The ring refused our SQEs for good (-EEXIST: this is not the thread of a
 * SINGLE_ISSUER ring, which fq_submit checks first; -EBADF...): the kernel
 * took none of them, so take them back and fail their pieces with err.
 * Their requests then complete with err instead of waiting forever for
 * I/O that never started, and no piece is left counted in flight. */
static void sqes_refused(struct file_queue *q, int err)
{
	struct io_uring_sq *sq = &q->ring.uring.sq;
	unsigned head = io_uring_smp_load_acquire(sq->khead);
	unsigned tail = sq->sqe_tail;

	io_uring_smp_store_release(sq->ktail, head);
	sq->sqe_head = sq->sqe_tail = head;
	q->unsubmitted = 0;
	for (unsigned i = head; i != tail; i++) {
		uint64_t pi = sq->sqes[i & sq->ring_mask].user_data;
		if (pi >= q->depth)
			continue; /* ours are piece indexes; nothing else is */
		/* failed as such: not retried (a retry would go to the same
		 * refusing ring) */
		struct piece *p = &q->pieces[pi];
		struct req *r = &q->t.reqs[p->req];
		if (!r->err)
			r->err = err;
		r->inflight--;
		fx_reqs_piece_end(&q->t, p->req);
		q->free_pieces[q->nfree_pieces++] = (uint32_t)pi;
		maybe_complete(q, p->req);
	}
}

/* Submit the prepared SQEs.  0, or the error the ring refused them with
 * (-EEXIST: not the ring's thread), their pieces failed with it.  A
 * transient refusal (-EAGAIN, -EBUSY, -EINTR) leaves them queued for the
 * next submit or wait.  A stopping queue submits nothing more. */
static int flush_sqes(struct file_queue *q)
{
	if (!q->unsubmitted || q->stopping)
		return 0;
	int ret = io_uring_submit(&q->ring.uring);
	if (ret >= 0) {
		q->unsubmitted = 0;
		return 0;
	}
	if (ret == -EAGAIN || ret == -EBUSY || ret == -EINTR)
		return 0;
	sqes_refused(q, ret);
	return ret;
}

static void maybe_complete(struct file_queue *q, uint32_t i)
{
	struct req *r = &q->t.reqs[i];

	if (r->inflight || r->crc_pending)
		return;
	if (r->op == FX_OP_FLUSH ? r->issued != 0 : (r->issued >= r->len || r->err || r->eof))
		fx_req_complete(&q->t, i);
}

/* Checksum the ranges the last CQEs moved; completes their requests when
 * nothing else is outstanding. */
static void run_crc_work(struct file_queue *q)
{
	for (uint32_t k = 0; k < q->nwork; k++) {
		struct crc_work *w = &q->work[k];
		struct req *r = &q->t.reqs[w->req];

		fx_req_crc_add(r, w->addr, w->len);
		r->crc_pending--;
		maybe_complete(q, w->req);
	}
	q->nwork = 0;
}

/* Account one CQE. */
static void on_cqe(struct file_queue *q, uint32_t pi, int res)
{
	struct piece *p = &q->pieces[pi];
	struct req *r = &q->t.reqs[p->req];
	uint32_t i = p->req;

	if (res == -EAGAIN || res == -EINTR) {
		prep_piece(q, pi); /* transient: the same piece again */
		return;
	}
	if (p->ioprio && !q->ioprio_ok && (res == -EPERM || res == -EINVAL)) {
		/* the realtime class needs CAP_SYS_NICE or CAP_SYS_ADMIN, and an
		 * old kernel may refuse the field; but -EINVAL is also a read the
		 * device refuses (O_DIRECT alignment).  Try once without: only
		 * if that succeeds was it the priority (decided below). */
		p->no_prio = 1;
		prep_piece(q, pi);
		return;
	}
	if (p->no_prio && res >= 0 && q->load_ioprio && !q->ioprio_ok) {
		/* the same read without the priority went: it was refused; go on
		 * without it, and say so once */
		fprintf(stderr, "fx100io: the kernel refused the I/O priority for loads; loads go "
				"first in fx100io's queue only\n");
		q->load_ioprio = 0;
		/* the device no longer claims it (Device.io_priority), and queues
		 * made from now on do not try it; another thread may read both */
		__atomic_fetch_and(&q->base.dev->info.caps, ~(uint32_t)FX_CAP_IOPRIO,
				   __ATOMIC_RELAXED);
		__atomic_store_n(&((struct file_dev *)q->base.dev)->load_ioprio, 0,
				 __ATOMIC_RELAXED);
	}
	if (p->ioprio && res >= 0) {
		/* counted here, not when prepared: a read the kernel ran with the
		 * class (a refused try, retried without it, is not one) */
		q->ioprio_ok = 1;
		q->base.stats.ioprio_ios++;
	}
	if (res < 0) {
		if (!r->err)
			r->err = res;
	} else if (r->op != FX_OP_FLUSH) {
		uint64_t got = (uint64_t)res;
		r->done += got;
		q->base.stats.bytes += got;
		if ((r->flags & FX_REQ_CRC32C) && got && q->stopping) {
			/* closing: its caller may have let go of the buffer already
			 * (a queue collected after its driver), so it is not read;
			 * the request then has no checksum to report */
			if (!r->err)
				r->err = -ECANCELED;
		} else if ((r->flags & FX_REQ_CRC32C) && got) {
			if (q->nwork == q->depth)
				run_crc_work(q); /* a piece has one SQE in flight: not reached */
			q->work[q->nwork++] = (struct crc_work){i, (uint32_t)got, p->addr};
			r->crc_pending++;
		}
		if (r->op == FX_OP_READ)
			q->base.stats
				.bytes_direct += got; /* the kernel wrote the caller's buffer */
		if (got < p->len) {
			if (got == 0) {
				if (r->op == FX_OP_READ)
					r->eof = 1; /* past end of file */
				else if (!r->err)
					r->err = -EIO;
			} else {
				/* Short transfer: resubmit the rest. */
				p->addr += got;
				p->off += got;
				p->len -= got;
				prep_piece(q, pi);
				return;
			}
		}
	}
	r->inflight--;
	fx_reqs_piece_end(&q->t, i);
	q->free_pieces[q->nfree_pieces++] = pi;
	maybe_complete(q, i);
}

static int process_cqes(struct file_queue *q)
{
	struct io_uring_cqe *cqes[64];
	int total = 0;
	unsigned n;

	do {
		n = io_uring_peek_batch_cqe(&q->ring.uring, cqes, 64);
		for (unsigned k = 0; k < n; k++)
			/* only pieces carry an index below depth (liburing's own
			 * timeout CQE on kernels without EXT_ARG does not) */
			if (cqes[k]->user_data < q->depth)
				on_cqe(q, (uint32_t)cqes[k]->user_data, cqes[k]->res);
		io_uring_cq_advance(&q->ring.uring, n);
		total += (int)n;
	} while (n == 64);
	if (total) {
		issue(q);
		flush_sqes(q);
		run_crc_work(q);
	}
	return total;
}

static int fq_submit(struct fx_queue *base, const struct fx_req *reqs, unsigned n)
{
	struct file_queue *q = (struct file_queue *)base;
	unsigned k;

	if (q->ring.disabled)
		return -EBADFD; /* nothing could go out: fx_queue_enable() first */
	if (q->stopping)
		return -EBADF; /* being closed (fx_queue_quiesce) */
	/* Another thread than a single-issuer ring's own: the kernel would
	 * refuse the submit.  Refuse the batch before accepting any of it. */
	if (!fx_ring_is_issuer(&q->ring))
		return -EEXIST;
	/* Validate everything first: a bad request rejects the batch
	 * before any of it is queued. */
	for (k = 0; k < n; k++) {
		int ret = fx_req_check(base->dev, &reqs[k]);
		if (ret < 0)
			return ret;
	}
	k = fx_reqs_accept(&q->t, reqs, n);
	issue(q);
	/* Refused after all (a forked child: the ring's thread is in the
	 * parent): the accepted requests failed with the error, and the caller
	 * hears it now. */
	int ret = flush_sqes(q);
	return ret < 0 ? ret : (int)k;
}

static void fq_process(struct fx_queue *base)
{
	struct file_queue *q = (struct file_queue *)base;
	process_cqes(q);
}

static int fq_reap(struct fx_queue *base, struct fx_cqe *out, unsigned max)
{
	return fx_ring_reap(base, &((struct file_queue *)base)->ring, fq_process, out, max);
}

static int fq_wait(struct fx_queue *base, unsigned min, int timeout_ms)
{
	return fx_ring_wait_done(base, &((struct file_queue *)base)->ring, fq_process, min,
				 timeout_ms);
}

/* Pieces the kernel holds: in flight, less those whose SQE it has not
 * taken yet (prepared, or given back by sqes_refused).  Exact with
 * liburing >= 2.2, whose io_uring_sq_ready() counts from the kernel's
 * head; older ones count from the last flush and make this count unsent
 * pieces too: a longer wait, never a buffer handed back early. */
static unsigned held_by_kernel(struct file_queue *q)
{
	unsigned inflight = q->depth - q->nfree_pieces;
	unsigned unsent = io_uring_sq_ready(&q->ring.uring);
	return inflight > unsent ? inflight - unsent : 0;
}

/* Stop issuing, and wait up to timeout_ms (< 0: until they are all back)
 * for the pieces the kernel holds to come back (their CQEs are accounted as
 * usual, so their requests complete).  Returns how many it still holds, or
 * -EEXIST at once while it holds some and this thread cannot wait for them:
 * a DEFER_TASKRUN ring's completions run only on its own thread. */
static int fq_quiesce(struct fx_queue *base, int timeout_ms)
{
	struct file_queue *q = (struct file_queue *)base;
	int64_t deadline = fx_now_ms() + (timeout_ms > 0 ? timeout_ms : 0);
	/* < 0: the thread whose call owns these buffers waits for them however
	 * long the kernel takes (only it may reuse them after) */
	int forever = timeout_ms < 0;

	q->stopping = 1;
	for (;;) {
		process_cqes(q);
		unsigned held = held_by_kernel(q);
		if (!held)
			return 0;
		if ((q->ring.features & FX_RING_DEFER_TASKRUN) && !fx_ring_is_issuer(&q->ring))
			return -EEXIST;
		int64_t left = deadline - fx_now_ms();
		if (!forever && (left <= 0 || q->gave_up)) {
			if (timeout_ms > 0)
				q->gave_up = 1; /* (a look without a wait is no give-up) */
			return (int)held;
		}
		if (forever || left > 1000)
			left = 1000; /* look again each second, whatever woke us */
		struct __kernel_timespec ts = {.tv_sec = left / 1000,
					       .tv_nsec = (left % 1000) * 1000000};
		struct io_uring_cqe *cqe;
		/* Without IORING_FEAT_EXT_ARG (before 5.11) liburing adds a
		 * timeout SQE and submits what is queued: those pieces then
		 * count as held, and the timeout's CQE is not a piece's. */
		int ret = io_uring_wait_cqe_timeout(&q->ring.uring, &cqe, &ts);
		if (ret == -EEXIST)
			return -EEXIST; /* (tied to a thread after all) */
		if (ret < 0 && ret != -ETIME && ret != -EINTR && ret != -EAGAIN && ret != -EBUSY)
			return (int)held;
	}
}

static void fq_destroy(struct fx_queue *base)
{
	struct file_queue *q = (struct file_queue *)base;

	/* A piece the kernel holds still reads or writes its caller's buffer:
	 * wait for it (bounded).  What does not come back is left to the
	 * kernel: this queue's memory is not the kernel's to use (it writes
	 * caller buffers and its own ring), so it is freed; the caller's
	 * buffers must stay owned (Queue.close tells Python how many). */
	int held = fq_quiesce(base, FX_QUEUE_DRAIN_MS);
	if (held == -EEXIST)
		held = (int)held_by_kernel(q);
	if (held > 0) {
		fx_ring_count_leaked((unsigned)held);
		fprintf(stderr,
			"fx100io: closing a %s queue left %d I/O(s) with the kernel (not back "
			"within %d ms, or closed from a thread that cannot wait for them); "
			"their buffers stay with it\n",
			base->dev->ops->name, held, FX_QUEUE_DRAIN_MS);
	}
	fx_ring_exit(&q->ring);
	fx_reqs_fini(&q->t);
	free(q->pieces);
	free(q->free_pieces);
	free(q->work);
	free(q);
}

static int fq_create(struct fx_dev *dev, const struct fx_queue_opts *o, struct fx_queue **out)
{
	struct file_dev *d = (struct file_dev *)dev;
	struct file_queue *q = calloc(1, sizeof(*q));
	int ret;

	if (!q)
		return -ENOMEM;
	q->base.ops = dev->ops;
	q->base.dev = dev;
	q->fds[0] = d->fd_direct;
	q->fds[1] = d->fd_buffered;
	q->bs = dev->info.block_size;
	q->load_ioprio = __atomic_load_n(&d->load_ioprio, __ATOMIC_RELAXED);
	q->depth = o->depth;
	q->max_io = o->max_io;
	ret = fx_reqs_init(&q->t, o->slots);
	if (!ret)
		q->t.write_depth = o->write_depth;
	if (ret < 0) {
		free(q);
		return ret;
	}
	q->pieces = calloc(o->depth, sizeof(*q->pieces));
	q->free_pieces = malloc(o->depth * sizeof(*q->free_pieces));
	q->work = malloc(o->depth * sizeof(*q->work));
	if (!q->pieces || !q->free_pieces || !q->work) {
		ret = -ENOMEM;
		goto fail;
	}
	for (uint32_t k = 0; k < o->depth; k++)
		q->free_pieces[k] = o->depth - 1 - k;
	q->nfree_pieces = o->depth;
	ret = fx_ring_init(&q->ring, o->depth, o->flags);
	if (ret < 0)
		goto fail;
	if (io_uring_register_files(&q->ring.uring, q->fds, 2) == 0)
		q->fixed_files = 1;
	q->base.reqs = &q->t;
	q->base.poll_fd = q->ring.efd;
	q->base.features = q->ring.features | (q->fixed_files ? FX_RING_FIXED_FILES : 0);
	*out = &q->base;
	return 0;
fail:
	fx_reqs_fini(&q->t);
	free(q->pieces);
	free(q->free_pieces);
	free(q->work);
	free(q);
	return ret;
}

static int fq_enable(struct fx_queue *base)
{
	return fx_ring_enable(&((struct file_queue *)base)->ring);
}

const struct fx_transport_ops fx_transport_file = {
	.name = "file",
	.dev_open = fx_file_dev_open,
	.dev_close = fx_file_dev_close,
	.queue_create = fq_create,
	.queue_destroy = fq_destroy,
	.queue_enable = fq_enable,
	.queue_quiesce = fq_quiesce,
	.queue_submit = fq_submit,
	.queue_reap = fq_reap,
	.queue_wait = fq_wait,
};
