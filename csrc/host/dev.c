/*
 * An NVMe-oF namespace as a device, on any transport (see host/dev.h).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "host/dev.h"

#include "host/ana.h"
#include "host/ns_ids.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

static int parse_hostid(const char *v, uint8_t out[16])
{
	if (strlen(v) != 32)
		return -EINVAL;
	for (int i = 0; i < 16; i++) {
		unsigned b;
		if (sscanf(v + 2 * i, "%2x", &b) != 1)
			return -EINVAL;
		out[i] = (uint8_t)b;
	}
	return 0;
}

/*
 * The keys of the target string, one name each: the option table
 * (fx100io/fabric_options.py) must list the same ones, and
 * tests/fabric/test_fabric_options.py reads this list (fx_nvmf_dev_keys) to check.
 * parse_kv's switch has no default, so -Wswitch fails the build when a key
 * has no case.
 */
enum dev_key {
	K_HOST,
	K_PORT,
	K_SUBNQN,
	K_HOSTNQN,
	K_HOSTID,
	K_NSID,
	K_QUEUES,
	K_QSIZE,
	K_HDGST,
	K_DDGST,
	K_KATO_MS,
	K_CONNECT_TIMEOUT_MS,
	K_IO_TIMEOUT_MS,
	K_RECONNECT_MS,
	K_MAX_RECONNECTS,
	K_MAX_XFER,
	K_DHCHAP_SECRET,
	K_DHCHAP_CTRL_SECRET,
	K_TLS,
	K_TLS_KEY,
	K_KTLS,
	K_UNKNOWN /* not a key: what key_of gives a name it does not know */
};

static const char *const dev_keys[K_UNKNOWN + 1] = {
	[K_HOST] = "host",
	[K_PORT] = "port",
	[K_SUBNQN] = "subnqn",
	[K_HOSTNQN] = "hostnqn",
	[K_HOSTID] = "hostid",
	[K_NSID] = "nsid",
	[K_QUEUES] = "queues",
	[K_QSIZE] = "qsize",
	[K_HDGST] = "hdgst",
	[K_DDGST] = "ddgst",
	[K_KATO_MS] = "kato_ms",
	[K_CONNECT_TIMEOUT_MS] = "connect_timeout_ms",
	[K_IO_TIMEOUT_MS] = "io_timeout_ms",
	[K_RECONNECT_MS] = "reconnect_ms",
	[K_MAX_RECONNECTS] = "max_reconnects",
	[K_MAX_XFER] = "max_xfer",
	[K_DHCHAP_SECRET] = "dhchap_secret",
	[K_DHCHAP_CTRL_SECRET] = "dhchap_ctrl_secret",
	[K_TLS] = "tls",
	[K_TLS_KEY] = "tls_key",
	[K_KTLS] = "ktls",
	[K_UNKNOWN] = NULL,
};

const char *const *fx_nvmf_dev_keys(void)
{
	return dev_keys;
}

static enum dev_key key_of(const char *k)
{
	int i = 0;

	while (i < K_UNKNOWN && strcmp(k, dev_keys[i]))
		i++;
	return (enum dev_key)i;
}

