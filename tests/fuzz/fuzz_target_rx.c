/*
 * libFuzzer harness for the receive path of our NVMe/TCP target
 * (csrc/target/conn.c and the admin/Fabrics executors behind it): the
 * fuzzer's bytes are what a host sends on one connection.  They go in over a
 * socketpair, all at once and then EOF, while a feeder thread drains whatever
 * the target answers; the target serves that connection on the fuzzer's own
 * thread (tgt_serve_fd), exactly as it serves an accepted socket.
 *
 * A live controller (cntlid 1, host HOST_NQN, enabled) is set up once and
 * held by a background admin connection, so that inputs which Connect an I/O
 * queue to it reach reads, writes (in-capsule and through R2T), flushes and
 * Write Zeroes on a 1 MiB namespace of 512-byte blocks.  Inputs that Connect
 * an admin queue get a controller of their own, freed when they end.
 *
 * Seeds: tests/fuzz/corpus/target_rx/ (sessions recorded from a host,
 * with and without digests; admin_aer_ana_change holds AERs in its first
 * half and reads the ANA log in its second, around the ANA change the
 * feeder makes half-way: see ana_change).
 */
/* fuzz-options: -max_len=8192 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <linux/sockios.h>
#include <unistd.h>

#include "target/tgt.h"

#define SUBNQN "nqn.2024-01.io.fx100io:test-target"
#define HOST_NQN "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-00000000000a"
#define AUTH_NQN "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-00000000000b"
/* (test secrets: keys 00 01 .. 1f, SHA-256 transform; c8 c9 .. 1f, SHA-512) */
#define AUTH_SECRET "DHHC-1:01:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh+KfiaR:"
#define AUTH_CTRL_SECRET                                                                             \
	"DHHC-1:03:yMnKy8zNzs/Q0dLT1NXW19jZ2tvc3d7f4OHi4+Tl5ucAAQIDBAUGBwgJCgsMDQ4PEBESExQVFhcYGRob" \
	"HB0eHy3QCJM=:"

static struct fx_target *g_t;

/* ------------------------------------------------ the feeder (the host side) */

struct feed {
	int fd;
	const uint8_t *p;
	size_t n;
};

/* Half-way through each input the port's ANA state of group 1 changes (to
 * a state the input's last byte picks), as a control command would: an
 * AER the input holds by then is answered by the connection's own thread,
 * woken through its eventfd (ana.c, tgt_ana_deliver), in the middle of
 * whatever the input sends.  (This thread stands in for the listener,
 * which is the only caller of tgt_ana_set.) */
static int outq(int fd)
{
	int n = 0;

	return ioctl(fd, SIOCOUTQ, &n) == 0 ? n : 0;
}

static void ana_change(const struct feed *f)
{
	static const uint8_t st[] = {NVME_ANA_OPTIMIZED, NVME_ANA_NON_OPTIMIZED,
				     NVME_ANA_INACCESSIBLE, NVME_ANA_PERSISTENT_LOSS,
				     NVME_ANA_CHANGE};
	uint8_t pick = st[f->p[f->n - 1] % sizeof(st)];

	tgt_ana_set(g_t, 0, 1, pick, pick == NVME_ANA_CHANGE ? NVME_ANA_OPTIMIZED : 0,
		    pick == NVME_ANA_CHANGE ? 100 : 0);
}

