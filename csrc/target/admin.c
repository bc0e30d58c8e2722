/*
 * Fabrics and admin commands of the target: Connect, Property Get/Set (the
 * controller registers CAP/VS/CC/CSTS), AUTH_Send/AUTH_Receive (auth.c),
 * Identify, Get Log Page (discovery
 * log), Set/Get Features, Keep Alive, Async Event Request.  Executors fill a
 * tgt_req (result dwords, controller-to-host data) and return the CQE status
 * field; conn.c moves the bytes.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>

#include "tgt.h"

#define VS_1_3 0x00010300u
#define CAP_TO_500MS 0x0Fu /* 7.5 s: we are ready at once, this only bounds the host's wait */

static uint64_t cap_value(void)
{
	return (uint64_t)FX_TGT_MQES /* MQES, 0's based */
	       | (1ull << 16)        /* CQR: queues are contiguous (fabrics) */
	       | ((uint64_t)CAP_TO_500MS << 24) | (1ull << 37) /* CSS: NVM command set */
		/* MPSMIN = MPSMAX = 0: 4 KiB pages, DSTRD 0 */;
}

static void put16(uint8_t *p, uint16_t v)
{
	memcpy(p, &v, 2);
}

static void put32(uint8_t *p, uint32_t v)
{
	memcpy(p, &v, 4);
}

static void put64(uint8_t *p, uint64_t v)
{
	memcpy(p, &v, 8);
}

/* ASCII field padded with spaces, as Identify's SN/MN/FR are. */
static void put_str(uint8_t *p, size_t n, const char *s)
{
	size_t l = strlen(s);

	memset(p, ' ', n);
	memcpy(p, s, l < n ? l : n);
}

/* ------------------------------------------------------------- Connect */

static uint16_t invalid_param(struct tgt_req *r, int in_sqe, uint32_t off)
{
	/* Connect Invalid Parameters: dw0 IPO (15:0) and IATTR bit 16
	 * (1: the offset is into the SQE, 0: into the data). */
	r->dw0 = (in_sqe ? 1u << 16 : 0) | (off & 0xFFFF);
	return TGT_SF_DNR(1, NVME_SC_CONNECT_INVALID_PARAM);
}

