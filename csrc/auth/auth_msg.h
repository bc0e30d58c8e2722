/*
 * NVMe in-band authentication (DH-HMAC-CHAP) on the wire: the AUTH_Send /
 * AUTH_Receive commands and the messages they carry (NVMe Base 2.x,
 * "Authentication"), with the build and parse helpers the initiator
 * (host/auth_host.c) and our target (target/auth.c) share.
 *
 * Parsing is the one place where the length rules live
 * (docs/architecture.md rule 13):
 * every parse function checks that what the header says fits in the bytes
 * it was given, never reads past len, and accepts trailing bytes (a
 * controller returns AL bytes whatever the message's size).  On error it
 * returns -EPROTO with *reason the Failure reason code to send back
 * (FX_AUTH_FAIL_*) and *why a static sentence for the log/exception.
 * Builders return the message's size or -EINVAL when cap is too small.
 *
 * What the parsers leave to the caller, because it depends on the
 * transaction's state: the transaction id (compare m->t_id), that the
 * hash and DH group are ones that were offered/selected, and that HL is
 * the selected hash's length.
 */
#ifndef FX100IO_AUTH_AUTH_MSG_H
#define FX100IO_AUTH_AUTH_MSG_H

#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "fx100io/nvme.h"
#include "auth/auth_crypto.h"

/* Fabrics command types */
#define NVMF_FCTYPE_AUTH_SEND 0x05
#define NVMF_FCTYPE_AUTH_RECV 0x06

/* Security protocol: DH-HMAC-CHAP; SPSP0/SPSP1 both 01h */
#define FX_AUTH_SECP_DHCHAP 0xE9
#define FX_AUTH_SPSP0 0x01
#define FX_AUTH_SPSP1 0x01

/* Connect response DW0: AUTHREQ bits above CNTLID */
#define FX_NVMF_CONNECT_ATR (1u << 17)  /* authentication transaction required */
#define FX_NVMF_CONNECT_ASCR (1u << 18) /* ... and secure channel concatenation */

/* Status (SCT 1, Fabrics): a command sent before the queue authenticated */
#define FX_NVME_SCT_CMD_SPECIFIC 0x1
#define FX_NVME_SC_AUTH_REQUIRED 0x91

/* Message types and ids */
#define FX_AUTH_TYPE_COMMON 0x00
#define FX_AUTH_TYPE_DHCHAP 0x01
#define FX_AUTH_ID_NEGOTIATE 0x00 /* common */
#define FX_AUTH_ID_CHALLENGE 0x01 /* DH-HMAC-CHAP */
#define FX_AUTH_ID_REPLY 0x02
#define FX_AUTH_ID_SUCCESS1 0x03
#define FX_AUTH_ID_SUCCESS2 0x04
#define FX_AUTH_ID_FAILURE2 0xF0 /* common, host -> controller */
#define FX_AUTH_ID_FAILURE1 0xF1 /* common, controller -> host */

#define FX_AUTH_AUTHID_DHCHAP 0x01 /* protocol descriptor AUTHID */
#define FX_AUTH_SC_C_NONE 0x00     /* no secure channel concatenation */

/* Failure messages: RESCODE and its explanation RESCODE_EXP */
#define FX_AUTH_RESCODE_FAILED 0x01
#define FX_AUTH_FAIL_FAILED 0x01
#define FX_AUTH_FAIL_NOT_USABLE 0x02
#define FX_AUTH_FAIL_CONCAT_MISMATCH 0x03
#define FX_AUTH_FAIL_HASH_UNUSABLE 0x04
#define FX_AUTH_FAIL_DHGROUP_UNUSABLE 0x05
#define FX_AUTH_FAIL_INCORRECT_PAYLOAD 0x06
#define FX_AUTH_FAIL_INCORRECT_MESSAGE 0x07

/* HashIDList and DHgIDList: 30 slots each in the descriptor's 60 */
#define FX_AUTH_MAX_IDS 30

/* The most bytes a host asks for with AUTH_Receive (as Linux does): more
 * than the largest challenge (16 + 64 + 1024). */
#define FX_AUTH_RECV_LEN 4096
/* Largest message either side builds: a reply with SHA-512 and ffdhe8192 */
#define FX_AUTH_MSG_MAX (16 + 2 * FX_AUTH_MAX_HASH_LEN + FX_AUTH_MAX_DH_LEN)

