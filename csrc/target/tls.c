/*
 * Our target's side of the NVMe/TCP secure channel (TLS 1.3 with a PSK):
 * the hosts' keys, and the start of a connection (see tgt.h).  The
 * handshake and the records are nvme_tcp/tls.c's, shared with the host.
 *
 * What a host that fails or stalls handshakes costs us (a thread and a
 * socket while it waits, a ClientHello parse, a key derivation and a
 * binder check, or one ECDHE agreement for a host with the key) is
 * bounded per peer address and target-wide, in time, and by a backoff
 * after repeated failures: tgt.h, FX_TGT_TLS_HS_*.
 */
#include "target/tgt.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "nvme_tcp/sock.h"

int tgt_tls_config(struct fx_target *t, const struct fx_target_config *cfg)
{
	t->tls = cfg->tls;
	if (cfg->tls < FX_TARGET_TLS_OFF || cfg->tls > FX_TARGET_TLS_REQUIRED)
		return -EINVAL;
	if (!cfg->n_tls_hosts)
		return 0;
	if (!cfg->tls_hosts)
		return -EINVAL;
	t->tls_hosts = calloc(cfg->n_tls_hosts, sizeof(*t->tls_hosts));
	if (!t->tls_hosts)
		return -ENOMEM;
	for (unsigned i = 0; i < cfg->n_tls_hosts; i++) {
		const struct fx_target_tls_host *in = &cfg->tls_hosts[i];
		struct tgt_tls_host *h = &t->tls_hosts[i];
		char hp[NVMF_NQN_SIZE];
		const char *why = NULL;

		if (!in->hostnqn || !in->hostnqn[0] || strlen(in->hostnqn) >= NVMF_NQN_SIZE)
			return -EINVAL;
		t->n_tls_hosts = i + 1; /* (wiped from here on) */
		snprintf(h->hostnqn, sizeof(h->hostnqn), "%s", in->hostnqn);
		for (unsigned j = 0; j < i; j++)
			if (strcmp(t->tls_hosts[j].hostnqn, in->hostnqn) == 0) {
				tgt_log(t, "TLS: two keys for host %s",
					tgt_printable(hp, sizeof(hp), in->hostnqn));
				return -EINVAL;
			}
		if (fx_tls_key_parse(in->key, &h->key, &why) != 0) {
			tgt_log(t, "TLS: the key for host %s: %s",
				tgt_printable(hp, sizeof(hp), in->hostnqn), why);
			return -EINVAL;
		}
	}
	return 0;
}

void tgt_tls_config_free(struct fx_target *t)
{
	for (unsigned i = 0; i < t->n_tls_hosts; i++)
		fx_tls_key_wipe(&t->tls_hosts[i].key);
	free(t->tls_hosts);
	t->tls_hosts = NULL;
	t->n_tls_hosts = 0;
}

/* ------------------------------------------------------------ bounds */

static const char backoff_why[] = "too many failed TLS handshakes as this host from this "
				  "address: refused for a while (up to 8 s; a success clears "
				  "it)";

static int host_has_key(const struct fx_target *t, const char *hostnqn)
{
	for (unsigned i = 0; i < t->n_tls_hosts; i++)
		if (strcmp(t->tls_hosts[i].hostnqn, hostnqn) == 0)
			return 1;
	return 0;
}

/* The (host NQN, address) slot of this connection, under t->lock; with
 * create, a free or the least recently failed slot is taken. */
static struct tgt_tls_backoff *backoff_slot(struct tgt_conn *c, const char *hostnqn, int create)
{
	struct fx_target *t = c->t;
	struct tgt_tls_backoff *old = NULL;

	for (unsigned i = 0; i < FX_TGT_TLS_BACKOFF_SLOTS; i++) {
		struct tgt_tls_backoff *b = &t->tls_backoff[i];

		if (b->addr[0] && strcmp(b->addr, c->peer_key) == 0 &&
		    strcmp(b->hostnqn, hostnqn) == 0)
			return b;
		if (!old || !b->addr[0] || (old->addr[0] && b->last_ms < old->last_ms))
			old = b;
	}
	if (!create)
		return NULL;
	memset(old, 0, sizeof(*old));
	snprintf(old->addr, sizeof(old->addr), "%s", c->peer_key);
	snprintf(old->hostnqn, sizeof(old->hostnqn), "%s", hostnqn);
	return old;
}