static uint16_t do_connect(struct tgt_conn *c, struct tgt_req *r)
{
	struct fx_target *t = c->t;
	const struct nvmf_connect_cmd *cmd = (const struct nvmf_connect_cmd *)r->sqe;
	struct nvmf_connect_data d;
	char hp[NVMF_NQN_SIZE], sp[NVMF_NQN_SIZE]; /* printable copies for logs */
	int discovery;
	uint16_t sf;

	if (c->state != TGT_CONN_WAIT_CONNECT)
		return TGT_SF_DNR(0, TGT_SC_CMD_SEQ_ERROR);
	if (cmd->recfmt != 0)
		return TGT_SF_DNR(1, NVME_SC_CONNECT_INCOMPATIBLE_FORMAT);
	if (!r->data || r->data_len < sizeof(d))
		return TGT_SF_DNR(0, TGT_SC_SGL_INVALID_DATA);
	memcpy(&d, r->data, sizeof(d));
	if (!memchr(d.subsysnqn, 0, sizeof(d.subsysnqn)))
		return invalid_param(r, 0, offsetof(struct nvmf_connect_data, subsysnqn));
	if (!memchr(d.hostnqn, 0, sizeof(d.hostnqn)) || !d.hostnqn[0])
		return invalid_param(r, 0, offsetof(struct nvmf_connect_data, hostnqn));
	tgt_printable(hp, sizeof(hp), d.hostnqn);
	tgt_printable(sp, sizeof(sp), d.subsysnqn);
	discovery = strcmp(d.subsysnqn, NVMF_DISCOVERY_NQN) == 0;
	if (!discovery && strcmp(d.subsysnqn, t->subnqn) != 0) {
		tgt_log(t, "%s: host %s asked for unknown subsystem %s", c->peer, hp, sp);
		return invalid_param(r, 0, offsetof(struct nvmf_connect_data, subsysnqn));
	}
	if (cmd->sqsize == 0 || cmd->sqsize > FX_TGT_MQES)
		return invalid_param(r, 1, offsetof(struct nvmf_connect_cmd, sqsize));
	/* The TLS PSK proved one host and subsystem: Connect may not name others. */
	if ((c->tls || c->ktls) &&
	    (strcmp(d.hostnqn, c->tls_hostnqn) != 0 || strcmp(d.subsysnqn, c->tls_subnqn) != 0)) {
		tgt_log(t,
			"%s: host %s connects to %s over TLS keyed for another host or subsystem",
			c->peer, hp, sp);
		return TGT_SF_DNR(1, NVME_SC_CONNECT_INVALID_HOST);
	}
	if (!discovery && !tgt_host_allowed(t, d.hostnqn)) {
		tgt_log(t, "%s: host %s is not allowed to connect to %s", c->peer, hp, t->subnqn);
		return TGT_SF_DNR(1, NVME_SC_CONNECT_INVALID_HOST);
	}
	if (cmd->qid == 0) {
		struct tgt_ctrl *ctrl;

		/* Dynamic controller model: the host asks for "any" (FFFFh,
		 * or FFFEh meaning the same to a dynamic subsystem). */
		if (d.cntlid != 0xFFFF && d.cntlid != 0xFFFE)
			return invalid_param(r, 0, offsetof(struct nvmf_connect_data, cntlid));
		/* An NVM controller's admin queue is woken for its events
		 * (ana.c): the eventfd exists before the controller can be
		 * found by an ANA change. */
		if (!discovery && c->evfd < 0) {
			c->evfd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
			if (c->evfd < 0)
				return TGT_SF(0, NVME_SC_INTERNAL);
		}
		ctrl = tgt_ctrl_new(c, discovery, d.hostnqn, d.hostid, cmd->kato);
		if (!ctrl)
			return TGT_SF(1, NVME_SC_CONNECT_CTRL_BUSY);
		r->dw0 = ctrl->cntlid;
		tgt_log(t, "%s: host %s connected to %s: controller %u, KATO %u ms, %s%s%s%s",
			c->peer, hp, sp, ctrl->cntlid, cmd->kato,
			c->hdgst ? "header digest" : "no header digest",
			c->ddgst ? ", data digest" : "", c->tls || c->ktls ? ", TLS records " : "",
			c->tls || c->ktls ? tgt_tls_layer(c) : "");
	} else {
		uint32_t ipo = 0;

		if (discovery)
			return invalid_param(r, 1, offsetof(struct nvmf_connect_cmd, qid));
		sf = tgt_ctrl_attach_io(c, d.cntlid, d.hostnqn, cmd->qid, &ipo);
		if (sf) {
			r->dw0 = ipo;
			return sf;
		}
		r->dw0 = d.cntlid;
		if (t->verbose)
			tgt_log(t, "%s: I/O queue %u of controller %u (sqsize %u)", c->peer,
				cmd->qid, d.cntlid, cmd->sqsize + 1u);
	}
	if (!discovery) {
		const struct tgt_dhchap_host *h = tgt_auth_host(t, d.hostnqn);

		/* A host with a secret authenticates on this queue before
		 * anything else: the response says so (AUTHREQ.ATR). */
		if (h) {
			if (tgt_auth_queue_start(c, h) < 0) {
				/* (the controller or queue goes with the connection) */
				tgt_log_must(t, c->peer_key, "internal error: out of memory",
					     "%s: out of memory for authentication", c->peer);
				r->close_after = 1;
				return TGT_SF(0, NVME_SC_INTERNAL);
			}
			r->dw0 |= FX_NVMF_CONNECT_ATR;
		}
	}
	c->sqsize = cmd->sqsize;
	c->sqhd = 1; /* the Connect itself was fetched */
	c->state = TGT_CONN_LIVE;
	return 0;
}

/* ----------------------------------------------------------- properties */