/* Write the input, then EOF, and drain the answers until the target closes. */
static void *feeder(void *arg)
{
	struct feed *f = arg;
	size_t off = 0;
	int writing = 1, changed = 0;
	static uint8_t sink[65536]; /* (one feeder at a time) */

	fcntl(f->fd, F_SETFL, fcntl(f->fd, F_GETFL) | O_NONBLOCK);
	if (f->n == 0) {
		shutdown(f->fd, SHUT_WR);
		writing = 0;
	}
	for (;;) {
		struct pollfd p = {.fd = f->fd, .events = POLLIN | (writing ? POLLOUT : 0)};

		if (poll(&p, 1, -1) < 0) {
			if (errno == EINTR)
				continue;
			break;
		}
		if (writing && (p.revents & (POLLOUT | POLLERR | POLLHUP))) {
			size_t upto = changed ? f->n : f->n / 2;
			ssize_t w = upto > off ? send(f->fd, f->p + off, upto - off, MSG_NOSIGNAL)
					       : 0;

			if (w > 0)
				off += (size_t)w;
			if (!changed && off >= f->n / 2) {
				/* (once the target has read the first half, at
				 * most about 100 ms: then an AER it holds is
				 * answered by the wake, not found at its
				 * arrival; yielding, not sleeping, keeps the
				 * executions per second) */
				for (int i = 0; i < 100000 && outq(f->fd) > 0; i++)
					sched_yield();
				ana_change(f);
				changed = 1;
			}
			if ((w < 0 && errno != EAGAIN && errno != EINTR) || off == f->n) {
				shutdown(f->fd, SHUT_WR);
				writing = 0;
			}
		}
		if (p.revents & (POLLIN | POLLERR | POLLHUP)) {
			ssize_t r = recv(f->fd, sink, sizeof(sink), 0);

			if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR))
				break;
		}
	}
	close(f->fd);
	return NULL;
}

/* ------------------------------------- the persistent controller (set up once) */

static void must(int ok, const char *what)
{
	if (!ok) {
		fprintf(stderr, "fuzz_target_rx: setup failed: %s (%s)\n", what, strerror(errno));
		abort();
	}
}

static void send_pdu(int fd, uint8_t type, uint8_t hlen, const uint8_t *spec, size_t slen,
		     const uint8_t *data, size_t dlen)
{
	uint8_t b[128 + 1024];
	uint32_t plen = (uint32_t)(hlen + dlen);

	memset(b, 0, sizeof(b));
	b[0] = type;
	b[2] = hlen;
	b[3] = (uint8_t)(dlen ? hlen : 0);
	memcpy(b + 4, &plen, 4);
	memcpy(b + 8, spec, slen);
	if (dlen)
		memcpy(b + hlen, data, dlen);
	must(send(fd, b, plen, MSG_NOSIGNAL) == (ssize_t)plen, "send");
}

static void recv_n(int fd, uint8_t *b, size_t n)
{
	while (n) {
		ssize_t r = recv(fd, b, n, 0);

		must(r > 0, "recv");
		b += r;
		n -= (size_t)r;
	}
}

/* Read PDUs until a CapsuleResp; its status field. */
static uint16_t wait_resp(int fd)
{
	for (;;) {
		uint8_t h[8], rest[256];
		uint32_t plen;

		recv_n(fd, h, 8);
		memcpy(&plen, h + 4, 4);
		must(plen >= 8 && plen - 8 <= sizeof(rest), "response size");
		recv_n(fd, rest, plen - 8);
		if (h[0] == NVME_TCP_RSP) {
			uint16_t st;

			memcpy(&st, rest + 14, 2); /* CQE status at 8 + 14 */
			return (uint16_t)(st >> 1);
		}
	}
}

static void *serve_admin(void *arg)
{
	tgt_serve_fd(g_t, (int)(intptr_t)arg);
	return NULL;
}

