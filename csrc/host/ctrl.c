/*
 * The NVMe-oF controller on any transport (see host/ctrl.h): the admin
 * queue is connected, driven and closed only through the transport's table,
 * so this file knows nothing of sockets, PDUs or queue pairs.
 *
 * Admin commands are serialised by the controller's mutex (keep alive
 * against everyone else), so the admin queue has one command in flight and
 * a transport can run it synchronously.
 */
#ifndef _GNU_SOURCE /* tests/c/Makefile passes -D_GNU_SOURCE */
#define _GNU_SOURCE
#endif
#include "host/ctrl.h"

#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

/* Admin queue depth as the Linux host uses it (32 entries, 0's based). */
#define ADMIN_SQSIZE 31
#define IO_SQSIZE_DEFAULT 127
/* Close must not hang on a dead target for a full command timeout. */
#define CLOSE_TIMEOUT_MS 2000
#define KA_TICK_MS 20

static int admin_exec(struct fx_nvmf_ctrl *c, struct nvme_sqe *sqe, void *data, uint32_t len,
		      int write, struct nvme_cqe *cqe)
{
	if (__atomic_load_n(&c->ka_failed, __ATOMIC_ACQUIRE))
		return -ECONNRESET;
	return c->tr->exec(c->aq, sqe, data, len, write, cqe, 0);
}

static int identify(struct fx_nvmf_ctrl *c, uint8_t cns, uint32_t nsid, void *buf, uint16_t *status)
{
	struct nvme_sqe sqe;
	struct nvme_cqe cqe;

	memset(&sqe, 0, sizeof(sqe));
	sqe.opcode = NVME_ADMIN_IDENTIFY;
	sqe.nsid = nsid;
	sqe.cdw10 = cns;
	int r = admin_exec(c, &sqe, buf, 4096, 0, &cqe);

	if (r == -EIO && status)
		*status = fx_nvmf_status_field(&cqe);
	return r;
}

int fx_nvmf_ctrl_get_log(struct fx_nvmf_ctrl *c, uint8_t lid, uint64_t off, void *buf, uint32_t len,
			 uint16_t *status)
{
	return fx_nvmf_ctrl_get_log_sp(c, lid, 0, off, buf, len, status);
}

int fx_nvmf_ctrl_get_log_sp(struct fx_nvmf_ctrl *c, uint8_t lid, uint8_t lsp, uint64_t off,
			    void *buf, uint32_t len, uint16_t *status)
{
	uint8_t *p = buf;
	/* One command may move at most MDTS; keep chunks dword multiples. */
	uint32_t chunk = c->mdts_bytes ? c->mdts_bytes : len;

	while (len) {
		uint32_t n = len < chunk ? len : chunk;
		uint32_t numd = n / 4 - 1; /* 0's based dwords */
		struct nvme_sqe sqe;
		struct nvme_cqe cqe;

		memset(&sqe, 0, sizeof(sqe));
		sqe.opcode = NVME_ADMIN_GET_LOG_PAGE;
		sqe.nsid = 0;
		sqe.cdw10 = lid | (uint32_t)(lsp & 0x1f) << 8 | (numd & 0xffff) << 16;
		sqe.cdw11 = numd >> 16;
		sqe.cdw12 = (uint32_t)off;
		sqe.cdw13 = (uint32_t)(off >> 32);
		int r = admin_exec(c, &sqe, p, n, 0, &cqe);

		if (r) {
			if (r == -EIO && status)
				*status = fx_nvmf_status_field(&cqe);
			return r;
		}
		p += n;
		off += n;
		len -= n;
	}
	return 0;
}

static void *ka_main(void *arg)
{
	struct fx_nvmf_ctrl *c = arg;
	int interval = (int)(c->params.kato_ms / 3);
	int64_t next;

	if (interval < KA_TICK_MS)
		interval = KA_TICK_MS;
	next = fx_nvmf_now_ms() + interval;
	while (!__atomic_load_n(&c->ka_stop, __ATOMIC_ACQUIRE)) {
		int64_t left = next - fx_nvmf_now_ms();

		if (left > 0) {
			fx_nvmf_sleep_ms(left < KA_TICK_MS ? (int)left : KA_TICK_MS);
			continue;
		}
		struct nvme_sqe sqe;
		struct nvme_cqe cqe;

		memset(&sqe, 0, sizeof(sqe));
		sqe.opcode = NVME_ADMIN_KEEP_ALIVE;
		pthread_mutex_lock(&c->lock);
		int r = c->tr->exec(c->aq, &sqe, NULL, 0, 0, &cqe, 0);

		if (r) {
			/* The controller is gone (or going): say so to
			 * every later admin call, and unblock none of them
			 * into a stream that is out of step. */
			__atomic_store_n(&c->ka_failed, 1, __ATOMIC_RELEASE);
			c->tr->shutdown(c->aq);
		}
		pthread_mutex_unlock(&c->lock);
		if (r) {
			fx_nvmf_log(
				"cntlid %u: keep alive failed (%s, status 0x%x); controller lost",
				c->cntlid, strerror(-r),
				r == -EIO ? fx_nvmf_status_field(&cqe) : 0);
			break;
		}
		next = fx_nvmf_now_ms() + interval;
	}
	return NULL;
}