/* ---------------------------------------------------------- wire layouts */

/* AUTH_Send / AUTH_Receive (a Fabrics command overlaying the SQE) */
struct nvmf_auth_cmd {
	uint8_t opcode; /* NVME_FABRICS_OPCODE */
	uint8_t rsvd1;
	uint16_t cid;
	uint8_t fctype;
	uint8_t rsvd2[19];
	struct nvme_sgl_desc dptr;
	uint8_t rsvd3;
	uint8_t spsp0;
	uint8_t spsp1;
	uint8_t secp;
	uint32_t al_tl; /* TL (send) / AL (receive) */
	uint8_t rsvd4[16];
} FX_PACKED;
_Static_assert(sizeof(struct nvmf_auth_cmd) == 64, "AUTH cmd");
_Static_assert(offsetof(struct nvmf_auth_cmd, spsp0) == 41, "AUTH spsp0");
_Static_assert(offsetof(struct nvmf_auth_cmd, secp) == 43, "AUTH secp");
_Static_assert(offsetof(struct nvmf_auth_cmd, al_tl) == 44, "AUTH tl");

struct nvmf_auth_dhchap_desc {
	uint8_t authid;
	uint8_t rsvd;
	uint8_t halen;
	uint8_t dhlen;
	uint8_t idlist[60]; /* [0, 30): hash ids, [30, 60): DH group ids */
} FX_PACKED;
_Static_assert(sizeof(struct nvmf_auth_dhchap_desc) == 64, "descriptor");

struct nvmf_auth_negotiate_hdr {
	uint8_t auth_type; /* common */
	uint8_t auth_id;   /* negotiate */
	uint8_t rsvd[2];
	uint16_t t_id;
	uint8_t sc_c;
	uint8_t napd;
	/* napd descriptors follow */
} FX_PACKED;
_Static_assert(sizeof(struct nvmf_auth_negotiate_hdr) == 8, "negotiate");

struct nvmf_auth_challenge_hdr {
	uint8_t auth_type;
	uint8_t auth_id;
	uint8_t rsvd1[2];
	uint16_t t_id;
	uint8_t hl;
	uint8_t rsvd2;
	uint8_t hashid;
	uint8_t dhgid;
	uint16_t dhvlen;
	uint32_t seqnum;
	/* C1[hl], DH value[dhvlen] */
} FX_PACKED;
_Static_assert(sizeof(struct nvmf_auth_challenge_hdr) == 16, "challenge");
_Static_assert(offsetof(struct nvmf_auth_challenge_hdr, dhvlen) == 10, "challenge dhvlen");

struct nvmf_auth_reply_hdr {
	uint8_t auth_type;
	uint8_t auth_id;
	uint8_t rsvd1[2];
	uint16_t t_id;
	uint8_t hl;
	uint8_t rsvd2;
	uint8_t cvalid;
	uint8_t rsvd3;
	uint16_t dhvlen;
	uint32_t seqnum;
	/* R1[hl], C2[hl], DH value[dhvlen] */
} FX_PACKED;
_Static_assert(sizeof(struct nvmf_auth_reply_hdr) == 16, "reply");
_Static_assert(offsetof(struct nvmf_auth_reply_hdr, seqnum) == 12, "reply seqnum");

struct nvmf_auth_success1_hdr {
	uint8_t auth_type;
	uint8_t auth_id;
	uint8_t rsvd1[2];
	uint16_t t_id;
	uint8_t hl;
	uint8_t rsvd2;
	uint8_t rvalid;
	uint8_t rsvd3[7];
	/* R2[hl] when rvalid */
} FX_PACKED;
_Static_assert(sizeof(struct nvmf_auth_success1_hdr) == 16, "success1");

struct nvmf_auth_success2 {
	uint8_t auth_type;
	uint8_t auth_id;
	uint8_t rsvd1[2];
	uint16_t t_id;
	uint8_t rsvd2[10];
} FX_PACKED;
_Static_assert(sizeof(struct nvmf_auth_success2) == 16, "success2");

struct nvmf_auth_failure {
	uint8_t auth_type; /* common */
	uint8_t auth_id;   /* failure1 / failure2 */
	uint8_t rsvd1[2];
	uint16_t t_id;
	uint8_t rescode;
	uint8_t rescode_exp;
} FX_PACKED;
_Static_assert(sizeof(struct nvmf_auth_failure) == 8, "failure");

