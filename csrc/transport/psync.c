/*
 * The psync engine: the same requests as the io_uring file queue, done with
 * pread/pwrite/fdatasync at submit time.  It is the fallback where io_uring
 * is unavailable (seccomp, kernel.io_uring_disabled), so it favours being
 * obviously correct over being fast.  Completions still arrive through an
 * eventfd so the asyncio layer does not care which engine runs.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "file_dev.h"

struct psync_queue {
	struct fx_queue base;
	int efd;
	int fds[2];
	uint64_t bs;
	struct req_table t;
};

static ssize_t xfer(int fd, int op, char *addr, size_t len, off_t off)
{
	return op == FX_OP_READ ? pread(fd, addr, len, off) : pwrite(fd, addr, len, off);
}

/* Do one range on one descriptor, looping over short transfers. */
static int do_range(struct psync_queue *q, struct req *r, int fd, uint64_t from, uint64_t to)
{
	while (from < to && !r->eof) {
		q->base.stats.ios++;
		ssize_t got = xfer(fd, r->op, r->addr + from, to - from, (off_t)(r->off + from));
		if (got < 0) {
			if (errno == EINTR || errno == EAGAIN)
				continue;
			return -errno;
		}
		if (got == 0) {
			if (r->op != FX_OP_READ)
				return -EIO;
			r->eof = 1;
		}
		fx_req_crc_add(r, r->addr + from, (uint64_t)got);
		r->done += (uint64_t)got;
		from += (uint64_t)got;
		q->base.stats.bytes += (uint64_t)got;
	}
	return 0;
}

static void run(struct psync_queue *q, struct req *r)
{
	if (r->op == FX_OP_FLUSH) {
		if (fdatasync(q->fds[1]) < 0)
			r->err = -errno;
		return;
	}
	/* Same split as the io_uring engine: aligned prefix direct, the
	 * rest through the page cache. */
	uint64_t mask = q->bs - 1, direct_end = 0;
	if (q->fds[0] >= 0 && !((uintptr_t)r->addr & mask) && !(r->off & mask))
		direct_end = r->len & ~mask;
	int ret = do_range(q, r, q->fds[0], 0, direct_end);
	if (ret == 0)
		ret = do_range(q, r, q->fds[1], direct_end, r->len);
	r->err = ret;
}

static int pq_submit(struct fx_queue *base, const struct fx_req *reqs, unsigned n)
{
	struct psync_queue *q = (struct psync_queue *)base;
	unsigned k;
	uint64_t one = 1;

	for (k = 0; k < n; k++) {
		int ret = fx_req_check(base->dev, &reqs[k]);
		if (ret < 0)
			return ret;
	}
	/* Each request completes here and frees its slot at once, so the
	 * free count never runs out: bound by what the done ring can hold
	 * until the caller reaps. */
	for (k = 0; k < n && q->t.pending < q->t.nslots; k++) {
		uint32_t i = fx_req_take(&q->t, &reqs[k]);
		run(q, &q->t.reqs[i]);
		fx_req_complete(&q->t, i);
	}
	if (k && write(q->efd, &one, sizeof(one)) < 0) {
		/* the counter cannot overflow at these rates */
	}
	return (int)k;
}

static int pq_reap(struct fx_queue *base, struct fx_cqe *out, unsigned max)
{
	struct psync_queue *q = (struct psync_queue *)base;
	uint64_t v;

	if (read(q->efd, &v, sizeof(v)) < 0) {
		/* EAGAIN: not signalled */
	}
	return fx_reqs_pop_done(&q->t, out, max);
}

static int pq_wait(struct fx_queue *base, unsigned min, int timeout_ms)
{
	(void)min;
	(void)timeout_ms;
	/* Everything finished inside submit. */
	return (int)((struct psync_queue *)base)->t.ndone;
}

static void pq_destroy(struct fx_queue *base)
{
	struct psync_queue *q = (struct psync_queue *)base;

	close(q->efd);
	fx_reqs_fini(&q->t);
	free(q);
}

static int pq_create(struct fx_dev *dev, const struct fx_queue_opts *o, struct fx_queue **out)
{
	struct file_dev *d = (struct file_dev *)dev;
	struct psync_queue *q = calloc(1, sizeof(*q));
	int ret;

	if (!q)
		return -ENOMEM;
	q->base.ops = dev->ops;
	q->base.dev = dev;
	q->fds[0] = d->fd_direct;
	q->fds[1] = d->fd_buffered;
	q->bs = dev->info.block_size;
	ret = fx_reqs_init(&q->t, o->slots);
	if (ret < 0) {
		free(q);
		return ret;
	}
	q->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (q->efd < 0) {
		ret = -errno;
		fx_reqs_fini(&q->t);
		free(q);
		return ret;
	}
	q->base.reqs = &q->t;
	q->base.poll_fd = q->efd;
	*out = &q->base;
	return 0;
}

const struct fx_transport_ops fx_transport_psync = {
	.name = "psync",
	.dev_open = fx_file_dev_open,
	.dev_close = fx_file_dev_close,
	.queue_create = pq_create,
	.queue_destroy = pq_destroy,
	.queue_submit = pq_submit,
	.queue_reap = pq_reap,
	.queue_wait = pq_wait,
};
