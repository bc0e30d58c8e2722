/*
 * Memory for NVMe/RDMA (transport/rdma_mem.c): one protection domain per
 * RDMA device context, shared by every queue of the process on it, and the
 * memory regions of the buffer pools registered in it once.
 *
 * A pool (fx_pool_create, or fx_pool_wrap for memory such as LMCache's) is
 * registered on first use, slot by slot of the pool registry (1 GiB each),
 * with local write and memory-window bind access and no remote access: the
 * target RDMA-WRITEs read data straight into it and RDMA-READs write data
 * from it only through the window each command binds over its own buffer.  A slot
 * reused by a later pool (a new generation) is registered anew, and a
 * pool's regions are dropped when it is destroyed.  Memory in no pool has
 * no key: the data path copies through a bounce buffer.
 */
#ifndef FX100IO_TRANSPORT_RDMA_MEM_H
#define FX100IO_TRANSPORT_RDMA_MEM_H

#include <infiniband/verbs.h>
#include <stdint.h>

struct fx_rdma_pd;

/* The shared PD of ctx (allocated on first use; one reference more).
 * NULL with errno set on failure. */
struct fx_rdma_pd *fx_rdma_pd_get(struct ibv_context *ctx);
/* One reference more on a PD the caller holds. */
void fx_rdma_pd_hold(struct fx_rdma_pd *pd);
void fx_rdma_pd_put(struct fx_rdma_pd *pd);
struct ibv_pd *fx_rdma_pd_ibv(const struct fx_rdma_pd *pd);

/*
 * The region of [addr, addr+len) when it lies in one slot of a registered
 * pool: registers that slot in pd on first use.  0 on success; -ENOENT
 * when the range is in no pool (use a bounce buffer) or registering
 * failed.  The region stays until the pool is destroyed.  Thread-safe.
 */
int fx_rdma_pool_mr(struct fx_rdma_pd *pd, const void *addr, uint64_t len, struct ibv_mr **mr);

/* Register every pool there is now in pd (queue creation does it, on the
 * caller's thread, so first I/Os do not pay for it). */
void fx_rdma_pd_register_pools(struct fx_rdma_pd *pd);

/* Register private memory (bounce buffers, capsules, admin data) in pd
 * with access (IBV_ACCESS_*: no more than it needs); NULL and errno on
 * failure. */
struct ibv_mr *fx_rdma_reg(struct fx_rdma_pd *pd, void *addr, size_t len, int access);

#endif
