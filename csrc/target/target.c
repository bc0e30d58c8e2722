/*
 * The target's outer shell: configuration and namespaces, the listening
 * socket, one thread per accepted connection, the controller registry (Fabrics
 * dynamic controller model: the admin Connect creates a controller, I/O
 * Connects join it by cntlid) and the keep-alive timer.
 *
 * Threads: the caller of fx_target_run() accepts (at the connection limit,
 * evicting one still in its handshake or an idle queue without keep alive,
 * or refusing), reaps finished connection threads, and every 100 ms closes
 * connections past their handshake deadline, controllers past their KATO and
 * queues of controllers without a KATO idle past the idle timeout; each
 * connection thread owns its socket's reads and writes, which time out when
 * a host stalls (conn.c).  A connection's fd is closed only by the listener
 * after joining its thread, so other threads may shutdown() it (keep-alive
 * expiry, controller reset, idle reaping, stop) without racing a reuse of
 * the descriptor number.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/fs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <arpa/inet.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "tgt.h"

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static struct fx_target *g_targets;

/* Take a log line from the target's bucket (FX_TGT_LOG_BURST lines, refilled
 * at FX_TGT_LOG_PER_S a second): 1 when it may be written, with *said the
 * lines dropped since the last one written; 0 (counted) when not. */
static int log_take(const struct fx_target *t, unsigned *said)
{
	/* (the limiter is the one part of a const target that logging
	 * changes; the target itself was never defined const) */
	struct tgt_loglim *l = (struct tgt_loglim *)&t->loglim;
	uint64_t now = tgt_now_ms();
	int ok;

	pthread_mutex_lock(&l->lock);
	if (now > l->refill_ms) {
		uint64_t add = (now - l->refill_ms) * FX_TGT_LOG_PER_S;

		/* (in thousandths of a line: no float, no lost fractions) */
		l->milli = l->milli + add > FX_TGT_LOG_BURST * 1000ull ? FX_TGT_LOG_BURST * 1000ull
								       : l->milli + add;
		l->refill_ms = now;
	}
	ok = l->milli >= 1000;
	if (ok) {
		l->milli -= 1000;
		*said = l->dropped;
		l->dropped = 0;
	} else {
		l->dropped++;
	}
	pthread_mutex_unlock(&l->lock);
	return ok;
}