static int ctrl_enable(struct fx_nvmf_ctrl *c)
{
	/* MPS = MPSMIN; 64-byte SQEs and 16-byte CQEs are what NVMe-oF
	 * requires (Linux's target fails the controller otherwise). */
	uint32_t mps = (uint32_t)((c->cap >> 48) & 0xf);
	uint64_t cc = NVME_CC_CSS_NVM | (mps << 7) | NVME_CC_AMS_RR | NVME_CC_IOSQES |
		      NVME_CC_IOCQES | NVME_CC_ENABLE;
	int r = fx_nvmf_q_prop_set(c->tr, c->aq, NVME_REG_CC, 0, cc, 0);

	if (r)
		return r;

	/* CAP.TO is the worst case in 500 ms units. */
	int64_t to = (int64_t)NVME_CAP_TIMEOUT(c->cap) * 500;
	int64_t deadline = fx_nvmf_now_ms() + (to < 500 ? 500 : to);

	for (;;) {
		uint64_t csts;

		r = fx_nvmf_q_prop_get(c->tr, c->aq, NVME_REG_CSTS, 0, &csts, 0);
		if (r)
			return r;
		if (csts & NVME_CSTS_CFS) {
			fx_nvmf_log("controller fatal status after CC.EN=1 (CC 0x%llx CSTS 0x%llx)",
				    (unsigned long long)cc, (unsigned long long)csts);
			return -EIO;
		}
		if (csts & NVME_CSTS_RDY)
			return 0;
		if (fx_nvmf_now_ms() >= deadline)
			return -ETIMEDOUT;
		/* CAP.TO can be minutes: a cancelled open must not wait it out. */
		if (fx_nvmf_sleep_ms(5) < 0)
			return -ECANCELED;
	}
}

static void parse_idctrl(struct fx_nvmf_ctrl *c)
{
	const uint8_t *id = c->idctrl;
	uint8_t mdts = id[NVME_IDC_MDTS];

	if (mdts == 0) {
		c->mdts_bytes = 0;
	} else {
		/* MDTS is a power of two in units of CAP.MPSMIN pages (4 KiB
		 * << 0..15); clamp what no uint32 length could use anyway,
		 * before the shift could leave 64 bits. */
		unsigned shift = 12 + (unsigned)((c->cap >> 48) & 0xf) + mdts;

		c->mdts_bytes = shift >= 31 ? 0x80000000u : (uint32_t)1 << shift;
	}
	/* IOCCSZ is in 16-byte units: a u32 times 16 can leave 32 bits. */
	uint64_t ioccsz = (uint64_t)fx_nvmf_le32(id + NVME_IDC_IOCCSZ) * 16;

	c->ioccsz_bytes = ioccsz > UINT32_MAX ? UINT32_MAX : (uint32_t)ioccsz;
	c->icdoff = fx_nvmf_le16(id + NVME_IDC_ICDOFF);
	c->nn = fx_nvmf_le32(id + NVME_IDC_NN);
}

int fx_nvmf_ctrl_open(const struct fx_nvmf_transport *tr, const struct fx_nvmf_addr *a,
		      const struct fx_nvmf_params *p, uint16_t want_io_queues,
		      struct fx_nvmf_ctrl **out, uint16_t *status)
{
	struct fx_nvmf_ctrl *c;
	int r;

	*out = NULL;
	if (status)
		*status = 0;
	fx_nvmf_auth_error_clear(); /* a reason from an earlier open is not this one's */
	c = calloc(1, sizeof(*c));
	if (!c)
		return -ENOMEM;
	c->addr = *a;
	c->params = *p;
	c->tr = tr;
	/* The controller's own storage for the admin queue (see ctrl.h);
	 * from here on it is only the opaque queue tr drives. */
	c->aq = calloc(1, tr->queue_size);
	if (!c->aq) {
		free(c);
		return -ENOMEM;
	}
	r = pthread_mutex_init(&c->lock, NULL);
	if (r) {
		free(c->aq);
		free(c);
		return -r;
	}