/* ------------------------------------------------------------- commands */

/* AUTH_Send (send != 0, len = TL) or AUTH_Receive (AL) into sqe; the
 * transport fills the data pointer. */
static inline void fx_auth_cmd_init(struct nvme_sqe *sqe, int send, uint32_t len)
{
	struct nvmf_auth_cmd *c = (struct nvmf_auth_cmd *)sqe;

	memset(sqe, 0, sizeof(*sqe));
	c->opcode = NVME_FABRICS_OPCODE;
	c->fctype = send ? NVMF_FCTYPE_AUTH_SEND : NVMF_FCTYPE_AUTH_RECV;
	c->secp = FX_AUTH_SECP_DHCHAP;
	c->spsp0 = FX_AUTH_SPSP0;
	c->spsp1 = FX_AUTH_SPSP1;
	c->al_tl = len;
}

/*
 * A received AUTH_Send/AUTH_Receive (target side): 0 with *send and *len,
 * or -EINVAL when SECP/SPSP0/SPSP1 are not DH-HMAC-CHAP's or the length
 * is 0; *field is the byte offset of the bad field (the error location).
 */
static inline int fx_auth_cmd_parse(const struct nvme_sqe *sqe, int *send, uint32_t *len,
				    unsigned *field)
{
	const struct nvmf_auth_cmd *c = (const struct nvmf_auth_cmd *)sqe;

	*field = 0;
	if (c->opcode != NVME_FABRICS_OPCODE ||
	    (c->fctype != NVMF_FCTYPE_AUTH_SEND && c->fctype != NVMF_FCTYPE_AUTH_RECV)) {
		*field = offsetof(struct nvmf_auth_cmd, fctype);
		return -EINVAL;
	}
	*send = c->fctype == NVMF_FCTYPE_AUTH_SEND;
	*len = c->al_tl;
	if (c->secp != FX_AUTH_SECP_DHCHAP)
		*field = offsetof(struct nvmf_auth_cmd, secp);
	else if (c->spsp0 != FX_AUTH_SPSP0)
		*field = offsetof(struct nvmf_auth_cmd, spsp0);
	else if (c->spsp1 != FX_AUTH_SPSP1)
		*field = offsetof(struct nvmf_auth_cmd, spsp1);
	else if (c->al_tl == 0)
		*field = offsetof(struct nvmf_auth_cmd, al_tl);
	return *field ? -EINVAL : 0;
}

/* ------------------------------------------------------------- messages */

/* Failure reason explanation as text ("authentication failed", ...). */
static inline const char *fx_auth_reason_str(uint8_t rescode_exp)
{
	switch (rescode_exp) {
	case FX_AUTH_FAIL_FAILED:
		return "authentication failed";
	case FX_AUTH_FAIL_NOT_USABLE:
		return "authentication protocol not usable";
	case FX_AUTH_FAIL_CONCAT_MISMATCH:
		return "secure channel concatenation mismatch";
	case FX_AUTH_FAIL_HASH_UNUSABLE:
		return "hash function not usable";
	case FX_AUTH_FAIL_DHGROUP_UNUSABLE:
		return "DH group not usable";
	case FX_AUTH_FAIL_INCORRECT_PAYLOAD:
		return "incorrect payload";
	case FX_AUTH_FAIL_INCORRECT_MESSAGE:
		return "incorrect protocol message";
	default:
		return "unknown reason";
	}
}

static inline int fx_auth_bad(uint8_t *reason, const char **why, uint8_t r, const char *w)
{
	if (reason)
		*reason = r;
	if (why)
		*why = w;
	return -EPROTO;
}

/* Type, id and transaction id of any message (all start alike). */
static inline int fx_auth_msg_peek(const void *buf, size_t len, uint8_t *type, uint8_t *id,
				   uint16_t *t_id)
{
	const uint8_t *b = (const uint8_t *)buf;

	if (!buf || len < 6)
		return -EPROTO;
	*type = b[0];
	*id = b[1];
	*t_id = (uint16_t)(b[4] | b[5] << 8);
	return 0;
}

/* AUTH_Negotiate, parsed: the first DH-HMAC-CHAP descriptor's lists. */
struct fx_auth_negotiate {
	uint16_t t_id;
	uint8_t sc_c;
	uint8_t nhash;
	uint8_t ndh;
	uint8_t hash_ids[FX_AUTH_MAX_IDS];
	uint8_t dh_ids[FX_AUTH_MAX_IDS];
};