/* ms this host NQN must still wait from this address (0: none) */
static uint64_t backoff_wait(struct tgt_conn *c, const char *hostnqn)
{
	struct tgt_tls_backoff *b;
	uint64_t now = tgt_now_ms(), wait = 0;

	pthread_mutex_lock(&c->t->lock);
	b = backoff_slot(c, hostnqn, 0);
	if (b && b->until_ms > now)
		wait = b->until_ms - now;
	pthread_mutex_unlock(&c->t->lock);
	return wait;
}

/* A handshake as hostnqn ended: a failure counts, a success clears. */
static void backoff_note(struct tgt_conn *c, const char *hostnqn, int failed)
{
	struct tgt_tls_backoff *b;
	uint64_t now = tgt_now_ms();

	pthread_mutex_lock(&c->t->lock);
	b = backoff_slot(c, hostnqn, failed);
	if (b && !failed) {
		memset(b, 0, sizeof(*b));
	} else if (b) {
		b->fails++;
		b->last_ms = now;
		if (b->fails >= FX_TGT_TLS_FREE_FAILS) {
			unsigned sh = b->fails - FX_TGT_TLS_FREE_FAILS;
			uint64_t wait = sh > 8 ? FX_TGT_TLS_BACKOFF_MAX_MS
					       : (uint64_t)FX_TGT_TLS_BACKOFF_MS << sh;

			b->until_ms = now + (wait > FX_TGT_TLS_BACKOFF_MAX_MS
						     ? FX_TGT_TLS_BACKOFF_MAX_MS
						     : wait);
		}
	}
	pthread_mutex_unlock(&c->t->lock);
}

/* The oldest connection in its TLS handshake, of address addr (NULL: of
 * any), and how many there are.  Under t->lock. */
static struct tgt_conn *oldest_hs_locked(struct fx_target *t, const char *addr, unsigned *n)
{
	struct tgt_conn *old = NULL;

	*n = 0;
	for (struct tgt_conn *o = t->conns; o; o = o->next) {
		if (!o->tls_hs_ms || (addr && strcmp(o->peer_key, addr) != 0))
			continue;
		++*n;
		if (!old || o->tls_hs_ms < old->tls_hs_ms)
			old = o;
	}
	return old;
}

/* c starts its TLS handshake: past the address's or the target's limit,
 * the oldest in progress gives way (its socket is shut, its thread ends
 * its handshake at once and says nothing: this one says why). */
static void hs_enter(struct tgt_conn *c)
{
	struct fx_target *t = c->t;
	unsigned shut_addr = 0, shut_all = 0;
	char other[64] = "";

	pthread_mutex_lock(&t->lock);
	for (int all = 0; all < 2; all++) {
		for (;;) {
			unsigned n;
			struct tgt_conn *old = oldest_hs_locked(t, all ? NULL : c->peer_key, &n);

			if (!old || n < (all ? FX_TGT_TLS_HS_MAX : FX_TGT_TLS_HS_PER_ADDR))
				break;
			old->tls_hs_ms = 0;
			old->tls_hs_evicted = 1;
			tgt_conn_shut(old);
			if (all) {
				shut_all++;
				snprintf(other, sizeof(other), "%s", old->peer_key);
			} else {
				shut_addr++;
			}
		}
	}
	c->tls_hs_ms = tgt_now_ms() | 1; /* (never 0: in progress) */
	pthread_mutex_unlock(&t->lock);
	if (shut_addr)
		tgt_log_must(t, c->peer_key, "TLS handshake pushed out (per-address limit)",
			     "%s: %u TLS handshakes in progress from %s (limit %u): closed the "
			     "oldest",
			     c->peer, FX_TGT_TLS_HS_PER_ADDR, c->peer_key, FX_TGT_TLS_HS_PER_ADDR);
	if (shut_all)
		tgt_log_must(t, other, "TLS handshake pushed out (target-wide limit)",
			     "%u TLS handshakes in progress in the target (limit %u): closed the "
			     "oldest, from %s",
			     FX_TGT_TLS_HS_MAX, FX_TGT_TLS_HS_MAX, other);
}

/* c's handshake ended: whether a newer one pushed it out (it said why). */
static int hs_leave(struct tgt_conn *c)
{
	int evicted;

	pthread_mutex_lock(&c->t->lock);
	c->tls_hs_ms = 0;
	evicted = c->tls_hs_evicted;
	pthread_mutex_unlock(&c->t->lock);
	return evicted;
}

/* ------------------------------------------------------------ handshake */

/* The PSK of the identity a host offers: its host NQN has a key here, and
 * its subsystem is ours or the discovery subsystem. */
