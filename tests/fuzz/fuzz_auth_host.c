/*
 * The initiator's DH-HMAC-CHAP (fx_nvmf_auth_host, csrc/host/auth_host.c,
 * and the message parsers of csrc/auth/auth_msg.h it calls) against a
 * controller that answers AUTH_Receive with arbitrary bytes.
 *
 * Input: u8 flags; then up to two messages, each u16 length (little
 * endian) and that many bytes (cut at the input's end): what the
 * controller returns for the first and second AUTH_Receive (the challenge
 * and the success1 a correct one would send); the rest of the AL bytes are
 * zeros.  flags bit 0: ASCR in the Connect response; bit 1: no ATR (the
 * controller asks for nothing); bit 2: the host has a controller secret
 * (bidirectional); bit 3: write the host's transaction id into each
 * message (so inputs get past that check); bit 4: the AUTH command number
 * (bits 5-7) fails with an NVMe status; without bit 4, bit 5: each
 * AUTH_Receive ends its data at the message (as SPDK's target does), so
 * exec reports the bytes that came (or -ENODATA for none), host/nvmf.h.
 *
 * Checked: every command the host sends is a well-formed AUTH_Send or
 * AUTH_Receive whose data is the size it says; every AUTH_Send carries a
 * message our own parsers accept (negotiate, reply, success2, failure2);
 * AL is FX_AUTH_RECV_LEN; the result is 0 or one of the errnos nvmf.h
 * documents; a bidirectional run never succeeds (an input cannot forge the
 * controller's response without its secret); nothing leaks (LSan).
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "auth/auth_crypto.h"
#include "host/auth_host.h"
#include "auth/auth_msg.h"
#include "host/nvmf.h"

#define FAIL(...)                                                \
	do {                                                     \
		fprintf(stderr, "fuzz_auth_host: " __VA_ARGS__); \
		fprintf(stderr, "\n");                           \
		abort();                                         \
	} while (0)

struct fake {
	const uint8_t *msg[2];
	size_t msg_len[2];
	unsigned recvs, cmds;
	int patch_tid, fail_at, short_data;
	uint16_t tid;
	uint8_t hl; /* from the reply the host sent */
};

static struct fake F;

static int fake_exec(void *q, struct nvme_sqe *sqe, void *data, uint32_t len, int write,
		     struct nvme_cqe *cqe, int timeout_ms)
{
	int send;
	uint32_t cl;
	unsigned field;
	uint8_t reason;
	const char *why;

	(void)q;
	(void)timeout_ms;
	memset(cqe, 0, sizeof(*cqe));
	if (fx_auth_cmd_parse(sqe, &send, &cl, &field))
		FAIL("host sent a bad AUTH command (field %u)", field);
	if (cl != len || send != write || !data)
		FAIL("command length %u vs data %u, send %d write %d", cl, len, send, write);
	if (F.fail_at >= 0 && (int)F.cmds++ == F.fail_at) {
		cqe->status = (uint16_t)(0x4002 << 1);
		return -EIO;
	}
	if (send) {
		uint8_t type, id;
		uint16_t tid;

		if (fx_auth_msg_peek(data, len, &type, &id, &tid))
			FAIL("AUTH_Send of %u bytes", len);
		if (type == FX_AUTH_TYPE_COMMON && id == FX_AUTH_ID_NEGOTIATE) {
			struct fx_auth_negotiate m;

			if (fx_auth_negotiate_parse(data, len, &m, &reason, &why))
				FAIL("negotiate: %s", why);
			F.tid = m.t_id;
		} else if (type == FX_AUTH_TYPE_DHCHAP && id == FX_AUTH_ID_REPLY) {
			struct fx_auth_reply m;

			if (fx_auth_reply_parse(data, len, &m, &reason, &why))
				FAIL("reply: %s", why);
			if (len != 16 + 2u * m.hl + m.dhvlen || m.t_id != F.tid)
				FAIL("reply of %u bytes, hl %u dhvlen %u", len, m.hl, m.dhvlen);
			F.hl = m.hl;
		} else if (type == FX_AUTH_TYPE_DHCHAP && id == FX_AUTH_ID_SUCCESS2) {
			if (fx_auth_success2_parse(data, len, &tid, &reason, &why) || tid != F.tid)
				FAIL("success2");
		} else if (type == FX_AUTH_TYPE_COMMON && id == FX_AUTH_ID_FAILURE2) {
			struct fx_auth_failure m;

			if (fx_auth_failure_parse(data, len, &m, &reason, &why) || m.rescode != 1)
				FAIL("failure2");
		} else {
			FAIL("host sent message type %u id %u", type, id);
		}
		return 0;
	}
	if (len != FX_AUTH_RECV_LEN)
		FAIL("AL %u", len);
	memset(data, 0, len);
	size_t n = 0;

