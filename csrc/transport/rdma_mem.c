/*
 * Protection domains and pool memory regions for NVMe/RDMA (see rdma_mem.h).
 *
 * A process has few RDMA devices and few pools, so both live in small
 * arrays under one mutex: the lookup is a short scan.  Registering a slot
 * (up to 1 GiB: ibv_reg_mr walks every page) is done without the mutex,
 * and queues register every pool there is when they are created, on the
 * caller's thread, so the data path rarely pays for it.  A registration
 * that failed (RLIMIT_MEMLOCK in a pod, say) is remembered for that pool
 * and said once, instead of being retried on every command.  A pool's
 * regions go when the pool does (fx_pool_release_hook).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "transport/rdma_mem.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"
#include "host/nvmf.h"

#define MAX_PDS 8
#define RETRY_FAILED_MS 5000 /* a failed registration is tried again after this */
#define LOG_EVERY_MS 10000   /* registration failures are said at most this often */

/* No remote access through the region itself: a target reaches pool
 * memory only through the memory window each command binds over its own
 * buffer (transport/rdma.c).  Local write because a window with remote
 * write needs it on its region (and the bounce copies). */
#define POOL_ACCESS (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND)

enum slot_state { SLOT_NONE, SLOT_BUSY, SLOT_READY, SLOT_FAILED };

struct fx_rdma_pd {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	unsigned refs;
	pid_t pid; /* a forked child inherits the table but must not touch the
	            * parent's regions: the uverbs fd is shared */
	struct {
		struct ibv_mr *mr;
		uint32_t gen; /* pool generation the state is for */
		enum slot_state state;
		int64_t failed_at; /* SLOT_FAILED: when (ms) */
	} slot[FX_BUF_SLOTS];
};

static pthread_mutex_t pds_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t pds_cond = PTHREAD_COND_INITIALIZER; /* a SLOT_BUSY ended */
static struct fx_rdma_pd pds[MAX_PDS];
static int64_t last_log_ms = -LOG_EVERY_MS;

/* Drop slot s's region in pd (called with pds_lock held). */
static void slot_drop(struct fx_rdma_pd *pd, int s)
{
	if (pd->slot[s].mr)
		ibv_dereg_mr(pd->slot[s].mr);
	pd->slot[s].mr = NULL;
	pd->slot[s].gen = 0;
	pd->slot[s].state = SLOT_NONE;
}

/* fx_pool_destroy: the pool in slot s (generation gen) is going away. */
static void pool_released(int s, uint32_t gen)
{
	pthread_mutex_lock(&pds_lock);
	for (int i = 0; i < MAX_PDS; i++) {
		struct fx_rdma_pd *pd = &pds[i];
		if (pd->refs && pd->pid != getpid())
			continue;
		while (pd->refs && pd->slot[s].state == SLOT_BUSY)
			pthread_cond_wait(&pds_cond, &pds_lock);
		if (pd->refs && pd->slot[s].gen == gen)
			slot_drop(pd, s);
	}
	pthread_mutex_unlock(&pds_lock);
}

struct fx_rdma_pd *fx_rdma_pd_get(struct ibv_context *ctx)
{
	struct fx_rdma_pd *free_one = NULL, *got = NULL;

	pthread_mutex_lock(&pds_lock);
	__atomic_store_n(&fx_pool_release_hook, pool_released, __ATOMIC_RELEASE);
	for (int i = 0; i < MAX_PDS; i++) {
		if (pds[i].refs && pds[i].ctx == ctx) {
			got = &pds[i];
			break;
		}
		if (!pds[i].refs && !free_one)
			free_one = &pds[i];
	}
	if (!got && free_one) {
		free_one->pd = ibv_alloc_pd(ctx);
		if (free_one->pd) {
			free_one->ctx = ctx;
			free_one->pid = getpid();
			got = free_one;
		}
	} else if (!got) {
		errno = ENOSPC;
	}
	if (got)
		got->refs++;
	pthread_mutex_unlock(&pds_lock);
	return got;
}

void fx_rdma_pd_hold(struct fx_rdma_pd *pd)
{
	pthread_mutex_lock(&pds_lock);
	pd->refs++;
	pthread_mutex_unlock(&pds_lock);
}

void fx_rdma_pd_put(struct fx_rdma_pd *pd)
{
	if (!pd)
		return;
	pthread_mutex_lock(&pds_lock);
	if (--pd->refs == 0) {
		for (int s = 0; s < FX_BUF_SLOTS && pd->pid == getpid(); s++)
			slot_drop(pd, s);
		if (pd->pid == getpid())
			ibv_dealloc_pd(pd->pd);
		pd->pd = NULL;
		pd->ctx = NULL;
	}
	pthread_mutex_unlock(&pds_lock);
}