void tgt_log(const struct fx_target *t, const char *fmt, ...)
{
	unsigned dropped = 0;
	va_list ap;

	if (t && t->quiet)
		return;
	/* Most lines are about one connection, and any host can make as
	 * many connections as it likes: the whole target writes a bounded
	 * number of lines, and says how many it left out. */
	if (t && !log_take(t, &dropped))
		return;
	flockfile(stderr);
	if (dropped)
		fprintf(stderr, "fx100io target: (%u log line%s left out: more than %u a second)\n",
			dropped, dropped == 1 ? "" : "s", FX_TGT_LOG_PER_S);
	fputs("fx100io target: ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	funlockfile(stderr);
}

/*
 * A line that must not be lost (tgt.h, FX_TGT_LOG_AGG): written like any
 * other while the bucket allows; past it, counted for (peer, what) and
 * said with its count by the listener's tick within a second.
 */
void tgt_log_must(const struct fx_target *t, const char *peer, const char *what, const char *fmt,
		  ...)
{
	struct tgt_loglim *l = (struct tgt_loglim *)&t->loglim;
	struct tgt_log_agg *slot = NULL;
	unsigned dropped = 0;
	va_list ap;

	if (t->quiet)
		return;
	if (log_take(t, &dropped)) {
		flockfile(stderr);
		if (dropped)
			fprintf(stderr,
				"fx100io target: (%u log line%s left out: more than %u a second)\n",
				dropped, dropped == 1 ? "" : "s", FX_TGT_LOG_PER_S);
		fputs("fx100io target: ", stderr);
		va_start(ap, fmt);
		vfprintf(stderr, fmt, ap);
		va_end(ap);
		fputc('\n', stderr);
		funlockfile(stderr);
		return;
	}
	pthread_mutex_lock(&l->lock);
	/* (log_take counted it as left out: it is said here instead) */
	if (l->dropped)
		l->dropped--;
	for (unsigned i = 0; i < FX_TGT_LOG_AGG && !slot; i++)
		if (!l->agg[i].peer[0] ||
		    (strcmp(l->agg[i].peer, peer) == 0 && strcmp(l->agg[i].what, what) == 0))
			slot = &l->agg[i];
	if (slot) {
		if (!slot->peer[0]) {
			snprintf(slot->peer, sizeof(slot->peer), "%s", peer);
			snprintf(slot->what, sizeof(slot->what), "%s", what);
		}
		slot->n++;
	} else {
		l->agg_other++;
	}
	pthread_mutex_unlock(&l->lock);
}

/* The counts of tgt_log_must, once a second (by the listener's tick);
 * never held back by the bucket: at most FX_TGT_LOG_AGG + 1 lines. */
static void log_agg_flush(struct fx_target *t)
{
	struct tgt_loglim *l = &t->loglim;
	struct tgt_log_agg agg[FX_TGT_LOG_AGG];
	unsigned other, n = 0;
	uint64_t now = tgt_now_ms();

	pthread_mutex_lock(&l->lock);
	if (now - l->agg_ms < 1000 || (!l->agg[0].peer[0] && !l->agg_other)) {
		pthread_mutex_unlock(&l->lock);
		return;
	}
	l->agg_ms = now;
	for (; n < FX_TGT_LOG_AGG && l->agg[n].peer[0]; n++)
		agg[n] = l->agg[n];
	memset(l->agg, 0, sizeof(l->agg));
	other = l->agg_other;
	l->agg_other = 0;
	pthread_mutex_unlock(&l->lock);
	if (t->quiet)
		return;
	flockfile(stderr);
	for (unsigned i = 0; i < n; i++)
		fprintf(stderr, "fx100io target: %s: %u x %s (more log lines than %u a second)\n",
			agg[i].peer, agg[i].n, agg[i].what, FX_TGT_LOG_PER_S);
	if (other)
		fprintf(stderr,
			"fx100io target: %u more failures or refusals from other addresses "
			"(more log lines than %u a second)\n",
			other, FX_TGT_LOG_PER_S);
	funlockfile(stderr);
}

/* The listener's tick: lines left out are said once the flood is over,
 * not only with the next line, which may never come. */
static void log_flush(struct fx_target *t)
{
	unsigned dropped = 0;

	log_agg_flush(t);

	pthread_mutex_lock(&t->loglim.lock);
	dropped = t->loglim.dropped;
	pthread_mutex_unlock(&t->loglim.lock);
	if (t->quiet || !dropped)
		return;
	if (log_take(t, &dropped) && dropped) {
		flockfile(stderr);
		fprintf(stderr, "fx100io target: (%u log line%s left out: more than %u a second)\n",
			dropped, dropped == 1 ? "" : "s", FX_TGT_LOG_PER_S);
		funlockfile(stderr);
	}
}

uint64_t tgt_now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

const char *tgt_printable(char *buf, size_t n, const char *s)
{
	size_t i = 0;

	for (; s[i] && i + 1 < n; i++)
		buf[i] = (s[i] >= 0x20 && s[i] < 0x7f) ? s[i] : '?';
	buf[i] = 0;
	return buf;
}

const char *tgt_ctrl_state_str(enum tgt_ctrl_state s)
{
	switch (s) {
	case TGT_CTRL_DISABLED:
		return "disabled";
	case TGT_CTRL_READY:
		return "ready";
	case TGT_CTRL_SHUTDOWN:
		return "shut down";
	case TGT_CTRL_DEAD:
		return "dead";
	}
	return "?";
}

/* FNV-1a: namespace identifiers only need to be stable and distinct. */
static uint64_t fnv1a(uint64_t h, const void *p, size_t n)
{
	const uint8_t *b = p;

	for (size_t i = 0; i < n; i++) {
		h ^= b[i];
		h *= 0x100000001b3ull;
	}
	return h;
}

/* NGUID and UUID from (subsystem NQN, nsid, path): the same namespace keeps
 * its identity across restarts, which is what hosts (Linux multipath, udev
 * by-id links) key on. */
static void ns_ids(const char *subnqn, struct tgt_ns *ns)
{
	uint64_t h[4];

	for (int i = 0; i < 4; i++) {
		uint64_t v = 0xcbf29ce484222325ull ^ (uint64_t)(i + 1) * 0x9e3779b97f4a7c15ull;

		v = fnv1a(v, subnqn, strlen(subnqn));
		v = fnv1a(v, &ns->nsid, sizeof(ns->nsid));
		v = fnv1a(v, ns->path, strlen(ns->path));
		h[i] = v;
	}
	memcpy(ns->nguid, &h[0], 16);
	memcpy(ns->uuid, &h[2], 16);
	ns->uuid[6] = (uint8_t)((ns->uuid[6] & 0x0f) | 0x40); /* RFC 4122 version 4 ... */
	ns->uuid[8] = (uint8_t)((ns->uuid[8] & 0x3f) | 0x80); /* ... variant 1 */
}

static int open_ns(struct fx_target *t, struct tgt_ns *ns, const char *path, uint32_t nsid)
{
	struct stat st;
	uint64_t bytes;
	int ret;

	ns->nsid = nsid;
	ns->fd = -1;
	ns->dfd = -1;
	ns->path = strdup(path);
	if (!ns->path)
		return -ENOMEM;
	/* Buffered I/O: the page cache makes sendfile() possible for reads
	 * and the host's Flush becomes fdatasync(). */
	ns->fd = open(path, O_RDWR | O_CLOEXEC);
	if (ns->fd < 0) {
		ret = -errno;
		tgt_log(t, "cannot open namespace %u %s: %s", nsid, path, strerror(-ret));
		return ret;
	}
	if (fstat(ns->fd, &st) < 0)
		return -errno;
	if (S_ISBLK(st.st_mode)) {
		if (ioctl(ns->fd, BLKGETSIZE64, &bytes) < 0)
			return -errno;
		ns->is_bdev = 1;
	} else if (S_ISREG(st.st_mode)) {
		bytes = (uint64_t)st.st_size;
	} else {
		tgt_log(t, "namespace %u %s is neither a regular file nor a block device", nsid,
			path);
		return S_ISDIR(st.st_mode) ? -EISDIR : -EINVAL;
	}
	ns->nsze = bytes >> t->lba_shift; /* a partial last block is not served */
	if (ns->nsze == 0) {
		tgt_log(t, "namespace %u %s is smaller than one %u-byte block", nsid, path,
			t->block_size);
		return -EINVAL;
	}
	/* The I/O engine reads data that is not in the page cache with
	 * O_DIRECT (no copy, no cache pollution, deep queues on the device)
	 * and what is cached with sendfile(); the mapping only answers
	 * mincore().  Either may be missing (tmpfs, odd filesystems): then
	 * buffered I/O, which is always correct. */
	{
		/* The same file as fd, not whatever the path names by now
		 * (it could have been renamed or replaced since). */
		char self[64];

		snprintf(self, sizeof(self), "/proc/self/fd/%d", ns->fd);
		ns->dfd = open(self, O_RDWR | O_CLOEXEC | O_DIRECT);
		if (ns->dfd >= 0) {
			struct stat dst;

			if (fstat(ns->dfd, &dst) < 0 || dst.st_dev != st.st_dev ||
			    dst.st_ino != st.st_ino) {
				close(ns->dfd);
				ns->dfd = -1;
			}
		}
	}
	ns->map_len = (size_t)(ns->nsze << t->lba_shift);
	ns->map = mmap(NULL, ns->map_len, PROT_READ, MAP_SHARED, ns->fd, 0);
	if (ns->map == MAP_FAILED)
		ns->map = NULL;
	if (!t->quiet && t->verbose)
		tgt_log(t, "namespace %u %s: O_DIRECT %s, cache residency %s", nsid, path,
			ns->dfd >= 0 ? "yes" : "no (buffered)", ns->map ? "known" : "unknown");
	ns_ids(t->subnqn, ns);
	return 0;
}

/* Bind and listen on p's address (p->svc: the TCP port bound before, when
 * it is opened again).  0 or -errno (the caller names the address). */
int tgt_port_listen(struct fx_target *t, struct tgt_port *p)
{
	struct addrinfo hints, *res = NULL, *ai;
	int fd = -1, ret = -EADDRNOTAVAIL, one = 1;
	const char *host = p->host, *port = p->svc;

	memset(&hints, 0, sizeof(hints));
	hints.ai_family = AF_UNSPEC;
	hints.ai_socktype = SOCK_STREAM;
	hints.ai_flags = AI_PASSIVE;
	ret = getaddrinfo(host && host[0] ? host : NULL, port && port[0] ? port : "4420", &hints,
			  &res);
	if (ret != 0) {
		tgt_log(t, "cannot resolve listen address %s:%s: %s", host ? host : "",
			port ? port : "", gai_strerror(ret));
		return ret == EAI_SERVICE ? -EINVAL : -EADDRNOTAVAIL;
	}
	ret = -EADDRNOTAVAIL;
	for (ai = res; ai; ai = ai->ai_next) {
		fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK,
			    ai->ai_protocol);
		if (fd < 0) {
			ret = -errno;
			continue;
		}
		setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
		if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && listen(fd, 128) == 0)
			break;
		ret = -errno;
		close(fd);
		fd = -1;
	}
	freeaddrinfo(res);
	if (fd < 0)
		return ret; /* the caller names the address with the error */
	struct sockaddr_storage ss;
	socklen_t sl = sizeof(ss);

	/* (once: a port opened again keeps its address, which connection
	 * threads may be reading for the discovery log) */
	if (!p->bound && getsockname(fd, (struct sockaddr *)&ss, &sl) == 0) {
		if (ss.ss_family == AF_INET)
			p->bound = ntohs(((struct sockaddr_in *)&ss)->sin_port);
		else if (ss.ss_family == AF_INET6)
			p->bound = ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
		p->family = ss.ss_family;
		getnameinfo((struct sockaddr *)&ss, sl, p->addr, sizeof(p->addr), NULL, 0,
			    NI_NUMERICHOST);
	}
	p->lfd = fd;
	atomic_store(&p->open, 1);
	return 0;
}

/* The listening ports (cfg->listens, or the one of host/port), their
 * initial ANA states and the namespaces' groups. */
