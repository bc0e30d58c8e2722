/*
 * DH-HMAC-CHAP, the host's side (see auth_host.h): run on a
 * queue right after its Fabrics Connect completed, when the controller's
 * Connect response asks for it, through the transport's synchronous exec:
 *
 *   AUTH_Send    AUTH_Negotiate   (SHA-256/384/512; null, ffdhe2048..8192)
 *   AUTH_Receive Challenge        (hash, group, S1, C1, controller's g^y)
 *   AUTH_Send    Reply            (R1, and C2/S2 with a controller secret, g^x)
 *   AUTH_Receive Success1         (R2 checked when we sent C2)
 *   AUTH_Send    Success2         (bidirectional only)
 *
 * A Failure1 from the controller, a wrong R2 or a malformed message ends the
 * transaction (we send Failure2 where the protocol has us do so) and fails
 * the connect; the reason is kept for the caller (fx_nvmf_auth_error) and
 * logged.  Nothing here logs or keeps a secret or a derived key: those live
 * on the stack or in libcrypto and are wiped before returning.
 *
 * Runs on whatever thread connects (the opener, a background connector),
 * with no Python in it.
 */
#ifndef _GNU_SOURCE /* tests/c/Makefile passes -D_GNU_SOURCE */
#define _GNU_SOURCE
#endif
#include "host/auth_host.h"

#include "auth/auth_crypto.h"
#include "auth/auth_msg.h"
#include "host/nvmf.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int fail(uint16_t qid, int rc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static int fail(uint16_t qid, int rc, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	fx_nvmf_auth_error_vset(fmt, ap);
	va_end(ap);
	fx_nvmf_log("qid %u: DH-HMAC-CHAP: %s", qid, fx_nvmf_auth_error());
	return rc;
}

static uint16_t next_tid(void)
{
	static uint16_t tid;

	return __atomic_add_fetch(&tid, 1, __ATOMIC_RELAXED);
}

struct txn {
	const struct fx_nvmf_transport *tr;
	void *q;
	const struct fx_nvmf_params *p;
	uint16_t qid;
	uint16_t t_id;
	int64_t deadline; /* the connect's (fx_nvmf_now_ms clock), 0: none */
	uint8_t *buf;     /* FX_AUTH_RECV_LEN bytes: every message in and out */
	uint32_t got;     /* bytes the last AUTH_Receive delivered (the parsers' bound) */
};

/* The wait allowed for the next command: what is left of the connect's
 * deadline (0: the queue's own timeout, when there is none); -1: past. */
static int time_left(const struct txn *t)
{
	int64_t left;

	if (!t->deadline)
		return 0;
	left = t->deadline - fx_nvmf_now_ms();
	if (left <= 0)
		return -1;
	return left > 0x7FFFFFFF ? 0x7FFFFFFF : (int)left;
}

static int timed_out(struct txn *t, const char *cmd, const char *what)
{
	return fail(t->qid, -ETIMEDOUT,
		    "%s (%s) did not complete within the connect's time (connect_timeout_ms)", cmd,
		    what);
}

static int auth_send(struct txn *t, uint32_t len, const char *what)
{
	struct nvme_sqe sqe;
	struct nvme_cqe cqe;
	int r;

	int left = time_left(t);

	if (left < 0)
		return timed_out(t, "AUTH_Send", what);
	fx_auth_cmd_init(&sqe, 1, len);
	r = t->tr->exec(t->q, &sqe, t->buf, len, 1, &cqe, left);
	if (r == -ETIMEDOUT && t->deadline)
		return timed_out(t, "AUTH_Send", what);
	if (r == -EIO)
		return fail(t->qid, -EIO, "AUTH_Send (%s) failed with NVMe status 0x%x", what,
			    fx_nvmf_status_field(&cqe));
	if (r)
		return fail(t->qid, r, "AUTH_Send (%s) failed: %s", what, strerror(-r));
	return 0;
}

static int auth_recv(struct txn *t, const char *what)
{
	struct nvme_sqe sqe;
	struct nvme_cqe cqe;
	int r;

	int left = time_left(t);

	if (left < 0)
		return timed_out(t, "AUTH_Receive", what);
	memset(t->buf, 0, FX_AUTH_RECV_LEN);
	fx_auth_cmd_init(&sqe, 0, FX_AUTH_RECV_LEN);
	r = t->tr->exec(t->q, &sqe, t->buf, FX_AUTH_RECV_LEN, 0, &cqe, left);
	/* A controller may end the data at its message's end (SPDK's does):
	 * the parsers then check each message's own length against what came,
	 * so a message cut short is not read as a whole one of zeros. */
	t->got = FX_AUTH_RECV_LEN;
	if (r > 0 || r == -ENODATA) {
		t->got = r > 0 ? (uint32_t)r : 0;
		r = 0;
	}
	if (r == -ETIMEDOUT && t->deadline)
		return timed_out(t, "AUTH_Receive", what);
	if (r == -EIO)
		return fail(t->qid, -EIO, "AUTH_Receive (%s) failed with NVMe status 0x%x", what,
			    fx_nvmf_status_field(&cqe));
	if (r)
		return fail(t->qid, r, "AUTH_Receive (%s) failed: %s", what, strerror(-r));
	return 0;
}

