/*
 * Helpers every transport's control path shares (see nvmf.h): logging,
 * the clock, the per-thread cancel fd, and the Fabrics commands whose
 * encoding does not depend on the fabric (Connect, Property Get/Set).
 */
#ifndef _GNU_SOURCE /* tests/c/Makefile passes -D_GNU_SOURCE */
#define _GNU_SOURCE
#endif
#include "host/nvmf.h"

#include <errno.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

void fx_nvmf_log(const char *fmt, ...)
{
	va_list ap;
	char line[512];

	va_start(ap, fmt);
	vsnprintf(line, sizeof(line), fmt, ap);
	va_end(ap);
	fprintf(stderr, "fx100io: nvmf: %s\n", line);
}

int64_t fx_nvmf_now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int64_t fx_nvmf_deadline_in(int timeout_ms)
{
	return fx_nvmf_now_ms() + (timeout_ms > 0 ? timeout_ms : FX_NVMF_DEFAULT_TIMEOUT_MS);
}

/* The last authentication failure of this thread (see nvmf.h): kept
 * here, with the other per-thread connect state, so that the Connect
 * helpers clear it without reaching into host/auth_host.c, which sets it. */
static _Thread_local char auth_err[320];

const char *fx_nvmf_auth_error(void)
{
	return auth_err;
}

void fx_nvmf_auth_error_clear(void)
{
	auth_err[0] = 0;
}

void fx_nvmf_auth_error_vset(const char *fmt, va_list ap)
{
	vsnprintf(auth_err, sizeof(auth_err), fmt, ap);
}

/* The calling thread's cancel eventfd (fx_nvmf_set_cancel_fd), -1: none.
 * Per thread, so a connector thread's blocking connect can be cut short
 * while the keep-alive threads and every other caller are unaffected.
 * Shared here because both the transport's network waits and the generic
 * CSTS.RDY poll honour it. */
static _Thread_local int cancel_fd = -1;

void fx_nvmf_set_cancel_fd(int fd)
{
	cancel_fd = fd;
}

int fx_nvmf_cancel_fd(void)
{
	return cancel_fd;
}

int fx_nvmf_sleep_ms(int ms)
{
	if (cancel_fd >= 0) {
		struct pollfd p = {.fd = cancel_fd, .events = POLLIN};
		int64_t until = fx_nvmf_now_ms() + ms;

		for (;;) {
			int64_t left = until - fx_nvmf_now_ms();

			if (left <= 0)
				return 0;
			int r = poll(&p, 1, (int)left);

			if (r > 0)
				return -ECANCELED;
			if (r < 0 && errno != EINTR)
				return 0;
		}
	}
	struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000};

	while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
		;
	return 0;
}

int fx_nvmf_nqn_ok(const char *nqn)
{
	size_t n = strnlen(nqn, NVMF_NQN_SIZE);

	return n > 0 && n < NVMF_NQN_SIZE;
}

void fx_nvmf_connect_cmd(const struct fx_nvmf_params *p, uint16_t qid, uint16_t sqsize,
			 uint16_t cntlid, struct nvme_sqe *sqe, struct nvmf_connect_data *cd)
{
	struct nvmf_connect_cmd cc;

	fx_nvmf_auth_error_clear(); /* a new connect: no stale reason */
	memset(cd, 0, sizeof(*cd));
	memcpy(cd->hostid, p->hostid, sizeof(cd->hostid));
	cd->cntlid = qid ? cntlid : 0xFFFF; /* admin: any (dynamic) controller */
	memcpy(cd->subsysnqn, p->subnqn, strlen(p->subnqn));
	memcpy(cd->hostnqn, p->hostnqn, strlen(p->hostnqn));

	memset(&cc, 0, sizeof(cc));
	cc.opcode = NVME_FABRICS_OPCODE;
	cc.fctype = NVMF_FCTYPE_CONNECT;
	cc.recfmt = 0;
	cc.qid = qid;
	cc.sqsize = sqsize;
	/* KATO belongs to the controller, so only the admin Connect sets it. */
	cc.kato = qid ? 0 : p->kato_ms;
	memcpy(sqe, &cc, sizeof(*sqe));
}

int fx_nvmf_params_set_secret(struct fx_nvmf_params *p, int ctrl, const char *text,
			      const char **why)
{
	return fx_auth_key_parse(text, ctrl ? &p->dhchap_ctrl_key : &p->dhchap_key, why);
}

int fx_nvmf_params_set_tls_key(struct fx_nvmf_params *p, const char *text, const char **why)
{
	return fx_tls_key_parse(text, &p->tls_key, why);
}

void fx_nvmf_params_wipe(struct fx_nvmf_params *p)
{
	fx_tls_key_wipe(&p->tls_key);
	fx_auth_key_wipe(&p->dhchap_key);
	fx_auth_key_wipe(&p->dhchap_ctrl_key);
}

int fx_nvmf_connect_errno(uint16_t sf)
{
	if (NVME_SCT(sf) == 1 && NVME_SC(sf) == NVME_SC_CONNECT_INVALID_HOST)
		return -EACCES;
	if (NVME_SCT(sf) == 1 && NVME_SC(sf) == NVME_SC_CONNECT_INVALID_PARAM)
		return -ENOENT;
	return -EIO;
}

/* A Property Get/Set capsule: 4- or 8-byte register at off (val for Set). */
static void prop_cmd(struct nvme_sqe *sqe, uint8_t fctype, uint32_t off, int size8, uint64_t val)
{
	struct nvmf_property_cmd pc;

	memset(&pc, 0, sizeof(pc));
	pc.opcode = NVME_FABRICS_OPCODE;
	pc.fctype = fctype;
	pc.attrib = size8 ? 1 : 0;
	pc.offset = off;
	pc.value = size8 ? val : (uint32_t)val;
	memcpy(sqe, &pc, sizeof(*sqe));
}

int fx_nvmf_q_prop_get(const struct fx_nvmf_transport *tr, void *q, uint32_t off, int size8,
		       uint64_t *val, int timeout_ms)
{
	struct nvme_sqe sqe;
	struct nvme_cqe cqe;

	prop_cmd(&sqe, NVMF_FCTYPE_PROP_GET, off, size8, 0);
	int r = tr->exec(q, &sqe, NULL, 0, 0, &cqe, timeout_ms);

	if (r)
		return r;
	*val = size8 ? (uint64_t)cqe.dw0 | (uint64_t)cqe.dw1 << 32 : cqe.dw0;
	return 0;
}

int fx_nvmf_q_prop_set(const struct fx_nvmf_transport *tr, void *q, uint32_t off, int size8,
		       uint64_t val, int timeout_ms)
{
	struct nvme_sqe sqe;
	struct nvme_cqe cqe;

	prop_cmd(&sqe, NVMF_FCTYPE_PROP_SET, off, size8, val);
	return tr->exec(q, &sqe, NULL, 0, 0, &cqe, timeout_ms);
}