static void setup(void)
{
	char path[] = "/dev/shm/fx100io-fuzz-XXXXXX";
	const char *paths[1] = {path};
	const char *allow[1] = {HOST_NQN};
	const struct fx_target_dhchap_host keys[1] = {
		{.hostnqn = AUTH_NQN, .secret = AUTH_SECRET, .ctrl_secret = AUTH_CTRL_SECRET}};
	struct fx_target_config cfg;
	uint8_t spec[120], sqe[64], data[1024];
	uint32_t v32;
	uint64_t v64;
	uint16_t v16;
	pthread_t th;
	int fd, sv[2];

	fd = mkstemp(path);
	if (fd < 0) { /* no /dev/shm: any temporary directory */
		snprintf(path, sizeof(path), "/tmp/fx100io-fuzz-XXXXXX");
		fd = mkstemp(path);
	}
	must(fd >= 0 && ftruncate(fd, 1 << 20) == 0, "namespace file");
	close(fd);
	memset(&cfg, 0, sizeof(cfg));
	cfg.host = "127.0.0.1";
	cfg.port = "0";
	cfg.subnqn = SUBNQN;
	cfg.ns_paths = paths;
	cfg.n_ns = 1;
	cfg.block_size = 512;
	cfg.allow_hosts = allow; /* (a keyed host turns "any host" off) */
	cfg.n_allow = 1;
	cfg.dhchap_hosts = keys;
	cfg.n_dhchap_hosts = 1;
	cfg.quiet = !getenv("FUZZ_TARGET_VERBOSE"); /* set it to see what an input does */
	cfg.verbose = !cfg.quiet;
	cfg.stall_timeout_ms = 5000;
	must(fx_target_create(&cfg, &g_t) == 0, "fx_target_create");
	unlink(path);

	/* The admin queue of controller 1: ICReq, Connect, CC.EN = 1. */
	must(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0, "socketpair");
	must(pthread_create(&th, NULL, serve_admin, (void *)(intptr_t)sv[1]) == 0, "thread");
	pthread_detach(th);
	memset(spec, 0, sizeof(spec));
	send_pdu(sv[0], NVME_TCP_ICREQ, 128, spec, 120, NULL, 0);
	{
		uint8_t resp[128];

		recv_n(sv[0], resp, 128);
		must(resp[0] == NVME_TCP_ICRESP, "ICResp");
	}
	memset(sqe, 0, sizeof(sqe));
	sqe[0] = NVME_FABRICS_OPCODE;
	sqe[1] = 0x40;
	sqe[2] = 1; /* cid */
	sqe[4] = NVMF_FCTYPE_CONNECT;
	v32 = sizeof(data);
	memcpy(sqe + 32, &v32, 4); /* SGL length */
	sqe[39] = NVME_SGL_DATA_BLOCK_OFFSET;
	v16 = 31;
	memcpy(sqe + 44, &v16, 2); /* sqsize; qid 0, KATO 0 */
	memset(data, 0, sizeof(data));
	for (int i = 0; i < 16; i++)
		data[i] = (uint8_t)i; /* hostid */
	v16 = 0xFFFF;
	memcpy(data + 16, &v16, 2);
	memcpy(data + 256, SUBNQN, strlen(SUBNQN));
	memcpy(data + 512, HOST_NQN, strlen(HOST_NQN));
	send_pdu(sv[0], NVME_TCP_CMD, 72, sqe, 64, data, sizeof(data));
	must(wait_resp(sv[0]) == 0, "Connect");
	memset(sqe, 0, sizeof(sqe));
	sqe[0] = NVME_FABRICS_OPCODE;
	sqe[1] = 0x40;
	sqe[2] = 2;
	sqe[4] = NVMF_FCTYPE_PROP_SET;
	v32 = NVME_REG_CC;
	memcpy(sqe + 44, &v32, 4);
	v64 = (6u << 16) | (4u << 20) | NVME_CC_ENABLE;
	memcpy(sqe + 48, &v64, 8);
	send_pdu(sv[0], NVME_TCP_CMD, 72, sqe, 64, NULL, 0);
	must(wait_resp(sv[0]) == 0, "Property Set CC.EN");
	/* sv[0] stays open (and unread: the target sends nothing unasked)
	 * for the life of the process. */
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct feed f;
	pthread_t th;
	int sv[2];

	if (!g_t)
		setup();
	/* (each input starts from the same states: see ana_change) */
	tgt_ana_set(g_t, 0, 0, NVME_ANA_OPTIMIZED, 0, 0);
	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)
		return 0;
	f.fd = sv[0];
	f.p = data;
	f.n = size;
	if (pthread_create(&th, NULL, feeder, &f) != 0) {
		close(sv[0]);
		close(sv[1]);
		return 0;
	}
	tgt_serve_fd(g_t, sv[1]); /* closes sv[1] */
	pthread_join(th, NULL);
	return 0;
}
