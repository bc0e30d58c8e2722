/*
 * Our target's side of the NVMe/TCP secure channel (TLS 1.3 with a PSK):
 * the hosts' keys, and the start of a connection (see tgt.h).  The
 * handshake and the records are nvme_tcp/tls.c's, shared with the host.
 *
 * What a host that fails or stalls handshakes costs us (a thread and a
 * socket while it waits, a ClientHello parse, a key derivation and a
 * binder check, or one ECDHE agreement for a host with the key) is
 * bounded in how many are in progress at once, per peer address and
 * target-wide, and in time: tgt.h, FX_TGT_TLS_HS_*.
 */
#include "target/tgt.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>

#include "nvme_tcp/sock.h"

int tgt_tls_config(struct fx_target *t, const struct fx_target_config *cfg)
{
	t->tls = cfg->tls;
	t->ktls = cfg->ktls;
	if (cfg->tls < FX_TARGET_TLS_OFF || cfg->tls > FX_TARGET_TLS_REQUIRED ||
	    (cfg->ktls != FX_TARGET_KTLS_AUTO && cfg->ktls != FX_TARGET_KTLS_OFF))
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

/* A connection in its TLS handshake is counted while it waits on the
 * network for a host that has not shown it holds a key we have (its PSK
 * binder verified): from its first byte until a whole record is here to
 * read (a ClientHello sent in one piece is never counted), and again if it
 * then waits for more.  Only such handshakes, a stranger's, a wrong key's,
 * a stalled one, are bounded and pushed out; one with its record in hand
 * only computes, and a proven one runs to its end (or its time limit).
 * Under t->lock. */
static void hs_shut_locked(struct tgt_conn *o)
{
	o->tls_hs_ms = 0;
	o->tls_hs_evicted = 1;
	tgt_conn_shut(o);
}

/* how many of hs[0..n) are from addr */
static unsigned hs_count(struct tgt_conn *const *hs, unsigned n, const char *addr)
{
	unsigned k = 0;

	for (unsigned i = 0; i < n; i++)
		k += strcmp(hs[i]->peer_key, addr) == 0;
	return k;
}

/* c waits for an unproven host: past its address's limit the oldest
 * counted one of that address gives way; past the target's, the oldest of the
 * address with the most in progress (so that a flood from some addresses
 * pushes out its own, not others').  The one pushed out has its socket
 * shut: its thread ends its handshake at once and says nothing (this one
 * says why).  One walk of the connections, then at most FX_TGT_TLS_HS_MAX
 * entries. */
static void hs_enter(struct tgt_conn *c)
{
	struct fx_target *t = c->t;
	struct tgt_conn *hs[FX_TGT_TLS_HS_MAX];
	unsigned n = 0, shut_addr = 0, shut_all = 0;
	char other[64] = "";

	pthread_mutex_lock(&t->lock);
	if (c->tls_hs_ms || c->tls_hs_evicted) { /* (counted already, or shut) */
		pthread_mutex_unlock(&t->lock);
		return;
	}
	/* (never more than FX_TGT_TLS_HS_MAX unproven: each entry made room) */
	for (struct tgt_conn *o = t->conns; o && n < FX_TGT_TLS_HS_MAX; o = o->next)
		if (o->tls_hs_ms && o != c)
			hs[n++] = o;
	while (hs_count(hs, n, c->peer_key) >= FX_TGT_TLS_HS_PER_ADDR) {
		unsigned old = n;

		for (unsigned i = 0; i < n; i++)
			if (strcmp(hs[i]->peer_key, c->peer_key) == 0 &&
			    (old == n || hs[i]->tls_hs_ms < hs[old]->tls_hs_ms))
				old = i;
		hs_shut_locked(hs[old]);
		hs[old] = hs[--n];
		shut_addr++;
	}
	while (n && n >= FX_TGT_TLS_HS_MAX) {
		unsigned old = 0, most = 0;

		for (unsigned i = 0; i < n; i++) {
			unsigned k = hs_count(hs, n, hs[i]->peer_key);

			if (k > most || (k == most && hs[i]->tls_hs_ms < hs[old]->tls_hs_ms)) {
				most = k;
				old = i;
			}
		}
		snprintf(other, sizeof(other), "%s", hs[old]->peer_key);
		hs_shut_locked(hs[old]);
		hs[old] = hs[--n];
		shut_all++;
	}
	c->tls_hs_ms = tgt_now_ms() | 1; /* (never 0: in progress) */
	pthread_mutex_unlock(&t->lock);
	if (shut_addr)
		tgt_log_must(t, c->peer_key, "TLS handshake pushed out (per-address limit)",
			     "%s: %u unproven TLS handshakes in progress from %s (limit %u): "
			     "closed the oldest",
			     c->peer, FX_TGT_TLS_HS_PER_ADDR, c->peer_key, FX_TGT_TLS_HS_PER_ADDR);
	if (shut_all)
		tgt_log_must(t, other, "TLS handshake pushed out (target-wide limit)",
			     "%u unproven TLS handshakes in progress in the target (limit %u): "
			     "closed the oldest of the address with the most, %s",
			     FX_TGT_TLS_HS_MAX, FX_TGT_TLS_HS_MAX, other);
}

/* whether a whole TLS record is in fd's receive queue (reading it will
 * not wait) */
static int record_here(int fd)
{
	uint8_t h[5];
	int avail = 0;

	if (recv(fd, h, sizeof(h), MSG_PEEK | MSG_DONTWAIT) != (ssize_t)sizeof(h) ||
	    ioctl(fd, FIONREAD, &avail) != 0)
		return 0;
	return (size_t)avail >= sizeof(h) + ((size_t)h[3] << 8 | h[4]);
}

/* fx_tls_server is about to read a record: counted (and bounded) while it
 * would wait for an unproven host, not counted otherwise. */
static void hs_waiting(void *arg, int proven)
{
	struct tgt_conn *c = arg;

	if (!proven && !record_here(c->fd)) {
		hs_enter(c);
		return;
	}
	pthread_mutex_lock(&c->t->lock);
	c->tls_hs_ms = 0;
	pthread_mutex_unlock(&c->t->lock);
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
	for (unsigned i = 0; i < t->n_tls_hosts; i++)
		if (strcmp(t->tls_hosts[i].hostnqn, id->hostnqn) == 0)
			return fx_tls_psk_derive(&t->tls_hosts[i].key, id->hostnqn, id->subnqn,
						 id->version, FX_TLS_KDF_RFC, psk) == 0
				       ? 0
				       : -EACCES;
	*why = "no TLS key for this host";
	return -EACCES;
}

/* ------------------------------------------------------------ kTLS */

/* The handshake is done and nothing past it read (fx_tls_server reads
 * records whole, the host's ICReq is still in the socket): with --ktls
 * auto, the kernel takes the keys and the connection's data path is the
 * clear-text one (recv, sendmsg, sendfile), c->tls freed.  0 with c->ktls
 * set, or with c->tls kept where the kernel cannot (*why says why: no tls
 * module, a cipher it lacks); -errno where the kernel took the send key and
 * refused the receive key (the socket is unusable: the caller closes it). */
static int to_kernel(struct tgt_conn *c, const char **why)
{
	struct fx_target *t = c->t;
	int r;

	*why = NULL;
	if (t->ktls != FX_TARGET_KTLS_OFF) {
		r = fx_ktls_start(c->fd, c->tls, &c->ktls, why);
		if (r && r != -ENOPROTOOPT)
			return r;
	}
	if (c->ktls) {
		fx_tls_free(c->tls);
		c->tls = NULL;
		atomic_fetch_add(&t->ktls_conns, 1);
	} else {
		atomic_fetch_add(&t->tls_user_conns, 1);
	}
	atomic_fetch_add(&t->tls_open, 1);
	c->tls_open_counted = 1;
	return 0;
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
	r = fx_tls_server(c->fd, lookup, hs_waiting, c, deadline, -1, &c->tls, &peer, &why);
	if (hs_leave(c)) {
		fx_tls_free(c->tls); /* (pushed out after it ended: it ends anyway) */
		c->tls = NULL;
		return -ECONNABORTED;
	}
	if (r) {
		tgt_printable(hp, sizeof(hp), peer.hostnqn ? peer.hostnqn : "(unknown)");
		/* counted past the log's rate by address alone: a host NQN is
		 * the peer's to choose, and would let one address take every
		 * count */
		tgt_log_must(t, c->peer_key, "failed TLS handshake",
			     "%s: TLS handshake with host %s failed: %s%s", c->peer, hp,
			     why ? why : strerror(-r),
			     r == -ETIMEDOUT ? " (the TLS handshake's time limit)" : "");
		return -ECONNABORTED;
	}
	snprintf(c->tls_hostnqn, sizeof(c->tls_hostnqn), "%s", peer.hostnqn);
	snprintf(c->tls_subnqn, sizeof(c->tls_subnqn), "%s", peer.subnqn);
	tgt_printable(hp, sizeof(hp), peer.hostnqn);
	r = to_kernel(c, &why);
	if (r) {
		tgt_log(t,
			"%s: TLS with host %s: moving the records to the kernel (kTLS) failed: "
			"%s; closing (--ktls off keeps them in fx100io)",
			c->peer, hp, why);
		return -ECONNABORTED;
	}
	if (t->verbose)
		tgt_log(t, "%s: TLS with host %s (identity version %d, %s), records %s%s%s",
			c->peer, hp, peer.version,
			peer.hash == FX_TLS_HASH_SHA384 ? "TLS_AES_256_GCM_SHA384"
							: "TLS_AES_128_GCM_SHA256",
			tgt_tls_layer(c), why ? ": " : "", why ? why : "");
	return 0;
}

const char *tgt_tls_layer(const struct tgt_conn *c)
{
	return c->ktls ? "by the kernel (kTLS)" : c->tls ? "by fx100io" : "in clear text";
}