static inline int fx_auth_negotiate_build(void *buf, size_t cap, const struct fx_auth_negotiate *m)
{
	size_t n = sizeof(struct nvmf_auth_negotiate_hdr) + sizeof(struct nvmf_auth_dhchap_desc);
	struct nvmf_auth_negotiate_hdr *h = (struct nvmf_auth_negotiate_hdr *)buf;
	struct nvmf_auth_dhchap_desc *d = (struct nvmf_auth_dhchap_desc *)(h + 1);

	if (!buf || cap < n || m->nhash > FX_AUTH_MAX_IDS || m->ndh > FX_AUTH_MAX_IDS)
		return -EINVAL;
	memset(buf, 0, n);
	h->auth_type = FX_AUTH_TYPE_COMMON;
	h->auth_id = FX_AUTH_ID_NEGOTIATE;
	h->t_id = m->t_id;
	h->sc_c = m->sc_c;
	h->napd = 1;
	d->authid = FX_AUTH_AUTHID_DHCHAP;
	d->halen = m->nhash;
	d->dhlen = m->ndh;
	memcpy(d->idlist, m->hash_ids, m->nhash);
	memcpy(d->idlist + FX_AUTH_MAX_IDS, m->dh_ids, m->ndh);
	return (int)n;
}

static inline int fx_auth_negotiate_parse(const void *buf, size_t len, struct fx_auth_negotiate *m,
					  uint8_t *reason, const char **why)
{
	const struct nvmf_auth_negotiate_hdr *h = (const struct nvmf_auth_negotiate_hdr *)buf;
	const struct nvmf_auth_dhchap_desc *d;

	memset(m, 0, sizeof(*m));
	if (!buf || len < sizeof(*h))
		return fx_auth_bad(reason, why, FX_AUTH_FAIL_INCORRECT_PAYLOAD,
				   "negotiate: shorter than its header");
	if (h->auth_type != FX_AUTH_TYPE_COMMON || h->auth_id != FX_AUTH_ID_NEGOTIATE)
		return fx_auth_bad(reason, why, FX_AUTH_FAIL_INCORRECT_MESSAGE,
				   "negotiate: not an AUTH_Negotiate message");
	m->t_id = h->t_id;
	m->sc_c = h->sc_c;
	if (h->napd == 0)
		return fx_auth_bad(reason, why, FX_AUTH_FAIL_INCORRECT_PAYLOAD,
				   "negotiate: no protocol descriptor");
	if ((len - sizeof(*h)) / sizeof(*d) < h->napd)
		return fx_auth_bad(reason, why, FX_AUTH_FAIL_INCORRECT_PAYLOAD,
				   "negotiate: descriptors run past the message");
	d = (const struct nvmf_auth_dhchap_desc *)(h + 1);
	for (unsigned i = 0; i < h->napd; i++, d++) {
		if (d->authid != FX_AUTH_AUTHID_DHCHAP)
			continue;
		if (d->halen > FX_AUTH_MAX_IDS || d->dhlen > FX_AUTH_MAX_IDS)
			return fx_auth_bad(reason, why, FX_AUTH_FAIL_INCORRECT_PAYLOAD,
					   "negotiate: more than 30 hash or DH group ids");
		m->nhash = d->halen;
		m->ndh = d->dhlen;
		memcpy(m->hash_ids, d->idlist, d->halen);
		memcpy(m->dh_ids, d->idlist + FX_AUTH_MAX_IDS, d->dhlen);
		return 0;
	}
	return fx_auth_bad(reason, why, FX_AUTH_FAIL_NOT_USABLE,
			   "negotiate: no DH-HMAC-CHAP protocol descriptor");
}

/* DH-HMAC-CHAP_Challenge; cval/dhv point into the parsed buffer. */
struct fx_auth_challenge {
	uint16_t t_id;
	uint8_t hl;
	uint8_t hashid;
	uint8_t dhgid;
	uint16_t dhvlen;
	uint32_t seqnum;
	const uint8_t *cval; /* C1[hl] */
	const uint8_t *dhv;  /* controller's DH public value [dhvlen], NULL when 0 */
};

