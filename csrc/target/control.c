/*
 * The target's control socket (--control PATH): a unix stream socket, mode
 * 0600, that takes one command line per connection and answers "ok" (after
 * any lines of output) or "error: why".  It is served on the listener's
 * thread between accepts, so a command never races the poll on the ports it
 * closes or opens; a client gets FX_CTL_TIMEOUT_MS to send its line and to
 * take the answer, and a line is at most FX_CTL_LINE bytes.
 *
 *   ana-state PORT GROUP STATE   PORT: port id (1..) or ADDR:PORT;
 *                                GROUP: 1..32 or "all"; STATE: optimized,
 *                                non-optimized, inaccessible,
 *                                persistent-loss, change
 *   ana-state PORT GROUP change [THEN [MS]]
 *                                change, then THEN (default: the state
 *                                before) after MS (default and at most
 *                                ANATT, 10000)
 *   close-port PORT              (remove-listen) its connections end, new
 *                                connects are refused
 *   open-port PORT               listen again on the same address and port
 *   ports                        one line per port: id, address, open or
 *                                closed, each group's state
 *   tls                          TLS connections since the start by record
 *                                layer, and those open now:
 *                                "ktls_conns N tls_user_conns M tls_open K"
 *                                (the kernel's, kTLS; ours; either, not
 *                                yet ended)
 */
#define _GNU_SOURCE
#include <ctype.h>
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "tgt.h"

#define FX_CTL_LINE 512
#define FX_CTL_TIMEOUT_MS 1000
#define FX_CTL_OUT 16384 /* `ports` with 16 ports x 32 groups fits */

/* Whether a unix stream socket at path is served: a connect that is not
 * refused (accepted, or queued: EAGAIN) means a live process listens there
 * (another target, given the same path); so does any error other than
 * "refused" or "gone" (the socket of something else, or not ours to
 * reach), which we must not remove either.  Only ECONNREFUSED (nobody
 * listens: a target that was killed left it) or ENOENT say stale. */
static int socket_in_use(const struct sockaddr_un *sa)
{
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	int r, e;

	if (fd < 0)
		return 1; /* (cannot tell: leave it alone) */
	r = connect(fd, (const struct sockaddr *)sa, sizeof(*sa));
	e = errno;
	close(fd);
	return r == 0 || (e != ECONNREFUSED && e != ENOENT);
}

int tgt_control_open(struct fx_target *t, const char *path)
{
	struct sockaddr_un sa;
	struct stat st;
	int fd;

	memset(&sa, 0, sizeof(sa));
	sa.sun_family = AF_UNIX;
	if (!path[0] || strlen(path) >= sizeof(sa.sun_path)) {
		tgt_log(t, "control socket path %s: 1..%zu bytes", path, sizeof(sa.sun_path) - 1);
		return -EINVAL;
	}
	memcpy(sa.sun_path, path, strlen(path));
	/* A socket left by a target that was killed is replaced; a live
	 * one (another target given the same path) is not taken over, and
	 * anything else at that path is not ours to remove. */
	if (lstat(path, &st) == 0) {
		if (!S_ISSOCK(st.st_mode)) {
			tgt_log(t, "control socket path %s exists and is not a socket", path);
			return -EEXIST;
		}
		if (socket_in_use(&sa)) {
			tgt_log(t,
				"control socket %s is in use (another target running with the same "
				"--control path?): give each target its own path",
				path);
			return -EADDRINUSE;
		}
		unlink(path);
	}
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (fd < 0)
		return -errno;
	/* The mode before the name exists: bind() creates the file with the
	 * socket's own mode less the umask, so it is never wider than 0600,
	 * even for an instant; chmod then sets exactly 0600 (a umask that
	 * took the owner's bits away), still before anyone may connect
	 * (listen). */
	if (fchmod(fd, 0600) < 0 || bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		int e = errno;

		tgt_log(t, "control socket %s: %s%s", path, strerror(e),
			e == EADDRINUSE ? " (another target took the path just now?)" : "");
		close(fd);
		return -e;
	}
	if (chmod(path, 0600) < 0 || lstat(path, &st) < 0 || listen(fd, 8) < 0) {
		int e = errno;

		tgt_log(t, "control socket %s: %s", path, strerror(e));
		close(fd);
		unlink(path); /* (ours: we just bound it) */
		return -e;
	}
	/* What we remove at exit: this very file, not one that replaced it. */
	t->ctl_dev = (uint64_t)st.st_dev;
	t->ctl_ino = (uint64_t)st.st_ino;
	t->ctl_fd = fd;
	snprintf(t->ctl_path, sizeof(t->ctl_path), "%s", path);
	return 0;
}