/*
 * Tell the controller we give up (best effort: the connect fails anyway).  Its answer is
 * awaited for at most FAILURE2_WAIT_MS: a controller that tears the queue down instead of
 * answering (Linux's nvmet-rdma can) must not hold the failed connect for its whole budget.
 */
#define FAILURE2_WAIT_MS 2000
static void send_failure2(struct txn *t, uint8_t reason)
{
	struct fx_auth_failure f = {.id = FX_AUTH_ID_FAILURE2,
				    .t_id = t->t_id,
				    .rescode = FX_AUTH_RESCODE_FAILED,
				    .rescode_exp = reason};
	int n = fx_auth_failure_build(t->buf, FX_AUTH_RECV_LEN, &f);
	struct nvme_sqe sqe;
	struct nvme_cqe cqe;
	int left = time_left(t);

	if (n < 0 || left < 0)
		return;
	if (left == 0 || left > FAILURE2_WAIT_MS)
		left = FAILURE2_WAIT_MS;
	fx_auth_cmd_init(&sqe, 1, (uint32_t)n);
	(void)t->tr->exec(t->q, &sqe, t->buf, (uint32_t)n, 1, &cqe, left);
}

/*
 * A message that failed its parser.  cut: it would have parsed had all of
 * the buffer come, so its own length runs past what the controller sent
 * (said so, not taken for a bad message or a wrong secret).
 */
static int malformed(struct txn *t, int cut, const char *why)
{
	if (cut && t->got < FX_AUTH_RECV_LEN)
		return fail(t->qid, -EPROTO,
			    "truncated message from the target: %s (only %u bytes arrived)", why,
			    t->got);
	return fail(t->qid, -EPROTO, "malformed message from the controller: %s", why);
}

/*
 * What came back where message `want` was expected: 0 when it is that
 * message (and of our transaction); a Failure1 from the controller becomes
 * -EACCES with its reason; anything else -EPROTO after a Failure2.
 */
static int expect(struct txn *t, uint8_t want, const char *what, const char *hint)
{
	uint8_t type, id;
	uint16_t tid;

	if (fx_auth_msg_peek(t->buf, t->got, &type, &id, &tid)) {
		send_failure2(t, FX_AUTH_FAIL_INCORRECT_PAYLOAD);
		return fail(t->qid, -EPROTO,
			    "truncated message from the target: %u bytes where the %s was expected",
			    t->got, what);
	}
	if (type == FX_AUTH_TYPE_COMMON && id == FX_AUTH_ID_FAILURE1) {
		struct fx_auth_failure f;

		if (fx_auth_failure_parse(t->buf, t->got, &f, NULL, NULL))
			return fail(t->qid, -EPROTO, "malformed AUTH_Failure1");
		return fail(t->qid, -EACCES,
			    "authentication failed: the controller sent AUTH_Failure1 with reason "
			    "0x%02x (%s)%s",
			    f.rescode_exp, fx_auth_reason_str(f.rescode_exp), hint);
	}
	if (type != FX_AUTH_TYPE_DHCHAP || id != want) {
		send_failure2(t, FX_AUTH_FAIL_INCORRECT_MESSAGE);
		return fail(t->qid, -EPROTO,
			    "the controller sent message type 0x%02x id 0x%02x where the %s was "
			    "expected",
			    type, id, what);
	}
	if (tid != t->t_id) {
		send_failure2(t, FX_AUTH_FAIL_INCORRECT_MESSAGE);
		return fail(t->qid, -EPROTO, "the %s has transaction id %u, ours is %u", what, tid,
			    t->t_id);
	}
	return 0;
}

