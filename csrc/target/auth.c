/*
 * DH-HMAC-CHAP (NVMe Base 2.x, "Authentication"), the controller's side:
 * one transaction per queue, driven by the host's AUTH_Send (Negotiate,
 * Reply, Success2, Failure2) and AUTH_Receive (our Challenge, Success1 or
 * Failure1) after a Connect whose response asked for it (ATR).
 *
 *   NEGOTIATE --Send Negotiate--> CHALLENGE --Receive--> REPLY
 *   REPLY --Send Reply (R1 checked)--> SUCCESS1 --Receive--> DONE, or
 *                                                 SUCCESS2 (bidirectional)
 *   SUCCESS2 --Send Success2--> DONE (authenticated)
 *   any error --> FAILURE1 --Receive (Failure1 with the reason)--> DONE
 *
 * A Negotiate restarts the transaction from any step (a host may
 * re-authenticate).  An authenticated queue stays so while it
 * re-authenticates (its I/O goes on, as with Linux's nvmet); if that fails,
 * the queue is closed once Failure1 is sent (or at its next other command),
 * never left answering every command with an error.  The cost an
 * unauthenticated host can impose is bounded four ways: FX_TGT_AUTH_MAX_TRIES
 * transactions per queue, FX_TGT_AUTH_MAX_DH DH operations at once in the
 * target, a bucket of DH tokens per peer address whatever host NQN it names
 * (a Challenge takes one, proving the secret gives it back), and a growing
 * wait for a host NQN from an address after FX_TGT_AUTH_FREE_FAILS failed
 * transactions in a row that cost us DH work, those the host abandoned
 * after our Challenge included (tgt.h).  Errors in what the host sends (lengths, T_ID, a message
 * out of order, a DH value out of range) are not NVMe errors: the AUTH_Send
 * completes and the reason goes back in Failure1, as Linux's nvmet does;
 * only malformed commands (SECP/SPSP, TL/AL against the data) get an error
 * status.  One log line per failed transaction names the host and the
 * reason, never a secret.  The crypto is auth/auth_crypto.c (libcrypto);
 * the messages are parsed and built by auth/auth_msg.h, as the initiator's.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "auth/auth_msg.h"
#include "tgt.h"

enum tgt_auth_step {
	STEP_NEGOTIATE, /* waiting for the host's Negotiate */
	STEP_CHALLENGE, /* negotiated: the next AUTH_Receive gets our Challenge */
	STEP_REPLY,     /* waiting for the host's Reply */
	STEP_SUCCESS1,  /* Reply verified: the next AUTH_Receive gets Success1 */
	STEP_SUCCESS2,  /* bidirectional: waiting for the host's Success2 */
	STEP_FAILURE1,  /* failed: the next AUTH_Receive gets Failure1 */
	STEP_DONE,      /* transaction over (authenticated or not) */
};

struct tgt_auth {
	const struct tgt_dhchap_host *host;
	enum tgt_auth_step step;
	int authenticated;
	int logged;        /* this transaction's failure has been logged */
	int counted;       /* ... and counted against the host's address */
	int costly;        /* this transaction made us do DH operations */
	int token;         /* ... and holds a DH token (tgt.h): 1 its address's, 2 its pair's */
	int close_pending; /* a re-authentication failed: close the queue */
	unsigned tries;    /* transactions started since the last success */
	uint16_t t_id;
	uint8_t hash, dhgid, hl;
	uint8_t reason; /* Failure1's reason code explanation (FX_AUTH_FAIL_*) */
	int bidir;
	uint32_t s1, s2;
	uint8_t c1[FX_AUTH_MAX_HASH_LEN], c2[FX_AUTH_MAX_HASH_LEN];
	struct fx_auth_dh *dh;
	size_t sess_len;
	uint8_t sess[FX_AUTH_MAX_DH_LEN];
};

static const char *step_str(enum tgt_auth_step s)
{
	switch (s) {
	case STEP_NEGOTIATE:
		return "negotiate";
	case STEP_CHALLENGE:
		return "challenge";
	case STEP_REPLY:
		return "reply";
	case STEP_SUCCESS1:
		return "success1";
	case STEP_SUCCESS2:
		return "success2";
	case STEP_FAILURE1:
		return "failure1";
	case STEP_DONE:
		return "done";
	}
	return "?";
}

/* ------------------------------------------------------------ config */

static int parse_secret(struct fx_target *t, const char *hostnqn, const char *text, const char *opt,
			struct fx_auth_key *key)
{
	const char *why = NULL;
	char hp[NVMF_NQN_SIZE];

	if (text && fx_auth_key_parse(text, key, &why) == 0)
		return 0;
	tgt_printable(hp, sizeof(hp), hostnqn);
	tgt_log(t, "%s for host %s: %s", opt, hp,
		text ? (why ? why : "not a DHHC-1 secret") : "missing");
	return -EINVAL;
}

