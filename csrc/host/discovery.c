/*
 * Discovery on any transport (see host/ctrl.h): the discovery log reader,
 * which only needs a source of log bytes (so it is fuzzed on its own), and
 * a one-shot discovery controller that feeds it through Get Log Page.
 */
#ifndef _GNU_SOURCE /* tests/c/Makefile passes -D_GNU_SOURCE */
#define _GNU_SOURCE
#endif
#include "host/ctrl.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* A discovery log larger than this is taken as garbage, not allocated. */
#define DISC_MAX_RECORDS 4096
#define DISC_RETRIES 8

int fx_nvmf_disc_log_read(fx_nvmf_get_log_fn get_log, void *ctx,
			  struct nvmf_disc_log_entry **entries, uint32_t *n, uint16_t *status,
			  const char **why)
{
	struct nvmf_disc_log_hdr *hdr;
	struct nvmf_disc_log_entry *e = NULL;
	int r;

	*entries = NULL;
	*n = 0;
	if (why)
		*why = NULL;
	hdr = malloc(sizeof(*hdr));
	if (!hdr)
		return -ENOMEM;

	r = -EAGAIN; /* the log kept changing under us */
	for (int tries = 0; tries < DISC_RETRIES; tries++) {
		uint64_t genctr, numrec;
		int rr = get_log(ctx, 0, hdr, sizeof(*hdr), status);

		if (rr) {
			r = rr;
			break;
		}
		genctr = hdr->genctr;
		numrec = hdr->numrec;
		if (hdr->recfmt != 0 || numrec > DISC_MAX_RECORDS) {
			if (why)
				*why = hdr->recfmt ? "record format not 0" : "too many records";
			r = -EPROTO;
			break;
		}
		free(e);
		e = NULL;
		if (numrec) {
			e = calloc(numrec, sizeof(*e));
			if (!e) {
				r = -ENOMEM;
				break;
			}
			rr = get_log(ctx, sizeof(*hdr), e, (uint32_t)(numrec * sizeof(*e)), status);
			if (rr) {
				r = rr;
				break;
			}
			/* Entries are only consistent with the header if the
			 * generation did not move while we read them. */
			rr = get_log(ctx, 0, hdr, sizeof(*hdr), status);
			if (rr) {
				r = rr;
				break;
			}
			if (hdr->genctr != genctr || hdr->numrec != numrec)
				continue;
		}
		*entries = e;
		*n = (uint32_t)numrec;
		e = NULL;
		r = 0;
		break;
	}
	free(e);
	free(hdr);
	return r;
}

static int disc_get_log(void *ctrl, uint64_t off, void *buf, uint32_t len, uint16_t *status)
{
	return fx_nvmf_ctrl_get_log(ctrl, NVME_LOG_DISCOVERY, off, buf, len, status);
}

int fx_nvmf_discover(const struct fx_nvmf_transport *tr, const struct fx_nvmf_addr *a,
		     const struct fx_nvmf_params *p, struct nvmf_disc_log_entry **entries,
		     uint32_t *n, uint16_t *status)
{
	struct fx_nvmf_params dp = *p;
	struct fx_nvmf_ctrl *c;
	const char *why;
	int r;

	*entries = NULL;
	*n = 0;
	if (status)
		*status = 0;
	memset(dp.subnqn, 0, sizeof(dp.subnqn));
	memcpy(dp.subnqn, NVMF_DISCOVERY_NQN, sizeof(NVMF_DISCOVERY_NQN));
	/* One short exchange: no keep-alive needed. */
	dp.kato_ms = 0;
	r = fx_nvmf_ctrl_open(tr, a, &dp, 0, &c, status);
	if (r)
		return r;
	r = fx_nvmf_disc_log_read(disc_get_log, c, entries, n, status, &why);
	if (why)
		fx_nvmf_log("discovery log: unusable header (%s)", why);
	fx_nvmf_ctrl_close(c);
	return r;
}