static int ports_create(struct fx_target *t, const struct fx_target_config *cfg)
{
	struct fx_target_listen one = {cfg->host, cfg->port};
	const struct fx_target_listen *l = cfg->n_listens ? cfg->listens : &one;
	unsigned n = cfg->n_listens ? cfg->n_listens : 1;
	int ret;

	if (n > FX_TGT_MAX_PORTS || (cfg->n_listens && !cfg->listens)) {
		tgt_log(t, "%u listening ports: at most %u", n, FX_TGT_MAX_PORTS);
		return -EINVAL;
	}
	for (unsigned i = 0; i < t->n_ns; i++) {
		uint32_t g = cfg->ns_ana_groups ? cfg->ns_ana_groups[i] : 1;

		if (g < 1 || g > FX_TGT_ANA_GROUPS) {
			tgt_log(t, "namespace %u: ANA group %u (1..%u)", i + 1, g,
				FX_TGT_ANA_GROUPS);
			return -EINVAL;
		}
		t->ns[i].anagrpid = g;
	}
	for (unsigned i = 0; i < n; i++) {
		struct tgt_port *p = &t->ports[i];

		p->lfd = -1;
		if ((l[i].host && strlen(l[i].host) >= sizeof(p->host)) ||
		    (l[i].port && strlen(l[i].port) >= sizeof(p->svc)))
			return -EINVAL;
		snprintf(p->host, sizeof(p->host), "%s", l[i].host ? l[i].host : "");
		snprintf(p->svc, sizeof(p->svc), "%s", l[i].port ? l[i].port : "");
		for (unsigned g = 0; g <= FX_TGT_ANA_GROUPS; g++)
			atomic_store(&p->ana[g], NVME_ANA_OPTIMIZED);
		t->n_ports = i + 1;
		ret = tgt_port_listen(t, p);
		if (ret < 0) {
			tgt_log(t, "cannot listen on %s:%s: %s", p->host, p->svc, strerror(-ret));
			return ret;
		}
		/* open-port binds the same TCP port again */
		snprintf(p->svc, sizeof(p->svc), "%d", p->bound);
	}
	for (unsigned i = 0; i < cfg->n_ana; i++) {
		const struct fx_target_ana *a = &cfg->ana[i];

		if (a->portid < 1 || a->portid > t->n_ports ||
		    tgt_ana_set(t, a->portid - 1, a->group, a->state, 0, 0) < 0) {
			tgt_log(t, "bad ANA state: port %u group %u state %u", a->portid, a->group,
				a->state);
			return -EINVAL;
		}
	}
	/* (the initial states are no change; a group that starts in change
	 * leaves it for optimized after ANATT, as one put there later) */
	for (unsigned i = 0; i < t->n_ports; i++) {
		t->ports[i].ana_chgcnt = 0;
		memset(t->ports[i].ana_chg, 0, sizeof(t->ports[i].ana_chg));
	}
	return 0;
}

static void target_free(struct fx_target *t)
{
	for (unsigned i = 0; i < t->n_ns; i++) {
		if (t->ns[i].fd >= 0)
			close(t->ns[i].fd);
		if (t->ns[i].dfd >= 0)
			close(t->ns[i].dfd);
		if (t->ns[i].map)
			munmap(t->ns[i].map, t->ns[i].map_len);
		free(t->ns[i].path);
	}
	free(t->ns);
	for (unsigned i = 0; i < t->n_allow; i++)
		free(t->allow[i]);
	free(t->allow);
	tgt_auth_config_free(t);
	tgt_tls_config_free(t);
	for (unsigned i = 0; i < t->n_ports; i++)
		if (t->ports[i].lfd >= 0)
			close(t->ports[i].lfd);
	tgt_control_close(t);
	if (t->wake[0] >= 0)
		close(t->wake[0]);
	if (t->wake[1] >= 0)
		close(t->wake[1]);
	tgt_iobufs_fini(t);
	pthread_cond_destroy(&t->dh_cond);
	pthread_cond_destroy(&t->drain_cond);
	pthread_mutex_destroy(&t->lock);
	pthread_mutex_destroy(&t->loglim.lock);
	free(t);
}

int fx_target_create(const struct fx_target_config *cfg, struct fx_target **out)
{
	struct fx_target *t;
	int ret;

	*out = NULL;
	if (!cfg || !cfg->subnqn || !cfg->n_ns || !cfg->ns_paths)
		return -EINVAL;
	if (cfg->block_size != 512 && cfg->block_size != 4096)
		return -EINVAL;
	if (strlen(cfg->subnqn) == 0 || strlen(cfg->subnqn) >= NVMF_NQN_SIZE ||
	    strcmp(cfg->subnqn, NVMF_DISCOVERY_NQN) == 0)
		return -EINVAL;
	/* the TLS record fault needs TLS, and a kind that exists */
	if (cfg->fault_tls_after &&
	    (cfg->tls == FX_TARGET_TLS_OFF || cfg->fault_tls_kind < FX_TARGET_FAULT_TLS_TICKET ||
	     cfg->fault_tls_kind > FX_TARGET_FAULT_TLS_WARNING))
		return -EINVAL;
	t = calloc(1, sizeof(*t));
	if (!t)
		return -ENOMEM;
	t->ctl_fd = -1;
	atomic_store(&t->disc_genctr, 1);
	t->wake[0] = t->wake[1] = -1;
	pthread_mutex_init(&t->loglim.lock, NULL);
	t->loglim.milli = FX_TGT_LOG_BURST * 1000ull;
	t->loglim.refill_ms = tgt_now_ms();
	pthread_mutex_init(&t->lock, NULL);
	pthread_cond_init(&t->dh_cond, NULL);
	pthread_cond_init(&t->drain_cond, NULL);
	{
		/* Test knobs (tests/target/test_target_inflight.py): the in-line path
		 * where io_uring works, a slow disk under writes. */
		const char *e = getenv("FX100IO_TARGET_INLINE");

		t->force_inline = e && *e && strcmp(e, "0") != 0;
		e = getenv("FX100IO_TARGET_FAULT_DISK_DELAY_MS");
		if (e && *e)
			t->fault_disk_delay_ms = (uint32_t)strtoul(e, NULL, 10);
	}
	snprintf(t->subnqn, sizeof(t->subnqn), "%s", cfg->subnqn);
	t->block_size = cfg->block_size;
	t->lba_shift = cfg->block_size == 4096 ? 12 : 9;
	t->max_io_queues = cfg->max_io_queues ? cfg->max_io_queues : FX_TGT_DEFAULT_IO_QUEUES;
	if (t->max_io_queues > 0xFFFE)
		t->max_io_queues = 0xFFFE;
	t->fault_drop_after = cfg->fault_drop_after;
	t->fault_delay_ms = cfg->fault_delay_ms;
	t->fault_corrupt_ddgst = cfg->fault_corrupt_ddgst;
	t->fault_tls_after = cfg->fault_tls_after;
	t->fault_tls_kind = cfg->fault_tls_kind;
	t->max_conns = cfg->max_connections ? cfg->max_connections : FX_TGT_DEFAULT_MAX_CONNS;
	t->handshake_ms = cfg->handshake_timeout_ms ? cfg->handshake_timeout_ms
						    : FX_TGT_DEFAULT_HANDSHAKE_MS;
	t->stall_ms = cfg->stall_timeout_ms ? cfg->stall_timeout_ms : FX_TGT_DEFAULT_STALL_MS;
	t->idle_ms = cfg->idle_timeout_ms == FX_TARGET_IDLE_NEVER ? 0
		     : cfg->idle_timeout_ms                       ? cfg->idle_timeout_ms
								  : FX_TGT_DEFAULT_IDLE_MS;
	t->verbose = cfg->verbose;
	t->quiet = cfg->quiet;
	{
		uint64_t budget = cfg->io_buffer_budget_mib
					  ? (uint64_t)cfg->io_buffer_budget_mib << 20
					  : FX_TGT_IO_BUFFER_BUDGET;

		if (budget < FX_TGT_IO_BUDGET_MIN || budget > SIZE_MAX / 2) {
			tgt_log(t, "I/O buffer budget of %u MiB: at least %u MiB",
				cfg->io_buffer_budget_mib, FX_TGT_IO_BUDGET_MIN >> 20);
			ret = -EINVAL;
			goto fail;
		}
		ret = tgt_iobufs_init(t, (size_t)budget);
		if (ret < 0)
			goto fail;
	}
	t->next_cntlid = 1;

	/* Serial number: 16 hex digits of the subsystem NQN's hash, so every
	 * controller of the subsystem reports the same one. */
	{
		char sn[21];
		uint64_t h = fnv1a(0xcbf29ce484222325ull, t->subnqn, strlen(t->subnqn));

		snprintf(sn, sizeof(sn), "%016llx    ", (unsigned long long)h);
		memcpy(t->serial, sn, 20);
	}

	t->ns = calloc(cfg->n_ns, sizeof(*t->ns));
	if (!t->ns) {
		ret = -ENOMEM;
		goto fail;
	}
	for (unsigned i = 0; i < cfg->n_ns; i++)
		t->ns[i].fd = t->ns[i].dfd = -1;
	t->n_ns = cfg->n_ns;
	for (unsigned i = 0; i < cfg->n_ns; i++) {
		ret = open_ns(t, &t->ns[i], cfg->ns_paths[i], i + 1);
		if (ret < 0)
			goto fail;
	}
	if (cfg->n_allow) {
		t->allow = calloc(cfg->n_allow, sizeof(char *));
		if (!t->allow) {
			ret = -ENOMEM;
			goto fail;
		}
		for (unsigned i = 0; i < cfg->n_allow; i++) {
			if (strlen(cfg->allow_hosts[i]) >= NVMF_NQN_SIZE) {
				ret = -EINVAL;
				goto fail;
			}
			t->allow[i] = strdup(cfg->allow_hosts[i]);
			if (!t->allow[i]) {
				ret = -ENOMEM;
				goto fail;
			}
			t->n_allow++;
		}
	}
	ret = tgt_auth_config(t, cfg);
	if (ret < 0)
		goto fail;
	ret = tgt_tls_config(t, cfg);
	if (ret < 0)
		goto fail;
	if (pipe2(t->wake, O_CLOEXEC | O_NONBLOCK) < 0) {
		ret = -errno;
		goto fail;
	}
	ret = ports_create(t, cfg);
	if (ret < 0)
		goto fail;
	if (cfg->control_path) {
		ret = tgt_control_open(t, cfg->control_path);
		if (ret < 0)
			goto fail;
	}
	/* Each connection is three descriptors at most (its socket, and
	 * its I/O engine's io_uring and wake eventfd once it moves data; an
	 * NVM controller's admin queue: its event eventfd, ana.c), each
	 * namespace two (buffered and O_DIRECT): a limit above what the
	 * process may open would turn into accept() or the engine's start
	 * failing with EMFILE. */
	{
		struct rlimit rl;
		/* listener, pipe, the caller's, and the namespaces' */
		const rlim_t spare = 64 + 2 * (rlim_t)t->n_ns;

		if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY &&
		    3 * (rlim_t)t->max_conns + spare > rl.rlim_cur) {
			uint32_t n = rl.rlim_cur > spare + 48
					     ? (uint32_t)((rl.rlim_cur - spare) / 3)
					     : 16u;

			tgt_log(t,
				"connection limit lowered from %u to %u by the open files limit %llu "
				"(ulimit -n)",
				t->max_conns, n, (unsigned long long)rl.rlim_cur);
			t->max_conns = n;
		}
	}

	pthread_mutex_lock(&g_lock);
	t->next_global = g_targets;
	g_targets = t;
	pthread_mutex_unlock(&g_lock);
	*out = t;
	return 0;