int tgt_auth_config(struct fx_target *t, const struct fx_target_config *cfg)
{
	uint32_t hashes = cfg->dhchap_hashes ? cfg->dhchap_hashes : FX_TARGET_DHCHAP_HASHES_ALL;
	uint32_t groups = cfg->dhchap_dhgroups ? cfg->dhchap_dhgroups
					       : FX_TARGET_DHCHAP_DHGROUPS_ALL;
	int ret;

	if (!(hashes & FX_TARGET_DHCHAP_HASHES_ALL) || (hashes & ~FX_TARGET_DHCHAP_HASHES_ALL) ||
	    !(groups & FX_TARGET_DHCHAP_DHGROUPS_ALL) ||
	    (groups & ~FX_TARGET_DHCHAP_DHGROUPS_ALL)) {
		tgt_log(t,
			"DH-HMAC-CHAP: hash mask 0x%x / DH group mask 0x%x names no usable or an "
			"unknown id",
			hashes, groups);
		return -EINVAL;
	}
	t->dhchap_hashes = hashes;
	t->dhchap_dhgroups = groups;
	if (!cfg->n_dhchap_hosts)
		return 0;
	if (!cfg->dhchap_hosts)
		return -EINVAL;
	t->dhchap = calloc(cfg->n_dhchap_hosts, sizeof(*t->dhchap));
	if (!t->dhchap)
		return -ENOMEM;
	for (unsigned i = 0; i < cfg->n_dhchap_hosts; i++) {
		const struct fx_target_dhchap_host *in = &cfg->dhchap_hosts[i];
		struct tgt_dhchap_host *h = &t->dhchap[i];

		if (!in->hostnqn || !in->hostnqn[0] || strlen(in->hostnqn) >= NVMF_NQN_SIZE)
			return -EINVAL;
		for (unsigned j = 0; j < i; j++)
			if (strcmp(t->dhchap[j].hostnqn, in->hostnqn) == 0) {
				char hp[NVMF_NQN_SIZE];

				tgt_log(t, "DH-HMAC-CHAP: two secrets for host %s",
					tgt_printable(hp, sizeof(hp), in->hostnqn));
				return -EINVAL;
			}
		t->n_dhchap = i + 1; /* (freed from here on) */
		snprintf(h->hostnqn, sizeof(h->hostnqn), "%s", in->hostnqn);
		ret = parse_secret(t, in->hostnqn, in->secret, "DH-HMAC-CHAP secret", &h->key);
		if (ret)
			return ret;
		if (in->ctrl_secret) {
			ret = parse_secret(t, in->hostnqn, in->ctrl_secret,
					   "DH-HMAC-CHAP controller secret", &h->ctrl_key);
			if (ret)
				return ret;
			h->has_ctrl_key = 1;
		}
	}
	return 0;
}

void tgt_auth_config_free(struct fx_target *t)
{
	if (t->dhchap) {
		for (unsigned i = 0; i < t->n_dhchap; i++) {
			fx_auth_key_wipe(&t->dhchap[i].key);
			fx_auth_key_wipe(&t->dhchap[i].ctrl_key);
		}
		free(t->dhchap);
	}
	t->dhchap = NULL;
	t->n_dhchap = 0;
}

const struct tgt_dhchap_host *tgt_auth_host(const struct fx_target *t, const char *hostnqn)
{
	for (unsigned i = 0; i < t->n_dhchap; i++)
		if (strcmp(t->dhchap[i].hostnqn, hostnqn) == 0)
			return &t->dhchap[i];
	return NULL;
}

/* ------------------------------------------------------------ a queue */

static void abandoned(struct tgt_conn *c, const char *how);

/* Forget the transaction's secrets: the DH key pair, session key and
 * challenges (what a later transaction must not reuse). */
static void transaction_wipe(struct tgt_auth *a)
{
	if (a->dh) {
		fx_auth_dh_free(a->dh);
		a->dh = NULL;
	}
	fx_auth_wipe(a->sess, sizeof(a->sess));
	fx_auth_wipe(a->c1, sizeof(a->c1));
	fx_auth_wipe(a->c2, sizeof(a->c2));
	a->sess_len = 0;
	a->bidir = 0;
}

int tgt_auth_queue_start(struct tgt_conn *c, const struct tgt_dhchap_host *h)
{
	struct tgt_auth *a;

	tgt_auth_queue_free(c);
	a = calloc(1, sizeof(*a));
	if (!a)
		return -ENOMEM;
	a->host = h;
	a->step = STEP_NEGOTIATE;
	c->auth = a;
	return 0;
}

void tgt_auth_queue_free(struct tgt_conn *c)
{
	if (!c->auth)
		return;
	abandoned(c, "closed the connection");
	transaction_wipe(c->auth);
	fx_auth_wipe(c->auth, sizeof(*c->auth));
	free(c->auth);
	c->auth = NULL;
}

int tgt_auth_done(const struct tgt_conn *c)
{
	return !c->auth || c->auth->authenticated;
}

int tgt_auth_must_close(const struct tgt_conn *c)
{
	return c->auth && c->auth->close_pending;
}

/* ------------------------------------------------------------ costs */

/* Wait for one of the target's FX_TGT_AUTH_MAX_DH DH slots: 0, or -EBUSY
 * after FX_TGT_AUTH_DH_WAIT_MS. */