static inline int fx_auth_challenge_build(void *buf, size_t cap, const struct fx_auth_challenge *m)
{
	struct nvmf_auth_challenge_hdr *h = (struct nvmf_auth_challenge_hdr *)buf;
	size_t n = sizeof(*h) + (size_t)m->hl + m->dhvlen;

	if (!buf || cap < n || !m->cval || (m->dhvlen && !m->dhv))
		return -EINVAL;
	memset(h, 0, sizeof(*h));
	h->auth_type = FX_AUTH_TYPE_DHCHAP;
	h->auth_id = FX_AUTH_ID_CHALLENGE;
	h->t_id = m->t_id;
	h->hl = m->hl;
	h->hashid = m->hashid;
	h->dhgid = m->dhgid;
	h->dhvlen = m->dhvlen;
	h->seqnum = m->seqnum;
	memcpy(h + 1, m->cval, m->hl);
	if (m->dhvlen)
		memcpy((uint8_t *)(h + 1) + m->hl, m->dhv, m->dhvlen);
	return (int)n;
}

static inline int fx_auth_challenge_parse(const void *buf, size_t len, struct fx_auth_challenge *m,
					  uint8_t *reason, const char **why)
{
	const struct nvmf_auth_challenge_hdr *h = (const struct nvmf_auth_challenge_hdr *)buf;
	size_t glen;

	memset(m, 0, sizeof(*m));
	if (!buf || len < sizeof(*h))
		return fx_auth_bad(reason, why, FX_AUTH_FAIL_INCORRECT_PAYLOAD,
				   "challenge: shorter than its header");
	if (h->auth_type != FX_AUTH_TYPE_DHCHAP || h->auth_id != FX_AUTH_ID_CHALLENGE)
		return fx_auth_bad(reason, why, FX_AUTH_FAIL_INCORRECT_MESSAGE,
				   "challenge: not a DH-HMAC-CHAP_Challenge message");
	m->t_id = h->t_id;
	m->hl = h->hl;
	m->hashid = h->hashid;
	m->dhgid = h->dhgid;
	m->dhvlen = h->dhvlen;
	m->seqnum = h->seqnum;
	if (!fx_auth_hash_len(h->hashid))
		return fx_auth_bad(reason, why, FX_AUTH_FAIL_HASH_UNUSABLE,
				   "challenge: unknown hash function id");
	if (h->hl != fx_auth_hash_len(h->hashid))
		return fx_auth_bad(reason, why, FX_AUTH_FAIL_HASH_UNUSABLE,
				   "challenge: HL is not the hash function's length");
	if (!fx_auth_dhgroup_name(h->dhgid))
		return fx_auth_bad(reason, why, FX_AUTH_FAIL_DHGROUP_UNUSABLE,
				   "challenge: unknown DH group id");
	glen = fx_auth_dh_len(h->dhgid);
	if (h->dhgid == FX_AUTH_DHGROUP_NULL ? h->dhvlen != 0 : h->dhvlen == 0 || h->dhvlen > glen)
		return fx_auth_bad(reason, why, FX_AUTH_FAIL_INCORRECT_PAYLOAD,
				   "challenge: DH value length does not fit the DH group");
	if (len - sizeof(*h) < (size_t)h->hl + h->dhvlen)
		return fx_auth_bad(reason, why, FX_AUTH_FAIL_INCORRECT_PAYLOAD,
				   "challenge: C1 and DH value run past the message");
	m->cval = (const uint8_t *)(h + 1);
	m->dhv = h->dhvlen ? m->cval + h->hl : NULL;
	return 0;
}

/* DH-HMAC-CHAP_Reply; pointers into the parsed buffer. */
struct fx_auth_reply {
	uint16_t t_id;
	uint8_t hl;
	uint8_t cvalid;
	uint16_t dhvlen;
	uint32_t seqnum;     /* S2; 0 when no controller challenge */
	const uint8_t *rval; /* R1[hl] */
	const uint8_t *cval; /* C2[hl] (meaningful when cvalid) */
	const uint8_t *dhv;  /* host's DH public value, NULL when dhvlen is 0 */
};