fail:
	target_free(t);
	return ret;
}

int fx_target_port(const struct fx_target *t)
{
	return t->ports[0].bound;
}

int fx_target_port_of(const struct fx_target *t, unsigned portid)
{
	return portid >= 1 && portid <= t->n_ports ? t->ports[portid - 1].bound : -EINVAL;
}

void fx_target_stop(struct fx_target *t)
{
	ssize_t r;

	t->stop = 1;
	r = write(t->wake[1], "s", 1); /* a full pipe already wakes the listener */
	(void)r;
}

void fx_target_stop_all(void)
{
	pthread_mutex_lock(&g_lock);
	for (struct fx_target *t = g_targets; t; t = t->next_global)
		fx_target_stop(t);
	pthread_mutex_unlock(&g_lock);
}

int tgt_host_allowed(const struct fx_target *t, const char *hostnqn)
{
	/* Hosts with a secret are allowed (to authenticate); naming any
	 * turns "any host" off, as host entries do in nvmet. */
	if (!t->n_allow && !t->n_dhchap)
		return 1;
	if (tgt_auth_host(t, hostnqn))
		return 1;
	for (unsigned i = 0; i < t->n_allow; i++)
		if (strcmp(t->allow[i], hostnqn) == 0)
			return 1;
	return 0;
}

/* --------------------------------------------------------- controllers */

static struct tgt_ctrl *find_ctrl_locked(struct fx_target *t, uint16_t cntlid)
{
	for (struct tgt_ctrl *c = t->ctrls; c; c = c->next)
		if (c->cntlid == cntlid)
			return c;
	return NULL;
}

/* A host whose controller died (admin queue gone, keep alive expired)
 * connects again at once, and its new queues' writes must not be
 * overtaken by old ones still on the disk: wait until the old
 * controllers' I/O queues have drained, at most the handshake timeout
 * (the Connect must be answered; only a stuck disk takes that long). */
static void wait_host_drained_locked(struct fx_target *t, const char *hostnqn)
{
	struct timespec until;

	clock_gettime(CLOCK_REALTIME, &until);
	until.tv_sec += t->handshake_ms / 1000u;
	until.tv_nsec += (long)(t->handshake_ms % 1000u) * 1000000L;
	if (until.tv_nsec >= 1000000000L) {
		until.tv_sec++;
		until.tv_nsec -= 1000000000L;
	}
	for (;;) {
		int busy = 0;

		for (struct tgt_ctrl *c = t->ctrls; c && !busy; c = c->next)
			busy = c->state == TGT_CTRL_DEAD && c->io_live && !c->discovery &&
			       strcmp(c->hostnqn, hostnqn) == 0;
		if (!busy || t->stop)
			return;
		if (pthread_cond_timedwait(&t->drain_cond, &t->lock, &until) == ETIMEDOUT) {
			tgt_log(t,
				"a dead controller's I/O queues still have disk I/O in flight after "
				"%u ms; new controller for the same host anyway",
				t->handshake_ms);
			return;
		}
	}
}

struct tgt_ctrl *tgt_ctrl_new(struct tgt_conn *conn, int discovery, const char *hostnqn,
			      const uint8_t hostid[16], uint32_t kato_ms)
{
	struct fx_target *t = conn->t;
	struct tgt_ctrl *c = calloc(1, sizeof(*c));

	if (!c)
		return NULL;
	c->qid_used = calloc(t->max_io_queues + 1u, 1);
	if (!c->qid_used) {
		free(c);
		return NULL;
	}
	c->t = t;
	c->discovery = discovery;
	snprintf(c->hostnqn, sizeof(c->hostnqn), "%s", hostnqn);
	memcpy(c->hostid, hostid, 16);
	c->kato_ms = kato_ms;
	c->state = TGT_CTRL_DISABLED;
	c->wce = 1;
	c->refs = 1;
	c->port = conn->port;
	c->aec = NVME_AEN_CFG_ANA_CHANGE;
	atomic_store(&c->last_cmd_ms, tgt_now_ms());

	pthread_mutex_lock(&t->lock);
	if (!discovery)
		wait_host_drained_locked(t, hostnqn);
	/* Dynamic controller model: any free ID in 1..0xFFEF. */
	for (unsigned tries = 0; tries < 0xFFEF; tries++) {
		uint16_t id = t->next_cntlid;

		t->next_cntlid = (uint16_t)(id >= 0xFFEF ? 1 : id + 1);
		if (!find_ctrl_locked(t, id)) {
			c->cntlid = id;
			break;
		}
	}
	if (!c->cntlid) {
		pthread_mutex_unlock(&t->lock);
		free(c->qid_used);
		free(c);
		return NULL;
	}
	c->next = t->ctrls;
	t->ctrls = c;
	conn->ctrl = c;
	conn->qid = 0;
	pthread_mutex_unlock(&t->lock);
	return c;
}