static int parse_kv(struct fx_nvmf_dev *d, const char *target)
{
	char *copy = strdup(target), *save = NULL;
	int ret = 0;

	if (!copy)
		return -ENOMEM;
	d->nsid = 1;
	d->queues = d->tr && d->tr->default_queues ? d->tr->default_queues
						   : 1; /* no transport: the URI fuzzer */
	d->queues_default = 1;
	d->params.kato_ms = 30000;
	d->params.timeout_ms = 10000;
	d->io_timeout_ms = 30000;
	d->reconnect_ms = FX_NVMF_RECONNECT_MS_DEFAULT;
	d->max_reconnects = FX_NVMF_MAX_RECONNECTS_DEFAULT;
	for (char *line = strtok_r(copy, "\n", &save); line && !ret;
	     line = strtok_r(NULL, "\n", &save)) {
		char *eq = strchr(line, '=');
		if (!eq)
			continue;
		*eq = 0;
		const char *k = line, *v = eq + 1;
		const char *why = NULL;
		enum dev_key key = key_of(k);

		switch (key) {
		case K_HOST:
			snprintf(d->addr.host, sizeof(d->addr.host), "%s", v);
			break;
		case K_PORT:
			snprintf(d->addr.port, sizeof(d->addr.port), "%s", v);
			break;
		case K_SUBNQN:
			snprintf(d->params.subnqn, sizeof(d->params.subnqn), "%s", v);
			break;
		case K_HOSTNQN:
			snprintf(d->params.hostnqn, sizeof(d->params.hostnqn), "%s", v);
			break;
		case K_HOSTID:
			ret = parse_hostid(v, d->params.hostid);
			break;
		case K_NSID:
			d->nsid = (uint32_t)strtoul(v, NULL, 10);
			break;
		case K_QUEUES:
			d->queues = (uint32_t)strtoul(v, NULL, 10);
			d->queues_default = 0;
			break;
		case K_QSIZE:
			d->qsize = (uint32_t)strtoul(v, NULL, 10);
			break;
		case K_HDGST:
			d->params.hdgst = atoi(v) != 0;
			break;
		case K_DDGST:
			d->params.ddgst = atoi(v) != 0;
			break;
		case K_KATO_MS:
			d->params.kato_ms = (uint32_t)strtoul(v, NULL, 10);
			break;
		case K_CONNECT_TIMEOUT_MS:
			d->params.timeout_ms = atoi(v);
			break;
		case K_IO_TIMEOUT_MS:
			d->io_timeout_ms = atoi(v);
			break;
		case K_RECONNECT_MS:
			d->reconnect_ms = atoi(v);
			break;
		case K_MAX_RECONNECTS:
			d->max_reconnects = atoi(v);
			break;
		case K_MAX_XFER:
			d->max_xfer = (uint32_t)strtoul(v, NULL, 10);
			break;
		case K_DHCHAP_SECRET:
		case K_DHCHAP_CTRL_SECRET:
			ret = fx_nvmf_params_set_secret(&d->params, key == K_DHCHAP_CTRL_SECRET, v,
							&why);
			if (ret)
				fprintf(stderr, "fx100io: %s: %s: %s\n", d->label, k, why);
			break;
		case K_TLS:
			d->params.tls = atoi(v) != 0;
			break;
		case K_TLS_KEY:
			ret = fx_nvmf_params_set_tls_key(&d->params, v, &why);
			if (ret)
				fprintf(stderr, "fx100io: %s: %s: %s\n", d->label, k, why);
			break;
		case K_KTLS:
			if (strcmp(v, "off") && strcmp(v, "auto"))
				ret = -EINVAL;
			d->params.ktls_off = strcmp(v, "off") == 0;
			break;
		case K_UNKNOWN: /* ignored, as fabric_uri never writes one */
			break;
		}
	}
	fx_auth_wipe(copy, strlen(target)); /* it held the secrets' text */
	free(copy);
	if (ret || !d->addr.host[0] || !d->addr.port[0] || !d->params.subnqn[0] ||
	    !d->params.hostnqn[0] || d->nsid == 0 || d->queues == 0 || d->queues > 64 ||
	    d->qsize == 1 || d->qsize > 4096 || d->io_timeout_ms <= 0 ||
	    d->params.timeout_ms <= 0 || d->reconnect_ms < 0 || d->max_reconnects < 0)
		return -EINVAL;
	return 0;
}

uint32_t fx_nvmf_xfer_size(uint32_t want, uint32_t mdts_bytes, uint32_t lba)
{
	uint64_t cap = want ? want : (1u << 20);

	if (cap < lba)
		cap = lba;
	if (mdts_bytes && mdts_bytes < cap)
		cap = mdts_bytes;
	if (cap > 65536ull * lba) /* NLB is a 16-bit field */
		cap = 65536ull * lba;
	return (uint32_t)(cap & ~(uint64_t)(lba - 1));
}