static uint16_t prop_get(struct tgt_conn *c, struct tgt_req *r)
{
	const struct nvmf_property_cmd *p = (const struct nvmf_property_cmd *)r->sqe;
	struct tgt_ctrl *ctrl = c->ctrl;
	int size8 = p->attrib & 1;
	uint64_t v;

	pthread_mutex_lock(&c->t->lock);
	switch (p->offset) {
	case NVME_REG_CAP:
		v = cap_value();
		break;
	case NVME_REG_CAP + 4:
		v = size8 ? ~0ull : cap_value() >> 32;
		break;
	case NVME_REG_VS:
		v = VS_1_3;
		break;
	case NVME_REG_CC:
		v = ctrl->cc;
		break;
	case NVME_REG_CSTS:
		v = ctrl->csts;
		break;
	default:
		v = ~0ull;
		break;
	}
	pthread_mutex_unlock(&c->t->lock);
	/* 8-byte access only to CAP; the rest are 4-byte registers. */
	if (v == ~0ull || (size8 && p->offset != NVME_REG_CAP))
		return TGT_SF_DNR(0, NVME_SC_INVALID_FIELD);
	r->dw0 = (uint32_t)v;
	r->dw1 = size8 ? (uint32_t)(v >> 32) : 0;
	return 0;
}

static uint16_t prop_set(struct tgt_conn *c, struct tgt_req *r)
{
	const struct nvmf_property_cmd *p = (const struct nvmf_property_cmd *)r->sqe;
	struct fx_target *t = c->t;
	struct tgt_ctrl *ctrl = c->ctrl;
	uint32_t v = (uint32_t)p->value, old;
	enum tgt_ctrl_state before;

	if (p->offset != NVME_REG_CC || (p->attrib & 1))
		return TGT_SF_DNR(0, NVME_SC_INVALID_FIELD);
	/* Shutdown: make written data durable before we report it done. */
	if (((v >> 14) & 3) && !ctrl->discovery)
		tgt_ctrl_flush_all(t);
	pthread_mutex_lock(&t->lock);
	old = ctrl->cc;
	before = ctrl->state;
	ctrl->cc = v;
	if ((v & NVME_CC_ENABLE) && !(old & NVME_CC_ENABLE)) {
		ctrl->csts = NVME_CSTS_RDY;
		ctrl->state = TGT_CTRL_READY;
	} else if (!(v & NVME_CC_ENABLE) && (old & NVME_CC_ENABLE)) {
		/* Controller reset: I/O queues do not survive it, nor do the
		 * held Async Event Requests (a reset aborts them: their CIDs
		 * may be reused) or the event state and configuration. */
		ctrl->csts = 0;
		ctrl->state = TGT_CTRL_DISABLED;
		ctrl->io_queues = 0;
		c->aers = 0;
		ctrl->ana_aen_pending = 0;
		ctrl->ana_aen_masked = 0;
		ctrl->aec = NVME_AEN_CFG_ANA_CHANGE;
		tgt_ctrl_kill_io_locked(t, ctrl);
		/* Reset is done (this answer, then CSTS.RDY = 0) only when
		 * no write of the old queues can still reach the media. */
		tgt_ctrl_wait_drained_locked(t, ctrl);
	}
	if ((v >> 14) & 3) {
		ctrl->csts = (ctrl->csts & ~(3u << 2)) | NVME_CSTS_SHST_CMPLT;
		ctrl->state = TGT_CTRL_SHUTDOWN;
	} else {
		ctrl->csts &= ~(3u << 2);
	}
	enum tgt_ctrl_state after = ctrl->state;

	pthread_mutex_unlock(&t->lock);
	/* (logged outside the lock: a slow stderr must not stall other queues) */
	if (t->verbose || before != after)
		tgt_log(t, "controller %u: CC 0x%08x -> %s", ctrl->cntlid, v,
			tgt_ctrl_state_str(after));
	return 0;
}

/* ------------------------------------------------------------- Identify */