	r = tr->connect(a, p, 0, ADMIN_SQSIZE, 0xFFFF, c->aq, &c->cntlid, status);
	if (r)
		goto fail_connect;

	r = fx_nvmf_q_prop_get(c->tr, c->aq, NVME_REG_CAP, 1, &c->cap, 0);
	if (!r) {
		uint64_t vs;

		r = fx_nvmf_q_prop_get(c->tr, c->aq, NVME_REG_VS, 0, &vs, 0);
		c->vs = (uint32_t)vs;
	}
	if (!r)
		r = ctrl_enable(c);
	if (!r)
		r = identify(c, NVME_ID_CNS_CTRL, 0, c->idctrl, status);
	if (r)
		goto fail;
	parse_idctrl(c);

	uint32_t sq = NVME_CAP_MQES(c->cap);
	uint16_t maxcmd = fx_nvmf_le16(c->idctrl + NVME_IDC_MAXCMD);

	if (sq > IO_SQSIZE_DEFAULT)
		sq = IO_SQSIZE_DEFAULT;
	if (maxcmd && sq > (uint32_t)maxcmd - 1)
		sq = (uint32_t)maxcmd - 1;
	c->io_sqsize = (uint16_t)sq;

	if (want_io_queues) {
		struct nvme_sqe sqe;
		struct nvme_cqe cqe;
		uint32_t n = want_io_queues - 1u; /* 0's based */

		memset(&sqe, 0, sizeof(sqe));
		sqe.opcode = NVME_ADMIN_SET_FEATURES;
		sqe.cdw10 = NVME_FEAT_NUM_QUEUES;
		sqe.cdw11 = n | n << 16;
		r = admin_exec(c, &sqe, NULL, 0, 0, &cqe);
		if (r) {
			if (r == -EIO && status)
				*status = fx_nvmf_status_field(&cqe);
			goto fail;
		}
		uint32_t nsqa = cqe.dw0 & 0xffff, ncqa = cqe.dw0 >> 16;
		uint32_t got = (nsqa < ncqa ? nsqa : ncqa) + 1;

		c->io_queues = (uint16_t)(got < want_io_queues ? got : want_io_queues);
	}

	if (p->kato_ms) {
		r = pthread_create(&c->ka_thread, NULL, ka_main, c);
		if (r) {
			r = -r;
			goto fail;
		}
		c->ka_running = 1;
	}
	*out = c;
	return 0;
fail:
	tr->close(c->aq);
fail_connect:
	pthread_mutex_destroy(&c->lock);
	fx_nvmf_params_wipe(&c->params);
	free(c->aq);
	free(c);
	return r;
}

/* Walk a Namespace Identification Descriptor list (4096 bytes from the
 * controller: every length is checked against the page's end, and a
 * descriptor of the wrong length for its type is skipped). */
static void ns_desc_list(const uint8_t *page, struct fx_nvmf_ns_ids *ids)
{
	size_t off = 0;

	while (off + sizeof(struct nvme_ns_id_desc) <= 4096) {
		const struct nvme_ns_id_desc *h = (const void *)(page + off);
		size_t body = off + sizeof(*h);

		if (h->nidt == 0 || h->nidl == 0 || body + h->nidl > 4096)
			return;
		if (h->nidt == NVME_NIDT_EUI64 && h->nidl == 8)
			memcpy(ids->eui64, page + body, 8);
		else if (h->nidt == NVME_NIDT_NGUID && h->nidl == 16)
			memcpy(ids->nguid, page + body, 16);
		else if (h->nidt == NVME_NIDT_UUID && h->nidl == 16)
			memcpy(ids->uuid, page + body, 16);
		off = body + h->nidl;
	}
}

int fx_nvmf_ctrl_ns_info(struct fx_nvmf_ctrl *c, uint32_t nsid, uint64_t *nsze, uint32_t *lba_size)
{
	return fx_nvmf_ctrl_ns_info_ids(c, nsid, nsze, lba_size, NULL);
}

