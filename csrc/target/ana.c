/*
 * Asymmetric Namespace Access of the target: each listening port is an NVMe
 * port of its own, and each ANA group (the namespaces are in group 1 unless
 * told) has a state as seen through each port.  The I/O path reads a
 * group's state per command without a lock (an atomic byte), so a change
 * takes effect for the commands that come after it; the ANA log page (LID
 * 0Ch) shows the states through the controller's own port; a change bumps
 * the change count and completes an Asynchronous Event Request of every
 * controller of that port with the ANA change notice (or keeps it until the
 * host sends one), after which no other notice is sent until the host reads
 * the log without RAE.  Changes, and closing or opening a port, come from
 * the control socket (control.c) on the listener's thread; the notices are
 * sent by each admin queue's own thread, which the listener wakes.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tgt.h"

static const struct {
	const char *name;
	uint8_t state;
} states[] = {
	{"optimized", NVME_ANA_OPTIMIZED},
	{"non-optimized", NVME_ANA_NON_OPTIMIZED},
	{"inaccessible", NVME_ANA_INACCESSIBLE},
	{"persistent-loss", NVME_ANA_PERSISTENT_LOSS},
	{"change", NVME_ANA_CHANGE},
};

uint8_t tgt_ana_state_parse(const char *s)
{
	for (size_t i = 0; i < sizeof(states) / sizeof(states[0]); i++)
		if (strcmp(s, states[i].name) == 0)
			return states[i].state;
	return 0;
}

const char *tgt_ana_state_str(uint8_t st)
{
	for (size_t i = 0; i < sizeof(states) / sizeof(states[0]); i++)
		if (states[i].state == st)
			return states[i].name;
	return "?";
}

uint8_t tgt_ana_state(const struct tgt_conn *c, const struct tgt_ns *ns)
{
	return atomic_load(&c->t->ports[c->port].ana[ns->anagrpid]);
}

uint16_t tgt_ana_io_status(const struct tgt_conn *c, const struct tgt_ns *ns)
{
	/* Not DNR: the same command may succeed on another path, or here
	 * once the transition is over. */
	switch (tgt_ana_state(c, ns)) {
	case NVME_ANA_OPTIMIZED:
	case NVME_ANA_NON_OPTIMIZED:
		return 0;
	case NVME_ANA_INACCESSIBLE:
		return TGT_SF(NVME_SCT_PATH, NVME_SC_ANA_INACCESSIBLE);
	case NVME_ANA_PERSISTENT_LOSS:
		return TGT_SF(NVME_SCT_PATH, NVME_SC_ANA_PERSISTENT_LOSS);
	default:
		return TGT_SF(NVME_SCT_PATH, NVME_SC_ANA_TRANSITION);
	}
}

size_t tgt_ana_log(struct tgt_conn *c, int rgo, uint8_t *out, size_t cap)
{
	struct fx_target *t = c->t;
	const struct tgt_port *p = &t->ports[c->port];
	struct nvme_ana_log_hdr h;
	size_t at = sizeof(h);

	memset(&h, 0, sizeof(h));
	memset(out, 0, cap);
	pthread_mutex_lock(&t->lock);
	h.chgcnt = p->ana_chgcnt;
	/* A descriptor for each group that has namespaces, in id order. */
	for (uint32_t g = 1; g <= FX_TGT_ANA_GROUPS; g++) {
		struct nvme_ana_group_desc d;
		uint32_t n = 0;

		for (unsigned i = 0; i < t->n_ns; i++)
			n += t->ns[i].anagrpid == g;
		if (!n)
			continue;
		memset(&d, 0, sizeof(d));
		d.grpid = g;
		d.nnsids = rgo ? 0 : n;
		d.chgcnt = p->ana_chg[g];
		d.state = atomic_load(&p->ana[g]);
		if (at + sizeof(d) <= cap)
			memcpy(out + at, &d, sizeof(d));
		at += sizeof(d);
		for (unsigned i = 0; !rgo && i < t->n_ns; i++) {
			if (t->ns[i].anagrpid != g)
				continue;
			if (at + 4 <= cap)
				memcpy(out + at, &t->ns[i].nsid, 4);
			at += 4;
		}
		h.ngrps++;
	}
	pthread_mutex_unlock(&t->lock);
	memcpy(out, &h, cap < sizeof(h) ? cap : sizeof(h));
	return at;
}