static void id_ctrl(struct tgt_conn *c, uint8_t *id)
{
	struct fx_target *t = c->t;
	struct tgt_ctrl *ctrl = c->ctrl;
	int disc = ctrl->discovery;

	memset(id, 0, 4096);
	/* VID/SSVID 0: no PCI vendor behind a software target */
	memcpy(id + 4, t->serial, 20);                                       /* SN */
	put_str(id + 24, 40, disc ? "fx100io discovery" : "fx100io target"); /* MN */
	put_str(id + 64, 8, "0.1.0");                                        /* FR */
	id[72] = 6;                                                          /* RAB */
	/* CMIC: several ports (when we have them), several controllers, ANA
	 * reporting */
	id[76] = disc ? 0 : (uint8_t)(0x02 | 0x08 | (t->n_ports > 1 ? 0x01 : 0));
	if (!disc)
		put32(id + 92, NVME_AEN_CFG_ANA_CHANGE); /* OAES: ANA change notices */
	id[NVME_IDC_MDTS] = FX_TGT_MDTS;
	put16(id + NVME_IDC_CNTLID, ctrl->cntlid);
	put32(id + NVME_IDC_VER, VS_1_3);
	id[111] = disc ? 2 : 1; /* CNTRLTYPE: discovery / I/O */
	id[258] = 3;            /* ACL */
	id[259] = FX_TGT_AERL;  /* AERL */
	id[261] = 1u << 2;      /* LPA: extended Get Log Page (LPO, NUMDU) */
	put16(id + NVME_IDC_KAS, FX_TGT_KAS);
	id[512] = 0x66; /* SQES: 64-byte entries */
	id[513] = 0x44; /* CQES: 16-byte entries */
	put16(id + NVME_IDC_MAXCMD, FX_TGT_MQES + 1);
	put32(id + NVME_IDC_NN, disc ? 0 : t->n_ns);
	if (!disc) {
		id[342] = FX_TGT_ANATT; /* ANATT (s), byte 342 */
		/* ANACAP: every state reported (optimized, non-optimized,
		 * inaccessible, persistent loss, change), and a namespace's
		 * ANAGRPID never changes while it is attached */
		id[343] = 0x1F | 0x40;              /* ANACAP, byte 343 */
		put32(id + 344, FX_TGT_ANA_GROUPS); /* ANAGRPMAX */
		put32(id + 348, FX_TGT_ANA_GROUPS); /* NANAGRPID */
		put32(id + 540, t->n_ns);           /* MNAN (= NN) */
		put16(id + 520, 1u << 3);           /* ONCS: Write Zeroes */
		id[525] = 1;                        /* VWC: we cache (page cache); Flush syncs */
	}
	/* SGLS: SGLs supported (bit 0) and the address field as an offset
	 * into the capsule (bit 20), which is what lets hosts send
	 * in-capsule data. */
	put32(id + NVME_IDC_SGLS, (1u << 0) | (1u << 20));
	snprintf((char *)id + NVME_IDC_SUBNQN, NVMF_NQN_SIZE, "%s",
		 disc ? NVMF_DISCOVERY_NQN : t->subnqn);
	put32(id + NVME_IDC_IOCCSZ, (64 + FX_TGT_ICD_MAX) / 16);
	put32(id + NVME_IDC_IORCSZ, 16 / 16);
	put16(id + NVME_IDC_ICDOFF, 0);
	id[1802] = 0; /* FCATT: dynamic controller model */
	id[NVME_IDC_MSDBD] = 1;
	put16(id + 1804, 1u << 0); /* OFCS: Disconnect supported */
}

static void id_ns(struct fx_target *t, const struct tgt_ns *ns, uint8_t *id)
{
	memset(id, 0, 4096);
	put64(id + NVME_IDNS_NSZE, ns->nsze);
	put64(id + NVME_IDNS_NCAP, ns->nsze);
	put64(id + 16, ns->nsze); /* NUSE */
	id[NVME_IDNS_NLBAF] = 0;  /* one LBA format */
	id[NVME_IDNS_FLBAS] = 0;
	id[30] = 1; /* NMIC: shared (several controllers, through several ports) */
	put32(id + 92, ns->anagrpid);                   /* ANAGRPID */
	memcpy(id + 104, ns->nguid, 16);                /* NGUID */
	id[NVME_IDNS_LBAF + 2] = (uint8_t)t->lba_shift; /* LBAF0: LBADS, no metadata */
}