int fx_nvmf_ctrl_ns_info_ids(struct fx_nvmf_ctrl *c, uint32_t nsid, uint64_t *nsze,
			     uint32_t *lba_size, struct fx_nvmf_ns_ids *ids)
{
	uint8_t *id;
	uint16_t sf = 0;
	int r;

	if (ids)
		memset(ids, 0, sizeof(*ids));
	if (nsid == 0 || nsid == 0xffffffffu)
		return -EINVAL;
	id = malloc(4096);
	if (!id)
		return -ENOMEM;
	pthread_mutex_lock(&c->lock);
	r = identify(c, NVME_ID_CNS_NS, nsid, id, &sf);
	pthread_mutex_unlock(&c->lock);
	if (r == -EIO && NVME_SCT(sf) == 0 && NVME_SC(sf) == 0x0b) /* Invalid Namespace */
		r = -ENODEV;
	if (r)
		goto out;

	/* An inactive nsid identifies as all zeroes. */
	uint64_t size = fx_nvmf_le64(id + NVME_IDNS_NSZE);
	unsigned fmt = id[NVME_IDNS_FLBAS] & 0xf;
	unsigned lbads;

	if (size == 0) {
		r = -ENODEV;
		goto out;
	}
	lbads = id[NVME_IDNS_LBAF + 4 * fmt + 2];
	if (fmt > id[NVME_IDNS_NLBAF] || lbads < 9 || lbads > 31) {
		fx_nvmf_log("nsid %u: unusable LBA format %u (NLBAF %u, LBADS %u)", nsid, fmt,
			    id[NVME_IDNS_NLBAF], lbads);
		r = -EPROTO;
		goto out;
	}
	/* The byte size must fit the 64 bits everything above counts in. */
	if (size > UINT64_MAX >> lbads) {
		fx_nvmf_log("nsid %u: unusable size: %llu blocks of %u bytes overflow 64 bits",
			    nsid, (unsigned long long)size, 1u << lbads);
		r = -EPROTO;
		goto out;
	}
	*nsze = size;
	*lba_size = 1u << lbads;
	if (ids) {
		memcpy(ids->nguid, id + NVME_IDNS_NGUID, 16);
		memcpy(ids->eui64, id + NVME_IDNS_EUI64, 8);
		ids->anagrpid = fx_nvmf_le32(id + NVME_IDNS_ANAGRPID);
		static const uint8_t zero[16];
		/* Only when Identify gave neither (Linux's target reports a
		 * UUID alone by default): CNS 03h is optional before NVMe 1.3,
		 * and a controller's refusal (a status) costs only the UUID.
		 * Any other failure (a timeout, a lost connection) fails the
		 * whole call: zeroes stored for a namespace that has a UUID
		 * would later read as "another namespace". */
		if (!memcmp(ids->nguid, zero, 16) && !memcmp(ids->eui64, zero, 8)) {
			memset(id, 0, 4096);
			sf = 0;
			pthread_mutex_lock(&c->lock);
			int r2 = identify(c, NVME_ID_CNS_NS_DESC_LIST, nsid, id, &sf);
			pthread_mutex_unlock(&c->lock);
			if (r2 == 0)
				ns_desc_list(id, ids);
			else if (!(r2 == -EIO && sf != 0))
				r = r2;
		}
	}
out:
	free(id);
	return r;
}

void fx_nvmf_ctrl_close(struct fx_nvmf_ctrl *c)
{
	if (!c)
		return;
	if (c->ka_running) {
		__atomic_store_n(&c->ka_stop, 1, __ATOMIC_RELEASE);
		pthread_join(c->ka_thread, NULL);
		c->ka_running = 0;
	}
	pthread_mutex_lock(&c->lock);
	/* An open controller's admin queue is connected until here; after a
	 * keep-alive failure it is shut down and talking to it is pointless. */
	if (!__atomic_load_n(&c->ka_failed, __ATOMIC_ACQUIRE)) {
		uint64_t cc, csts;

		/* Normal shutdown so the target flushes and frees the
		 * controller now rather than at keep-alive expiry. */
		int r = fx_nvmf_q_prop_get(c->tr, c->aq, NVME_REG_CC, 0, &cc, CLOSE_TIMEOUT_MS);

		if (!r)
			r = fx_nvmf_q_prop_set(c->tr, c->aq, NVME_REG_CC, 0,
					       (cc & ~(3ULL << 14)) | NVME_CC_SHN_NORMAL,
					       CLOSE_TIMEOUT_MS);
		int64_t deadline = fx_nvmf_now_ms() + CLOSE_TIMEOUT_MS;

		while (!r) {
			r = fx_nvmf_q_prop_get(c->tr, c->aq, NVME_REG_CSTS, 0, &csts,
					       CLOSE_TIMEOUT_MS);
			if (r || (csts & (3u << 2)) == NVME_CSTS_SHST_CMPLT ||
			    fx_nvmf_now_ms() >= deadline)
				break;
			fx_nvmf_sleep_ms(5);
		}
	}
	c->tr->close(c->aq);
	pthread_mutex_unlock(&c->lock);
	pthread_mutex_destroy(&c->lock);
	fx_nvmf_params_wipe(&c->params);
	free(c->aq);
	free(c);
}