uint16_t tgt_ctrl_attach_io(struct tgt_conn *conn, uint16_t cntlid, const char *hostnqn,
			    uint16_t qid, uint32_t *ipo_attr)
{
	struct fx_target *t = conn->t;
	struct tgt_ctrl *c;
	uint16_t sf = 0;
	unsigned limit;

	pthread_mutex_lock(&t->lock);
	c = find_ctrl_locked(t, cntlid);
	if (!c || c->discovery || c->state == TGT_CTRL_DEAD) {
		*ipo_attr = offsetof(struct nvmf_connect_data, cntlid); /* IATTR 0: in the data */
		sf = TGT_SF_DNR(1, NVME_SC_CONNECT_INVALID_PARAM);
		goto out;
	}
	if (strcmp(c->hostnqn, hostnqn) != 0) {
		*ipo_attr = offsetof(struct nvmf_connect_data, hostnqn);
		sf = TGT_SF_DNR(1, NVME_SC_CONNECT_INVALID_PARAM);
		goto out;
	}
	/* A controller lives on one port (its ANA states are that port's,
	 * and closing the port ends all its queues). */
	if (c->port != conn->port) {
		*ipo_attr = offsetof(struct nvmf_connect_data, cntlid);
		sf = TGT_SF_DNR(1, NVME_SC_CONNECT_INVALID_PARAM);
		goto out;
	}
	limit = c->io_queues ? c->io_queues : t->max_io_queues;
	if (qid > limit) {
		*ipo_attr = (1u << 16) | offsetof(struct nvmf_connect_cmd, qid); /* IATTR 1: SQE */
		sf = TGT_SF_DNR(1, NVME_SC_CONNECT_INVALID_PARAM);
		goto out;
	}
	if (c->qid_used[qid] || c->state != TGT_CTRL_READY) {
		sf = TGT_SF_DNR(0, TGT_SC_CMD_SEQ_ERROR);
		goto out;
	}
	/* A host with a secret takes the qid once it has authenticated. */
	if (!tgt_auth_host(t, hostnqn)) {
		c->qid_used[qid] = 1;
		conn->qid_claimed = 1;
	}
	c->refs++;
	c->io_live++;
	conn->io_counted = 1;
	conn->ctrl = c;
	conn->qid = qid;
out:
	pthread_mutex_unlock(&t->lock);
	return sf;
}

int tgt_ctrl_claim_qid(struct tgt_conn *conn)
{
	struct fx_target *t = conn->t;
	struct tgt_ctrl *c;
	int ret = 0;

	pthread_mutex_lock(&t->lock);
	c = conn->ctrl;
	if (conn->qid == 0 || conn->qid_claimed)
		goto out;
	if (!c || conn->qid_released || conn->qid > t->max_io_queues || c->qid_used[conn->qid] ||
	    c->state != TGT_CTRL_READY) {
		ret = -EBUSY;
		goto out;
	}
	c->qid_used[conn->qid] = 1;
	conn->qid_claimed = 1;
out:
	pthread_mutex_unlock(&t->lock);
	return ret;
}

void tgt_ctrl_kill_io_locked(struct fx_target *t, struct tgt_ctrl *ctrl)
{
	for (struct tgt_conn *c = t->conns; c; c = c->next) {
		if (c->ctrl != ctrl || c->qid == 0 || c->qid_released)
			continue;
		tgt_conn_shut(c);
		/* Free the qid now: after a reset the host reconnects its
		 * queues at once, maybe before this thread has noticed. */
		if (c->qid <= t->max_io_queues && c->qid_claimed)
			ctrl->qid_used[c->qid] = 0;
		c->qid_released = 1;
	}
}

void tgt_conn_drained(struct tgt_conn *conn)
{
	struct fx_target *t = conn->t;

	pthread_mutex_lock(&t->lock);
	if (conn->io_counted && conn->ctrl) {
		conn->io_counted = 0;
		conn->ctrl->io_live--;
		pthread_cond_broadcast(&t->drain_cond);
	}
	pthread_mutex_unlock(&t->lock);
}

void tgt_ctrl_wait_drained_locked(struct fx_target *t, struct tgt_ctrl *ctrl)
{
	/* The queues were shut: each ends its commands and its disk I/O
	 * (bounded by the disk, not by the host), then calls
	 * tgt_conn_drained(). */
	while (ctrl->io_live && !t->stop)
		pthread_cond_wait(&t->drain_cond, &t->lock);
}

static void ctrl_kill_all_locked(struct fx_target *t, struct tgt_ctrl *ctrl)
{
	for (struct tgt_conn *c = t->conns; c; c = c->next)
		if (c->ctrl == ctrl)
			tgt_conn_shut(c);
}

void tgt_ctrl_flush_all(struct fx_target *t)
{
	for (unsigned i = 0; i < t->n_ns; i++)
		fdatasync(t->ns[i].fd);
}

void tgt_conn_detach(struct tgt_conn *conn)
{
	struct fx_target *t = conn->t;
	struct tgt_ctrl *c;

	pthread_mutex_lock(&t->lock);
	/* No AER answer is sent on this queue any more (ana.c). */
	conn->aers = 0;
	c = conn->ctrl;
	if (!c) {
		pthread_mutex_unlock(&t->lock);
		return;
	}
	conn->ctrl = NULL;
	if (conn->io_counted) {
		conn->io_counted = 0;
		c->io_live--;
		pthread_cond_broadcast(&t->drain_cond);
	}
	if (conn->qid == 0) {
		/* The admin queue is the controller: without it the host
		 * cannot even keep it alive, so its I/O queues go too. */
		if (c->state != TGT_CTRL_DEAD)
			c->state = TGT_CTRL_DEAD;
		tgt_ctrl_kill_io_locked(t, c);
	} else if (!conn->qid_released && conn->qid_claimed && conn->qid <= t->max_io_queues) {
		c->qid_used[conn->qid] = 0;
	}
	if (--c->refs == 0) {
		struct tgt_ctrl **pp = &t->ctrls;

		while (*pp && *pp != c)
			pp = &(*pp)->next;
		if (*pp)
			*pp = c->next;
		free(c->qid_used);
		free(c);
	}
	pthread_mutex_unlock(&t->lock);
}

/* The value of last_cmd_ms once a controller's KATO has run out: from then
 * on no sign of life counts, so a capsule read after a stall longer than
 * KATO (the process stopped, the machine paused) can neither run nor
 * restart the timer for the capsules behind it in the same receive. */
#define KATO_EXPIRED UINT64_MAX

/* The one keep-alive rule, for the listener's tick and for every capsule and
 * data PDU (docs/architecture.md rule 13): has c's KATO run out at now since
 * its last sign of life?  1: it ran out and this caller marked it (it tears
 * the controller down), -1: it had already been marked, 0: alive, and
 * refreshed to now when refresh is set.  Lock-free (a compare-and-swap on
 * last_cmd_ms), so I/O queues do not take t->lock per command; the
 * exchange is what stops one queue refreshing a timer another has just
 * found expired. */
static int kato_step(struct tgt_ctrl *c, uint64_t now, int refresh)
{
	uint64_t last = atomic_load(&c->last_cmd_ms);

	for (;;) {
		/* (read each time: Set Features may change it, under t->lock) */
		uint32_t kato = __atomic_load_n(&c->kato_ms, __ATOMIC_RELAXED);

		if (last == KATO_EXPIRED)
			return -1;
		/* A sign of life stored after now was read is newer than
		 * now: alive (an unsigned now - last would wrap). */
		if (kato && now > last && now - last > kato) {
			if (atomic_compare_exchange_weak(&c->last_cmd_ms, &last, KATO_EXPIRED))
				return 1;
			continue;
		}
		if (!refresh || last >= now ||
		    atomic_compare_exchange_weak(&c->last_cmd_ms, &last, now))
			return 0;
	}
}