static int dh_enter(struct fx_target *t)
{
	struct timespec ts;
	int ret = 0;

	clock_gettime(CLOCK_REALTIME, &ts);
	ts.tv_sec += FX_TGT_AUTH_DH_WAIT_MS / 1000;
	ts.tv_nsec += (long)(FX_TGT_AUTH_DH_WAIT_MS % 1000) * 1000000L;
	if (ts.tv_nsec >= 1000000000L) {
		ts.tv_sec++;
		ts.tv_nsec -= 1000000000L;
	}
	pthread_mutex_lock(&t->lock);
	while (t->dh_running >= FX_TGT_AUTH_MAX_DH && ret == 0)
		ret = pthread_cond_timedwait(&t->dh_cond, &t->lock, &ts);
	if (t->dh_running < FX_TGT_AUTH_MAX_DH) {
		t->dh_running++;
		ret = 0;
	} else {
		ret = -EBUSY;
	}
	pthread_mutex_unlock(&t->lock);
	if (!ret)
		atomic_fetch_add(&t->dh_ops, 1);
	return ret;
}

static void dh_leave(struct fx_target *t)
{
	pthread_mutex_lock(&t->lock);
	t->dh_running--;
	pthread_cond_signal(&t->dh_cond);
	pthread_mutex_unlock(&t->lock);
}

/* A bucket of DH tokens refilled to now. */
static void bucket_refill(uint64_t *milli, uint64_t *refill_ms, uint64_t now)
{
	if (now > *refill_ms) {
		uint64_t m = *milli + (now - *refill_ms) * FX_TGT_AUTH_DH_PER_S;

		*milli = m > FX_TGT_AUTH_DH_BURST * 1000ull ? FX_TGT_AUTH_DH_BURST * 1000ull : m;
		*refill_ms = now;
	}
}

/* The peer address's DH tokens, refilled to now.  A new address takes a
 * free slot or one whose bucket has refilled (a full bucket is what a new
 * slot starts with: replacing it gives nobody more); with none such, the
 * overflow bucket that all such addresses share (tgt.h).  Under t->lock. */
static struct tgt_dh_peer *dh_peer_locked(struct tgt_conn *c, uint64_t now)
{
	struct fx_target *t = c->t;
	struct tgt_dh_peer *p = NULL;

	for (unsigned i = 0; i < FX_TGT_AUTH_DH_PEERS && !p; i++)
		if (t->dh_peers[i].addr[0] && strcmp(t->dh_peers[i].addr, c->peer_key) == 0)
			p = &t->dh_peers[i];
	for (unsigned i = 0; i < FX_TGT_AUTH_DH_PEERS && !p; i++) {
		struct tgt_dh_peer *q = &t->dh_peers[i];

		if (q->addr[0])
			bucket_refill(&q->milli, &q->refill_ms, now);
		if (!q->addr[0] || q->milli >= FX_TGT_AUTH_DH_BURST * 1000ull) {
			p = q;
			snprintf(p->addr, sizeof(p->addr), "%s", c->peer_key);
			p->milli = FX_TGT_AUTH_DH_BURST * 1000ull;
			p->refill_ms = now;
		}
	}
	if (!p) {
		p = &t->dh_overflow;
		if (!p->refill_ms) { /* (first use) */
			p->milli = FX_TGT_AUTH_DH_BURST * 1000ull;
			p->refill_ms = now;
		}
	}
	bucket_refill(&p->milli, &p->refill_ms, now);
	return p;
}

/* The queue's (host, address) pair if it proved its secret within
 * FX_TGT_AUTH_TRUST_MS, its bucket refilled to now; else NULL.  Under
 * t->lock. */
static struct tgt_dh_trust *dh_trusted_locked(struct tgt_conn *c, uint64_t now)
{
	struct fx_target *t = c->t;

	for (unsigned i = 0; i < FX_TGT_AUTH_DH_TRUSTED; i++) {
		struct tgt_dh_trust *p = &t->dh_trusted[i];

		if (p->host && p->host == c->auth->host && strcmp(p->addr, c->peer_key) == 0) {
			if (now >= p->ok_ms && now - p->ok_ms >= FX_TGT_AUTH_TRUST_MS)
				return NULL;
			bucket_refill(&p->milli, &p->refill_ms, now);
			return p;
		}
	}
	return NULL;
}

/* The queue's host proved its secret: its pair (host, address) gets a
 * bucket of its own, or keeps it (tgt.h, FX_TGT_AUTH_DH_TRUSTED). */
static void dh_trust(struct tgt_conn *c)
{
	struct fx_target *t = c->t;
	struct tgt_dh_trust *p = NULL, *old = NULL;
	uint64_t now = tgt_now_ms();

	pthread_mutex_lock(&t->lock);
	for (unsigned i = 0; i < FX_TGT_AUTH_DH_TRUSTED && !p; i++) {
		struct tgt_dh_trust *q = &t->dh_trusted[i];

		if (q->host == c->auth->host && strcmp(q->addr, c->peer_key) == 0)
			p = q;
		else if (!old || !q->host || (old->host && q->ok_ms < old->ok_ms))
			old = q;
	}
	if (!p) {
		p = old;
		p->host = c->auth->host;
		snprintf(p->addr, sizeof(p->addr), "%s", c->peer_key);
		p->milli = FX_TGT_AUTH_DH_BURST * 1000ull;
		p->refill_ms = now;
	}
	p->ok_ms = now;
	pthread_mutex_unlock(&t->lock);
}