int tgt_ana_aer(struct tgt_conn *c, uint16_t cid, uint32_t *dw0)
{
	struct fx_target *t = c->t;
	struct tgt_ctrl *ctrl = c->ctrl;
	int ret = 0;

	pthread_mutex_lock(&t->lock);
	if (!ctrl->discovery && ctrl->ana_aen_pending) {
		ctrl->ana_aen_pending = 0;
		*dw0 = NVME_AER_ANA_CHANGE;
		ret = 1;
	} else if (c->aers > FX_TGT_AERL) {
		ret = -(int)TGT_SF_DNR(1, TGT_SC_AER_LIMIT);
	} else {
		c->aer_cid[c->aers++] = cid;
	}
	pthread_mutex_unlock(&t->lock);
	return ret;
}

void tgt_ana_log_read(struct tgt_conn *c)
{
	pthread_mutex_lock(&c->t->lock);
	c->ctrl->ana_aen_masked = 0;
	pthread_mutex_unlock(&c->t->lock);
}

/* Tell each controller of port pi about a change: the notice waits in
 * ana_aen_pending for the oldest AER of its admin queue, whose own thread
 * is woken to send the answer (tgt_ana_deliver).  Nothing here writes to a
 * host's socket: a host that has stopped reading blocks its own queue's
 * thread only, never the listener (accepts, timers, the control socket) or
 * the notices of other hosts.  (Under t->lock; an eventfd write never
 * blocks: EFD_NONBLOCK, and a counter near 2^64 just means "woken".) */
static void notify_port_locked(struct fx_target *t, unsigned pi)
{
	for (struct tgt_conn *c = t->conns; c; c = c->next) {
		struct tgt_ctrl *ctrl = c->ctrl;
		uint64_t one = 1;

		if (!ctrl || c->qid != 0 || ctrl->discovery || ctrl->port != pi ||
		    ctrl->state == TGT_CTRL_DEAD || ctrl->ana_aen_masked)
			continue;
		if (!(ctrl->aec & NVME_AEN_CFG_ANA_CHANGE))
			continue;
		ctrl->ana_aen_masked = 1;
		ctrl->ana_aen_pending = 1;
		if (c->aers && c->evfd >= 0 && write(c->evfd, &one, sizeof(one)) < 0) {
			/* (EAGAIN: a wake is already due) */
		}
	}
}

int tgt_ana_deliver(struct tgt_conn *c)
{
	struct fx_target *t = c->t;
	uint16_t cid = 0;
	int send = 0;

	pthread_mutex_lock(&t->lock);
	if (c->ctrl && !c->ctrl->discovery && c->ctrl->ana_aen_pending && c->aers) {
		cid = c->aer_cid[0];
		memmove(c->aer_cid, c->aer_cid + 1, (c->aers - 1) * sizeof(c->aer_cid[0]));
		c->aers--;
		c->ctrl->ana_aen_pending = 0;
		send = 1;
	}
	pthread_mutex_unlock(&t->lock);
	return send ? tgt_send_resp(c, cid, 0, NVME_AER_ANA_CHANGE, 0) : 0;
}

/* Whether group g has namespaces: only those have a descriptor in the ANA
 * log, so only their changes are changes of the log. */
static int group_used(const struct fx_target *t, uint32_t g)
{
	for (unsigned i = 0; i < t->n_ns; i++)
		if (t->ns[i].anagrpid == g)
			return 1;
	return 0;
}

/* Under t->lock: set the state of group (0: every group) through port pi,
 * and where it is change, when it leaves it (tgt_ana_set).  Each port's
 * ANA log is its own (a controller sees its port's states), so the counts
 * are per port: a group descriptor's grows by one with each change of that
 * descriptor, the log's by one for each call that changed any descriptor
 * (a state set to what it already is changes nothing, and announces
 * nothing).  Both wrap from 2^64 - 1 to 0, as the spec asks.  Returns
 * whether the log changed (the notice is then flagged). */
static int set_locked(struct fx_target *t, unsigned pi, uint32_t group, uint8_t state, uint8_t then,
		      uint32_t after_ms)
{
	struct tgt_port *p = &t->ports[pi];
	uint64_t now = tgt_now_ms();
	int changed = 0;

	for (uint32_t g = group ? group : 1; g <= (group ? group : FX_TGT_ANA_GROUPS); g++) {
		uint8_t old = atomic_load(&p->ana[g]);

		if (state == NVME_ANA_CHANGE) {
			/* (from change to change: the new target and time) */
			p->chg_then[g] = then                     ? then
					 : old != NVME_ANA_CHANGE ? old
					 : p->chg_then[g]         ? p->chg_then[g]
								  : NVME_ANA_OPTIMIZED;
			p->chg_due_ms[g] = now + (after_ms ? after_ms : FX_TGT_ANATT * 1000u);
		} else {
			p->chg_due_ms[g] = 0;
		}
		if (old == state)
			continue;
		atomic_store(&p->ana[g], state);
		if (group_used(t, g)) {
			p->ana_chg[g]++;
			changed = 1;
		}
	}
	if (changed) {
		p->ana_chgcnt++;
		notify_port_locked(t, pi);
	}
	return changed;
}