/* Mark c dead and shut every queue of it (under t->lock): 1 when this call
 * did it, 0 when it was already dead. */
static int kato_kill_locked(struct fx_target *t, struct tgt_ctrl *c)
{
	if (c->state == TGT_CTRL_DEAD)
		return 0;
	c->state = TGT_CTRL_DEAD;
	ctrl_kill_all_locked(t, c);
	return 1;
}

int tgt_ctrl_alive(struct tgt_conn *conn)
{
	struct tgt_ctrl *c = conn->ctrl;
	struct fx_target *t = conn->t;
	uint64_t last, now;
	char host[NVMF_NQN_SIZE];
	int killed;

	/* Only an authenticated queue keeps its controller alive: one that
	 * merely knows the host NQN and controller ID must not. */
	if (!c || !tgt_auth_done(conn))
		return 0;
	last = atomic_load(&c->last_cmd_ms);
	now = tgt_now_ms();
	switch (kato_step(c, now, 1)) {
	case 0:
		return 0;
	case -1:
		return -ETIMEDOUT;
	}
	pthread_mutex_lock(&t->lock);
	killed = kato_kill_locked(t, c);
	tgt_printable(host, sizeof(host), c->hostnqn);
	pthread_mutex_unlock(&t->lock);
	if (killed)
		tgt_log(t,
			"controller %u (host %s): qid %u received a PDU %llu ms after the "
			"controller's last sign of life, past KATO %u ms: dropped the controller "
			"without running it",
			c->cntlid, host, conn->qid,
			(unsigned long long)(last != KATO_EXPIRED && now > last ? now - last : 0),
			__atomic_load_n(&c->kato_ms, __ATOMIC_RELAXED));
	return -ETIMEDOUT;
}

static void check_kato(struct fx_target *t)
{
	uint64_t now = tgt_now_ms();
	struct {
		uint16_t cntlid;
		uint32_t kato_ms;
		char host[NVMF_NQN_SIZE];
	} gone[4];
	unsigned n = 0, more = 0;

	pthread_mutex_lock(&t->lock);
	for (struct tgt_ctrl *c = t->ctrls; c; c = c->next) {
		if (c->state == TGT_CTRL_DEAD || !c->kato_ms)
			continue;
		/* (-1: a queue found it expired and is about to take the
		 * lock to kill it; whoever gets here first does) */
		if (!kato_step(c, now, 0) || !kato_kill_locked(t, c))
			continue;
		if (n < 4) {
			gone[n].cntlid = c->cntlid;
			gone[n].kato_ms = c->kato_ms;
			tgt_printable(gone[n].host, sizeof(gone[n].host), c->hostnqn);
			n++;
		} else {
			more++;
		}
	}
	pthread_mutex_unlock(&t->lock);
	/* (logged outside the lock: a slow stderr must not stall other queues) */
	for (unsigned i = 0; i < n; i++)
		tgt_log(t, "controller %u (host %s): no command within KATO %u ms, dropped it",
			gone[i].cntlid, gone[i].host, gone[i].kato_ms);
	if (more)
		tgt_log(t, "%u more controllers dropped for keep alive timeout", more);
}

/* --------------------------------------------------------- connections */

static void conn_free(struct tgt_conn *c)
{
	tgt_iopeer_put(c);
	if (c->fd >= 0)
		close(c->fd);
	if (c->evfd >= 0)
		close(c->evfd);
	free(c);
}

/* Join and free finished connections (all of them when wait_all). */
static void reap(struct fx_target *t, int wait_all)
{
	struct tgt_conn *victims = NULL, **pp;

	pthread_mutex_lock(&t->lock);
	for (pp = &t->conns; *pp;) {
		struct tgt_conn *c = *pp;

		if (wait_all || atomic_load(&c->done)) {
			*pp = c->next;
			c->next = victims;
			victims = c;
			t->n_conns--;
		} else {
			pp = &c->next;
		}
	}
	pthread_mutex_unlock(&t->lock);
	while (victims) {
		struct tgt_conn *c = victims;

		victims = c->next;
		if (c->thread_started)
			pthread_join(c->thread, NULL);
		conn_free(c);
	}
}

/* What the target's per-peer bounds (DH work, a share of the I/O buffers)
 * count a connection against: its source address, IPv4 (mapped or not) as
 * itself, IPv6 by its /64 prefix, since a host that has one IPv6 address
 * usually has its whole /64 to pick others from. */
static void peer_key(const struct sockaddr_storage *ss, char *out, size_t n)
{
	char host[64] = "?";

	if (ss->ss_family == AF_INET6) {
		const struct sockaddr_in6 *s6 = (const struct sockaddr_in6 *)ss;
		const uint8_t *a = s6->sin6_addr.s6_addr;

		if (!IN6_IS_ADDR_V4MAPPED(&s6->sin6_addr)) {
			snprintf(out, n, "%x:%x:%x:%x::/64", a[0] << 8 | a[1], a[2] << 8 | a[3],
				 a[4] << 8 | a[5], a[6] << 8 | a[7]);
			return;
		}
		inet_ntop(AF_INET, a + 12, host, sizeof(host));
	} else {
		getnameinfo((const struct sockaddr *)ss, sizeof(*ss), host, sizeof(host), NULL, 0,
			    NI_NUMERICHOST);
	}
	snprintf(out, n, "%s", host);
}

static void peer_name(const struct sockaddr_storage *ss, char *out, size_t n)
{
	char host[64] = "?", serv[16] = "?";

	getnameinfo((const struct sockaddr *)ss, sizeof(*ss), host, sizeof(host), serv,
		    sizeof(serv), NI_NUMERICHOST | NI_NUMERICSERV);
	snprintf(out, n, "%s%s%s:%s", ss->ss_family == AF_INET6 ? "[" : "", host,
		 ss->ss_family == AF_INET6 ? "]" : "", serv);
}

/* Socket options set once per connection, never per PDU.  The timeouts make
 * a blocked recv/send return EAGAIN after stall_ms without progress (conn.c
 * decides whether that silence is legal); keepalive probes and the user
 * timeout find a peer that vanished without a FIN or RST, which would
 * otherwise hold an idle queue whose controller has no KATO forever. */
static void conn_sockopts(const struct fx_target *t, int fd)
{
	struct timeval tv = {.tv_sec = t->stall_ms / 1000, .tv_usec = (t->stall_ms % 1000) * 1000};
	int one = 1, idle = (int)(t->stall_ms / 1000 ? t->stall_ms / 1000 : 1), cnt = 3;
	unsigned user = tgt_user_timeout_ms(t);

	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
	setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
	/* (the TCP ones fail harmlessly on a socketpair) */
	setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
	setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &idle, sizeof(idle));
	setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof(cnt));
	setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user, sizeof(user));
	/* Responses are small and latency-bound; bulk data is pushed with
	 * MSG_MORE / sendfile, so Nagle would only add delay. */
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

static struct tgt_conn *conn_new(struct fx_target *t, int fd)
{
	struct tgt_conn *c = calloc(1, sizeof(*c));

	if (!c)
		return NULL;
	c->t = t;
	c->fd = fd;
	c->evfd = -1;
	c->accepted_ms = tgt_now_ms();
	c->rcvtimeo_ms = t->stall_ms;
	conn_sockopts(t, fd);
	return c;
}

