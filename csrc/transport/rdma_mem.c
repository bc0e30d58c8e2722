/*
 * Protection domains and pool memory regions for NVMe/RDMA (see rdma_mem.h).
 *
 * A process has few RDMA devices and few pools, so both live in small
 * arrays under one mutex: the lookup is a short scan, and a data-path
 * command takes the mutex once.  Memory regions stay registered until the
 * PD goes away or their pool slot is reused, as io_uring's fixed buffers
 * stay installed until their slot is replaced.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "transport/rdma_mem.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/uio.h>

#include "internal.h"

#define MAX_PDS 8

/* Remote read: the target reads write data; remote write: it writes read
 * data; local write: receives and bounce copies. */
#define POOL_ACCESS (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE)

struct fx_rdma_pd {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	unsigned refs;
	struct {
		struct ibv_mr *mr;
		uint32_t gen; /* pool generation the MR was made for */
	} slot[FX_BUF_SLOTS];
};

static pthread_mutex_t pds_lock = PTHREAD_MUTEX_INITIALIZER;
static struct fx_rdma_pd pds[MAX_PDS];

struct fx_rdma_pd *fx_rdma_pd_get(struct ibv_context *ctx)
{
	struct fx_rdma_pd *free_one = NULL, *got = NULL;

	pthread_mutex_lock(&pds_lock);
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
		for (int s = 0; s < FX_BUF_SLOTS; s++) {
			if (pd->slot[s].mr)
				ibv_dereg_mr(pd->slot[s].mr);
			pd->slot[s].mr = NULL;
			pd->slot[s].gen = 0;
		}
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

int fx_rdma_pool_keys(struct fx_rdma_pd *pd, const void *addr, uint64_t len, uint32_t *lkey,
                      uint32_t *rkey)
{
	struct iovec iov;
	uint32_t gen;
	int s = fx_pool_lookup(addr, len, &iov, &gen);
	int ret = 0;

	if (s < 0)
		return -ENOENT;
	pthread_mutex_lock(&pds_lock);
	if (pd->slot[s].gen != gen) {
		/* First use of this slot here, or a new pool in it: the old
		 * MR (if any) covers memory that is gone. */
		if (pd->slot[s].mr)
			ibv_dereg_mr(pd->slot[s].mr);
		pd->slot[s].mr = ibv_reg_mr(pd->pd, iov.iov_base, iov.iov_len, POOL_ACCESS);
		pd->slot[s].gen = pd->slot[s].mr ? gen : 0;
		if (!pd->slot[s].mr)
			ret = errno ? -errno : -ENOMEM;
	}
	if (ret == 0) {
		*lkey = pd->slot[s].mr->lkey;
		*rkey = pd->slot[s].mr->rkey;
	}
	pthread_mutex_unlock(&pds_lock);
	return ret;
}

struct ibv_mr *fx_rdma_reg(struct fx_rdma_pd *pd, void *addr, size_t len)
{
	return ibv_reg_mr(pd->pd, addr, len, POOL_ACCESS);
}