static int run(struct txn *t)
{
	const struct fx_nvmf_params *p = t->p;
	const int bidi = p->dhchap_ctrl_key.len != 0;
	struct fx_auth_negotiate neg = {
		.t_id = t->t_id,
		.sc_c = FX_AUTH_SC_C_NONE,
		.nhash = 3,
		.ndh = 6,
		.hash_ids = {FX_AUTH_HASH_SHA256, FX_AUTH_HASH_SHA384, FX_AUTH_HASH_SHA512},
		.dh_ids = {FX_AUTH_DHGROUP_NULL, FX_AUTH_DHGROUP_2048, FX_AUTH_DHGROUP_3072,
			   FX_AUTH_DHGROUP_4096, FX_AUTH_DHGROUP_6144, FX_AUTH_DHGROUP_8192},
	};
	struct fx_auth_challenge ch;
	struct fx_auth_success1 s1;
	struct fx_auth_dh *dh = NULL;
	uint8_t c1[FX_AUTH_MAX_HASH_LEN], c2[FX_AUTH_MAX_HASH_LEN];
	uint8_t r1[FX_AUTH_MAX_HASH_LEN], r2[FX_AUTH_MAX_HASH_LEN];
	static _Thread_local uint8_t sess[FX_AUTH_MAX_DH_LEN], pub[FX_AUTH_MAX_DH_LEN];
	size_t hl, plen = 0;
	uint32_t s2 = 0;
	uint8_t reason = 0;
	const char *why = NULL;
	int n, r;

	/* 1. negotiate */
	n = fx_auth_negotiate_build(t->buf, FX_AUTH_RECV_LEN, &neg);
	if (n < 0)
		return fail(t->qid, -EINVAL, "cannot build AUTH_Negotiate");
	r = auth_send(t, (uint32_t)n, "negotiate");
	if (r)
		return r;

	/* 2. challenge */
	r = auth_recv(t, "challenge");
	if (r)
		return r;
	r = expect(t, FX_AUTH_ID_CHALLENGE, "DH-HMAC-CHAP_Challenge",
		   " (no hash function or DH group in common?)");
	if (r)
		return r;
	if (fx_auth_challenge_parse(t->buf, t->got, &ch, &reason, &why)) {
		/* asked before Failure2 overwrites the buffer */
		int cut = fx_auth_challenge_parse(t->buf, FX_AUTH_RECV_LEN, &ch, NULL, NULL) == 0;

		send_failure2(t, reason);
		return malformed(t, cut, why);
	}
	hl = ch.hl;
	memcpy(c1, ch.cval, hl);
	r = 0;
	if (ch.dhgid != FX_AUTH_DHGROUP_NULL) {
		plen = fx_auth_dh_len(ch.dhgid);
		r = fx_auth_dh_new(ch.dhgid, &dh);
		if (r == 0)
			r = fx_auth_dh_pub(dh, pub, plen);
		if (r) {
			send_failure2(t, FX_AUTH_FAIL_FAILED);
			r = fail(t->qid, r, "cannot make a %s key pair: %s",
				 fx_auth_dhgroup_name(ch.dhgid), strerror(-r));
			goto out;
		}
		r = fx_auth_dh_derive(dh, ch.dhv, ch.dhvlen, sess, plen);
		if (r) {
			send_failure2(t, FX_AUTH_FAIL_INCORRECT_PAYLOAD);
			r = fail(t->qid, r == -EPROTO ? -EPROTO : r,
				 "the controller's %s public value is %s",
				 fx_auth_dhgroup_name(ch.dhgid),
				 r == -EPROTO ? "out of range" : "unusable");
			goto out;
		}
	}

	/* 3. reply: R1 (and C2, S2 to have the controller prove itself) */
	r = fx_auth_response(FX_AUTH_ROLE_HOST, ch.hashid, &p->dhchap_key, c1, sess, plen,
			     ch.seqnum, t->t_id, FX_AUTH_SC_C_NONE, p->hostnqn, p->subnqn, r1);
	if (r == 0 && bidi) {
		r = fx_auth_random(c2, hl);
		while (r == 0 && s2 == 0)
			r = fx_auth_random(&s2, sizeof(s2));
	}
	if (r) {
		send_failure2(t, FX_AUTH_FAIL_FAILED);
		r = fail(t->qid, r, "cannot compute the response: %s", strerror(-r));
		goto out;
	}
	struct fx_auth_reply rep = {
		.t_id = t->t_id,
		.hl = (uint8_t)hl,
		.cvalid = (uint8_t)bidi,
		.dhvlen = (uint16_t)plen,
		.seqnum = s2,
		.rval = r1,
		.cval = c2,
		.dhv = plen ? pub : NULL,
	};
	n = fx_auth_reply_build(t->buf, FX_AUTH_RECV_LEN, &rep);
	if (n < 0) {
		r = fail(t->qid, -EINVAL, "cannot build DH-HMAC-CHAP_Reply");
		goto out;
	}
	r = auth_send(t, (uint32_t)n, "reply");
	if (r)
		goto out;

	/* 4. success1 */
	r = auth_recv(t, "success1");
	if (r == -ECONNRESET || r == -EPIPE || r == -ENOTCONN) {
		/* Linux's target fails the controller as it sends Failure1, and on
		 * NVMe/RDMA the teardown can overtake the message: a controller
		 * that hangs up on our response has refused it. */
		r = fail(t->qid, -EACCES,
			 "authentication failed: the controller closed the connection instead of "
			 "answering our DH-HMAC-CHAP reply (wrong dhchap_secret for this host and "
			 "subsystem?)");
		goto out;
	}
	if (r)
		goto out;
	r = expect(t, FX_AUTH_ID_SUCCESS1, "DH-HMAC-CHAP_Success1",
		   " (wrong dhchap_secret for this host and subsystem?)");
	if (r)
		goto out;
	if (fx_auth_success1_parse(t->buf, t->got, &s1, &reason, &why)) {
		int cut = fx_auth_success1_parse(t->buf, FX_AUTH_RECV_LEN, &s1, NULL, NULL) == 0;

		send_failure2(t, reason);
		r = malformed(t, cut, why);
		goto out;
	}
	if (s1.hl != hl) {
		send_failure2(t, FX_AUTH_FAIL_HASH_UNUSABLE);
		r = fail(t->qid, -EPROTO, "Success1's HL %u differs from the challenge's %zu",
			 s1.hl, hl);
		goto out;
	}
	if (!bidi)
		goto out; /* authenticated; an unasked R2 is ignored */

	/* 5. the controller's response, then success2 */
	if (!s1.rvalid) {
		send_failure2(t, FX_AUTH_FAIL_FAILED);
		r = fail(t->qid, -EACCES,
			 "bidirectional authentication failed: the controller sent no response "
			 "to our challenge (AUTH_Failure2 sent, reason 0x%02x: %s)",
			 FX_AUTH_FAIL_FAILED, fx_auth_reason_str(FX_AUTH_FAIL_FAILED));
		goto out;
	}
	r = fx_auth_response(FX_AUTH_ROLE_CTRL, ch.hashid, &p->dhchap_ctrl_key, c2, sess, plen, s2,
			     t->t_id, FX_AUTH_SC_C_NONE, p->hostnqn, p->subnqn, r2);
	if (r) {
		send_failure2(t, FX_AUTH_FAIL_FAILED);
		r = fail(t->qid, r, "cannot compute the controller's response: %s", strerror(-r));
		goto out;
	}
	if (!fx_auth_mac_equal(r2, s1.rval, hl)) {
		send_failure2(t, FX_AUTH_FAIL_FAILED);
		r = fail(t->qid, -EACCES,
			 "bidirectional authentication failed: the controller's response does not "
			 "match dhchap_ctrl_secret (AUTH_Failure2 sent, reason 0x%02x: %s)",
			 FX_AUTH_FAIL_FAILED, fx_auth_reason_str(FX_AUTH_FAIL_FAILED));
		goto out;
	}
	n = fx_auth_success2_build(t->buf, FX_AUTH_RECV_LEN, t->t_id);
	r = n < 0 ? -EINVAL : auth_send(t, (uint32_t)n, "success2");
out:
	fx_auth_dh_free(dh);
	fx_auth_wipe(sess, sizeof(sess));
	fx_auth_wipe(r1, sizeof(r1));
	fx_auth_wipe(r2, sizeof(r2));
	fx_auth_wipe(c2, sizeof(c2));
	return r;
}

