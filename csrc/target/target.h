/*
 * fx100io's NVMe/TCP target: serves files and block devices as namespaces of
 * one NVM subsystem, plus the discovery subsystem, to any NVMe/TCP host (our
 * own initiator, Linux's nvme-tcp, SPDK).  It is a test, benchmark and
 * container target: one thread per connection reads PDUs from a blocking
 * socket, so every queue's receive side is a simple in-order state machine
 * and the kernel does the scheduling; an I/O queue that moves data also gets
 * an engine (io.c) that keeps many Reads and Writes in flight on an io_uring
 * (O_DIRECT for uncached data, sendfile for cached) and answers each from
 * its own thread as its disk I/O completes, its data buffers bounded per
 * connection (FX_TGT_IO_BUDGET, 32 MiB) and target-wide (io_buffer_budget_mib,
 * shared fairly between peer addresses).  Connections are bounded in number and must finish their
 * handshake in time; no thread waits forever on a host that went silent in
 * the middle of a PDU or stopped reading (see the limits below).
 *
 * Life cycle: fx_target_create() opens the namespaces and binds the listening
 * socket (so the caller can report the real port before serving),
 * fx_target_run() accepts and serves until fx_target_stop(), then closes
 * every connection and returns; fx_target_destroy() frees.
 */
#ifndef FX100IO_TARGET_H
#define FX100IO_TARGET_H

#include <stdint.h>

struct fx_target;

#define FX_TARGET_IDLE_NEVER 0xFFFFFFFFu

/*
 * In-band authentication (DH-HMAC-CHAP) of one host, as Linux nvmet's host
 * entry (dhchap_key, dhchap_ctrl_key): secrets in the DHHC-1 text form that
 * `nvme gen-dhchap-key` writes.  A host with a secret must authenticate on
 * every queue (admin and I/O) before any other command is served; with a
 * controller secret too, it may also authenticate us (bidirectional).
 */
struct fx_target_dhchap_host {
	const char *hostnqn;
	const char *secret;      /* the host's secret (required) */
	const char *ctrl_secret; /* the controller's secret, or NULL */
};

/* A host's configured TLS PSK (NVMeTLSkey-1:HH:...:), for the secure channel. */
struct fx_target_tls_host {
	const char *hostnqn;
	const char *key;
};

/* fx_target_config.tls: whether hosts must, may or cannot use TLS. */
#define FX_TARGET_TLS_OFF 0
#define FX_TARGET_TLS_OPTIONAL 1 /* TLS or clear text, by the host's first byte */
#define FX_TARGET_TLS_REQUIRED 2 /* TLS only: anything else is closed */

/* Bits of fx_target_config.dhchap_hashes / dhchap_dhgroups: 1u << id. */
#define FX_TARGET_DHCHAP_HASHES_ALL 0x0Eu   /* SHA-256 (1), SHA-384 (2), SHA-512 (3) */
#define FX_TARGET_DHCHAP_DHGROUPS_ALL 0x3Fu /* null (0), ffdhe2048 (1) ... ffdhe8192 (5) */

/* One listening port (port id = its index + 1). */
struct fx_target_listen {
	const char *host; /* address (literal or name), e.g. "127.0.0.1", "::" */
	const char *port; /* service; "0" picks a free port */
};

/* An initial ANA state: port id (1..), ANA group (1..32; 0 = every
 * group), state (NVME_ANA_OPTIMIZED ... NVME_ANA_CHANGE).  Every group is
 * optimized through every port unless told. */
struct fx_target_ana {
	unsigned portid;
	uint32_t group;
	uint8_t state;
};

/* fx_target_config.ktls: which record layer a TLS connection uses once its
 * handshake (ours, in userspace) is done. */
#define FX_TARGET_KTLS_AUTO 0 /* the kernel's (kTLS) where it has the tls ULP, else ours */
#define FX_TARGET_KTLS_OFF 1  /* always ours */

/* --fault-tls-record kinds: a NewSessionTicket, close_notify, a fatal
 * alert (internal_error), a warning alert (user_canceled); their names, in
 * this order, are fx100io/target_faults.py's FAULT_TLS_KINDS */
enum {
	FX_TARGET_FAULT_TLS_TICKET = 1,
	FX_TARGET_FAULT_TLS_CLOSE_NOTIFY,
	FX_TARGET_FAULT_TLS_FATAL,
	FX_TARGET_FAULT_TLS_WARNING
};