void tgt_control_close(struct fx_target *t)
{
	struct stat st;
	int ours;

	if (t->ctl_fd < 0)
		return;
	/* Only the socket we bound: if someone removed it and another
	 * target bound the path since, that one is not ours to unlink.
	 * (Compared while our socket still holds its inode: once closed,
	 * its number may be given to a new file.) */
	ours = lstat(t->ctl_path, &st) == 0 && S_ISSOCK(st.st_mode) &&
	       (uint64_t)st.st_dev == t->ctl_dev && (uint64_t)st.st_ino == t->ctl_ino;
	if (ours)
		unlink(t->ctl_path);
	close(t->ctl_fd);
	t->ctl_fd = -1;
}

/* A port named by its id or its ADDR:PORT ([ADDR]:PORT for IPv6), as
 * bound or as configured; -1 when none. */
static int find_port(const struct fx_target *t, const char *s)
{
	char *end;
	unsigned long id = strtoul(s, &end, 10);

	if (*s && isdigit((unsigned char)*s) && !*end)
		return id >= 1 && id <= t->n_ports ? (int)id - 1 : -1;
	for (unsigned i = 0; i < t->n_ports; i++) {
		const struct tgt_port *p = &t->ports[i];
		char a[320], b[320], c[320];

		snprintf(a, sizeof(a), "%s:%d", p->addr, p->bound);
		snprintf(b, sizeof(b), "[%s]:%d", p->addr, p->bound);
		snprintf(c, sizeof(c), "%s:%d", p->host, p->bound);
		if (!strcmp(s, a) || !strcmp(s, b) || !strcmp(s, c))
			return (int)i;
	}
	return -1;
}

/* Run one command line; the answer goes to out. */
static void run_line(struct fx_target *t, char *line, char *out, size_t cap)
{
	char *arg[7];
	int n = 0, pi;
	char *save = NULL;

	/* (a 7th word makes any command's count wrong) */
	for (char *w = strtok_r(line, " \t\r\n", &save); w && n < 7;
	     w = strtok_r(NULL, " \t\r\n", &save))
		arg[n++] = w;
	if (n == 0) {
		snprintf(out, cap, "error: empty command\n");
		return;
	}
	if (!strcmp(arg[0], "ports") && n == 1) {
		size_t at = 0;

		for (unsigned i = 0; i < t->n_ports && at < cap; i++) {
			const struct tgt_port *p = &t->ports[i];
			int k = snprintf(out + at, cap - at, "port %u %s%s%s:%d %s", i + 1,
					 p->family == AF_INET6 ? "[" : "", p->addr,
					 p->family == AF_INET6 ? "]" : "", p->bound,
					 p->lfd >= 0 ? "open" : "closed");

			at += k > 0 ? (size_t)k : 0;
			for (uint32_t g = 1; g <= FX_TGT_ANA_GROUPS && at < cap; g++) {
				int used = 0;

				for (unsigned j = 0; j < t->n_ns; j++)
					used |= t->ns[j].anagrpid == g;
				if (!used)
					continue;
				k = snprintf(out + at, cap - at, " %u=%s", g,
					     tgt_ana_state_str(atomic_load(&p->ana[g])));
				at += k > 0 ? (size_t)k : 0;
			}
			if (at < cap)
				at += (size_t)snprintf(out + at, cap - at, "\n");
		}
		if (at < cap)
			snprintf(out + at, cap - at, "ok\n");
		return;
	}
	if (!strcmp(arg[0], "tls") && n == 1) {
		snprintf(out, cap, "ktls_conns %llu tls_user_conns %llu tls_open %llu\nok\n",
			 (unsigned long long)atomic_load(&t->ktls_conns),
			 (unsigned long long)atomic_load(&t->tls_user_conns),
			 (unsigned long long)atomic_load(&t->tls_open));
		return;
	}
	if (!strcmp(arg[0], "ana-state") && n >= 4 && n <= 6) {
		char *end;
		unsigned long g = strtoul(arg[2], &end, 10), ms = 0;
		uint8_t st = tgt_ana_state_parse(arg[3]), then = 0;

		pi = find_port(t, arg[1]);
		if (pi < 0) {
			snprintf(out, cap, "error: no port %.64s (a port id 1..%u or ADDR:PORT)\n",
				 arg[1], t->n_ports);
			return;
		}
		if (!strcmp(arg[2], "all"))
			g = 0;
		else if (!isdigit((unsigned char)arg[2][0]) || *end || g < 1 ||
			 g > FX_TGT_ANA_GROUPS) {
			snprintf(out, cap, "error: ANA group %.64s: 1..%u or all\n", arg[2],
				 FX_TGT_ANA_GROUPS);
			return;
		}
		if (!st) {
			snprintf(out, cap,
				 "error: ANA state %.64s: optimized, non-optimized, inaccessible, "
				 "persistent-loss or change\n",
				 arg[3]);
			return;
		}
		if (n > 4 && st != NVME_ANA_CHANGE) {
			snprintf(out, cap,
				 "error: a state to go to and a time are for change only "
				 "(ana-state PORT GROUP change [STATE [MS]])\n");
			return;
		}
		if (n > 4) {
			then = tgt_ana_state_parse(arg[4]);
			if (!then || then == NVME_ANA_CHANGE) {
				snprintf(
					out, cap,
					"error: state after change %.64s: optimized, non-optimized, "
					"inaccessible or persistent-loss\n",
					arg[4]);
				return;
			}
		}
		if (n > 5) {
			ms = strtoul(arg[5], &end, 10);
			if (!isdigit((unsigned char)arg[5][0]) || *end || ms < 1 ||
			    ms > FX_TGT_ANATT * 1000u) {
				snprintf(
					out, cap,
					"error: time in change %.64s: 1..%u ms (ANATT, which hosts "
					"are promised)\n",
					arg[5], FX_TGT_ANATT * 1000u);
				return;
			}
		}
		tgt_ana_set(t, (unsigned)pi, (uint32_t)g, st, then, (uint32_t)ms);
		snprintf(out, cap, "ok\n");
		return;
	}
	if ((!strcmp(arg[0], "close-port") || !strcmp(arg[0], "remove-listen") ||
	     !strcmp(arg[0], "open-port")) &&
	    n == 2) {
		int ret;

		pi = find_port(t, arg[1]);
		if (pi < 0) {
			snprintf(out, cap, "error: no port %.64s (a port id 1..%u or ADDR:PORT)\n",
				 arg[1], t->n_ports);
			return;
		}
		ret = !strcmp(arg[0], "open-port") ? tgt_port_open(t, (unsigned)pi)
						   : tgt_port_close(t, (unsigned)pi);
		if (ret == -EALREADY)
			snprintf(out, cap, "error: port %d is already %s\n", pi + 1,
				 !strcmp(arg[0], "open-port") ? "open" : "closed");
		else if (ret < 0)
			snprintf(out, cap, "error: port %d: %s\n", pi + 1, strerror(-ret));
		else
			snprintf(out, cap, "ok\n");
		return;
	}
	snprintf(out, cap,
		 "error: unknown command or wrong arguments: %.64s (ana-state PORT GROUP STATE, "
		 "ana-state PORT GROUP change [STATE [MS]], close-port PORT, open-port PORT, "
		 "ports, tls)\n",
		 arg[0]);
}