static uint16_t identify(struct tgt_conn *c, struct tgt_req *r)
{
	struct fx_target *t = c->t;
	const struct nvme_sqe *sqe = r->sqe;
	uint8_t cns = (uint8_t)(sqe->cdw10 & 0xFF);
	uint8_t csi = (uint8_t)(sqe->cdw11 >> 24);
	int disc = c->ctrl->discovery;
	struct tgt_ns *ns;

	memset(r->out, 0, 4096);
	r->out_len = 4096;
	switch (cns) {
	case NVME_ID_CNS_CTRL:
		id_ctrl(c, r->out);
		return 0;
	case NVME_ID_CNS_NS:
		if (disc)
			break;
		if (sqe->nsid < 1 || sqe->nsid > t->n_ns)
			return TGT_SF_DNR(0, TGT_SC_INVALID_NS);
		id_ns(t, &t->ns[sqe->nsid - 1], r->out);
		return 0;
	case NVME_ID_CNS_NS_ACTIVE_LIST: {
		unsigned k = 0;

		if (disc)
			break;
		if (sqe->nsid >= 0xFFFFFFFEu)
			return TGT_SF_DNR(0, TGT_SC_INVALID_NS);
		for (uint32_t i = 1; i <= t->n_ns && k < 1024; i++)
			if (i > sqe->nsid)
				put32(r->out + 4 * k++, i);
		return 0;
	}
	case 0x03: /* Namespace Identification Descriptor list: NGUID, UUID */
		if (disc)
			break;
		if (sqe->nsid < 1 || sqe->nsid > t->n_ns)
			return TGT_SF_DNR(0, TGT_SC_INVALID_NS);
		ns = &t->ns[sqe->nsid - 1];
		r->out[0] = 2;  /* NIDT NGUID */
		r->out[1] = 16; /* NIDL */
		memcpy(r->out + 4, ns->nguid, 16);
		r->out[20] = 3; /* NIDT UUID */
		r->out[21] = 16;
		memcpy(r->out + 24, ns->uuid, 16);
		return 0;
	case 0x05: /* I/O command set specific namespace: nothing beyond NVM */
		if (disc || csi != 0)
			break;
		if (sqe->nsid < 1 || sqe->nsid > t->n_ns)
			return TGT_SF_DNR(0, TGT_SC_INVALID_NS);
		return 0;
	case 0x06: /* I/O command set specific controller (NVM): no extra limits */
		if (disc || csi != 0)
			break;
		return 0;
	default:
		break;
	}
	r->out_len = 0;
	return TGT_SF_DNR(0, NVME_SC_INVALID_FIELD);
}

/* ---------------------------------------------------------- log pages */

/* The entry of port pi: its own address, or (a wildcard listener) the one
 * the host reached us at. */
static void disc_entry(struct tgt_conn *c, uint8_t *e, uint8_t subtype, const char *nqn,
		       unsigned pi)
{
	struct nvmf_disc_log_entry *d = (struct nvmf_disc_log_entry *)e;
	const struct tgt_port *p = &c->t->ports[pi];
	int any = strcmp(p->addr, "0.0.0.0") == 0 || strcmp(p->addr, "::") == 0 || !p->addr[0];
	int fam = any ? c->local_family : p->family;

	memset(d, 0, sizeof(*d));
	d->trtype = NVMF_TRTYPE_TCP;
	d->adrfam = fam == AF_INET6 ? NVMF_ADRFAM_IPV6 : NVMF_ADRFAM_IPV4;
	d->subtype = subtype;
	/* secure channel: not specified without TLS, else required or not
	 * (TREQ bits 1:0); SQ flow control stays on */
	d->treq = c->t->tls == FX_TARGET_TLS_REQUIRED   ? 1
		  : c->t->tls == FX_TARGET_TLS_OPTIONAL ? 2
							: 0;
	d->portid = (uint16_t)(pi + 1);
	d->cntlid = 0xFFFF; /* dynamic controllers */
	d->asqsz = 32;
	snprintf(d->trsvcid, sizeof(d->trsvcid), "%d", p->bound);
	snprintf(d->subnqn, sizeof(d->subnqn), "%s", nqn);
	snprintf(d->traddr, sizeof(d->traddr), "%s", any ? c->local_addr : p->addr);
	d->tsas[0] = c->t->tls ? 2 : 0; /* SECTYPE: TLS 1.3, or no security */
}