struct fx_target_config {
	const char *host; /* listen address (literal or name), e.g. "127.0.0.1", "::" */
	const char *port; /* service; "0" picks a free port (see fx_target_port) */
	/* Several ports (up to 16; then host/port are not used): each is an
	 * NVMe port of its own (port id, discovery log entry, ANA states). */
	const struct fx_target_listen *listens;
	unsigned n_listens;
	const struct fx_target_ana *ana;
	unsigned n_ana;
	const uint32_t *ns_ana_groups; /* [n_ns]: namespace i+1's ANA group; NULL: all 1 */
	/* A unix socket that takes control commands (ana-state, close-port,
	 * open-port, ports; docs/target.md); NULL: none. */
	const char *control_path;
	const char *subnqn;          /* our NVM subsystem's NQN */
	const char *const *ns_paths; /* namespace i+1 is ns_paths[i]: file or block device */
	unsigned n_ns;
	const char *const *allow_hosts; /* host NQNs allowed to connect; n_allow 0 = any */
	unsigned n_allow;
	/* Hosts that must authenticate (DH-HMAC-CHAP).  They are allowed to
	 * connect; with any of them and no allow_hosts, no other host is
	 * (as nvmet, where host entries turn allow_any_host off).  The
	 * discovery controller does not authenticate. */
	const struct fx_target_dhchap_host *dhchap_hosts;
	unsigned n_dhchap_hosts;
	/* The hash functions and DH groups we accept (bit 1u << id; 0 = all);
	 * of those the host offers too, the strongest is used. */
	uint32_t dhchap_hashes;
	uint32_t dhchap_dhgroups;
	/* NVMe/TCP secure channel (TLS 1.3 with a PSK, csrc/target/tls.c):
	 * FX_TARGET_TLS_*, and the hosts' keys.  The discovery log says
	 * TREQ required / not required and SECTYPE TLS 1.3 when it is on. */
	int tls;
	const struct fx_target_tls_host *tls_hosts;
	unsigned n_tls_hosts;
	int ktls;               /* FX_TARGET_KTLS_* (0: auto) */
	uint32_t block_size;    /* 512 or 4096 */
	uint32_t max_io_queues; /* granted per controller; 0 = default (64) */
	/* Limits against hosts that are hostile, broken or gone; 0 = default.
	 * max_connections (1024; fewer when the open files limit is lower):
	 * at the limit, a new connection evicts the oldest one still in its
	 * ICReq/Connect handshake; failing that, the longest idle Connected
	 * queue of a controller with keep alive off (KATO 0) that has been idle
	 * for 1 s (or handshake_timeout_ms, when shorter); failing that (every
	 * connection busy or kept alive), it is closed at once; each with a
	 * log line.
	 * handshake_timeout_ms (10000): a connection must complete ICReq and
	 * Connect (and DH-HMAC-CHAP, for a host with a secret) within this
	 * long of its accept, or it is closed.
	 * stall_timeout_ms (30000): once a PDU's first byte has arrived, the
	 * whole PDU (header, data, digests) must arrive within this long, and a
	 * host must keep reading what we send (no progress for this long);
	 * otherwise the connection is closed.  A Connected queue may be silent
	 * between PDUs while its controller lives: KATO bounds that, or
	 * idle_timeout_ms when the controller has no KATO.
	 * idle_timeout_ms (300000; FX_TARGET_IDLE_NEVER: never): a Connected
	 * queue whose controller has keep alive off (KATO 0) and that has
	 * received nothing, with no command being executed or answered, for
	 * this long is closed (one log line per sweep).  An admin queue counts
	 * as busy while any queue of its controller gets commands.  Controllers
	 * with a KATO are left to their KATO. */
	uint32_t max_connections;
	/* io_buffer_budget_mib (256; at least 8): the data buffers of every
	 * connection together (commands in flight, Admin data collected by
	 * R2T), shared between peer addresses: while n addresses hold some
	 * or wait, one may take more only up to 1/n of it, a lone one 3/4
	 * (so a newcomer finds room at once); each I/O queue also at most
	 * 32 MiB.  Commands that do not fit wait for room. */
	uint32_t io_buffer_budget_mib;
	uint32_t handshake_timeout_ms;
	uint32_t stall_timeout_ms;
	uint32_t idle_timeout_ms;
	/* fault injection for tests; 0 = off */
	uint32_t fault_drop_after; /* close a connection after it sent this many PDUs */
	uint32_t fault_delay_ms;   /* sleep before answering each command */
	uint32_t
		fault_corrupt_ddgst; /* corrupt the data digest of every Nth C2HData of a connection */
	/* a TLS record of kind fault_tls_kind (FX_TARGET_FAULT_TLS_*) sealed with
	 * the connection's keys (by the kernel on kTLS), sent once per target
	 * inside the data of a C2HData (between two of its records), the first
	 * place a connection reaches once it sent fault_tls_after 16 KiB
	 * records of read data, on every read path (from the page cache or
	 * the disk, with or without a data digest, with fault_drop_after); a
	 * C2HData of one record has no such place.  TLS only; 0 = off. */
	uint32_t fault_tls_after;
	uint32_t fault_tls_kind;
	int verbose; /* 0: errors and connects to stderr; 1: also every command */
	int quiet;   /* no log lines at all (benchmarks) */
};

/*
 * Validate cfg, open the namespaces (read-write), bind and listen.
 * -EINVAL (bad config: no namespaces, bad block size, an I/O buffer budget under 8 MiB, NQN too long, a
 * namespace smaller than one block, a DH-HMAC-CHAP secret that does not
 * parse (logged without the secret), no usable hash or DH group),
 * -ENOENT/-EACCES/-EISDIR (a namespace), -EADDRINUSE/-EADDRNOTAVAIL (listen address), -ENOMEM.
 */
int fx_target_create(const struct fx_target_config *cfg, struct fx_target **out);

/* The port actually bound (useful with port "0"); of port id portid. */
int fx_target_port(const struct fx_target *t);
int fx_target_port_of(const struct fx_target *t, unsigned portid);

/* Serve until fx_target_stop(); closes all connections before returning.
 * 0, or -errno of accept when the listening socket fails. */
int fx_target_run(struct fx_target *t);

/* Ask fx_target_run() to return (any thread; async-signal-safe). */
void fx_target_stop(struct fx_target *t);

/* Stop every target created in this process that is not yet destroyed
 * (for a binding that does not keep the handle at hand). */
void fx_target_stop_all(void);

void fx_target_destroy(struct fx_target *t);

#endif