/* Take a DH token: the pair's own when its host proved itself from this
 * address lately, else the address's.  0 (and *which: 2 the pair's, 1 the
 * address's), or the ms until there is one. */
static uint64_t dh_token_take_once(struct tgt_conn *c, int *which)
{
	struct tgt_dh_trust *tp;
	uint64_t *milli, wait = 0, now = tgt_now_ms();

	pthread_mutex_lock(&c->t->lock);
	tp = dh_trusted_locked(c, now);
	*which = tp ? 2 : 1;
	milli = tp ? &tp->milli : &dh_peer_locked(c, now)->milli;
	if (*milli >= 1000)
		*milli -= 1000;
	else
		wait = (1000 - *milli + FX_TGT_AUTH_DH_PER_S - 1) / FX_TGT_AUTH_DH_PER_S;
	pthread_mutex_unlock(&c->t->lock);
	return wait;
}

static uint64_t dh_token_take(struct tgt_conn *c, int *which)
{
	uint64_t wait = dh_token_take_once(c, which);

	/* (a short wait, when the next token is that close, rather than a
	 * failure: tgt.h) */
	if (wait && wait <= FX_TGT_AUTH_DH_TOKEN_WAIT_MS) {
		usleep((useconds_t)wait * 1000u);
		wait = dh_token_take_once(c, which);
	}
	return wait;
}

/* The host proved its secret: the transaction's token goes back where it
 * came from (which: dh_token_take's). */
static void dh_token_give_back(struct tgt_conn *c, int which)
{
	uint64_t *milli, now = tgt_now_ms();
	struct tgt_dh_trust *tp;

	pthread_mutex_lock(&c->t->lock);
	tp = which == 2 ? dh_trusted_locked(c, now) : NULL;
	milli = tp ? &tp->milli : &dh_peer_locked(c, now)->milli;
	*milli = *milli + 1000 > FX_TGT_AUTH_DH_BURST * 1000ull ? FX_TGT_AUTH_DH_BURST * 1000ull
								: *milli + 1000;
	pthread_mutex_unlock(&c->t->lock);
}

/* The (host, address) slot of this queue, under t->lock; with create, a
 * free or the least recently failed slot is taken. */
static struct tgt_auth_backoff *backoff_slot(struct tgt_conn *c, int create)
{
	struct fx_target *t = c->t;
	struct tgt_auth_backoff *old = NULL;
	const char *addr = c->peer_key;

	for (unsigned i = 0; i < FX_TGT_AUTH_BACKOFF_SLOTS; i++) {
		struct tgt_auth_backoff *b = &t->auth_backoff[i];

		if (b->host == c->auth->host && strcmp(b->addr, addr) == 0)
			return b;
		if (!old || !b->host || (old->host && b->last_ms < old->last_ms))
			old = b;
	}
	if (!create)
		return NULL;
	memset(old, 0, sizeof(*old));
	old->host = c->auth->host;
	snprintf(old->addr, sizeof(old->addr), "%s", addr);
	return old;
}

/* A transaction of this queue failed: count it for its host and address. */
static void backoff_failed(struct tgt_conn *c)
{
	struct tgt_auth_backoff *b;
	uint64_t now = tgt_now_ms();

	pthread_mutex_lock(&c->t->lock);
	b = backoff_slot(c, 1);
	b->fails++;
	b->last_ms = now;
	if (b->fails >= FX_TGT_AUTH_FREE_FAILS) {
		unsigned sh = b->fails - FX_TGT_AUTH_FREE_FAILS;
		uint64_t wait = sh > 8 ? FX_TGT_AUTH_BACKOFF_MAX_MS
				       : (uint64_t)FX_TGT_AUTH_BACKOFF_MS << sh;

		if (wait > FX_TGT_AUTH_BACKOFF_MAX_MS)
			wait = FX_TGT_AUTH_BACKOFF_MAX_MS;
		b->until_ms = now + wait;
	}
	pthread_mutex_unlock(&c->t->lock);
}

static void backoff_succeeded(struct tgt_conn *c)
{
	struct tgt_auth_backoff *b;

	pthread_mutex_lock(&c->t->lock);
	b = backoff_slot(c, 0);
	if (b)
		memset(b, 0, sizeof(*b));
	pthread_mutex_unlock(&c->t->lock);
}

/* ms this host must still wait here before a new transaction (0: none) */
static uint64_t backoff_wait(struct tgt_conn *c)
{
	struct tgt_auth_backoff *b;
	uint64_t now = tgt_now_ms(), wait = 0;

	pthread_mutex_lock(&c->t->lock);
	b = backoff_slot(c, 0);
	if (b && b->until_ms > now)
		wait = b->until_ms - now;
	pthread_mutex_unlock(&c->t->lock);
	return wait;
}

/*
 * A transaction that made us do DH work ended neither in success nor in a
 * failure we found: the host left it (how: a new Negotiate, a Failure2,
 * the connection's end).  That is what a host that knows only a host NQN
 * does to make us spend (a Challenge costs a key pair, abandoning it costs
 * the host nothing): a failure like any other, for the backoff and the log
 * (whose lines are bounded target-wide).
 */