/* Open (or re-open) the controller; called with open_lock held (not lock:
 * this waits on the network, up to CAP.TO). */
/* All zeroes: the controller did not report that identifier (it has none,
 * or refused the Identify that carries it). */
static int id_none(const uint8_t *id, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (id[i])
			return 0;
	return 1;
}

/* Keep a reported identifier; an unreported one never erases a known one. */
static void id_keep(uint8_t *have, const uint8_t *now, size_t n)
{
	if (!id_none(now, n))
		memcpy(have, now, n);
}

static int ctrl_open_locked(struct fx_nvmf_dev *d, uint16_t *status)
{
	struct fx_nvmf_ctrl *c = NULL, *old;
	/* Enough I/O queues for several threads' queues. */
	uint16_t want = (uint16_t)(d->queues * 8 < 64 ? d->queues * 8 : 64);
	int ret = fx_nvmf_ctrl_open(d->tr, &d->addr, &d->params, want, &c, status);

	if (ret < 0)
		return ret;
	uint64_t nsze = 0;
	uint32_t lba = 0;
	/* the controller's limit, and the transport's */
	uint32_t mdts = c->mdts_bytes;
	if (d->tr->max_xfer && (!mdts || d->tr->max_xfer < mdts))
		mdts = d->tr->max_xfer;
	struct fx_nvmf_ns_ids ids;
	ret = fx_nvmf_ctrl_ns_info_ids(c, d->nsid, &nsze, &lba, &ids);
	if (ret == 0 && !fx_nvmf_xfer_size(d->max_xfer, mdts, lba)) {
		fprintf(stderr,
			"fx100io: %s: nsid %u: blocks of %u bytes exceed the controller's "
			"largest transfer (MDTS %u bytes)\n",
			d->label, d->nsid, lba, c->mdts_bytes);
		ret = -EPROTO;
	}
	if (ret < 0) {
		fx_nvmf_ctrl_close(c);
		return ret;
	}
	uint8_t *used = calloc((size_t)c->io_queues + 1, 1);
	if (!used) {
		fx_nvmf_ctrl_close(c);
		return -ENOMEM;
	}
	pthread_mutex_lock(&d->lock);
	old = d->ctrl;
	if (old && (lba != d->info->block_size || nsze * lba != d->info->size ||
		    fx_nvmf_ns_ids_differ(ids.nguid, ids.eui64, ids.uuid, d->info->nguid,
					  d->info->eui64, d->info->uuid))) {
		/* A different namespace behind the same name: never write
		 * to it as if it were the old one. */
		pthread_mutex_unlock(&d->lock);
		free(used);
		fx_nvmf_ctrl_close(c);
		return -ESTALE;
	}
	free(d->qid_used);
	d->qid_used = used;
	d->ctrl = c;
	d->ctrl_epoch++;
	d->info->size = nsze * lba; /* fits: fx_nvmf_ctrl_ns_info checks */
	d->info->block_size = lba;
	id_keep(d->info->nguid, ids.nguid, 16);
	id_keep(d->info->eui64, ids.eui64, 8);
	id_keep(d->info->uuid, ids.uuid, 16);
	d->anagrpid = ids.anagrpid;
	memset(&d->ana, 0, sizeof(d->ana)); /* another controller: learnt afresh */
	d->max_xfer = fx_nvmf_xfer_size(d->max_xfer, mdts, lba);
	pthread_mutex_unlock(&d->lock);
	/* Only open_lock holders use a ctrl pointer beyond lock, so the old
	 * one is ours to close. */
	if (old)
		fx_nvmf_ctrl_close(old);
	return 0;
}