int tgt_ana_set(struct fx_target *t, unsigned pi, uint32_t group, uint8_t state, uint8_t then,
		uint32_t after_ms)
{
	char g[16] = "every ANA group", how[96] = "";
	int changed;

	if (pi >= t->n_ports || group > FX_TGT_ANA_GROUPS || !state ||
	    strcmp(tgt_ana_state_str(state), "?") == 0)
		return -EINVAL;
	if (then && (then == NVME_ANA_CHANGE || strcmp(tgt_ana_state_str(then), "?") == 0))
		return -EINVAL;
	if ((then || after_ms) && state != NVME_ANA_CHANGE)
		return -EINVAL;
	if (after_ms > FX_TGT_ANATT * 1000u)
		return -EINVAL;
	pthread_mutex_lock(&t->lock);
	changed = set_locked(t, pi, group, state, then, after_ms);
	pthread_mutex_unlock(&t->lock);
	if (group)
		snprintf(g, sizeof(g), "ANA group %u", group);
	if (state == NVME_ANA_CHANGE)
		snprintf(how, sizeof(how), " (then %s in %u ms)",
			 then ? tgt_ana_state_str(then) : "its state before",
			 after_ms ? after_ms : FX_TGT_ANATT * 1000u);
	tgt_log(t, "port %u: %s now %s%s%s", pi + 1, g, tgt_ana_state_str(state), how,
		changed ? "" : " (no change)");
	return 0;
}

void tgt_ana_tick(struct fx_target *t)
{
	uint64_t now = tgt_now_ms();

	for (unsigned pi = 0; pi < t->n_ports; pi++) {
		struct tgt_port *p = &t->ports[pi];

		for (uint32_t g = 1; g <= FX_TGT_ANA_GROUPS; g++) {
			uint8_t then;
			int changed;

			/* (read without the lock: only this thread and the
			 * control commands it runs set a deadline) */
			if (!p->chg_due_ms[g] || now < p->chg_due_ms[g])
				continue;
			pthread_mutex_lock(&t->lock);
			then = p->chg_then[g];
			changed = set_locked(t, pi, g, then, 0, 0);
			pthread_mutex_unlock(&t->lock);
			/* (a group without namespaces, put in change by "all",
			 * leaves it in silence: no host can see it) */
			if (changed)
				tgt_log(t, "port %u: ANA group %u left change: now %s", pi + 1, g,
					tgt_ana_state_str(then));
		}
	}
}

int tgt_port_close(struct fx_target *t, unsigned pi)
{
	struct tgt_port *p;
	unsigned n = 0;

	if (pi >= t->n_ports)
		return -EINVAL;
	p = &t->ports[pi];
	if (p->lfd < 0)
		return -EALREADY;
	atomic_store(&p->open, 0);
	atomic_fetch_add(&t->disc_genctr, 1);
	close(p->lfd);
	p->lfd = -1;
	/* Its connections end: the host sees the path die. */
	pthread_mutex_lock(&t->lock);
	for (struct tgt_conn *c = t->conns; c; c = c->next)
		if (c->port == pi && !atomic_load(&c->done)) {
			tgt_conn_shut(c);
			n++;
		}
	pthread_mutex_unlock(&t->lock);
	tgt_log(t, "port %u (%s:%d) closed, %u connection%s ended", pi + 1, p->addr, p->bound, n,
		n == 1 ? "" : "s");
	return 0;
}

int tgt_port_open(struct fx_target *t, unsigned pi)
{
	struct tgt_port *p;
	int ret;

	if (pi >= t->n_ports)
		return -EINVAL;
	p = &t->ports[pi];
	if (p->lfd >= 0)
		return -EALREADY;
	ret = tgt_port_listen(t, p);
	if (!ret)
		atomic_fetch_add(&t->disc_genctr, 1);
	if (ret < 0)
		tgt_log(t, "port %u: cannot listen on %s:%s again: %s", pi + 1, p->host, p->svc,
			strerror(-ret));
	else
		tgt_log(t, "port %u (%s:%d) open again", pi + 1, p->addr, p->bound);
	return ret;
}
