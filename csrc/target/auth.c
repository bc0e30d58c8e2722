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
 * re-authenticate).  Errors in what the host sends (lengths, T_ID, a message
 * out of order, a DH value out of range) are not NVMe errors: the AUTH_Send
 * completes and the reason goes back in Failure1, as Linux's nvmet does;
 * only malformed commands (SECP/SPSP, TL/AL against the data) get an error
 * status.  One log line per failed transaction names the host and the
 * reason, never a secret.  The crypto is nvmf/auth_crypto.c (libcrypto).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tgt.h"

/* Message types and ids (AUTH_Type / AUTH_Id) */
#define MSG_COMMON 0x00
#define MSG_DHCHAP 0x01
#define ID_NEGOTIATE 0x00
#define ID_CHALLENGE 0x01
#define ID_REPLY 0x02
#define ID_SUCCESS1 0x03
#define ID_SUCCESS2 0x04
#define ID_FAILURE2 0xF0
#define ID_FAILURE1 0xF1

#define SECP_DHCHAP 0xE9
#define AUTHID_DHCHAP 0x01
#define DESC_LEN 64        /* protocol descriptor: authid, rsvd, halen, dhlen, idlist[60] */
#define NEG_HDR 8          /* Negotiate header before the descriptors */
#define CHAL_HDR 16
#define REPLY_HDR 16
#define SUCC1_HDR 16
#define SUCC2_LEN 16
#define FAIL_LEN 8         /* Failure1/Failure2 */
#define MIN_MSG 6          /* type, id, rsvd, t_id: what every message has */

/* Failure reason code explanations (rescode is always 01h, "failed") */
#define RC_FAILED 0x01
#define RC_NOT_USABLE 0x02
#define RC_CONCAT_MISMATCH 0x03
#define RC_HASH_UNUSABLE 0x04
#define RC_DHGROUP_UNUSABLE 0x05
#define RC_INCORRECT_PAYLOAD 0x06
#define RC_INCORRECT_MESSAGE 0x07

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
	uint16_t t_id;
	uint8_t hash, dhgid, hl;
	uint8_t reason;    /* Failure1's reason code explanation */
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

static uint16_t get16(const uint8_t *p)
{
	return (uint16_t)(p[0] | p[1] << 8);
}

static uint32_t get32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static void put16(uint8_t *p, uint16_t v)
{
	p[0] = (uint8_t)v;
	p[1] = (uint8_t)(v >> 8);
}

