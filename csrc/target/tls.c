/*
 * Our target's side of the NVMe/TCP secure channel (TLS 1.3 with a PSK):
 * the hosts' keys, and the start of a connection (see tgt.h).  The
 * handshake and the records are nvme_tcp/tls.c's, shared with the host.
 *
 * Known limit: the handshake's work (one ECDHE key agreement and a few
 * HKDFs, well under a millisecond) is bounded only by the connection limit
 * and the handshake deadline, not per peer address as DH-HMAC-CHAP's is.
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

int tgt_tls_accept(struct tgt_conn *c)
{
	struct fx_target *t = c->t;
	int64_t deadline = fx_tcp_now_ms() + (int64_t)t->handshake_ms;
	struct fx_tls_identity peer;
	const char *why = NULL;
	uint8_t first;
	char hp[NVMF_NQN_SIZE];
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
	r = fx_tls_server(c->fd, lookup, c, deadline, -1, &c->tls, &peer, &why);
	if (r) {
		tgt_log(t, "%s: TLS handshake with host %s failed: %s", c->peer,
			peer.hostnqn ? tgt_printable(hp, sizeof(hp), peer.hostnqn) : "(unknown)",
			why ? why : strerror(-r));
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