int fx_nvmf_dev_init(struct fx_nvmf_dev *d, const struct fx_nvmf_transport *tr, const char *label,
		     const char *target, struct fx_dev_info *info)
{
	uint16_t status = 0;
	int ret;

	memset(d, 0, sizeof(*d));
	d->tr = tr;
	d->label = label;
	d->info = info;
	pthread_mutex_init(&d->lock, NULL);
	pthread_mutex_init(&d->open_lock, NULL);
	ret = parse_kv(d, target);
	/* a key asks for a secure channel (never clear text for a URI that
	 * gave one); every queue, admin and I/O, does its handshake in the
	 * blocking connect (transport/tcp_ctrl.c) and the data path carries
	 * records (transport/tcp.c).  NVMe/TCP's only: RDMA has no TLS. */
	if (ret == 0 && d->params.tls_key.len)
		d->params.tls = 1;
	if (ret == 0 && d->params.tls && strcmp(label, "nvme+tcp") != 0) {
		fprintf(stderr, "fx100io: %s: tls=1: a secure channel is NVMe/TCP's only\n",
			d->label);
		ret = -EPROTONOSUPPORT;
	}
	if (ret == 0) {
		pthread_mutex_lock(&d->open_lock);
		ret = ctrl_open_locked(d, &status);
		pthread_mutex_unlock(&d->open_lock);
	}
	if (ret < 0)
		fx_nvmf_dev_fini(d);
	return ret;
}

void fx_nvmf_dev_fini(struct fx_nvmf_dev *d)
{
	if (d->ctrl)
		fx_nvmf_ctrl_close(d->ctrl);
	d->ctrl = NULL;
	free(d->qid_used);
	d->qid_used = NULL;
	fx_nvmf_params_wipe(&d->params);
	pthread_mutex_destroy(&d->open_lock);
	pthread_mutex_destroy(&d->lock);
}

/* Next free qid after the last one handed out: a qid just released may
 * still be torn down on the target side, so it is reused last. */
static int take_qid(struct fx_nvmf_dev *d)
{
	uint16_t n = d->ctrl ? d->ctrl->io_queues : 0;

	for (uint16_t k = 0; k < n; k++) {
		uint16_t q = (uint16_t)((d->next_qid + k) % n + 1);
		if (!d->qid_used[q]) {
			d->qid_used[q] = 1;
			d->next_qid = q % n;
			return q;
		}
	}
	return -EBUSY;
}

static void release_qid(struct fx_nvmf_dev *d, int qid, uint32_t epoch)
{
	pthread_mutex_lock(&d->lock);
	if (d->ctrl_epoch == epoch && d->qid_used && qid > 0)
		d->qid_used[qid] = 0;
	pthread_mutex_unlock(&d->lock);
}

/* Is the controller still there?  Asks it (CSTS on the admin queue) rather
 * than guessing from one refused Connect: re-opening tears down every
 * thread's queues.  Called with open_lock held. */
static int ctrl_alive_locked(struct fx_nvmf_dev *d)
{
	struct fx_nvmf_ctrl *c = d->ctrl;
	uint64_t csts = 0;
	int ret;

	if (!c || __atomic_load_n(&c->ka_failed, __ATOMIC_ACQUIRE))
		return 0;
	pthread_mutex_lock(&c->lock);
	ret = fx_nvmf_q_prop_get(c->tr, c->aq, NVME_REG_CSTS, 0, &csts, 0);
	pthread_mutex_unlock(&c->lock);
	return ret == 0 && (csts & NVME_CSTS_RDY) && !(csts & NVME_CSTS_CFS);
}

/* Take open_lock; give up when *stop is set (another thread's controller
 * open may hold it for CAP.TO). */
static int lock_open(struct fx_nvmf_dev *d, const int *stop)
{
	if (!stop) {
		pthread_mutex_lock(&d->open_lock);
		return 0;
	}
	for (;;) {
		struct timespec ts;
		clock_gettime(CLOCK_REALTIME, &ts);
		ts.tv_nsec += 20 * 1000000L;
		if (ts.tv_nsec >= 1000000000L) {
			ts.tv_sec++;
			ts.tv_nsec -= 1000000000L;
		}
		if (pthread_mutex_timedlock(&d->open_lock, &ts) == 0)
			return 0;
		if (__atomic_load_n(stop, __ATOMIC_ACQUIRE))
			return -ECANCELED;
	}
}

