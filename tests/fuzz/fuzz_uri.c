/* fuzz-excludes: host/dev.c */
/*
 * The NVMe-oF device's target string (parse_kv in csrc/host/dev.c, which
 * the nvme+tcp and nvme+rdma devices share): the "key=value" lines
 * fx100io.fabric_uri.to_transport_target() makes of an nvme+tcp:// (or
 * nvme+rdma://) URI.
 *
 * Any bytes: no crash, and an accepted target always has a host, port,
 * subsystem and host NQN (NUL-terminated in their fields), nsid > 0,
 * 1..64 queues and positive timeouts.  A well-formed target (what the
 * Python side promises to send: known keys, values without control bytes
 * that fit their fields, plain decimals in range, a 32-digit hex host ID,
 * a queue size of 0 or 2..4096)
 * must be accepted or refused exactly as a reference parser here says, and
 * accepted with exactly its values.
 */
#include "host/dev.c"

#include <ctype.h>
#include <limits.h>

#define FAIL(...)                                          \
	do {                                               \
		fprintf(stderr, "fuzz_uri: " __VA_ARGS__); \
		fprintf(stderr, "\n");                     \
		abort();                                   \
	} while (0)

struct ref {
	char host[256], port[16], subnqn[NVMF_NQN_SIZE], hostnqn[NVMF_NQN_SIZE];
	uint8_t hostid[16];
	unsigned long nsid, queues, qsize, kato_ms, max_xfer, connect_timeout_ms, io_timeout_ms;
	int hdgst, ddgst;
};

static int hexval(int ch)
{
	return isdigit(ch) ? ch - '0' : tolower(ch) - 'a' + 10;
}

/* A plain decimal (1..10 ASCII digits) no larger than max. */
static int decimal(const char *v, unsigned long max, unsigned long *out)
{
	unsigned long x = 0;
	size_t n = strlen(v);

	if (n == 0 || n > 10)
		return 0;
	for (size_t i = 0; i < n; i++) {
		if (v[i] < '0' || v[i] > '9')
			return 0;
		x = x * 10 + (unsigned long)(v[i] - '0');
	}
	if (x > max)
		return 0;
	*out = x;
	return 1;
}

static int str_field(char *dst, size_t cap, const char *v)
{
	if (strlen(v) >= cap)
		return 0;
	strcpy(dst, v);
	return 1;
}

/* Parse a well-formed target into r: 1, or 0 if it is not well-formed. */
static int ref_parse(const char *s, struct ref *r)
{
	memset(r, 0, sizeof(*r));
	r->nsid = 1;
	r->queues = 1;
	r->kato_ms = 30000;
	r->connect_timeout_ms = 10000;
	r->io_timeout_ms = 30000;
	while (*s) {
		const char *end = strchr(s, '\n'), *eq;
		char line[1024], *v;
		size_t n = end ? (size_t)(end - s) : strlen(s);
		int ok;

		if (n == 0 || n >= sizeof(line))
			return 0;
		memcpy(line, s, n);
		line[n] = 0;
		s += n + (end != NULL);
		for (size_t i = 0; i < n; i++)
			if ((unsigned char)line[i] < 0x20 || line[i] == 0x7f)
				return 0;
		eq = strchr(line, '=');
		if (!eq)
			return 0;
		v = line + (eq - line);
		*v++ = 0;
		if (!strcmp(line, "host"))
			ok = str_field(r->host, sizeof(r->host), v);
		else if (!strcmp(line, "port"))
			ok = str_field(r->port, sizeof(r->port), v);
		else if (!strcmp(line, "subnqn"))
			ok = str_field(r->subnqn, sizeof(r->subnqn), v);
		else if (!strcmp(line, "hostnqn"))
			ok = str_field(r->hostnqn, sizeof(r->hostnqn), v);
		else if (!strcmp(line, "hostid")) {
			ok = strlen(v) == 32;
			for (int i = 0; ok && i < 32; i++)
				ok = isxdigit((unsigned char)v[i]);
			for (int i = 0; ok && i < 16; i++)
				r->hostid[i] = (uint8_t)(hexval(v[2 * i]) << 4 |
							 hexval(v[2 * i + 1]));
		} else if (!strcmp(line, "nsid"))
			ok = decimal(v, UINT32_MAX, &r->nsid);
		else if (!strcmp(line, "queues"))
			ok = decimal(v, UINT32_MAX, &r->queues);
		else if (!strcmp(line, "qsize"))
			ok = decimal(v, UINT32_MAX, &r->qsize);
		else if (!strcmp(line, "kato_ms"))
			ok = decimal(v, UINT32_MAX, &r->kato_ms);
		else if (!strcmp(line, "max_xfer"))
			ok = decimal(v, UINT32_MAX, &r->max_xfer);
		else if (!strcmp(line, "connect_timeout_ms"))
			ok = decimal(v, INT_MAX, &r->connect_timeout_ms);
		else if (!strcmp(line, "io_timeout_ms"))
			ok = decimal(v, INT_MAX, &r->io_timeout_ms);
		else if (!strcmp(line, "hdgst") || !strcmp(line, "ddgst")) {
			ok = !strcmp(v, "0") || !strcmp(v, "1");
			*(line[0] == 'h' ? &r->hdgst : &r->ddgst) = v[0] == '1';
		} else
			ok = 0;
		if (!ok)
			return 0;
	}
	return 1;
}