static void abandoned(struct tgt_conn *c, const char *how)
{
	struct tgt_auth *a = c->auth;
	char hp[NVMF_NQN_SIZE], what[200];

	if (!a->costly || a->counted)
		return;
	a->counted = 1;
	backoff_failed(c);
	if (c->t->stop)
		return; /* (our own stop ends it: nothing to say) */
	tgt_printable(hp, sizeof(hp), a->host->hostnqn);
	snprintf(what, sizeof(what), "abandoned authentication as host %.160s", hp);
	tgt_log_must(c->t, c->peer_key, what,
		     "%s qid %u: host %s abandoned DH-HMAC-CHAP "
		     "authentication after our challenge (%s); counted as a failed attempt",
		     c->peer, c->qid, hp, how);
}

int tgt_auth_allows(const struct tgt_conn *c, const struct nvme_sqe *sqe)
{
	uint8_t fctype;

	if (tgt_auth_done(c))
		return 1;
	if (sqe->opcode != NVME_FABRICS_OPCODE)
		return 0;
	fctype = ((const uint8_t *)sqe)[4];
	return fctype == NVMF_FCTYPE_AUTH_SEND || fctype == NVMF_FCTYPE_AUTH_RECV ||
	       fctype == TGT_FCTYPE_DISCONNECT;
}

/*
 * The transaction failed: the queue is not (or no longer) authenticated and
 * the next AUTH_Receive gets Failure1 with reason rc.  One log line per
 * transaction: host NQN, queue and why (detail: what exactly, or NULL).
 */
static int fail(struct tgt_conn *c, uint8_t rc, const char *detail)
{
	struct tgt_auth *a = c->auth;
	char hp[NVMF_NQN_SIZE], what[200];

	if (a->authenticated)
		a->close_pending = 1; /* a re-authentication: the queue goes */
	a->authenticated = 0;
	a->reason = rc;
	a->step = STEP_FAILURE1;
	transaction_wipe(a);
	/* Only what cost us DH operations is held against the host's address:
	 * a malformed message or a wrong response with the null group costs
	 * no more than any command. */
	if (!a->counted && a->costly) {
		a->counted = 1;
		backoff_failed(c);
	}
	if (a->logged)
		return 0;
	a->logged = 1;
	tgt_printable(hp, sizeof(hp), a->host->hostnqn);
	snprintf(what, sizeof(what), "failed authentication as host %.160s", hp);
	tgt_log_must(c->t, c->peer_key, what,
		     "%s qid %u: host %s failed DH-HMAC-CHAP authentication: %s%s%s", c->peer,
		     c->qid, hp,
		     rc == FX_AUTH_FAIL_FAILED && !detail ? "response mismatch (wrong secret?)"
							  : fx_auth_reason_str(rc),
		     detail ? ": " : "", detail ? detail : "");
	return 0;
}

/* The transaction succeeded: the queue takes commands (said for admin
 * queues, and for every queue when verbose). */
static void authenticated(struct tgt_conn *c)
{
	struct tgt_auth *a = c->auth;
	char hp[NVMF_NQN_SIZE];

	a->authenticated = 1;
	a->counted = 1;       /* (settled: never abandoned) */
	a->close_pending = 0; /* (proved itself again after a failure) */
	a->tries = 0;
	a->step = STEP_DONE;
	backoff_succeeded(c);
	if (c->qid == 0 || c->t->verbose)
		tgt_log(c->t, "%s qid %u: host %s authenticated (DH-HMAC-CHAP, %s, DH group %s%s)",
			c->peer, c->qid, tgt_printable(hp, sizeof(hp), a->host->hostnqn),
			fx_auth_hash_name(a->hash), fx_auth_dhgroup_name(a->dhgid),
			a->bidir ? ", bidirectional" : "");
}

/* The strongest id of mask (bit 1u << id) that the host lists too. */
static int pick(const uint8_t *ids, unsigned n, uint32_t mask, int hi)
{
	for (int id = hi; id >= 0; id--) {
		if (!(mask & (1u << id)))
			continue;
		for (unsigned i = 0; i < n; i++)
			if (ids[i] == id)
				return id;
	}
	return -1;
}