static int ctrl_gone(struct fx_nvmf_dev *d)
{
	return !d->ctrl || __atomic_load_n(&d->ctrl->ka_failed, __ATOMIC_ACQUIRE);
}

void fx_nvmf_dev_connect_io(struct fx_nvmf_dev *d, const int *stop, void *q,
			    struct fx_nvmf_io_conn *res)
{
	uint16_t status = 0;
	int ret = -ENOTCONN;

	memset(res, 0, sizeof(*res));
	/* A few qids: one refused Connect (a qid the target has not torn
	 * down yet) should cost a retry, not the controller. */
	for (int attempt = 0; attempt < 4; attempt++) {
		pthread_mutex_lock(&d->lock);
		int gone = ctrl_gone(d);
		pthread_mutex_unlock(&d->lock);
		if (gone) {
			ret = lock_open(d, stop);
			if (ret < 0)
				break;
			if (ctrl_gone(d)) /* nobody re-opened it meanwhile */
				ret = ctrl_open_locked(d, &status);
			pthread_mutex_unlock(&d->open_lock);
			if (ret < 0)
				break;
		}
		pthread_mutex_lock(&d->lock);
		int qid = take_qid(d);
		uint16_t cntlid = d->ctrl->cntlid;
		uint16_t sqsize = d->ctrl->io_sqsize;
		if (d->qsize && d->qsize - 1 < sqsize)
			sqsize = (uint16_t)(d->qsize - 1);
		res->incap_max = d->ctrl->ioccsz_bytes > 64 ? d->ctrl->ioccsz_bytes - 64 : 0;
		res->max_xfer = d->max_xfer;
		res->icdoff = d->ctrl->icdoff;
		uint32_t epoch = d->ctrl_epoch;
		pthread_mutex_unlock(&d->lock);
		if (qid < 0) {
			ret = qid;
			break;
		}
		uint16_t got_cntlid = 0;
		struct fx_nvmf_params p = d->params;

		p.io_incap_max = res->icdoff == 0 ? res->incap_max : 0;
		ret = d->tr->connect(&d->addr, &p, (uint16_t)qid, sqsize, cntlid, q, &got_cntlid,
				     &status);
		fx_nvmf_params_wipe(&p);
		if (ret == 0) {
			res->epoch = epoch;
			res->qid = (uint16_t)qid;
			res->sqsize = sqsize;
			break;
		}
		release_qid(d, qid, epoch);
		if (ret != -ENOENT && ret != -EIO)
			break; /* refused, unreachable, timed out: nothing to retry now */
		int r2 = lock_open(d, stop);
		if (r2 < 0) {
			ret = r2;
			break;
		}
		pthread_mutex_lock(&d->lock);
		int same = d->ctrl_epoch == epoch;
		pthread_mutex_unlock(&d->lock);
		int alive = 1;
		if (same) {
			/* The check talks on the shared admin queue: a cancel
			 * must not cut it (and so the controller) short. */
			int cfd = fx_nvmf_cancel_fd();
			fx_nvmf_set_cancel_fd(-1);
			alive = ctrl_alive_locked(d);
			fx_nvmf_set_cancel_fd(cfd);
		}
		if (!alive) {
			/* The target forgot the controller (restart, KATO). */
			int r3 = ctrl_open_locked(d, &status);
			if (r3 < 0) {
				pthread_mutex_unlock(&d->open_lock);
				ret = r3;
				break;
			}
		}
		pthread_mutex_unlock(&d->open_lock);
	}
	res->err = ret;
}

/* One chunk of the ANA log (host/ana.c): ctrl->lock is taken per command,
 * not across the page, so that keep alive goes on between chunks. */