static inline int fx_auth_reply_build(void *buf, size_t cap, const struct fx_auth_reply *m)
{
	struct nvmf_auth_reply_hdr *h = (struct nvmf_auth_reply_hdr *)buf;
	size_t n = sizeof(*h) + 2 * (size_t)m->hl + m->dhvlen;
	uint8_t *p;

	if (!buf || cap < n || !m->rval || (m->dhvlen && !m->dhv))
		return -EINVAL;
	memset(buf, 0, n);
	h->auth_type = FX_AUTH_TYPE_DHCHAP;
	h->auth_id = FX_AUTH_ID_REPLY;
	h->t_id = m->t_id;
	h->hl = m->hl;
	h->cvalid = m->cvalid ? 1 : 0;
	h->dhvlen = m->dhvlen;
	h->seqnum = m->seqnum;
	p = (uint8_t *)(h + 1);
	memcpy(p, m->rval, m->hl);
	if (m->cvalid && m->cval)
		memcpy(p + m->hl, m->cval, m->hl);
	if (m->dhvlen)
		memcpy(p + 2 * m->hl, m->dhv, m->dhvlen);
	return (int)n;
}

static inline int fx_auth_reply_parse(const void *buf, size_t len, struct fx_auth_reply *m,
				      uint8_t *reason, const char **why)
{
	const struct nvmf_auth_reply_hdr *h = (const struct nvmf_auth_reply_hdr *)buf;

	memset(m, 0, sizeof(*m));
	if (!buf || len < sizeof(*h))
		return fx_auth_bad(reason, why, FX_AUTH_FAIL_INCORRECT_PAYLOAD,
				   "reply: shorter than its header");
	if (h->auth_type != FX_AUTH_TYPE_DHCHAP || h->auth_id != FX_AUTH_ID_REPLY)
		return fx_auth_bad(reason, why, FX_AUTH_FAIL_INCORRECT_MESSAGE,
				   "reply: not a DH-HMAC-CHAP_Reply message");
	m->t_id = h->t_id;
	m->hl = h->hl;
	m->cvalid = h->cvalid & 1;
	m->dhvlen = h->dhvlen;
	m->seqnum = h->seqnum;
	if (h->hl != 32 && h->hl != 48 && h->hl != 64)
		return fx_auth_bad(reason, why, FX_AUTH_FAIL_HASH_UNUSABLE,
				   "reply: HL is no hash function's length");
	if (h->dhvlen > FX_AUTH_MAX_DH_LEN)
		return fx_auth_bad(reason, why, FX_AUTH_FAIL_INCORRECT_PAYLOAD,
				   "reply: DH value longer than any DH group's");
	if (len - sizeof(*h) < 2 * (size_t)h->hl + h->dhvlen)
		return fx_auth_bad(reason, why, FX_AUTH_FAIL_INCORRECT_PAYLOAD,
				   "reply: response, challenge and DH value run past the message");
	m->rval = (const uint8_t *)(h + 1);
	m->cval = m->rval + h->hl;
	m->dhv = h->dhvlen ? m->rval + 2 * (size_t)h->hl : NULL;
	return 0;
}

/* DH-HMAC-CHAP_Success1; rval points into the parsed buffer. */
struct fx_auth_success1 {
	uint16_t t_id;
	uint8_t hl;
	uint8_t rvalid;
	const uint8_t *rval; /* R2[hl] when rvalid, else NULL */
};

static inline int fx_auth_success1_build(void *buf, size_t cap, const struct fx_auth_success1 *m)
{
	struct nvmf_auth_success1_hdr *h = (struct nvmf_auth_success1_hdr *)buf;
	size_t n = sizeof(*h) + (m->rvalid ? (size_t)m->hl : 0);

	if (!buf || cap < n || (m->rvalid && !m->rval))
		return -EINVAL;
	memset(buf, 0, n);
	h->auth_type = FX_AUTH_TYPE_DHCHAP;
	h->auth_id = FX_AUTH_ID_SUCCESS1;
	h->t_id = m->t_id;
	h->hl = m->hl;
	h->rvalid = m->rvalid ? 1 : 0;
	if (m->rvalid)
		memcpy(h + 1, m->rval, m->hl);
	return (int)n;
}

