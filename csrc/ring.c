/*
 * io_uring setup with a runtime feature probe, and lazy installation of
 * buffer-pool slots as fixed buffers.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <time.h>

#include "internal.h"
#include "reqs.h"

/* FX100IO_RING_SETUP with a value it does not know is said once. */
static int warned_ring_setup;

/* Flag sets to try, best first.  Older kernels reject unknown setup flags
 * with -EINVAL, so each step drops what the previous kernel generation
 * lacked.  SUBMIT_ALL keeps a batch going past one bad request. */
static const struct {
	unsigned setup;
	unsigned features;
} probe_order[] = {
	{IORING_SETUP_SUBMIT_ALL | IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN,
	 FX_RING_SINGLE_ISSUER | FX_RING_DEFER_TASKRUN},
	{IORING_SETUP_SUBMIT_ALL | IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_COOP_TASKRUN |
		 IORING_SETUP_TASKRUN_FLAG,
	 FX_RING_SINGLE_ISSUER | FX_RING_COOP_TASKRUN},
	{IORING_SETUP_COOP_TASKRUN, FX_RING_COOP_TASKRUN},
	{0, 0},
};

int fx_ring_init(struct fx_ring *r, unsigned entries, uint32_t queue_flags)
{
	struct io_uring_params p;
	size_t first = 0;
	int ret = -EINVAL;

	memset(r, 0, sizeof(*r));
	r->efd = -1;
	/* FX100IO_RING_SETUP=plain forces the fallback path, so tests can
	 * cover it on kernels that have every feature. */
	const char *force = getenv("FX100IO_RING_SETUP");
	if (force && strcmp(force, "plain") == 0)
		first = sizeof(probe_order) / sizeof(probe_order[0]) - 1;
	else if (force && *force && !__atomic_exchange_n(&warned_ring_setup, 1, __ATOMIC_RELAXED))
		fprintf(stderr, "fx100io: FX100IO_RING_SETUP=%s ignored (only 'plain')\n", force);
	/* A ring whose eventfd an event loop sleeps on: no DEFER_TASKRUN
	 * (FX_QUEUE_FD_WAKE says why), COOP_TASKRUN at best. */
	else if (queue_flags & FX_QUEUE_FD_WAKE)
		first = 1;

	for (size_t i = first; i < sizeof(probe_order) / sizeof(probe_order[0]); i++) {
		memset(&p, 0, sizeof(p));
		p.flags = probe_order[i].setup;
		/* Only a single-issuer ring is tied to the thread that makes it:
		 * started disabled, it is tied to the one that enables it.  Every
		 * kernel with SINGLE_ISSUER (6.0) has R_DISABLED (5.10). */
		if ((queue_flags & FX_QUEUE_DEFER_ENABLE) && (p.flags & IORING_SETUP_SINGLE_ISSUER))
			p.flags |= IORING_SETUP_R_DISABLED;
		ret = io_uring_queue_init_params(entries, &r->uring, &p);
		if (ret == 0) {
			r->features = probe_order[i].features;
			r->disabled = !!(p.flags & IORING_SETUP_R_DISABLED);
			/* the kernel ties a single-issuer ring to this thread
			 * now, or to the one that enables it */
			r->issuer = pthread_self();
			break;
		}
		if (ret != -EINVAL)
			return ret; /* ENOSYS, EPERM, ENOMEM: no flag set helps */
	}
	if (ret < 0)
		return ret;

	/* No io_uring_register_ring_fd(): a registered ring fd is held by the
	 * registering thread, so a ring closed from another thread (Device.close
	 * while a worker thread still lives) would keep its files open until
	 * that thread exits. */

	r->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (r->efd < 0) {
		ret = -errno;
		io_uring_queue_exit(&r->uring);
		return ret;
	}
	ret = io_uring_register_eventfd(&r->uring, r->efd);
	if (ret < 0) {
		close(r->efd);
		io_uring_queue_exit(&r->uring);
		return ret;
	}
	/* A sparse table lets pools be installed on first use, so a ring
	 * created before a pool still uses it as fixed buffers. */
	if (io_uring_register_buffers_sparse(&r->uring, FX_BUF_SLOTS) == 0)
		r->features |= FX_RING_FIXED_BUFS;
	return 0;
}