static int ana_chunk(void *ctx, uint8_t lsp, uint64_t off, void *buf, uint32_t len,
		     uint16_t *status)
{
	struct fx_nvmf_ctrl *c = ctx;
	int ret;

	pthread_mutex_lock(&c->lock);
	ret = fx_nvmf_ctrl_get_log_sp(c, NVME_LOG_ANA, lsp, off, buf, len, status);
	pthread_mutex_unlock(&c->lock);
	return ret;
}

int fx_nvmf_dev_ana(struct fx_nvmf_dev *d, uint32_t *grpid, uint8_t *state)
{
	uint64_t chgcnt = 0;
	uint16_t sf = 0;
	int ret;

	pthread_mutex_lock(&d->open_lock); /* the ctrl pointer (and d->ana) stay ours */
	*grpid = d->anagrpid;
	if (ctrl_gone(d)) {
		ret = -ENOTCONN;
	} else if (!d->anagrpid) {
		ret = -EOPNOTSUPP;
	} else {
		ret = fx_nvmf_ana_read(&d->ana, ana_chunk, d->ctrl, d->ctrl->mdts_bytes,
				       d->anagrpid, state, &chgcnt, &sf);
		if (ret == -EIO && NVME_SCT(sf) == 0 && NVME_SC(sf) == 0x09)
			ret = -EOPNOTSUPP; /* Invalid Log Page: no ANA reporting */
	}
	pthread_mutex_unlock(&d->open_lock);
	return ret;
}

void fx_nvmf_dev_close_io(struct fx_nvmf_dev *d, void *q, const struct fx_nvmf_io_conn *res)
{
	d->tr->close(q);
	release_qid(d, res->qid, res->epoch);
}

/* ---------------------------------------------------------- wait policy */

int fx_nvmf_waits_init(struct fx_nvmf_waits *w, uint32_t nslots)
{
	memset(w, 0, sizeof(*w));
	w->queued_at = calloc(nslots, sizeof(*w->queued_at));
	w->fails_at = calloc(nslots, sizeof(*w->fails_at));
	if (!w->queued_at || !w->fails_at) {
		fx_nvmf_waits_fini(w);
		return -ENOMEM;
	}
	return 0;
}

void fx_nvmf_waits_fini(struct fx_nvmf_waits *w)
{
	free(w->queued_at);
	free(w->fails_at);
	w->queued_at = NULL;
	w->fails_at = NULL;
}

void fx_nvmf_waits_stamp(struct fx_nvmf_waits *w, uint32_t ri, int64_t now)
{
	w->queued_at[ri] = now;
	w->fails_at[ri] = w->cx_fails;
}

int fx_nvmf_waits_check(struct fx_nvmf_waits *w, const struct fx_nvmf_dev *d, uint32_t ri, int err,
			int64_t now)
{
	if (!w->disc_at) {
		w->disc_at = now;
		w->disc_fails = w->cx_fails;
	}
	int64_t since = w->queued_at[ri] > w->disc_at ? w->queued_at[ri] : w->disc_at;
	/* attempts counted from the later of the two (wrap-safe) */
	uint32_t base = w->fails_at[ri] - w->disc_fails < (1u << 31) ? w->fails_at[ri]
								     : w->disc_fails;
	if (w->cx_fails - base >= (uint32_t)d->max_reconnects)
		return err;
	if (now - since >= d->io_timeout_ms)
		return -ETIMEDOUT;
	return 0;
}

/* ------------------------------------------------------------ connector */