static int on_negotiate(struct tgt_conn *c, const uint8_t *m, uint32_t len)
{
	struct tgt_auth *a = c->auth;
	struct fx_auth_negotiate neg;
	const char *why = NULL;
	uint8_t rc = 0;
	int hash, group;
	uint64_t wait;

	abandoned(c, "started another");
	transaction_wipe(a);
	a->logged = 0;
	a->counted = 0;
	a->costly = 0;
	a->token = 0;
	/* (a re-authentication: the queue stays authenticated meanwhile) */
	if (fx_auth_negotiate_parse(m, len, &neg, &rc, &why) < 0) {
		a->t_id = len >= 6 ? (uint16_t)(m[4] | m[5] << 8) : 0;
		return fail(c, rc, why);
	}
	a->t_id = neg.t_id;
	if (a->tries >= FX_TGT_AUTH_MAX_TRIES) {
		a->logged = a->tries > FX_TGT_AUTH_MAX_TRIES; /* (said once) */
		a->tries = FX_TGT_AUTH_MAX_TRIES + 1;
		a->counted = 1; /* (cost nothing: not held against the address) */
		return fail(c, FX_AUTH_FAIL_FAILED, "too many attempts on this queue");
	}
	a->tries++;
	if ((wait = backoff_wait(c)) != 0) {
		char msg[96];

		snprintf(msg, sizeof(msg),
			 "too many failed attempts from this address; next one in %llu ms",
			 (unsigned long long)wait);
		a->counted = 1; /* (waiting does not make the wait longer) */
		return fail(c, FX_AUTH_FAIL_FAILED, msg);
	}
	if (neg.sc_c != FX_AUTH_SC_C_NONE)
		return fail(c, FX_AUTH_FAIL_CONCAT_MISMATCH, "we offer no secure channel");
	hash = pick(neg.hash_ids, neg.nhash, c->t->dhchap_hashes, FX_AUTH_HASH_SHA512);
	if (hash < 0)
		return fail(c, FX_AUTH_FAIL_HASH_UNUSABLE, "none of the host's is allowed here");
	group = pick(neg.dh_ids, neg.ndh, c->t->dhchap_dhgroups, FX_AUTH_DHGROUP_8192);
	if (group < 0)
		return fail(c, FX_AUTH_FAIL_DHGROUP_UNUSABLE, "none of the host's is allowed here");
	a->hash = (uint8_t)hash;
	a->hl = (uint8_t)fx_auth_hash_len(a->hash);
	a->dhgid = (uint8_t)group;
	a->step = STEP_CHALLENGE;
	return 0;
}

static int on_reply(struct tgt_conn *c, const uint8_t *m, uint32_t len)
{
	struct tgt_auth *a = c->auth;
	const struct fx_target *t = c->t;
	uint8_t r1[FX_AUTH_MAX_HASH_LEN];
	struct fx_auth_reply rep;
	size_t dh_len = fx_auth_dh_len(a->dhgid);
	const char *why = NULL;
	uint8_t rc = 0;
	int ok;

	if (fx_auth_reply_parse(m, len, &rep, &rc, &why) < 0)
		return fail(c, rc, why);
	if (rep.t_id != a->t_id)
		return fail(c, FX_AUTH_FAIL_INCORRECT_PAYLOAD, "T_ID is not the transaction's");
	if (rep.hl != a->hl)
		return fail(c, FX_AUTH_FAIL_INCORRECT_PAYLOAD,
			    "HL is not the negotiated hash's length");
	if (a->dhgid == FX_AUTH_DHGROUP_NULL ? rep.dhvlen != 0
					     : (rep.dhvlen == 0 || rep.dhvlen > dh_len))
		return fail(c, FX_AUTH_FAIL_INCORRECT_PAYLOAD, "DHVLEN does not fit the DH group");
	if (rep.dhvlen) {
		int ret;

		if (dh_enter(c->t) < 0)
			return fail(c, FX_AUTH_FAIL_FAILED, "too many authentications at once");
		ret = fx_auth_dh_derive_range_checked(a->dh, rep.dhv, rep.dhvlen, a->sess, dh_len);
		dh_leave(c->t);

		if (ret == -EPROTO)
			return fail(c, FX_AUTH_FAIL_DHGROUP_UNUSABLE,
				    "the host's DH value is out of range");
		if (ret < 0)
			return fail(c, FX_AUTH_FAIL_FAILED, "DH key agreement failed");
		a->sess_len = dh_len;
	}
	if (fx_auth_response(FX_AUTH_ROLE_HOST, a->hash, &a->host->key, a->c1, a->sess, a->sess_len,
			     a->s1, a->t_id, 0, a->host->hostnqn, t->subnqn, r1) < 0)
		return fail(c, FX_AUTH_FAIL_FAILED, "computing the expected response failed");
	ok = fx_auth_mac_equal(r1, rep.rval, a->hl);
	fx_auth_wipe(r1, sizeof(r1));
	if (!ok)
		return fail(c, FX_AUTH_FAIL_FAILED, NULL);
	/* The host knows its secret: whatever comes next, its DH work was no
	 * abuse, and its address keeps its token. */
	if (a->token) {
		dh_token_give_back(c, a->token);
		a->token = 0;
	}
	dh_trust(c);
	/* The host has proved itself: its I/O queue takes its qid now. */
	if (tgt_ctrl_claim_qid(c) < 0)
		return fail(c, FX_AUTH_FAIL_FAILED, "another queue of the controller has this qid");
	a->s2 = rep.seqnum;
	/* CVALID with a sequence number 0 carries C2 for a secure channel,
	 * not for bidirectional authentication (which is what 0 says). */
	a->bidir = rep.cvalid && a->s2 != 0;
	if (a->bidir) {
		if (!a->host->has_ctrl_key)
			return fail(
				c, FX_AUTH_FAIL_FAILED,
				"the host asks us to authenticate, but we have no controller secret "
				"for it (--dhchap-ctrl-key)");
		memcpy(a->c2, rep.cval, a->hl);
	}
	a->step = STEP_SUCCESS1;
	return 0;
}

/* AUTH_Send/AUTH_Receive's own fields (SECP, SPSP0/1, TL/AL) */
static uint16_t check_cmd(const struct tgt_req *r, uint32_t *len)
{
	unsigned field;
	int send;

	if (fx_auth_cmd_parse(r->sqe, &send, len, &field) < 0)
		return TGT_SF_DNR(0, NVME_SC_INVALID_FIELD);
	return 0;
}