int fx_nvmf_auth_host(const struct fx_nvmf_transport *tr, void *q, const struct fx_nvmf_params *p,
		      uint16_t qid, uint32_t connect_dw0, int64_t deadline)
{
	if (!(connect_dw0 & (FX_NVMF_CONNECT_ATR | FX_NVMF_CONNECT_ASCR))) {
		/* A controller secret says the controller must prove itself:
		 * one that asks for no authentication never does.  (Discovery
		 * controllers need not: the device's own connect checks.) */
		if (p->dhchap_ctrl_key.len && strcmp(p->subnqn, NVMF_DISCOVERY_NQN) != 0)
			return fail(
				qid, -EACCES,
				"the controller did not authenticate itself (dhchap_ctrl_secret "
				"given, but its Connect response asks for no authentication)");
		return 0;
	}
	if (connect_dw0 & FX_NVMF_CONNECT_ASCR)
		return fail(qid, -EPROTONOSUPPORT,
			    "the subsystem requires authentication with secure channel "
			    "concatenation (AUTHREQ.ASCR, TLS after DH-HMAC-CHAP), which fx100io "
			    "does not support");
	if (!p->dhchap_key.len)
		return fail(qid, -EACCES,
			    "the subsystem requires DH-HMAC-CHAP authentication; give "
			    "dhchap_secret=... (the host's DHHC-1 secret) in the URI");

	struct txn t = {
		.tr = tr, .q = q, .p = p, .qid = qid, .t_id = next_tid(), .deadline = deadline};
	int r;

	t.buf = calloc(1, FX_AUTH_RECV_LEN);
	if (!t.buf)
		return fail(qid, -ENOMEM, "out of memory");
	r = run(&t);
	fx_auth_wipe(t.buf, FX_AUTH_RECV_LEN);
	free(t.buf);
	if (r == 0)
		fx_nvmf_auth_error_clear();
	return r;
}