static void *cx_main(void *arg)
{
	struct fx_nvmf_connector *x = arg;
	struct fx_nvmf_io_conn res;

	fx_nvmf_set_cancel_fd(x->cancel_fd);
	pthread_mutex_lock(&x->lock);
	for (;;) {
		while (!x->stop && x->state != FX_CX_BUSY)
			pthread_cond_wait(&x->cond, &x->lock);
		if (x->stop)
			break;
		pthread_mutex_unlock(&x->lock);
		fx_nvmf_dev_connect_io(x->dev, &x->stop, x->q, &res);
		pthread_mutex_lock(&x->lock);
		x->res = res;
		x->state = FX_CX_DONE;
		uint64_t one = 1;
		if (write(x->wake_fd, &one, sizeof(one)) < 0 ||
		    (x->notify_fd >= 0 && write(x->notify_fd, &one, sizeof(one)) < 0)) {
			/* only a full counter fails, and both are read on reap */
		}
	}
	pthread_mutex_unlock(&x->lock);
	return NULL;
}

int fx_nvmf_cx_init(struct fx_nvmf_connector *x, struct fx_nvmf_dev *d, int notify_fd)
{
	memset(x, 0, sizeof(*x));
	x->dev = d;
	x->notify_fd = notify_fd;
	x->cancel_fd = -1;
	x->q = calloc(1, d->tr->queue_size);
	x->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (x->wake_fd >= 0)
		x->cancel_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (!x->q || x->wake_fd < 0 || x->cancel_fd < 0) {
		int err = !x->q ? -ENOMEM : -errno;
		free(x->q);
		if (x->wake_fd >= 0)
			close(x->wake_fd);
		x->q = NULL;
		x->wake_fd = -1;
		x->cancel_fd = -1;
		return err;
	}
	pthread_mutex_init(&x->lock, NULL);
	pthread_cond_init(&x->cond, NULL);
	return 0;
}

int fx_nvmf_cx_request(struct fx_nvmf_connector *x, unsigned conn)
{
	int ret;

	if (!x->started) {
		ret = pthread_create(&x->thread, NULL, cx_main, x);
		if (ret)
			return -ret;
		x->started = 1;
	}
	pthread_mutex_lock(&x->lock);
	ret = x->state == FX_CX_IDLE ? 0 : -EBUSY;
	if (!ret) {
		x->conn = conn;
		x->state = FX_CX_BUSY;
		pthread_cond_signal(&x->cond);
	}
	pthread_mutex_unlock(&x->lock);
	return ret;
}

int fx_nvmf_cx_collect(struct fx_nvmf_connector *x, unsigned *conn, struct fx_nvmf_io_conn *res,
		       void *q_out)
{
	uint64_t v;
	int done;

	if (read(x->wake_fd, &v, sizeof(v)) < 0) {
		/* EAGAIN: nothing new, or read by an earlier pass */
	}
	pthread_mutex_lock(&x->lock);
	done = x->state == FX_CX_DONE;
	if (done) {
		*conn = x->conn;
		*res = x->res;
		if (res->err == 0)
			memcpy(q_out, x->q, x->dev->tr->queue_size);
		x->state = FX_CX_IDLE;
	}
	pthread_mutex_unlock(&x->lock);
	return done;
}

void fx_nvmf_cx_stop(struct fx_nvmf_connector *x)
{
	if (!x->q)
		return;
	if (x->started) {
		pthread_mutex_lock(&x->lock);
		__atomic_store_n(&x->stop, 1, __ATOMIC_RELEASE);
		pthread_cond_signal(&x->cond);
		pthread_mutex_unlock(&x->lock);
		uint64_t one = 1;
		if (write(x->cancel_fd, &one, sizeof(one)) < 0) {
			/* the join still ends, at the attempt's own timeout */
		}
		pthread_join(x->thread, NULL);
		x->started = 0;
	}
	if (x->state == FX_CX_DONE && x->res.err == 0)
		fx_nvmf_dev_close_io(x->dev, x->q, &x->res);
	x->state = FX_CX_IDLE;
}

void fx_nvmf_cx_fini(struct fx_nvmf_connector *x)
{
	if (!x->q)
		return;
	fx_nvmf_cx_stop(x);
	close(x->wake_fd);
	close(x->cancel_fd);
	pthread_cond_destroy(&x->cond);
	pthread_mutex_destroy(&x->lock);
	free(x->q);
	x->q = NULL;
}