uint16_t tgt_auth_send(struct tgt_conn *c, struct tgt_req *r)
{
	struct tgt_auth *a = c->auth;
	const uint8_t *m = r->data;
	uint32_t tl;
	uint16_t t_id, sf;
	uint8_t type, id;

	if ((sf = check_cmd(r, &tl)) != 0)
		return sf;
	if (!m || r->data_len < tl)
		return TGT_SF_DNR(0, TGT_SC_SGL_INVALID_DATA);
	if (!a) /* nothing to authenticate on this queue */
		return TGT_SF_DNR(0, TGT_SC_CMD_SEQ_ERROR);
	if (fx_auth_msg_peek(m, tl, &type, &id, &t_id) < 0) {
		fail(c, FX_AUTH_FAIL_INCORRECT_PAYLOAD, "message shorter than its header");
		return 0;
	}
	if (c->t->verbose)
		tgt_log(c->t, "%s qid %u: AUTH_Send %u bytes, type 0x%02x id 0x%02x in step %s",
			c->peer, c->qid, tl, type, id, step_str(a->step));
	if (type == FX_AUTH_TYPE_COMMON && id == FX_AUTH_ID_NEGOTIATE) {
		on_negotiate(c, m, tl);
		return 0;
	}
	if (type == FX_AUTH_TYPE_COMMON && id == FX_AUTH_ID_FAILURE2) {
		struct fx_auth_failure f2;
		char hp[NVMF_NQN_SIZE];
		int ok = fx_auth_failure_parse(m, tl, &f2, NULL, NULL) == 0;

		/* The host gives up (say, our R2 did not match its controller
		 * secret): the transaction is over and the queue refuses I/O;
		 * a queue that was authenticated (re-authentication) goes. */
		if (a->authenticated || a->close_pending)
			r->close_after = 1;
		if (a->costly && !a->counted) { /* (logged below) */
			a->counted = 1;
			backoff_failed(c);
		}
		a->authenticated = 0;
		a->step = STEP_DONE;
		transaction_wipe(a);
		if (!a->logged)
			tgt_log(c->t,
				"%s qid %u: host %s ended DH-HMAC-CHAP authentication with "
				"Failure2 (%s)",
				c->peer, c->qid, tgt_printable(hp, sizeof(hp), a->host->hostnqn),
				!ok ? "malformed"
				: f2.rescode_exp == FX_AUTH_FAIL_FAILED
					? "our response did not match its controller secret"
					: fx_auth_reason_str(f2.rescode_exp));
		a->logged = 1;
		return 0;
	}
	if (type != FX_AUTH_TYPE_DHCHAP) {
		fail(c, FX_AUTH_FAIL_INCORRECT_MESSAGE, "unknown message type");
		return 0;
	}
	if (!((id == FX_AUTH_ID_REPLY && a->step == STEP_REPLY) ||
	      (id == FX_AUTH_ID_SUCCESS2 && a->step == STEP_SUCCESS2))) {
		fail(c, FX_AUTH_FAIL_INCORRECT_MESSAGE, NULL);
		return 0;
	}
	if (id == FX_AUTH_ID_REPLY) {
		on_reply(c, m, tl);
		return 0;
	}
	{
		const char *why = NULL;
		uint8_t rc = 0;

		if (fx_auth_success2_parse(m, tl, &t_id, &rc, &why) < 0) {
			fail(c, rc, why);
			return 0;
		}
		if (t_id != a->t_id) {
			fail(c, FX_AUTH_FAIL_INCORRECT_PAYLOAD, "T_ID is not the transaction's");
			return 0;
		}
	}
	/* Success2: the host accepted our response. */
	authenticated(c);
	transaction_wipe(a);
	return 0;
}

/* build_challenge() failed the transaction: Failure1 goes instead */
#define BUILD_FAILED 0xFFFFu