struct ibv_pd *fx_rdma_pd_ibv(const struct fx_rdma_pd *pd)
{
	return pd->pd;
}

/* Slot s (its memory iov, generation gen) ready in pd: registered now if
 * it is not yet; 0, or -ENOENT when registering it failed (now or before). */
static int slot_ensure(struct fx_rdma_pd *pd, int s, const struct iovec *iov, uint32_t gen)
{
	struct iovec now;
	uint32_t now_gen;

	pthread_mutex_lock(&pds_lock);
	while (pd->slot[s].state == SLOT_BUSY)
		pthread_cond_wait(&pds_cond, &pds_lock);
	if (pd->slot[s].gen == gen &&
	    (pd->slot[s].state == SLOT_READY ||
	     (pd->slot[s].state == SLOT_FAILED &&
	      fx_nvmf_now_ms() - pd->slot[s].failed_at < RETRY_FAILED_MS))) {
		int ret = pd->slot[s].state == SLOT_READY ? 0 : -ENOENT;
		pthread_mutex_unlock(&pds_lock);
		return ret;
	}
	/* The pool may have gone since the caller looked (its release hook
	 * found nothing to drop then): register only what is still there.
	 * pds_lock -> the registry's lock is the one order both are taken in. */
	if (fx_pool_slot(s, &now, &now_gen) != s || now_gen != gen) {
		pthread_mutex_unlock(&pds_lock);
		return -ENOENT;
	}
	/* A new pool in the slot (or the first use): the old region covers
	 * memory that is gone. */
	slot_drop(pd, s);
	pd->slot[s].state = SLOT_BUSY;
	pd->slot[s].gen = gen;
	pthread_mutex_unlock(&pds_lock);

	struct ibv_mr *mr = ibv_reg_mr(pd->pd, iov->iov_base, iov->iov_len, POOL_ACCESS);
	int err = mr ? 0 : errno ? errno : ENOMEM;

	pthread_mutex_lock(&pds_lock);
	if (!mr && fx_nvmf_now_ms() - last_log_ms >= LOG_EVERY_MS) {
		last_log_ms = fx_nvmf_now_ms();
		fprintf(stderr,
			"fx100io: nvme+rdma: registering %zu bytes of pool memory for RDMA failed (%s)%s; "
			"I/O on it goes through bounce buffers (a copy) and registering is retried "
			"every %d s\n",
			iov->iov_len, strerror(err),
			err == ENOMEM || err == EAGAIN || err == EPERM
				? ": raise RLIMIT_MEMLOCK (ulimit -l) for pinned memory"
				: "",
			RETRY_FAILED_MS / 1000);
	}
	pd->slot[s].mr = mr;
	pd->slot[s].failed_at = fx_nvmf_now_ms();
	pd->slot[s].state = mr ? SLOT_READY : SLOT_FAILED;
	pthread_cond_broadcast(&pds_cond);
	pthread_mutex_unlock(&pds_lock);
	return mr ? 0 : -ENOENT;
}

int fx_rdma_pool_mr(struct fx_rdma_pd *pd, const void *addr, uint64_t len, struct ibv_mr **mr)
{
	struct iovec iov;
	uint32_t gen;
	int s = fx_pool_lookup(addr, len, &iov, &gen);

	if (s < 0)
		return -ENOENT;
	int ret = slot_ensure(pd, s, &iov, gen);
	if (ret)
		return ret;
	pthread_mutex_lock(&pds_lock);
	/* re-checked: the pool may have gone (and its region) meanwhile */
	if (pd->slot[s].gen == gen && pd->slot[s].state == SLOT_READY) {
		*mr = pd->slot[s].mr;
	} else {
		ret = -ENOENT;
	}
	pthread_mutex_unlock(&pds_lock);
	return ret;
}

void fx_rdma_pd_register_pools(struct fx_rdma_pd *pd)
{
	for (int s = 0; s < FX_BUF_SLOTS; s++) {
		struct iovec iov;
		uint32_t gen;
		if (fx_pool_slot(s, &iov, &gen) == s)
			slot_ensure(pd, s, &iov, gen);
	}
}

struct ibv_mr *fx_rdma_reg(struct fx_rdma_pd *pd, void *addr, size_t len, int access)
{
	return ibv_reg_mr(pd->pd, addr, len, access);
}