static uint16_t get_log(struct tgt_conn *c, struct tgt_req *r)
{
	const struct nvme_sqe *sqe = r->sqe;
	uint8_t lid = (uint8_t)(sqe->cdw10 & 0xFF);
	uint64_t numd = ((uint64_t)(sqe->cdw11 & 0xFFFF) << 16 | (sqe->cdw10 >> 16)) + 1;
	uint64_t len = numd * 4;
	uint64_t off = (uint64_t)sqe->cdw12 | ((uint64_t)sqe->cdw13 << 32);
	uint8_t page[1024 * (2 + FX_TGT_MAX_PORTS)];
	uint64_t page_len = 0;

	if (len > FX_TGT_ADMIN_BUF || len > r->sgl_len)
		return TGT_SF_DNR(0, len > r->sgl_len ? TGT_SC_SGL_INVALID_DATA
						      : NVME_SC_INVALID_FIELD);
	if (off & 3)
		return TGT_SF_DNR(0, NVME_SC_INVALID_FIELD);
	memset(r->out, 0, (size_t)len);
	r->out_len = (uint32_t)len;
	if (lid == NVME_LOG_DISCOVERY && c->ctrl->discovery) {
		struct nvmf_disc_log_hdr *h = (struct nvmf_disc_log_hdr *)page;
		unsigned n = 0;

		memset(page, 0, sizeof(page));
		/* Our NVM subsystem through each open port (only to hosts it
		 * would admit), then the discovery subsystem itself (this
		 * port), as current Linux targets do.  (Ports open and close on
		 * the listener's thread; an entry read during a change may
		 * show either.) */
		if (tgt_host_allowed(c->t, c->ctrl->hostnqn))
			for (unsigned i = 0; i < c->t->n_ports; i++)
				if (atomic_load(&c->t->ports[i].open))
					disc_entry(c, page + 1024 * (1 + n++), NVMF_SUBTYPE_NVME,
						   c->t->subnqn, i);
		disc_entry(c, page + 1024 * (1 + n++), NVMF_SUBTYPE_CURRENT_DISCOVERY,
			   NVMF_DISCOVERY_NQN, c->port);
		h->genctr = atomic_load(&c->t->disc_genctr);
		h->numrec = n;
		h->recfmt = 0;
		page_len = 1024 * (1 + n);
		if (off < page_len)
			memcpy(r->out, page + off,
			       (size_t)(page_len - off < len ? page_len - off : len));
		return 0;
	}
	if (c->ctrl->discovery)
		return TGT_SF_DNR(0, NVME_SC_INVALID_FIELD);
	if (lid == NVME_LOG_ANA) {
		int rgo = (sqe->cdw10 >> 8) & NVME_ANA_LSP_RGO;

		if (!off) {
			tgt_ana_log(c, rgo, r->out, (size_t)len);
		} else {
			/* (from an offset: the page is built whole, then cut) */
			uint8_t *tmp = malloc(FX_TGT_ADMIN_BUF);
			size_t full;

			if (!tmp)
				return TGT_SF(0, NVME_SC_INTERNAL);
			full = tgt_ana_log(c, rgo, tmp, FX_TGT_ADMIN_BUF);
			if (full > FX_TGT_ADMIN_BUF)
				full = FX_TGT_ADMIN_BUF;
			if (off < full)
				memcpy(r->out, tmp + off,
				       (size_t)(full - off < len ? full - off : len));
			free(tmp);
		}
		/* RAE (bit 15) clear: the host has seen the change */
		if (!(sqe->cdw10 & (1u << 15)))
			tgt_ana_log_read(c);
		return 0;
	}
	/* Any other page of an NVM subsystem: nothing to report (zeros). */
	return 0;
}

/* ------------------------------------------------------------- features */