static int lookup(void *arg, const struct fx_tls_identity *id, struct fx_tls_psk *psk,
		  const char **why)
{
	struct tgt_conn *c = arg;
	struct fx_target *t = c->t;

	if (strcmp(id->subnqn, t->subnqn) != 0 && strcmp(id->subnqn, NVMF_DISCOVERY_NQN) != 0) {
		*why = "the host's TLS identity names another subsystem";
		return -EACCES;
	}
	if (backoff_wait(c, id->hostnqn)) {
		*why = backoff_why;
		return -EACCES;
	}
	for (unsigned i = 0; i < t->n_tls_hosts; i++)
		if (strcmp(t->tls_hosts[i].hostnqn, id->hostnqn) == 0)
			return fx_tls_psk_derive(&t->tls_hosts[i].key, id->hostnqn, id->subnqn,
						 id->version, FX_TLS_KDF_RFC, psk) == 0
				       ? 0
				       : -EACCES;
	*why = "no TLS key for this host";
	return -EACCES;
}

int tgt_tls_accept(struct tgt_conn *c)
{
	struct fx_target *t = c->t;
	int64_t deadline = fx_tcp_now_ms() + (int64_t)t->handshake_ms;
	struct fx_tls_identity peer;
	const char *why = NULL;
	uint8_t first;
	char hp[NVMF_NQN_SIZE];
	uint32_t limit;
	int r;

	if (t->tls == FX_TARGET_TLS_OFF)
		return 0;
	/* the first byte decides: a TLS handshake record, or a clear ICReq */
	r = fx_tcp_wait(c->fd, POLLIN, deadline, -1);
	if (r == 0 && recv(c->fd, &first, 1, MSG_PEEK | MSG_DONTWAIT) != 1)
		r = -ECONNRESET;
	if (r) {
		if (r == -ETIMEDOUT)
			tgt_log(t, "%s: no TLS handshake or ICReq within %u ms; closing", c->peer,
				t->handshake_ms);
		return -ECONNABORTED;
	}
	if (first != 0x16) {
		if (t->tls == FX_TARGET_TLS_OPTIONAL)
			return 0;
		tgt_log(t,
			"%s: host did not start TLS (first byte 0x%02x), which this target "
			"requires; closing",
			c->peer, first);
		return -ECONNABORTED;
	}
	memset(&peer, 0, sizeof(peer));
	/* from the first byte, the handshake has its own, shorter limit: a
	 * PSK handshake is one round trip */
	limit = t->handshake_ms < FX_TGT_TLS_HS_MS ? t->handshake_ms : FX_TGT_TLS_HS_MS;
	if (fx_tcp_now_ms() + (int64_t)limit < deadline)
		deadline = fx_tcp_now_ms() + (int64_t)limit;
	hs_enter(c);
	r = fx_tls_server(c->fd, lookup, c, deadline, -1, &c->tls, &peer, &why);
	if (hs_leave(c)) {
		fx_tls_free(c->tls); /* (pushed out after it ended: it ends anyway) */
		c->tls = NULL;
		return -ECONNABORTED;
	}
	/* failures and successes of a host we have a key for count against
	 * (or clear) its backoff from this address (a refusal by the backoff
	 * itself does not: the wait ends); others cost no key work */
	if (peer.hostnqn && host_has_key(t, peer.hostnqn) && why != backoff_why)
		backoff_note(c, peer.hostnqn, r != 0);
	if (r) {
		char what[200];

		tgt_printable(hp, sizeof(hp), peer.hostnqn ? peer.hostnqn : "(unknown)");
		snprintf(what, sizeof(what), "failed TLS handshake as host %.160s", hp);
		tgt_log_must(t, c->peer_key, what, "%s: TLS handshake with host %s failed: %s%s",
			     c->peer, hp, why ? why : strerror(-r),
			     r == -ETIMEDOUT ? " (the TLS handshake's time limit)" : "");
		return -ECONNABORTED;
	}
	snprintf(c->tls_hostnqn, sizeof(c->tls_hostnqn), "%s", peer.hostnqn);
	snprintf(c->tls_subnqn, sizeof(c->tls_subnqn), "%s", peer.subnqn);
	if (t->verbose)
		tgt_log(t, "%s: TLS with host %s (identity version %d, %s)", c->peer,
			tgt_printable(hp, sizeof(hp), peer.hostnqn), peer.version,
			peer.hash == FX_TLS_HASH_SHA384 ? "TLS_AES_256_GCM_SHA384"
							: "TLS_AES_128_GCM_SHA256");
	return 0;
}