static void start_conn(struct fx_target *t, int fd, const struct sockaddr_storage *ss,
		       unsigned port)
{
	struct tgt_conn *c = conn_new(t, fd);
	pthread_attr_t attr;
	int attr_ok;

	if (!c) {
		close(fd);
		return;
	}
	c->port = port;
	peer_name(ss, c->peer, sizeof(c->peer));
	peer_key(ss, c->peer_key, sizeof(c->peer_key));
	if (tgt_iopeer_get(c) < 0) {
		conn_free(c);
		return;
	}
	{
		struct sockaddr_storage ls;
		socklen_t ll = sizeof(ls);

		if (getsockname(fd, (struct sockaddr *)&ls, &ll) == 0) {
			c->local_family = ls.ss_family;
			getnameinfo((struct sockaddr *)&ls, ll, c->local_addr,
				    sizeof(c->local_addr), NULL, 0, NI_NUMERICHOST);
			/* An IPv4 host reaching a "::" listener: advertise the
			 * IPv4 address it used, not the mapped form. */
			if (strncmp(c->local_addr, "::ffff:", 7) == 0 &&
			    strchr(c->local_addr, '.')) {
				memmove(c->local_addr, c->local_addr + 7,
					strlen(c->local_addr + 7) + 1);
				c->local_family = AF_INET;
			}
		}
	}
	attr_ok = pthread_attr_init(&attr) == 0;
	if (attr_ok)
		pthread_attr_setstacksize(&attr, FX_TGT_THREAD_STACK);
	pthread_mutex_lock(&t->lock);
	c->next = t->conns;
	t->conns = c;
	t->n_conns++;
	if (pthread_create(&c->thread, attr_ok ? &attr : NULL, tgt_conn_main, c) == 0)
		c->thread_started = 1;
	else
		atomic_store(&c->done, 1); /* reaped (and closed) on the next turn */
	pthread_mutex_unlock(&t->lock);
	if (attr_ok)
		pthread_attr_destroy(&attr);
	if (!c->thread_started)
		tgt_log(t, "cannot start a thread for %s", c->peer);
}

int tgt_serve_fd(struct fx_target *t, int fd)
{
	struct tgt_conn *c = conn_new(t, fd), **pp;

	if (!c) {
		close(fd);
		return -ENOMEM;
	}
	snprintf(c->peer, sizeof(c->peer), "fd %d", fd);
	snprintf(c->peer_key, sizeof(c->peer_key), "fd");
	if (tgt_iopeer_get(c) < 0) {
		conn_free(c);
		return -ENOMEM;
	}
	pthread_mutex_lock(&t->lock);
	c->next = t->conns;
	t->conns = c;
	t->n_conns++;
	pthread_mutex_unlock(&t->lock);
	tgt_conn_main(c);
	pthread_mutex_lock(&t->lock);
	for (pp = &t->conns; *pp && *pp != c; pp = &(*pp)->next)
		;
	if (*pp) {
		*pp = c->next;
		t->n_conns--;
	}
	pthread_mutex_unlock(&t->lock);
	conn_free(c);
	return 0;
}

/* How long a Connected queue of a controller without keep alive has been
 * idle (under t->lock): received nothing and executed nothing since it began
 * waiting for its next PDU; an admin queue also needs its controller to have
 * had no command on any queue (closing it ends the controller).  0 when it
 * is busy, not Connected, kept alive by a KATO, or already closing. */
static uint64_t idle_age_locked(const struct fx_target *t, const struct tgt_conn *c, uint64_t now)
{
	uint64_t since = atomic_load(&c->wait_since_ms), last;

	if (!since || !c->ctrl || c->ctrl->kato_ms || c->deadline_hit || !atomic_load(&c->live) ||
	    atomic_load(&c->done) || atomic_load(&c->r2t_busy) || now < since)
		return 0;
	if (c->qid == 0) {
		/* A write of any queue waiting for its data keeps the
		 * controller, and so its admin queue, busy. */
		for (const struct tgt_conn *o = t->conns; o; o = o->next)
			if (o->ctrl == c->ctrl && atomic_load(&o->r2t_busy))
				return 0;
		last = atomic_load(&c->ctrl->last_cmd_ms);
		if (last > since)
			since = last;
		if (now < since)
			return 0;
	}
	return now - since;
}

/* At the limit, how long a queue without keep alive must have been idle
 * before it gives way to a new connection: long beside the gap between a
 * host's Connect and its first command (or between commands of a queue in
 * use), short enough that a silent host locks new hosts out only briefly. */
static uint32_t idle_grace_ms(const struct fx_target *t)
{
	return t->handshake_ms < FX_TGT_EVICT_IDLE_GRACE_MS ? t->handshake_ms
							    : FX_TGT_EVICT_IDLE_GRACE_MS;
}

/* Say what the connection limit did, in one or two lines a second at most:
 * a flood must not become a flood of log lines. */
static void limit_notice(struct fx_target *t)
{
	uint64_t now = tgt_now_ms();

	if (!t->lim_refused && !t->lim_evicted && !t->lim_idle_evicted)
		return;
	if (t->lim_log_ms && now - t->lim_log_ms < 1000)
		return;
	if (t->lim_refused)
		tgt_log(t,
			"refused %u connection%s (the last from %s): connection limit %u reached "
			"(--max-connections), every connection busy, kept alive or closing",
			t->lim_refused, t->lim_refused == 1 ? "" : "s", t->lim_peer, t->max_conns);
	if (t->lim_evicted)
		tgt_log(t,
			"closed %u connection%s still in their ICReq/Connect handshake, oldest first, "
			"to make room for new ones: connection limit %u reached (--max-connections)",
			t->lim_evicted, t->lim_evicted == 1 ? "" : "s", t->max_conns);
	if (t->lim_idle_evicted)
		tgt_log(t,
			"closed %u idle Connected connection%s (controller keep alive off, KATO 0; "
			"nothing received for %u ms or more), longest idle first, to make room for new "
			"ones: connection limit %u reached (--max-connections)",
			t->lim_idle_evicted, t->lim_idle_evicted == 1 ? "" : "s", idle_grace_ms(t),
			t->max_conns);
	t->lim_log_ms = now;
	t->lim_refused = t->lim_evicted = t->lim_idle_evicted = 0;
}

/* Shut the chosen victim of an eviction (its thread ends and the listener
 * frees it), unless none was found or FX_TGT_EVICT_SLACK connections are
 * already closing; then drop t->lock.  Returns whether one was shut. */
static int shut_victim_unlock(struct fx_target *t, struct tgt_conn *victim, unsigned dying)
{
	int shut = victim && dying < FX_TGT_EVICT_SLACK;

	if (shut) {
		tgt_conn_shut(victim);
		victim->deadline_hit = 1;
	}
	pthread_mutex_unlock(&t->lock);
	return shut;
}

/*
 * At the limit, a connection still in its handshake gives way to a new one,
 * the oldest first, so that idle or half-open sockets cannot lock hosts out
 * until their deadline; a Connected queue is never evicted.  Connections
 * closed this way (or by the deadline) stay counted until their threads end,
 * and at most FX_TGT_EVICT_SLACK of them may be on the way out: the number
 * of connections never exceeds max_conns + FX_TGT_EVICT_SLACK.  1 when one
 * was evicted.
 */
static int evict_pending(struct fx_target *t)
{
	struct tgt_conn *old = NULL;
	unsigned dying = 0;

	pthread_mutex_lock(&t->lock);
	for (struct tgt_conn *c = t->conns; c; c = c->next) {
		if (c->deadline_hit || atomic_load(&c->done))
			dying++;
		else if (!atomic_load(&c->live) && (!old || c->accepted_ms <= old->accepted_ms))
			old = c; /* (the list is newest first) */
	}
	return shut_victim_unlock(t, old, dying);
}

