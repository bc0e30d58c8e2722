/*
 * Pinned buffer pools.  Memory is mapped once, populated, locked and
 * published in a process-wide registry of fixed-buffer slots that every
 * ring installs lazily (see fx_ring_buf_index).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "internal.h"

#define HUGE_2M (2ULL << 20)

struct fx_pool {
	void *base;
	uint64_t size;     /* what the caller asked for */
	uint64_t map_size; /* what was mapped */
	int pinned;
	int huge;
	int slot0; /* first registry slot, -1 when not registered */
	int nslots;
	int external; /* fx_pool_wrap: the memory is the caller's */
};

static struct {
	pthread_mutex_t lock;
	struct {
		uintptr_t base;
		uint64_t len;
		uint32_t gen; /* bumped on every reuse; 0 means free */
	} slot[FX_BUF_SLOTS];
	uint32_t next_gen;
} registry = {.lock = PTHREAD_MUTEX_INITIALIZER, .next_gen = 1};

static void registry_publish(struct fx_pool *p)
{
	int need = (int)((p->map_size + FX_BUF_SLOT_MAX - 1) / FX_BUF_SLOT_MAX);

	p->slot0 = -1;
	p->nslots = 0;
	pthread_mutex_lock(&registry.lock);
	for (int s = 0; s + need <= FX_BUF_SLOTS; s++) {
		int ok = 1;
		for (int k = 0; k < need; k++)
			if (registry.slot[s + k].gen) {
				ok = 0;
				break;
			}
		if (!ok)
			continue;
		for (int k = 0; k < need; k++) {
			uint64_t off = (uint64_t)k * FX_BUF_SLOT_MAX;
			uint64_t len = p->map_size - off;
			if (len > FX_BUF_SLOT_MAX)
				len = FX_BUF_SLOT_MAX;
			registry.slot[s + k].base = (uintptr_t)p->base + off;
			registry.slot[s + k].len = len;
			if (registry.next_gen == 0 || registry.next_gen == UINT32_MAX)
				registry.next_gen = 1;
			registry.slot[s + k].gen = registry.next_gen++;
		}
		p->slot0 = s;
		p->nslots = need;
		break;
	}
	pthread_mutex_unlock(&registry.lock);
}

int fx_pool_lookup(const void *addr, uint64_t len, struct iovec *iov, uint32_t *gen)
{
	uintptr_t a = (uintptr_t)addr;
	int found = -1;

	pthread_mutex_lock(&registry.lock);
	for (int s = 0; s < FX_BUF_SLOTS; s++) {
		if (!registry.slot[s].gen)
			continue;
		uintptr_t b = registry.slot[s].base;
		if (a >= b && a - b <= registry.slot[s].len &&
		    len <= registry.slot[s].len - (a - b)) {
			iov->iov_base = (void *)b;
			iov->iov_len = registry.slot[s].len;
			*gen = registry.slot[s].gen;
			found = s;
			break;
		}
	}
	pthread_mutex_unlock(&registry.lock);
	return found;
}

int fx_pool_create(uint64_t size, unsigned flags, struct fx_pool **out)
{
	struct fx_pool *p;
	void *m = MAP_FAILED;
	int ret;

	if (size == 0)
		return -EINVAL;
	p = calloc(1, sizeof(*p));
	if (!p)
		return -ENOMEM;
	p->size = size;

	/* Explicit huge pages only exist when the admin reserved some;
	 * otherwise ask for transparent huge pages, which fewer TLB misses
	 * and fewer pinned-page records both like. */
	if (!(flags & FX_POOL_NO_HUGE)) {
		uint64_t hs = (size + HUGE_2M - 1) & ~(HUGE_2M - 1);
		m = mmap(NULL, hs, PROT_READ | PROT_WRITE,
			 MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB | MAP_POPULATE, -1, 0);
		if (m != MAP_FAILED) {
			p->huge = 1;
			p->map_size = hs;
		}
	}
	if (m == MAP_FAILED) {
		p->map_size = (size + 4095) & ~4095ULL;
		m = mmap(NULL, p->map_size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1,
			 0);
		if (m == MAP_FAILED) {
			ret = -errno;
			free(p);
			return ret;
		}
		if (!(flags & FX_POOL_NO_HUGE))
			madvise(m, p->map_size, MADV_HUGEPAGE);
		/* Populate after madvise so the faults can use huge pages. */
		madvise(m, p->map_size, MADV_POPULATE_WRITE);
	}
	p->base = m;

	if (mlock(m, p->map_size) == 0) {
		p->pinned = 1;
	} else if (flags & FX_POOL_REQUIRE_PINNED) {
		ret = -errno;
		munmap(m, p->map_size);
		free(p);
		return ret;
	}
	registry_publish(p);
	*out = p;
	return 0;
}

int fx_pool_wrap(void *addr, uint64_t size, struct fx_pool **out)
{
	struct fx_pool *p;

	if (!addr || size == 0)
		return -EINVAL;
	p = calloc(1, sizeof(*p));
	if (!p)
		return -ENOMEM;
	p->base = addr;
	p->size = p->map_size = size;
	p->external = 1;
	registry_publish(p);
	if (p->slot0 < 0) {
		free(p);
		return -ENOSPC;
	}
	*out = p;
	return 0;
}

void (*fx_pool_release_hook)(int slot, uint32_t gen);

int fx_pool_slot(int slot, struct iovec *iov, uint32_t *gen)
{
	int ret = -1;

	if (slot < 0 || slot >= FX_BUF_SLOTS)
		return -1;
	pthread_mutex_lock(&registry.lock);
	if (registry.slot[slot].gen) {
		iov->iov_base = (void *)registry.slot[slot].base;
		iov->iov_len = registry.slot[slot].len;
		*gen = registry.slot[slot].gen;
		ret = slot;
	}
	pthread_mutex_unlock(&registry.lock);
	return ret;
}

void fx_pool_destroy(struct fx_pool *p)
{
	uint32_t gens[FX_BUF_SLOTS];

	if (!p)
		return;
	pthread_mutex_lock(&registry.lock);
	for (int k = 0; k < p->nslots; k++) {
		gens[k] = registry.slot[p->slot0 + k].gen;
		registry.slot[p->slot0 + k].gen = 0;
	}
	pthread_mutex_unlock(&registry.lock);
	/* RDMA memory regions of these slots (transport/rdma_mem.c) go now:
	 * they pin the pages and their keys would let a target write here. */
	void (*hook)(int, uint32_t) = __atomic_load_n(&fx_pool_release_hook, __ATOMIC_ACQUIRE);
	for (int k = 0; hook && k < p->nslots; k++)
		hook(p->slot0 + k, gens[k]);
	/* Rings that installed these slots keep the pages pinned until they
	 * replace the slot or exit; the kernel holds its own references, so
	 * unmapping here is safe. */
	if (!p->external)
		munmap(p->base, p->map_size);
	free(p);
}

void *fx_pool_base(const struct fx_pool *p)
{
	return p->base;
}
uint64_t fx_pool_size(const struct fx_pool *p)
{
	return p->size;
}
int fx_pool_pinned(const struct fx_pool *p)
{
	return p->pinned;
}
int fx_pool_huge(const struct fx_pool *p)
{
	return p->huge;
}