static uint16_t features(struct tgt_conn *c, struct tgt_req *r, int set)
{
	struct fx_target *t = c->t;
	struct tgt_ctrl *ctrl = c->ctrl;
	const struct nvme_sqe *sqe = r->sqe;
	uint8_t fid = (uint8_t)(sqe->cdw10 & 0xFF);
	unsigned sel = (sqe->cdw10 >> 8) & 7;
	uint16_t sf = 0;

	pthread_mutex_lock(&t->lock);
	switch (fid) {
	case NVME_FEAT_NUM_QUEUES:
		if (ctrl->discovery) {
			sf = TGT_SF_DNR(0, NVME_SC_INVALID_FIELD);
		} else if (set) {
			uint32_t nsqr = sqe->cdw11 & 0xFFFF, ncqr = sqe->cdw11 >> 16;
			uint32_t want = (nsqr > ncqr ? nsqr : ncqr) + 1;

			if (nsqr == 0xFFFF || ncqr == 0xFFFF) {
				sf = TGT_SF_DNR(0, NVME_SC_INVALID_FIELD);
				break;
			}
			ctrl->io_queues = (uint16_t)(want < t->max_io_queues ? want
									     : t->max_io_queues);
			r->dw0 = (ctrl->io_queues - 1u) | (uint32_t)(ctrl->io_queues - 1u) << 16;
		} else {
			uint32_t n = sel == 1 || !ctrl->io_queues ? t->max_io_queues
								  : ctrl->io_queues;

			r->dw0 = (n - 1u) | (n - 1u) << 16;
		}
		break;
	case 0x0F: /* Keep Alive Timer */
		if (set)
			/* (queues read it without t->lock: tgt_ctrl_alive) */
			__atomic_store_n(&ctrl->kato_ms, sqe->cdw11, __ATOMIC_RELAXED);
		else
			r->dw0 = ctrl->kato_ms;
		break;
	case 0x0B: /* Asynchronous Event Configuration: ANA change notices (bit 11) */
		if (set)
			ctrl->aec = sqe->cdw11;
		else
			r->dw0 = ctrl->aec;
		break;
	case 0x06: /* Volatile Write Cache */
		if (ctrl->discovery)
			sf = TGT_SF_DNR(0, NVME_SC_INVALID_FIELD);
		else if (set)
			ctrl->wce = sqe->cdw11 & 1;
		else
			r->dw0 = ctrl->wce;
		break;
	default:
		sf = TGT_SF_DNR(0, NVME_SC_INVALID_FIELD);
		break;
	}
	if (!sf && !set && sel == 3)
		r->dw0 = 1u << 2; /* supported capabilities: changeable, not saveable */
	pthread_mutex_unlock(&t->lock);
	return sf;
}

/* ------------------------------------------------------------- dispatch */

uint16_t tgt_exec_fabrics(struct tgt_conn *c, struct tgt_req *r)
{
	uint8_t fctype = ((const uint8_t *)r->sqe)[4];

	if (fctype == NVMF_FCTYPE_CONNECT)
		return do_connect(c, r);
	switch (fctype) {
	case NVMF_FCTYPE_PROP_GET:
		if (c->qid != 0)
			return TGT_SF_DNR(0, NVME_SC_INVALID_FIELD);
		return prop_get(c, r);
	case NVMF_FCTYPE_PROP_SET:
		if (c->qid != 0)
			return TGT_SF_DNR(0, NVME_SC_INVALID_FIELD);
		return prop_set(c, r);
	case NVMF_FCTYPE_AUTH_SEND:
		return tgt_auth_send(c, r);
	case NVMF_FCTYPE_AUTH_RECV:
		return tgt_auth_receive(c, r);
	case TGT_FCTYPE_DISCONNECT: /* (an I/O queue): answer, then close it */
		if (c->qid == 0)
			return TGT_SF_DNR(0, NVME_SC_INVALID_FIELD);
		r->close_after = 1;
		return 0;
	default:
		return TGT_SF_DNR(0, NVME_SC_INVALID_OPCODE);
	}
}

uint16_t tgt_exec_admin(struct tgt_conn *c, struct tgt_req *r)
{
	switch (r->sqe->opcode) {
	case NVME_ADMIN_IDENTIFY:
		return identify(c, r);
	case NVME_ADMIN_GET_LOG_PAGE:
		return get_log(c, r);
	case NVME_ADMIN_SET_FEATURES:
		return features(c, r, 1);
	case NVME_ADMIN_GET_FEATURES:
		return features(c, r, 0);
	case NVME_ADMIN_KEEP_ALIVE:
		return 0; /* the receive path already restarted the KATO timer */
	case NVME_ADMIN_ASYNC_EVENT: {
		/* Held until an event (an ANA change of this port; ana.c);
		 * one already waiting completes it at once. */
		int k = tgt_ana_aer(c, r->sqe->cid, &r->dw0);

		if (k < 0)
			return (uint16_t)-k;
		r->hold = k == 0;
		return 0;
	}
	case 0x08: /* Abort: dw0 bit 0 set = not aborted (we finish commands in order) */
		r->dw0 = 1;
		return 0;
	default:
		return TGT_SF_DNR(0, NVME_SC_INVALID_OPCODE);
	}
}