/*
 * At the limit with no handshake to evict: the Connected queue without keep
 * alive that has been idle the longest, if for at least idle_grace_ms(), so
 * that a host that Connects with KATO 0 and goes silent cannot hold every
 * slot.  Queues that are busy or whose controller has a KATO (KATO expiry
 * governs those) are never taken.  Same slack bound as evict_pending().
 */
static int evict_idle(struct fx_target *t)
{
	struct tgt_conn *old = NULL;
	uint64_t now = tgt_now_ms(), best = 0;
	unsigned dying = 0;

	pthread_mutex_lock(&t->lock);
	for (struct tgt_conn *c = t->conns; c; c = c->next) {
		uint64_t age;

		if (c->deadline_hit || atomic_load(&c->done)) {
			dying++;
			continue;
		}
		age = idle_age_locked(t, c, now);
		if (age >= idle_grace_ms(t) && age > best) {
			best = age;
			old = c;
		}
	}
	return shut_victim_unlock(t, old, dying);
}

/* A new connection: served, served after evicting one still in its
 * handshake or an idle one without keep alive, or refused (closed at once). */
static void admit(struct fx_target *t, int fd, const struct sockaddr_storage *ss, unsigned port)
{
	unsigned open;

	pthread_mutex_lock(&t->lock);
	open = t->n_conns;
	pthread_mutex_unlock(&t->lock);
	if (open >= t->max_conns) {
		reap(t, 0); /* in a burst, some may have ended since the loop's reap */
		pthread_mutex_lock(&t->lock);
		open = t->n_conns;
		pthread_mutex_unlock(&t->lock);
	}
	if (open < t->max_conns) {
		start_conn(t, fd, ss, port);
	} else if (evict_pending(t)) {
		t->lim_evicted++;
		start_conn(t, fd, ss, port);
	} else if (evict_idle(t)) {
		t->lim_idle_evicted++;
		start_conn(t, fd, ss, port);
	} else {
		close(fd);
		t->lim_refused++;
		peer_name(ss, t->lim_peer, sizeof(t->lim_peer));
	}
	limit_notice(t);
}

/* Close connections that did not complete ICReq and Connect (and the
 * queue's authentication, where its host has a secret) in time: the
 * listener shuts their sockets, which ends their threads' receives. */
static void check_handshakes(struct fx_target *t)
{
	uint64_t now = tgt_now_ms();
	unsigned n = 0;
	char first[80] = "";

	pthread_mutex_lock(&t->lock);
	for (struct tgt_conn *c = t->conns; c; c = c->next) {
		if (c->deadline_hit || atomic_load(&c->live) || atomic_load(&c->done) ||
		    now - c->accepted_ms < t->handshake_ms)
			continue;
		tgt_conn_shut(c);
		c->deadline_hit = 1;
		if (!n++)
			snprintf(first, sizeof(first), "%s", c->peer);
	}
	pthread_mutex_unlock(&t->lock);
	if (n == 1)
		tgt_log(t,
			"%s: no ICReq/Connect (and authentication, where required) within %u ms of "
			"connecting, closed it",
			first, t->handshake_ms);
	else if (n)
		tgt_log(t,
			"closed %u connections (%s, ...) that did not complete ICReq/Connect (and "
			"authentication, where required) within %u ms",
			n, first, t->handshake_ms);
	limit_notice(t); /* what the last second's flood left unsaid */
}

/* Close Connected queues of controllers without keep alive that have been
 * idle for idle_ms (--idle-timeout-ms); one log line per sweep. */
static void check_idle(struct fx_target *t)
{
	uint64_t now = tgt_now_ms();
	unsigned n = 0;
	char first[96] = "";

	if (!t->idle_ms)
		return;
	pthread_mutex_lock(&t->lock);
	for (struct tgt_conn *c = t->conns; c; c = c->next) {
		if (idle_age_locked(t, c, now) < t->idle_ms)
			continue;
		tgt_conn_shut(c);
		c->deadline_hit = 1;
		if (!n++)
			snprintf(first, sizeof(first), "%s qid %u", c->peer, c->qid);
	}
	pthread_mutex_unlock(&t->lock);
	if (n)
		tgt_log(t,
			"closed %u idle connection%s (%s%s): controller keep alive off (KATO 0) and "
			"nothing received for %u ms (--idle-timeout-ms)",
			n, n == 1 ? "" : "s", first, n == 1 ? "" : ", ...", t->idle_ms);
}

int fx_target_run(struct fx_target *t)
{
	int ret = 0;

	while (!t->stop) {
		/* [0] wake, [1] control, then the ports (a closed one's fd is
		 * -1: poll skips it) */
		struct pollfd p[2 + FX_TGT_MAX_PORTS];
		int n;

		p[0] = (struct pollfd){.fd = t->wake[0], .events = POLLIN};
		p[1] = (struct pollfd){.fd = t->ctl_fd, .events = POLLIN};
		for (unsigned i = 0; i < t->n_ports; i++)
			p[2 + i] = (struct pollfd){.fd = t->ports[i].lfd, .events = POLLIN};
		n = poll(p, 2 + t->n_ports, 100);

		if (n < 0 && errno != EINTR) {
			ret = -errno;
			break;
		}
		if (n > 0 && (p[0].revents & POLLIN)) {
			char b[64];

			while (read(t->wake[0], b, sizeof(b)) > 0)
				;
		}
		reap(t, 0); /* first: finished connections free their slots */
		for (unsigned i = 0; n > 0 && i < t->n_ports; i++) {
			if (!(p[2 + i].revents & POLLIN) || t->ports[i].lfd < 0)
				continue;
			/* A bounded burst: a flood must not keep the deadlines
			 * and KATO below from being checked (poll returns at once
			 * while the backlog is not empty). */
			for (unsigned k = 0; k < 256; k++) {
				struct sockaddr_storage ss;
				socklen_t sl = sizeof(ss);
				int fd = accept4(t->ports[i].lfd, (struct sockaddr *)&ss, &sl,
						 SOCK_CLOEXEC);

				if (fd >= 0) {
					admit(t, fd, &ss, i);
					continue;
				}
				if (errno == EMFILE || errno == ENFILE || errno == ENOMEM ||
				    errno == ENOBUFS) {
					tgt_log(t, "accept: %s (will retry)", strerror(errno));
					usleep(50 * 1000);
				}
				break; /* EAGAIN, ECONNABORTED, EINTR, ... */
			}
		}
		/* (after the accepts: a command may close a port) */
		if (n > 0 && (p[1].revents & POLLIN))
			tgt_control_serve(t);
		check_handshakes(t);
		check_kato(t);
		check_idle(t);
		tgt_ana_tick(t);
		tgt_iobufs_tick(t);
		log_flush(t);
	}

	/* Stop: refuse new connections, end the live ones, wait for them. */
	for (unsigned i = 0; i < t->n_ports; i++) {
		if (t->ports[i].lfd >= 0)
			close(t->ports[i].lfd);
		t->ports[i].lfd = -1;
	}
	pthread_mutex_lock(&t->lock);
	for (struct tgt_conn *c = t->conns; c; c = c->next)
		tgt_conn_shut(c);
	pthread_mutex_unlock(&t->lock);
	reap(t, 1);
	tgt_ctrl_flush_all(t);
	return ret;
}

void fx_target_destroy(struct fx_target *t)
{
	struct fx_target **pp;

	if (!t)
		return;
	pthread_mutex_lock(&g_lock);
	for (pp = &g_targets; *pp; pp = &(*pp)->next_global) {
		if (*pp == t) {
			*pp = t->next_global;
			break;
		}
	}
	pthread_mutex_unlock(&g_lock);
	/* run() normally reaped everything; a target never run has no conns. */
	reap(t, 1);
	target_free(t);
}