static void put32(uint8_t *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

/* ------------------------------------------------------------ config */

static int parse_secret(struct fx_target *t, const char *hostnqn, const char *text,
                        const char *opt, struct fx_auth_key *key)
{
	const char *why = NULL;
	char hp[NVMF_NQN_SIZE];

	if (text && fx_auth_key_parse(text, key, &why) == 0)
		return 0;
	tgt_printable(hp, sizeof(hp), hostnqn);
	tgt_log(t, "%s for host %s: %s", opt, hp, text ? (why ? why : "not a DHHC-1 secret")
	                                               : "missing");
	return -EINVAL;
}

int tgt_auth_config(struct fx_target *t, const struct fx_target_config *cfg)
{
	uint32_t hashes = cfg->dhchap_hashes ? cfg->dhchap_hashes : FX_TARGET_DHCHAP_HASHES_ALL;
	uint32_t groups = cfg->dhchap_dhgroups ? cfg->dhchap_dhgroups
	                                       : FX_TARGET_DHCHAP_DHGROUPS_ALL;
	int ret;

	if (!(hashes & FX_TARGET_DHCHAP_HASHES_ALL) || (hashes & ~FX_TARGET_DHCHAP_HASHES_ALL) ||
	    !(groups & FX_TARGET_DHCHAP_DHGROUPS_ALL) || (groups & ~FX_TARGET_DHCHAP_DHGROUPS_ALL)) {
		tgt_log(t, "DH-HMAC-CHAP: hash mask 0x%x / DH group mask 0x%x names no usable or an "
		        "unknown id", hashes, groups);
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
	transaction_wipe(c->auth);
	fx_auth_wipe(c->auth, sizeof(*c->auth));
	free(c->auth);
	c->auth = NULL;
}

int tgt_auth_done(const struct tgt_conn *c)
{
	return !c->auth || c->auth->authenticated;
}

int tgt_auth_allows(const struct tgt_conn *c, const struct nvme_sqe *sqe)
{
	uint8_t fctype;

	if (tgt_auth_done(c))
		return 1;
	if (sqe->opcode != NVME_FABRICS_OPCODE)
		return 0;
	fctype = ((const uint8_t *)sqe)[4];
	return fctype == TGT_FCTYPE_AUTH_SEND || fctype == TGT_FCTYPE_AUTH_RECV ||
	       fctype == TGT_FCTYPE_DISCONNECT;
}

static const char *reason_str(uint8_t rc)
{
	switch (rc) {
	case RC_FAILED:
		return "response mismatch (wrong secret?)";
	case RC_NOT_USABLE:
		return "no DH-HMAC-CHAP protocol descriptor";
	case RC_CONCAT_MISMATCH:
		return "secure channel concatenation asked for (not supported)";
	case RC_HASH_UNUSABLE:
		return "no hash function both sides allow";
	case RC_DHGROUP_UNUSABLE:
		return "no DH group both sides allow, or an unusable DH value";
	case RC_INCORRECT_PAYLOAD:
		return "incorrect payload";
	case RC_INCORRECT_MESSAGE:
		return "message out of order";
	}
	return "failed";
}

/*
 * The transaction failed: the queue is not (or no longer) authenticated and
 * the next AUTH_Receive gets Failure1 with reason rc.  One log line per
 * transaction: host NQN, queue and why (detail: what exactly, or NULL).
 */
static int fail(struct tgt_conn *c, uint8_t rc, const char *detail)
{
	struct tgt_auth *a = c->auth;
	char hp[NVMF_NQN_SIZE];

	a->authenticated = 0;
	a->reason = rc;
	a->step = STEP_FAILURE1;
	transaction_wipe(a);
	if (a->logged)
		return 0;
	a->logged = 1;
	tgt_log(c->t, "%s qid %u: host %s failed DH-HMAC-CHAP authentication: %s%s%s", c->peer,
	        c->qid, tgt_printable(hp, sizeof(hp), a->host->hostnqn), reason_str(rc),
	        detail ? ": " : "", detail ? detail : "");
	return 0;
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
	const uint8_t *d = NULL;
	unsigned napd;
	int hash, group;

	transaction_wipe(a);
	a->logged = 0;
	a->authenticated = 0; /* (re-authentication: the queue waits for its outcome) */
	a->t_id = get16(m + 4);
	if (len < NEG_HDR + DESC_LEN)
		return fail(c, RC_INCORRECT_PAYLOAD, "Negotiate shorter than one descriptor");
	if (m[6] != 0) /* SC_C */
		return fail(c, RC_CONCAT_MISMATCH, NULL);
	napd = m[7];
	if (napd == 0)
		return fail(c, RC_INCORRECT_PAYLOAD, "no protocol descriptor");
	for (unsigned i = 0; i < napd && NEG_HDR + (i + 1) * DESC_LEN <= len; i++)
		if (m[NEG_HDR + i * DESC_LEN] == AUTHID_DHCHAP) {
			d = m + NEG_HDR + i * DESC_LEN;
			break;
		}
	if (!d)
		return fail(c, RC_NOT_USABLE, NULL);
	if (d[2] > 30 || d[3] > 30)
		return fail(c, RC_INCORRECT_PAYLOAD, "HALEN or DHLEN above 30");
	hash = pick(d + 4, d[2], c->t->dhchap_hashes, FX_AUTH_HASH_SHA512);
	if (hash < 0)
		return fail(c, RC_HASH_UNUSABLE, NULL);
	group = pick(d + 4 + 30, d[3], c->t->dhchap_dhgroups, FX_AUTH_DHGROUP_8192);
	if (group < 0)
		return fail(c, RC_DHGROUP_UNUSABLE, NULL);
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
	uint32_t dhvlen;
	size_t dh_len = fx_auth_dh_len(a->dhgid);
	int ok;

	if (len < REPLY_HDR)
		return fail(c, RC_INCORRECT_PAYLOAD, "Reply shorter than its header");
	dhvlen = get16(m + 10);
	if (m[6] != a->hl)
		return fail(c, RC_INCORRECT_PAYLOAD, "HL is not the negotiated hash's length");
	if (REPLY_HDR + 2u * a->hl + dhvlen > len)
		return fail(c, RC_INCORRECT_PAYLOAD, "HL and DHVLEN run past the message");
	if (a->dhgid == FX_AUTH_DHGROUP_NULL ? dhvlen != 0 : (dhvlen == 0 || dhvlen > dh_len))
		return fail(c, RC_INCORRECT_PAYLOAD, "DHVLEN does not fit the DH group");
	if (dhvlen) {
		int ret = fx_auth_dh_derive(a->dh, m + REPLY_HDR + 2u * a->hl, dhvlen, a->sess, dh_len);

		if (ret == -EPROTO)
			return fail(c, RC_DHGROUP_UNUSABLE, "the host's DH value is out of range");
		if (ret < 0)
			return fail(c, RC_FAILED, "DH key agreement failed");
		a->sess_len = dh_len;
	}
	if (fx_auth_response(FX_AUTH_ROLE_HOST, a->hash, &a->host->key, a->c1, a->sess, a->sess_len,
	                     a->s1, a->t_id, 0, a->host->hostnqn, t->subnqn, r1) < 0)
		return fail(c, RC_FAILED, "computing the expected response failed");
	ok = fx_auth_mac_equal(r1, m + REPLY_HDR, a->hl);
	fx_auth_wipe(r1, sizeof(r1));
	if (!ok)
		return fail(c, RC_FAILED, NULL);
	a->s2 = get32(m + 12);
	/* CVALID with a sequence number 0 carries C2 for a secure channel,
	 * not for bidirectional authentication (which is what 0 says). */
	a->bidir = (m[8] & 1) && a->s2 != 0;
	if (a->bidir) {
		if (!a->host->has_ctrl_key)
			return fail(c, RC_FAILED,
			            "the host asks us to authenticate, but we have no controller secret "
			            "for it (--dhchap-ctrl-key)");
		memcpy(a->c2, m + REPLY_HDR + a->hl, a->hl);
	}
	a->step = STEP_SUCCESS1;
	return 0;
}

uint16_t tgt_auth_send(struct tgt_conn *c, struct tgt_req *r)
{
	const uint8_t *sqe = (const uint8_t *)r->sqe;
	struct tgt_auth *a = c->auth;
	uint32_t tl = get32(sqe + 44);
	const uint8_t *m = r->data;
	uint8_t type, id;

	if (sqe[43] != SECP_DHCHAP || sqe[41] != 0x01 || sqe[42] != 0x01 || tl == 0)
		return TGT_SF_DNR(0, NVME_SC_INVALID_FIELD);
	if (!m || r->data_len < tl)
		return TGT_SF_DNR(0, TGT_SC_SGL_INVALID_DATA);
	if (!a) /* nothing to authenticate on this queue */
		return TGT_SF_DNR(0, TGT_SC_CMD_SEQ_ERROR);
	if (c->t->verbose)
		tgt_log(c->t, "%s qid %u: AUTH_Send %u bytes, type 0x%02x id 0x%02x in step %s",
		        c->peer, c->qid, tl, tl >= 2 ? m[0] : 0, tl >= 2 ? m[1] : 0,
		        step_str(a->step));
	if (tl < MIN_MSG) {
		fail(c, RC_INCORRECT_PAYLOAD, "message shorter than its header");
		return 0;
	}
	type = m[0];
	id = m[1];
	if (type == MSG_COMMON && id == ID_NEGOTIATE) {
		on_negotiate(c, m, tl);
		return 0;
	}
	if (type == MSG_COMMON && id == ID_FAILURE2) {
		char hp[NVMF_NQN_SIZE];

		/* The host gives up (say, our R2 did not match its controller
		 * secret): the transaction is over and the queue refuses I/O. */
		a->authenticated = 0;
		a->step = STEP_DONE;
		transaction_wipe(a);
		if (!a->logged)
			tgt_log(c->t, "%s qid %u: host %s ended DH-HMAC-CHAP authentication with "
			        "Failure2 (reason 0x%02x: %s)", c->peer, c->qid,
			        tgt_printable(hp, sizeof(hp), a->host->hostnqn), tl >= FAIL_LEN ? m[7] : 0,
			        tl >= FAIL_LEN && m[7] == RC_FAILED ? "our response did not match its "
			                                              "controller secret"
			                                            : "see the host's log");
		a->logged = 1;
		return 0;
	}
	if (type != MSG_DHCHAP) {
		fail(c, RC_INCORRECT_MESSAGE, "unknown message type");
		return 0;
	}
	if (!((id == ID_REPLY && a->step == STEP_REPLY) ||
	      (id == ID_SUCCESS2 && a->step == STEP_SUCCESS2))) {
		fail(c, RC_INCORRECT_MESSAGE, NULL);
		return 0;
	}
	if (get16(m + 4) != a->t_id) {
		fail(c, RC_INCORRECT_PAYLOAD, "T_ID is not the transaction's");
		return 0;
	}
	if (id == ID_REPLY) {
		on_reply(c, m, tl);
		return 0;
	}
	/* Success2: the host accepted our response. */
	a->authenticated = 1;
	a->step = STEP_DONE;
	transaction_wipe(a);
	return 0;
}

static uint16_t build_challenge(struct tgt_conn *c, uint8_t *out, uint32_t al, uint32_t *len)
{
	struct tgt_auth *a = c->auth;
	size_t dh_len = fx_auth_dh_len(a->dhgid);
	uint32_t need = CHAL_HDR + a->hl + (uint32_t)dh_len;

	if (al < need)
		return TGT_SF_DNR(0, NVME_SC_INVALID_FIELD);
	if (fx_auth_random(a->c1, a->hl) < 0 || fx_auth_random(&a->s1, sizeof(a->s1)) < 0)
		return TGT_SF(0, NVME_SC_INTERNAL);
	if (!a->s1) /* 0 is not a sequence number */
		a->s1 = 1;
	if (a->dhgid != FX_AUTH_DHGROUP_NULL) {
		if (a->dh)
			fx_auth_dh_free(a->dh);
		a->dh = NULL;
		if (fx_auth_dh_new(a->dhgid, &a->dh) < 0 ||
		    fx_auth_dh_pub(a->dh, out + CHAL_HDR + a->hl, dh_len) < 0)
			return TGT_SF(0, NVME_SC_INTERNAL);
	}
	out[0] = MSG_DHCHAP;
	out[1] = ID_CHALLENGE;
	put16(out + 4, a->t_id);
	out[6] = a->hl;
	out[8] = a->hash;
	out[9] = a->dhgid;
	put16(out + 10, (uint16_t)dh_len);
	put32(out + 12, a->s1);
	memcpy(out + CHAL_HDR, a->c1, a->hl);
	*len = need;
	a->step = STEP_REPLY;
	return 0;
}

static uint16_t build_success1(struct tgt_conn *c, uint8_t *out, uint32_t al, uint32_t *len)
{
	struct tgt_auth *a = c->auth;
	const struct fx_target *t = c->t;
	char hp[NVMF_NQN_SIZE];

	if (al < SUCC1_HDR + (uint32_t)a->hl)
		return TGT_SF_DNR(0, NVME_SC_INVALID_FIELD);
	out[0] = MSG_DHCHAP;
	out[1] = ID_SUCCESS1;
	put16(out + 4, a->t_id);
	out[6] = a->hl;
	if (a->bidir) {
		if (fx_auth_response(FX_AUTH_ROLE_CTRL, a->hash, &a->host->ctrl_key, a->c2, a->sess,
		                     a->sess_len, a->s2, a->t_id, 0, a->host->hostnqn, t->subnqn,
		                     out + SUCC1_HDR) < 0)
			return TGT_SF(0, NVME_SC_INTERNAL);
		out[8] = 1; /* RVALID */
		a->step = STEP_SUCCESS2;
	} else {
		a->authenticated = 1;
		a->step = STEP_DONE;
	}
	*len = SUCC1_HDR + a->hl;
	if (c->qid == 0 || t->verbose)
		tgt_log(t, "%s qid %u: host %s authenticated%s (DH-HMAC-CHAP, %s, DH group %s%s)",
		        c->peer, c->qid, tgt_printable(hp, sizeof(hp), a->host->hostnqn),
		        a->bidir ? " (pending its check of our response)" : "",
		        fx_auth_hash_name(a->hash), fx_auth_dhgroup_name(a->dhgid),
		        a->bidir ? ", bidirectional" : "");
	if (!a->bidir)
		transaction_wipe(a);
	return 0;
}

uint16_t tgt_auth_receive(struct tgt_conn *c, struct tgt_req *r)
{
	const uint8_t *sqe = (const uint8_t *)r->sqe;
	struct tgt_auth *a = c->auth;
	uint32_t al = get32(sqe + 44);
	uint32_t len = 0;
	uint16_t sf;

	if (sqe[43] != SECP_DHCHAP || sqe[41] != 0x01 || sqe[42] != 0x01 || al == 0)
		return TGT_SF_DNR(0, NVME_SC_INVALID_FIELD);
	if (al > r->sgl_len || al > FX_TGT_ADMIN_BUF)
		return TGT_SF_DNR(0, TGT_SC_SGL_INVALID_DATA);
	if (!a)
		return TGT_SF_DNR(0, TGT_SC_CMD_SEQ_ERROR);
	if (c->t->verbose)
		tgt_log(c->t, "%s qid %u: AUTH_Receive %u bytes in step %s", c->peer, c->qid, al,
		        step_str(a->step));
	/* The message, zero padded to AL (the host's buffer) */
	memset(r->out, 0, al);
	switch (a->step) {
	case STEP_CHALLENGE:
		sf = build_challenge(c, r->out, al, &len);
		break;
	case STEP_SUCCESS1:
		sf = build_success1(c, r->out, al, &len);
		break;
	default:
		/* Nothing for the host to receive now: it is out of step. */
		if (a->step != STEP_FAILURE1)
			fail(c, RC_INCORRECT_MESSAGE, "AUTH_Receive with no message to send");
		if (al < FAIL_LEN)
			return TGT_SF_DNR(0, NVME_SC_INVALID_FIELD);
		r->out[0] = MSG_COMMON;
		r->out[1] = ID_FAILURE1;
		put16(r->out + 4, a->t_id);
		r->out[6] = 0x01; /* rescode: authentication failed */
		r->out[7] = a->reason;
		a->step = STEP_DONE;
		len = FAIL_LEN;
		sf = 0;
		break;
	}
	if (sf)
		return sf;
	r->out_len = al; /* (len bytes of message, then zeros) */
	(void)len;
	return 0;
}