static int ref_accepts(const struct ref *r)
{
	return r->host[0] && r->port[0] && r->subnqn[0] && r->hostnqn[0] && r->nsid &&
	       r->queues >= 1 && r->queues <= 64 && r->qsize != 1 && r->qsize <= 4096 &&
	       r->connect_timeout_ms && r->io_timeout_ms;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char *s = malloc(size + 1);
	struct fx_nvmf_dev *d = calloc(1, sizeof(*d));
	struct ref ref;
	int r, wf;

	if (!s || !d)
		abort();
	memcpy(s, data, size);
	s[size] = 0; /* C sees the string up to the first NUL, as from Python */
	r = parse_kv(d, s);
	if (r == 0) {
		if (!d->addr.host[0] || !memchr(d->addr.host, 0, sizeof(d->addr.host)) ||
		    !d->addr.port[0] || !memchr(d->addr.port, 0, sizeof(d->addr.port)) ||
		    !d->params.subnqn[0] ||
		    !memchr(d->params.subnqn, 0, sizeof(d->params.subnqn)) ||
		    !d->params.hostnqn[0] ||
		    !memchr(d->params.hostnqn, 0, sizeof(d->params.hostnqn)))
			FAIL("accepted without host, port, subsystem or host NQN");
		if (d->nsid == 0 || d->queues == 0 || d->queues > 64 || d->qsize == 1 ||
		    d->qsize > 4096 || d->io_timeout_ms <= 0 || d->params.timeout_ms <= 0)
			FAIL("accepted nsid %u, %u queues of %u, timeouts %d/%d", d->nsid,
			     d->queues, d->qsize, d->params.timeout_ms, d->io_timeout_ms);
	} else if (r != -EINVAL) {
		FAIL("parse_kv returned %d", r);
	}

	wf = ref_parse(s, &ref);
	if (wf && (r == 0) != ref_accepts(&ref))
		FAIL("well-formed target %s (reference: %s)", r ? "refused" : "accepted",
		     ref_accepts(&ref) ? "accept" : "refuse");
	if (wf && r == 0) {
		if (strcmp(ref.host, d->addr.host) || strcmp(ref.port, d->addr.port) ||
		    strcmp(ref.subnqn, d->params.subnqn) || strcmp(ref.hostnqn, d->params.hostnqn))
			FAIL("a string option differs from the target's text");
		if (memcmp(ref.hostid, d->params.hostid, 16))
			FAIL("hostid differs");
		if (ref.nsid != d->nsid || ref.queues != d->queues || ref.qsize != d->qsize ||
		    ref.kato_ms != d->params.kato_ms || ref.max_xfer != d->max_xfer ||
		    ref.connect_timeout_ms != (unsigned long)d->params.timeout_ms ||
		    ref.io_timeout_ms != (unsigned long)d->io_timeout_ms ||
		    ref.hdgst != d->params.hdgst || ref.ddgst != d->params.ddgst)
			FAIL("a number option differs from the target's text");
	}
	free(d);
	free(s);
	return 0;
}