void fx_ring_exit(struct fx_ring *r)
{
	io_uring_queue_exit(&r->uring);
	if (r->efd >= 0)
		close(r->efd);
	r->efd = -1;
}

int fx_ring_enable(struct fx_ring *r)
{
	if (!r->disabled)
		return 0;
	/* The raw call: liburing 2.3 declares io_uring_enable_rings() but its
	 * shared library does not export it. */
	if (syscall(__NR_io_uring_register, r->uring.ring_fd, IORING_REGISTER_ENABLE_RINGS, NULL,
		    0) < 0)
		return -errno;
	r->disabled = 0;
	r->issuer = pthread_self();
	return 0;
}

int fx_ring_is_issuer(const struct fx_ring *r)
{
	if (!(r->features & FX_RING_SINGLE_ISSUER))
		return 1;
	return pthread_equal(r->issuer, pthread_self()) != 0;
}

/* I/Os that queue destroys left with the kernel, process-wide (any thread
 * may destroy a queue). */
static uint64_t leaked_ios;

void fx_ring_count_leaked(unsigned n)
{
	__atomic_fetch_add(&leaked_ios, n, __ATOMIC_RELAXED);
}

uint64_t fx_queue_leaked_ios(void)
{
	return __atomic_load_n(&leaked_ios, __ATOMIC_RELAXED);
}

int fx_ring_buf_index(struct fx_ring *r, const void *addr, uint64_t len)
{
	struct iovec iov;
	uint32_t gen;
	__u64 tag = 0;

	if (!(r->features & FX_RING_FIXED_BUFS))
		return -1;
	int slot = fx_pool_lookup(addr, len, &iov, &gen);
	if (slot < 0)
		return -1;
	if (r->installed[slot] == gen)
		return slot;
	if (r->installed[slot] == UINT32_MAX)
		return -1;
	/* Replacing a slot drops the old pool's pages from this ring. */
	if (io_uring_register_buffers_update_tag(&r->uring, slot, &iov, &tag, 1) != 1) {
		/* Usually RLIMIT_MEMLOCK; the pool's pinned flag tells the
		 * user why.  Plain reads stay correct. */
		r->installed[slot] = UINT32_MAX;
		return -1;
	}
	r->installed[slot] = gen;
	return slot;
}

void fx_ring_flush_events(struct fx_ring *r)
{
	uint64_t v;

	/* Clear first: a completion racing with the reap re-arms the fd and
	 * costs one spurious wake-up, never a lost one. */
	if (read(r->efd, &v, sizeof(v)) < 0) {
		/* EAGAIN: nothing was signalled */
	}
	if (r->features & FX_RING_DEFER_TASKRUN)
		io_uring_get_events(&r->uring);
}

int64_t fx_now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int fx_ring_wait_done(struct fx_queue *q, struct fx_ring *r, void (*process)(struct fx_queue *q),
		      unsigned min, int timeout_ms)
{
	int64_t deadline = timeout_ms >= 0 ? fx_now_ms() + timeout_ms : -1;

	if (min > q->reqs->pending)
		min = q->reqs->pending; /* never wait for what was not asked */
	for (;;) {
		struct io_uring_cqe *cqe;
		struct __kernel_timespec ts, *tsp = NULL;

		process(q);
		if (q->reqs->ndone >= min)
			return (int)q->reqs->ndone;
		if (deadline >= 0) {
			int64_t left = deadline - fx_now_ms();
			if (left <= 0)
				return -ETIME;
			ts.tv_sec = left / 1000;
			ts.tv_nsec = (left % 1000) * 1000000;
			tsp = &ts;
		}
		int ret = io_uring_submit_and_wait_timeout(&r->uring, &cqe, 1, tsp, NULL);
		if (ret == -EINTR || ret == -EEXIST)
			return ret; /* EEXIST: not the ring's thread (SINGLE_ISSUER) */
		if (ret < 0 && ret != -ETIME && ret != -EAGAIN && ret != -EBUSY)
			return ret;
	}
}

int fx_ring_reap(struct fx_queue *q, struct fx_ring *r, void (*process)(struct fx_queue *q),
		 struct fx_cqe *out, unsigned max)
{
	fx_ring_flush_events(r);
	process(q);
	return fx_reqs_pop_done(q->reqs, out, max);
}
