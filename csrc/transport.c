/*
 * The transport dispatcher: the only code that calls through ops tables.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <string.h>

#include "internal.h"
#include "reqs.h"

static const struct fx_transport_ops *const transports[] = {
	&fx_transport_file,
	&fx_transport_psync,
	&fx_transport_tcp,
	&fx_transport_rdma,
};

int fx_dev_open(const char *transport, const char *target, const struct fx_dev_opts *opts,
		struct fx_dev **out)
{
	static const struct fx_dev_opts defaults = {.direct = 1};

	if (!transport || !target || !out)
		return -EINVAL;
	for (size_t i = 0; i < sizeof(transports) / sizeof(transports[0]); i++)
		if (strcmp(transports[i]->name, transport) == 0)
			return transports[i]->dev_open(transports[i], target,
						       opts ? opts : &defaults, out);
	return -EINVAL;
}

void fx_dev_info(const struct fx_dev *d, struct fx_dev_info *info)
{
	*info = d->info;
	/* a queue thread may clear FX_CAP_IOPRIO once the kernel refuses it */
	info->caps = __atomic_load_n(&d->info.caps, __ATOMIC_RELAXED);
}

int fx_dev_ana(struct fx_dev *d, uint32_t *grpid, uint8_t *state)
{
	if (!d || !grpid || !state)
		return -EINVAL;
	if (!d->ops->dev_ana)
		return -EOPNOTSUPP;
	return d->ops->dev_ana(d, grpid, state);
}

void fx_dev_close(struct fx_dev *d)
{
	if (d)
		d->ops->dev_close(d);
}

int fx_queue_create(struct fx_dev *d, const struct fx_queue_opts *opts, struct fx_queue **out)
{
	struct fx_queue_opts o = {0};

	if (!d || !out)
		return -EINVAL;
	if (opts)
		o = *opts;
	if (o.depth == 0)
		o.depth = 64;
	if (o.max_io == 0)
		o.max_io = 1u << 20;
	if (o.slots == 0)
		o.slots = 4096;
	if (o.write_depth == 0)
		o.write_depth = FX_WRITE_DEPTH_DEFAULT;
	if (o.depth > 4096 || o.max_io < d->info.block_size || o.slots > (1u << 20))
		return -EINVAL;
	/* Pieces must stay aligned for O_DIRECT. */
	o.max_io &= ~(d->info.block_size - 1);
	if (!d->ops->queue_enable)
		o.flags &= ~FX_QUEUE_DEFER_ENABLE; /* usable from any thread anyway */
	return d->ops->queue_create(d, &o, out);
}

int fx_queue_enable(struct fx_queue *q)
{
	if (!q)
		return -EINVAL;
	return q->ops->queue_enable ? q->ops->queue_enable(q) : 0;
}

int fx_queue_quiesce(struct fx_queue *q, int timeout_ms)
{
	if (!q)
		return -EINVAL;
	return q->ops->queue_quiesce ? q->ops->queue_quiesce(q, timeout_ms) : 0;
}

void fx_queue_destroy(struct fx_queue *q)
{
	if (q)
		q->ops->queue_destroy(q);
}

int fx_queue_submit(struct fx_queue *q, const struct fx_req *reqs, unsigned n)
{
	return q->ops->queue_submit(q, reqs, n);
}

int fx_queue_reap(struct fx_queue *q, struct fx_cqe *out, unsigned max)
{
	return q->ops->queue_reap(q, out, max);
}

int fx_queue_wait(struct fx_queue *q, unsigned min, int timeout_ms)
{
	return q->ops->queue_wait(q, min, timeout_ms);
}

int fx_queue_fd(const struct fx_queue *q)
{
	return q ? q->poll_fd : -EBADF; /* (a closed queue: no fd) */
}

unsigned fx_queue_pending(const struct fx_queue *q)
{
	return q->reqs->pending;
}

unsigned fx_queue_features(const struct fx_queue *q)
{
	return q ? q->features : 0;
}

void fx_queue_stats(const struct fx_queue *q, struct fx_queue_stats *out)
{
	*out = q->stats;
	if (q->reqs) {
		for (unsigned c = 0; c < FX_PRIO_CLASSES; c++)
			out->prio_pieces[c] = q->reqs->pieces[c];
		out->prio_shares = q->reqs->shares;
	}
}