/* Wait for fd to be ready (events), up to the client's deadline. */
static int wait_fd(int fd, short events, uint64_t deadline)
{
	uint64_t now = tgt_now_ms();
	struct pollfd p = {.fd = fd, .events = events};

	if (now >= deadline)
		return -ETIMEDOUT;
	return poll(&p, 1, (int)(deadline - now)) == 1 ? 0 : -ETIMEDOUT;
}

void tgt_control_serve(struct fx_target *t)
{
	char line[FX_CTL_LINE + 1];
	char *out;
	size_t have = 0, len, at = 0;
	uint64_t deadline;
	int fd = accept4(t->ctl_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);

	if (fd < 0)
		return;
	out = malloc(FX_CTL_OUT);
	if (!out) {
		close(fd);
		return;
	}
	deadline = tgt_now_ms() + FX_CTL_TIMEOUT_MS;
	/* One line: up to its newline (or the end of what the client sends). */
	for (;;) {
		ssize_t k;

		if (have == FX_CTL_LINE) {
			snprintf(out, FX_CTL_OUT, "error: line longer than %d bytes\n",
				 FX_CTL_LINE);
			goto answer;
		}
		k = recv(fd, line + have, FX_CTL_LINE - have, 0);
		if (k > 0) {
			have += (size_t)k;
			if (memchr(line, '\n', have))
				break;
			continue;
		}
		if (k == 0)
			break;
		if ((errno != EAGAIN && errno != EINTR) ||
		    (errno == EAGAIN && wait_fd(fd, POLLIN, deadline) < 0)) {
			close(fd);
			free(out);
			return;
		}
	}
	line[have] = 0;
	if (memchr(line, 0, have)) {
		snprintf(out, FX_CTL_OUT, "error: a NUL byte in the line\n");
		goto answer;
	}
	{
		char *nl = strchr(line, '\n');

		if (nl)
			*nl = 0;
	}
	run_line(t, line, out, FX_CTL_OUT);
answer:
	len = strnlen(out, FX_CTL_OUT);
	while (at < len) {
		ssize_t k = send(fd, out + at, len - at, MSG_NOSIGNAL);

		if (k > 0)
			at += (size_t)k;
		else if (k < 0 && errno == EAGAIN && wait_fd(fd, POLLOUT, deadline) == 0)
			continue;
		else
			break;
	}
	/* Whatever the client sent beyond the line is read and dropped
	 * before the close (until its end or the deadline): closing with
	 * unread bytes would reset the connection and could lose the
	 * answer on its way. */
	shutdown(fd, SHUT_WR);
	for (;;) {
		char drop[512];
		ssize_t k = recv(fd, drop, sizeof(drop), 0);

		if (k > 0 || (k < 0 && errno == EINTR))
			continue;
		if (k < 0 && errno == EAGAIN && wait_fd(fd, POLLIN, deadline) == 0)
			continue;
		break;
	}
	close(fd);
	free(out);
}