	if (F.recvs < 2) {
		n = F.msg_len[F.recvs] < len ? F.msg_len[F.recvs] : len;
		if (n)
			memcpy(data, F.msg[F.recvs], n);
		if (F.patch_tid) {
			((uint8_t *)data)[4] = (uint8_t)F.tid;
			((uint8_t *)data)[5] = (uint8_t)(F.tid >> 8);
		}
	}
	F.recvs++;
	if (F.short_data && n < len)
		return n ? (int)n : -ENODATA;
	return 0;
}

static void fake_shutdown(void *q)
{
	(void)q;
}

static void fake_close(void *q)
{
	(void)q;
}

static const struct fx_nvmf_transport fake_tr = {
	.name = "fuzz",
	.queue_size = 1,
	.exec = fake_exec,
	.shutdown = fake_shutdown,
	.close = fake_close,
};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static struct fx_nvmf_params p;
	static int ready;
	const uint8_t *end = data + size;

	if (!ready) {
		snprintf(p.hostnqn, sizeof(p.hostnqn), "nqn.2014-08.org.nvmexpress:uuid:fuzz");
		snprintf(p.subnqn, sizeof(p.subnqn), "nqn.2026-11.io.fx100:fuzz");
		if (fx_nvmf_params_set_secret(
			    &p, 0,
			    "DHHC-1:00:ICcuNTxDSlFYX2ZtdHuCiZCXnqWss7rByM/W3eTr8vmMpzdS:", NULL) ||
		    fx_nvmf_params_set_secret(
			    &p, 1,
			    "DHHC-1:01:ICgwOEBIUFhgaHB4gIiQmKCosLjAyNDY4Ojw+AAIEBhKWqU/:", NULL))
			FAIL("test secrets");
		ready = 1;
	}
	if (size < 1)
		return 0;
	uint8_t flags = data[0];
	const uint8_t *in = data + 1;

	memset(&F, 0, sizeof(F));
	F.patch_tid = !!(flags & 8);
	F.fail_at = (flags & 16) ? (flags >> 5) : -1;
	F.short_data = !(flags & 16) && (flags & 32);
	for (int i = 0; i < 2 && end - in >= 2; i++) {
		size_t n = (size_t)(in[0] | in[1] << 8);

		in += 2;
		if (n > (size_t)(end - in))
			n = (size_t)(end - in);
		F.msg[i] = in;
		F.msg_len[i] = n;
		in += n;
	}
	struct fx_nvmf_params hp = p;

	if (!(flags & 4))
		fx_auth_key_wipe(&hp.dhchap_ctrl_key);
	uint32_t dw0 = 1 | ((flags & 2) ? 0 : FX_NVMF_CONNECT_ATR) |
		       ((flags & 1) ? FX_NVMF_CONNECT_ASCR : 0);
	int r = fx_nvmf_auth_host(&fake_tr, NULL, &hp, 0, dw0, 0);

	switch (r) {
	case 0:
		if ((flags & 4) && !(flags & 2) && !(flags & 1))
			FAIL("bidirectional authentication succeeded on forged input");
		break;
	case -EACCES:
	case -EPROTO:
	case -EPROTONOSUPPORT:
	case -EIO:
		if (!fx_nvmf_auth_error()[0])
			FAIL("error %d without a reason", r);
		break;
	default:
		FAIL("unexpected result %d", r);
	}
	fx_nvmf_params_wipe(&hp);
	return 0;
}