static uint16_t build_challenge(struct tgt_conn *c, uint8_t *out, uint32_t al)
{
	struct tgt_auth *a = c->auth;
	size_t dh_len = fx_auth_dh_len(a->dhgid);
	uint8_t dhv[FX_AUTH_MAX_DH_LEN];
	struct fx_auth_challenge ch = {
		.t_id = a->t_id,
		.hl = a->hl,
		.hashid = a->hash,
		.dhgid = a->dhgid,
		.dhvlen = (uint16_t)dh_len,
		.cval = a->c1,
		.dhv = dh_len ? dhv : NULL,
	};

	if (al < sizeof(struct nvmf_auth_challenge_hdr) + a->hl + dh_len)
		return TGT_SF_DNR(0, NVME_SC_INVALID_FIELD);
	if (fx_auth_random(a->c1, a->hl) < 0 || fx_auth_random(&a->s1, sizeof(a->s1)) < 0)
		return TGT_SF(0, NVME_SC_INTERNAL);
	if (!a->s1) /* 0 is not a sequence number */
		a->s1 = 1;
	ch.seqnum = a->s1;
	if (dh_len) {
		if (a->dh)
			fx_auth_dh_free(a->dh);
		a->dh = NULL;
		int ret;

		int which;
		uint64_t wait = dh_token_take(c, &which);

		if (wait) {
			char msg[160];

			snprintf(msg, sizeof(msg),
				 "too many DH transactions from this address (%u, then "
				 "%u a second, that did not authenticate); next one in %llu ms",
				 FX_TGT_AUTH_DH_BURST, FX_TGT_AUTH_DH_PER_S,
				 (unsigned long long)wait);
			fail(c, FX_AUTH_FAIL_FAILED, msg);
			return BUILD_FAILED;
		}
		a->token = which;
		if (dh_enter(c->t) < 0) {
			fail(c, FX_AUTH_FAIL_FAILED, "too many authentications at once");
			return BUILD_FAILED;
		}
		a->costly = 1;
		ret = fx_auth_dh_new(a->dhgid, &a->dh) < 0 ||
		      fx_auth_dh_pub(a->dh, dhv, dh_len) < 0;
		dh_leave(c->t);
		if (ret)
			return TGT_SF(0, NVME_SC_INTERNAL);
	}
	if (fx_auth_challenge_build(out, al, &ch) < 0)
		return TGT_SF(0, NVME_SC_INTERNAL);
	a->step = STEP_REPLY;
	return 0;
}

static uint16_t build_success1(struct tgt_conn *c, uint8_t *out, uint32_t al)
{
	struct tgt_auth *a = c->auth;
	const struct fx_target *t = c->t;
	uint8_t r2[FX_AUTH_MAX_HASH_LEN];
	struct fx_auth_success1 s1 = {
		.t_id = a->t_id, .hl = a->hl, .rvalid = (uint8_t)a->bidir, .rval = r2};
	int n;

	if (al < sizeof(struct nvmf_auth_success1_hdr) + a->hl)
		return TGT_SF_DNR(0, NVME_SC_INVALID_FIELD);
	if (a->bidir &&
	    fx_auth_response(FX_AUTH_ROLE_CTRL, a->hash, &a->host->ctrl_key, a->c2, a->sess,
			     a->sess_len, a->s2, a->t_id, 0, a->host->hostnqn, t->subnqn, r2) < 0)
		return TGT_SF(0, NVME_SC_INTERNAL);
	n = fx_auth_success1_build(out, al, &s1);
	fx_auth_wipe(r2, sizeof(r2));
	if (n < 0)
		return TGT_SF(0, NVME_SC_INTERNAL);
	if (a->bidir)
		a->step = STEP_SUCCESS2;
	if (!a->bidir) {
		authenticated(c);
		transaction_wipe(a);
	}
	return 0;
}

uint16_t tgt_auth_receive(struct tgt_conn *c, struct tgt_req *r)
{
	struct tgt_auth *a = c->auth;
	uint32_t al;
	uint16_t sf;

	if ((sf = check_cmd(r, &al)) != 0)
		return sf;
	if (al > r->sgl_len || al > FX_TGT_ADMIN_BUF)
		return TGT_SF_DNR(0, TGT_SC_SGL_INVALID_DATA);
	if (!a || !r->out)
		return TGT_SF_DNR(0, TGT_SC_CMD_SEQ_ERROR);
	/* Before authentication the queue's buffer is FX_TGT_AUTH_BUF bytes,
	 * more than any message: a longer AL gets that much. */
	if (al > r->out_cap)
		al = r->out_cap;
	if (c->t->verbose)
		tgt_log(c->t, "%s qid %u: AUTH_Receive %u bytes in step %s", c->peer, c->qid, al,
			step_str(a->step));
	/* The message, zero padded to AL (the host's buffer), as nvmet does */
	memset(r->out, 0, al);
	/* An authenticated queue with no transaction going: nothing to
	 * receive, and nothing to fail either (the queue stays as it is). */
	if (a->step == STEP_DONE && a->authenticated)
		return TGT_SF_DNR(0, TGT_SC_CMD_SEQ_ERROR);
	switch (a->step) {
	case STEP_CHALLENGE:
		sf = build_challenge(c, r->out, al);
		if (sf == BUILD_FAILED) {
			memset(r->out, 0, al);
			goto failure1;
		}
		break;
	case STEP_SUCCESS1:
		sf = build_success1(c, r->out, al);
		break;
	default:
failure1 : {
	struct fx_auth_failure f1 = {
		.id = FX_AUTH_ID_FAILURE1, .t_id = a->t_id, .rescode = FX_AUTH_RESCODE_FAILED};

	/* Nothing for the host to receive now: it is out of step. */
	if (a->step != STEP_FAILURE1)
		fail(c, FX_AUTH_FAIL_INCORRECT_MESSAGE, "AUTH_Receive with no message to send");
	f1.rescode_exp = a->reason;
	if (fx_auth_failure_build(r->out, al, &f1) < 0)
		return TGT_SF_DNR(0, NVME_SC_INVALID_FIELD);
	a->step = STEP_DONE;
	/* A failed re-authentication: the queue goes once the host
		 * has its Failure1 (it reconnects and authenticates anew). */
	if (a->close_pending)
		r->close_after = 1;
	sf = 0;
	break;
}
	}
	if (sf)
		return sf;
	r->out_len = al;
	return 0;
}