static inline int fx_auth_success1_parse(const void *buf, size_t len, struct fx_auth_success1 *m,
					 uint8_t *reason, const char **why)
{
	const struct nvmf_auth_success1_hdr *h = (const struct nvmf_auth_success1_hdr *)buf;

	memset(m, 0, sizeof(*m));
	if (!buf || len < sizeof(*h))
		return fx_auth_bad(reason, why, FX_AUTH_FAIL_INCORRECT_PAYLOAD,
				   "success1: shorter than its header");
	if (h->auth_type != FX_AUTH_TYPE_DHCHAP || h->auth_id != FX_AUTH_ID_SUCCESS1)
		return fx_auth_bad(reason, why, FX_AUTH_FAIL_INCORRECT_MESSAGE,
				   "success1: not a DH-HMAC-CHAP_Success1 message");
	m->t_id = h->t_id;
	m->hl = h->hl;
	m->rvalid = h->rvalid & 1;
	if (h->hl != 32 && h->hl != 48 && h->hl != 64)
		return fx_auth_bad(reason, why, FX_AUTH_FAIL_HASH_UNUSABLE,
				   "success1: HL is no hash function's length");
	if (m->rvalid) {
		if (len - sizeof(*h) < h->hl)
			return fx_auth_bad(reason, why, FX_AUTH_FAIL_INCORRECT_PAYLOAD,
					   "success1: response runs past the message");
		m->rval = (const uint8_t *)(h + 1);
	}
	return 0;
}

static inline int fx_auth_success2_build(void *buf, size_t cap, uint16_t t_id)
{
	struct nvmf_auth_success2 *h = (struct nvmf_auth_success2 *)buf;

	if (!buf || cap < sizeof(*h))
		return -EINVAL;
	memset(h, 0, sizeof(*h));
	h->auth_type = FX_AUTH_TYPE_DHCHAP;
	h->auth_id = FX_AUTH_ID_SUCCESS2;
	h->t_id = t_id;
	return (int)sizeof(*h);
}

static inline int fx_auth_success2_parse(const void *buf, size_t len, uint16_t *t_id,
					 uint8_t *reason, const char **why)
{
	const struct nvmf_auth_success2 *h = (const struct nvmf_auth_success2 *)buf;

	if (!buf || len < sizeof(*h))
		return fx_auth_bad(reason, why, FX_AUTH_FAIL_INCORRECT_PAYLOAD,
				   "success2: shorter than the message");
	if (h->auth_type != FX_AUTH_TYPE_DHCHAP || h->auth_id != FX_AUTH_ID_SUCCESS2)
		return fx_auth_bad(reason, why, FX_AUTH_FAIL_INCORRECT_MESSAGE,
				   "success2: not a DH-HMAC-CHAP_Success2 message");
	*t_id = h->t_id;
	return 0;
}

/* AUTH_Failure1 (controller) / AUTH_Failure2 (host). */
struct fx_auth_failure {
	uint8_t id; /* FX_AUTH_ID_FAILURE1 or FX_AUTH_ID_FAILURE2 */
	uint16_t t_id;
	uint8_t rescode;
	uint8_t rescode_exp;
};

static inline int fx_auth_failure_build(void *buf, size_t cap, const struct fx_auth_failure *m)
{
	struct nvmf_auth_failure *h = (struct nvmf_auth_failure *)buf;

	if (!buf || cap < sizeof(*h) ||
	    (m->id != FX_AUTH_ID_FAILURE1 && m->id != FX_AUTH_ID_FAILURE2))
		return -EINVAL;
	memset(h, 0, sizeof(*h));
	h->auth_type = FX_AUTH_TYPE_COMMON;
	h->auth_id = m->id;
	h->t_id = m->t_id;
	h->rescode = m->rescode;
	h->rescode_exp = m->rescode_exp;
	return (int)sizeof(*h);
}

/* A failure message of either direction (check m->id for the one wanted). */
static inline int fx_auth_failure_parse(const void *buf, size_t len, struct fx_auth_failure *m,
					uint8_t *reason, const char **why)
{
	const struct nvmf_auth_failure *h = (const struct nvmf_auth_failure *)buf;

	memset(m, 0, sizeof(*m));
	if (!buf || len < sizeof(*h))
		return fx_auth_bad(reason, why, FX_AUTH_FAIL_INCORRECT_PAYLOAD,
				   "failure: shorter than the message");
	if (h->auth_type != FX_AUTH_TYPE_COMMON ||
	    (h->auth_id != FX_AUTH_ID_FAILURE1 && h->auth_id != FX_AUTH_ID_FAILURE2))
		return fx_auth_bad(reason, why, FX_AUTH_FAIL_INCORRECT_MESSAGE,
				   "failure: not an AUTH_Failure message");
	m->id = h->auth_id;
	m->t_id = h->t_id;
	m->rescode = h->rescode;
	m->rescode_exp = h->rescode_exp;
	return 0;
}

#endif
