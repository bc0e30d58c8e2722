/*
 * Internals of the NVMe/TCP target shared by target.c (listener, controller
 * registry, keep-alive timer), conn.c (one connection's PDU state machine and
 * the I/O path) and admin.c (Fabrics and admin commands, Identify and log
 * page contents).  Not installed.
 */
#ifndef FX100IO_TARGET_TGT_H
#define FX100IO_TARGET_TGT_H

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/socket.h>

#include "fx100io/nvme.h"
#include "auth/auth_msg.h"
#include "nvme_tcp/ktls.h"
#include "nvme_tcp/tls.h"
#include "nvme_tcp/tls_psk.h"
#include "target.h"

/* Limits we advertise.  MDTS is in units of the 4 KiB minimum page: 2^10
 * pages = 4 MiB per command, so a 14-80 MiB KV chunk is a handful of
 * commands, while a connection never buffers more than FX_TGT_CHUNK. */
#define FX_TGT_MDTS 10
#define FX_TGT_MAX_XFER (4096u << FX_TGT_MDTS)
#define FX_TGT_MQES 1023u         /* 0's based: 1024-entry queues */
#define FX_TGT_ICD_MAX 16384u     /* in-capsule data per command (IOCCSZ) */
#define FX_TGT_MAXH2CDATA 131072u /* bytes per H2CData PDU (ICResp) */
#define FX_TGT_CHUNK 262144u      /* C2HData PDU size when we must touch the data */
#define FX_TGT_ADMIN_BUF 65536u   /* largest admin data transfer (log pages) */
/* A queue's admin data buffer until its host has authenticated: what an
 * AUTH_Receive needs (a Challenge is at most 16 + 64 + 1024 bytes; hosts
 * ask for 4 KiB).  A longer AL gets this much, the message zero padded. */
#define FX_TGT_AUTH_BUF 4096u
#define FX_TGT_R2T_BUFS 4u /* admin/Fabrics data collections at once, per queue */
#define FX_TGT_AERL 3u     /* 0's based: up to 4 outstanding AERs */
#define FX_TGT_DEFAULT_IO_QUEUES 64u
/* Asymmetric Namespace Access (ana.c): listening ports (each its own port
 * id, 1..), ANA groups (ids 1..FX_TGT_ANA_GROUPS; namespaces are in group
 * 1 unless told), and the ANA Transition Time we promise (s). */
#define FX_TGT_MAX_PORTS 16u
#define FX_TGT_ANA_GROUPS 32u
#define FX_TGT_ANATT 10u
#define FX_TGT_KAS 10u /* keep alive granularity, 100 ms units */
/* Defaults of the limits that keep hostile or dead hosts from exhausting us
 * (fx_target_config says what each bounds). */
#define FX_TGT_DEFAULT_MAX_CONNS 1024u
#define FX_TGT_DEFAULT_HANDSHAKE_MS 10000u
#define FX_TGT_DEFAULT_STALL_MS 30000u
#define FX_TGT_DEFAULT_IDLE_MS 300000u
/* At the connection limit, a Connected queue of a controller without keep
 * alive may be closed for a new connection once it has been idle this long
 * (or the handshake timeout, when shorter; see evict_idle() in target.c). */
#define FX_TGT_EVICT_IDLE_GRACE_MS 1000u
/* Connections closed at the limit (or by their deadline) whose threads have
 * not ended yet: at most this many on top of the limit. */
#define FX_TGT_EVICT_SLACK 64u
/* TLS handshakes (tls.c), which run on the connection's thread before
 * ICReq.  What a host that fails or stalls them can cost us is bounded in
 * how many are in progress at once (not in rate).  A handshake is counted
 * while it waits on the network for a host that has not shown it holds a
 * key (its PSK binder verified): at most FX_TGT_TLS_HS_PER_ADDR from one
 * peer address (peer_key) and FX_TGT_TLS_HS_MAX in the target; a new one
 * past either shuts the oldest counted one of its address, or of the
 * address with the most.  One with a whole record to read only computes,
 * and one whose binder verified is not counted and never pushed out, so
 * connections that never prove a key cannot push out a host that has one.
 * Each must end within FX_TGT_TLS_HS_MS (or the handshake timeout, when
 * shorter).  No backoff after wrong keys: anyone behind the same address
 * could claim a host's (public) NQN and lock it out, and a wrong key costs
 * one key derivation and one HMAC, bounded by the above. */
#define FX_TGT_TLS_HS_PER_ADDR 8u
#define FX_TGT_TLS_HS_MAX 64u
#define FX_TGT_TLS_HS_MS 3000u
/* DH-HMAC-CHAP transactions a queue may start without one succeeding: each
 * costs a DH key pair and a key agreement (ffdhe8192: a few ms of CPU each,
 * a short private exponent; the peer's value is range checked only), so a
 * host must not loop on them for the whole handshake deadline. */
#define FX_TGT_AUTH_MAX_TRIES 4u
/* DH operations (key pair, key agreement) running at once in the whole
 * target; more wait, at most FX_TGT_AUTH_DH_WAIT_MS, then fail the
 * transaction: however many connections a host opens, authentication
 * takes at most this many CPUs. */
#define FX_TGT_AUTH_MAX_DH 2u
#define FX_TGT_AUTH_DH_WAIT_MS 2000u
/* Failed transactions in a row for one host NQN from one peer address
 * (across connections) that made us do DH work (those abandoned after our
 * Challenge, by a new Negotiate, a Failure2 or the connection's end, too) (a key pair: the group is
 * not null) before a new one must wait: FX_TGT_AUTH_BACKOFF_MS, doubled
 * with each further failure up to FX_TGT_AUTH_BACKOFF_MAX_MS; meanwhile a
 * Negotiate gets Failure1 at once, at no DH cost.  A success clears it.  FX_TGT_AUTH_BACKOFF_SLOTS (host, address) pairs are
 * remembered, the least recently failed one replaced. */
#define FX_TGT_AUTH_FREE_FAILS 16u
#define FX_TGT_AUTH_BACKOFF_MS 500u
#define FX_TGT_AUTH_BACKOFF_MAX_MS 8000u
#define FX_TGT_AUTH_BACKOFF_SLOTS 64u
/* Log lines of the whole target: a burst of FX_TGT_LOG_BURST, then
 * FX_TGT_LOG_PER_S a second; the rest are counted and the count said. */
#define FX_TGT_LOG_BURST 100u
#define FX_TGT_LOG_PER_S 20u
/* Lines that matter (a failed authentication, a refusal, an internal error)
 * are never left out silently: past the bucket, they are counted per peer
 * address and kind, FX_TGT_LOG_AGG kinds a second (the rest as one count),
 * and each count is said once a second ("127.0.0.9: 10 x failed
 * authentication as host X"), however many lines a flood makes. */
#define FX_TGT_LOG_AGG 32u
/* DH work per peer address (target.c, peer_key), whatever host NQN it
 * names: each Challenge with a DH group (a key pair now, a key agreement
 * at the Reply) takes a token from the address's bucket of
 * FX_TGT_AUTH_DH_BURST, refilled at FX_TGT_AUTH_DH_PER_S a second; a
 * Reply that proves the host's secret gives it back, so a host that
 * authenticates never runs dry, however many queues it connects, while
 * one that abandons or fails its transactions gets this many at most.
 * An address with no token left gets Failure1 at once, at no DH cost.
 * FX_TGT_AUTH_DH_PEERS addresses are remembered, the least recently
 * used one replaced. */
#define FX_TGT_AUTH_DH_BURST 32u
#define FX_TGT_AUTH_DH_PER_S 4u
#define FX_TGT_AUTH_DH_PEERS 256u
/* An address's bucket is shared by every host NQN it names, so a neighbour
 * behind the same address (NAT, the same IPv6 /64) could drain it and lock
 * out a host that has the right secret.  A (host NQN, address) pair that
 * proved its secret within FX_TGT_AUTH_TRUST_MS has a bucket of its own
 * (the same size and refill), which only transactions naming that host
 * from that address use; FX_TGT_AUTH_DH_TRUSTED pairs are remembered, the
 * longest unproven replaced (only a proof creates one).  A slot of the
 * address table is replaced only once its bucket has refilled (forgetting
 * it then gives nothing away); while none has, new addresses share one
 * overflow bucket.  A Challenge that finds its bucket empty waits for the
 * next token when that is at most FX_TGT_AUTH_DH_TOKEN_WAIT_MS away (one
 * token's refill), rather than fail a host that only came at a bad time. */
#define FX_TGT_AUTH_DH_TRUSTED 256u
#define FX_TGT_AUTH_TRUST_MS (3600u * 1000u)
#define FX_TGT_AUTH_DH_TOKEN_WAIT_MS (1000u / FX_TGT_AUTH_DH_PER_S)
/* A connection thread needs a few KiB of stack (ASan builds some more):
 * 512 KiB instead of the default 8 MiB keeps a thousand of them cheap. */
#define FX_TGT_THREAD_STACK (512u << 10)
/* An I/O queue keeps many Read/Write commands in flight (io.c): data
 * buffers of the commands between their start (disk read submitted, R2T
 * sent) and the end of their response's send total at most this much per
 * connection; a command that does not fit waits, in order, for one to end.
 * With commands up to FX_TGT_MAX_XFER (4 MiB) that is 8 of the largest, or
 * 32 of 1 MiB (16 where transparent huge pages are on: a 1 MiB command then
 * takes a whole 2 MiB page, io.c), at once; a
 * queue never holds more than its depth. */
#define FX_TGT_IO_BUDGET (32u << 20)
/* The I/O buffers of all connections together (io.c, struct tgt_iobufs):
 * at most the budget (--io-buffer-budget, this by default; at least
 * FX_TGT_IO_BUDGET_MIN, two of the largest commands), shared between peer
 * addresses (target.c, peer_key): while n addresses have buffers or wait
 * for them, one may take more only up to budget / n, and a lone one up to
 * three quarters, so that a newcomer always finds room at once however
 * much the others hold and however long they hold it (a host that does
 * not read its socket keeps its reads' buffers for the stall timeout).  A
 * command that does not fit waits, in its queue's order, for room.
 * Admin data collected by R2T comes out of the same budget (without
 * waiting: a retryable error when there is no room); Connect and
 * authentication data do not (conn.c, r2t_budget_part).  A host above its
 * share that sends no write data while others wait is closed
 * (FX_TGT_SQUEEZE_MS). */
#define FX_TGT_IO_BUFFER_BUDGET (256u << 20)
#define FX_TGT_IO_BUDGET_MIN (2u * FX_TGT_MAX_XFER)
/* Shares are checked when a buffer is taken, and a write's buffer is taken
 * at its R2T: hosts at two addresses that take R2Ts and never send the data
 * would otherwise hold the whole budget (3/4 + 1/4) until the data timeout
 * (2 x stall_ms) while everyone else waits.  So while any queue waits for
 * room, a connection whose address holds more than its share and that has
 * writes waiting for data must have sent some write data within the last
 * FX_TGT_SQUEEZE_MS (stall_ms / 4 if less), or it is closed and its
 * buffers go back: what it holds beyond its share is then given back
 * within that time, and the waiting host's share, at least one command of
 * the largest size, fits.  A host that is sending its data keeps going;
 * connections are polled that often only while someone waits. */
#define FX_TGT_SQUEEZE_MS 500u
/* After a C2HTermReq, how long the connection drains the host's data before
 * it closes (conn.c, linger_after_term). */
#define FX_TGT_TERM_LINGER_MS 1000u
#define FX_TGT_SQUEEZE_POLL_MS 50u
/* Buffers kept for reuse once the whole target has had nothing in flight
 * for a moment (the cache otherwise keeps what the last 100 ms used). */
#define FX_TGT_IO_IDLE_CACHE (4u << 20)
#define FX_TGT_BUF_CLASSES 7
/* io_uring workers (bounded and unbounded, each) per queue's ring. */
#define FX_TGT_IO_WORKERS 2u
/* O_DIRECT file I/O: offset, length and buffer aligned to this. */
#define FX_TGT_DIO_ALIGN 4096u
/* R2T transfer tags of the I/O engine's writes (io.c) have this bit; the
 * others index the connection's R2T table (admin, Fabrics, and I/O writes
 * when the queue has no engine). */
#define TGT_TTAG_IO 0x8000u

/* Status field helpers (SC bits 0-7, SCT bits 8-10, DNR bit 14). */
#define TGT_SF(sct, sc) ((uint16_t)(((sct) << 8) | (sc)))
#define TGT_SF_DNR(sct, sc) ((uint16_t)(TGT_SF(sct, sc) | NVME_DNR))
#define TGT_SC_INVALID_NS 0x0B
#define TGT_SC_CMD_SEQ_ERROR 0x0C
#define TGT_SC_SGL_INVALID_DATA 0x0F
#define TGT_SC_TRANSIENT_TRANSPORT 0x22
#define TGT_SC_AER_LIMIT 0x05 /* SCT 1 */
/* Fabrics Disconnect (auth/auth_msg.h has AUTH_Send/AUTH_Receive's
 * types, the Connect response's ATR bit and Authentication Required) */
#define TGT_FCTYPE_DISCONNECT 0x08
#define TGT_SC_WRITE_FAULT 0x80      /* SCT 2 */
#define TGT_SC_UNRECOVERED_READ 0x81 /* SCT 2 */

struct tgt_ns {
	uint32_t nsid;
	int fd;
	int is_bdev;
	int dfd;   /* the same, O_DIRECT (-1: not possible here) */
	void *map; /* read-only mapping for mincore(): is a range cached? */
	size_t map_len;
	char *path;
	uint64_t nsze; /* blocks */
	uint8_t nguid[16];
	uint8_t uuid[16];
	uint32_t anagrpid; /* its ANA group, 1..FX_TGT_ANA_GROUPS */
};

/* A listening port: its own port id (index + 1), the address it was given
 * and the one bound, and the state of each ANA group as seen through it
 * (read by the I/O path without a lock: a change takes effect for the
 * commands that come after it). */
struct tgt_port {
	char host[256]; /* as configured ("" = any) */
	char svc[32];
	int lfd;         /* -1: closed (close-port), new connects refused (listener only) */
	atomic_int open; /* lfd >= 0, for the discovery log's readers */
	int bound;       /* the TCP port bound */
	int family;      /* of the bound address */
	char addr[64];   /* the bound address, numeric */
	_Atomic uint8_t ana[FX_TGT_ANA_GROUPS + 1];
	/* Under t->lock: the change counts of this port's ANA log (its
	 * header's, each group descriptor's; ana.c, set_locked), and for a
	 * group in change, the state it goes to and when (0: not in change;
	 * set by the listener's thread only, which runs tgt_ana_tick). */
	uint64_t ana_chgcnt;
	uint64_t ana_chg[FX_TGT_ANA_GROUPS + 1];
	uint8_t chg_then[FX_TGT_ANA_GROUPS + 1];
	uint64_t chg_due_ms[FX_TGT_ANA_GROUPS + 1];
};

/* A host that must authenticate (DH-HMAC-CHAP): its parsed secrets. */
struct tgt_dhchap_host {
	char hostnqn[NVMF_NQN_SIZE];
	struct fx_auth_key key;      /* the host's */
	struct fx_auth_key ctrl_key; /* ours, for bidirectional authentication */
	int has_ctrl_key;
};

struct tgt_auth; /* one queue's DH-HMAC-CHAP transaction (auth.c) */

/* One peer address's part of the I/O buffer budget (io.c; under the
 * budget's lock): one per address with a connection. */
struct tgt_iopeer {
	struct tgt_iopeer *next;
	char key[64];
	unsigned conns;   /* connections from it */
	size_t held;      /* bytes of buffers its commands hold */
	unsigned waiting; /* its queues waiting for room */
};

/* The target-wide I/O buffer budget (io.c). */
struct tgt_iobufs {
	pthread_mutex_t lock;
	size_t budget;
	size_t used;   /* in commands' hands */
	size_t cached; /* kept for reuse, freed when room is needed */
	size_t peak;   /* most used since the last trim (the listener's tick) */
	void **cache[FX_TGT_BUF_CLASSES];
	unsigned ncache[FX_TGT_BUF_CLASSES], cache_max[FX_TGT_BUF_CLASSES];
	struct tgt_iopeer *peers;
	unsigned active;         /* peers holding buffers or waiting for them */
	struct tgt_ioq *waiters; /* queues waiting for room (woken when theirs fits) */
	atomic_uint nwait;       /* how many: read without the lock by connections' threads */
};
struct tgt_ioq; /* one I/O queue's engine: commands in flight (io.c) */

/* Failed authentications of one host from one address (auth.c; under the
 * target's lock). */
struct tgt_auth_backoff {
	const struct tgt_dhchap_host *host; /* NULL: free slot */
	char addr[64];
	unsigned fails;    /* failed transactions in a row */
	uint64_t last_ms;  /* of the last failure */
	uint64_t until_ms; /* no new transaction before */
};

/* One peer address's DH tokens (auth.c; under the target's lock). */
struct tgt_dh_peer {
	char addr[64];      /* "": a free slot */
	uint64_t milli;     /* tokens, in thousandths */
	uint64_t refill_ms; /* last refilled (and used) */
};

/* A (host, address) pair that proved its secret: its own DH tokens
 * (auth.c; under the target's lock). */
struct tgt_dh_trust {
	const struct tgt_dhchap_host *host; /* NULL: a free slot */
	char addr[64];
	uint64_t ok_ms; /* its last proof */
	uint64_t milli; /* tokens, in thousandths */
	uint64_t refill_ms;
};

enum tgt_ctrl_state {
	TGT_CTRL_DISABLED, /* connected, CC.EN = 0 */
	TGT_CTRL_READY,    /* CC.EN = 1, CSTS.RDY = 1 */
	TGT_CTRL_SHUTDOWN, /* CC.SHN written, CSTS.SHST = complete */
	TGT_CTRL_DEAD,     /* admin queue gone or keep alive expired */
};
const char *tgt_ctrl_state_str(enum tgt_ctrl_state s);

struct tgt_ctrl {
	struct fx_target *t;
	struct tgt_ctrl *next;
	uint16_t cntlid;
	int discovery;
	char hostnqn[NVMF_NQN_SIZE];
	uint8_t hostid[16];
	unsigned refs; /* connections using it; under t->lock */
	/* under t->lock: */
	enum tgt_ctrl_state state;
	uint32_t cc;
	uint32_t csts;
	uint16_t io_queues; /* granted by Set Features (count, not 0's based); 0: not yet */
	uint8_t *qid_used;  /* [max_io_queues + 1] */
	uint32_t kato_ms;
	uint32_t aec;  /* Asynchronous Event Configuration (ANA change notices on by default) */
	unsigned port; /* index in t->ports of the port it was created on */
	/* ANA change notice (under t->lock): to be reported (no AER was held
	 * when the state changed), and reported but not yet cleared by a Get
	 * Log Page of the ANA log without RAE (no other one until then). */
	int ana_aen_pending, ana_aen_masked;
	uint32_t wce;                 /* volatile write cache enable */
	_Atomic uint64_t last_cmd_ms; /* for KATO: any command on any of its queues */
	/* I/O queues attached whose disk I/O may still be running (under
	 * t->lock; t->drain_cond signals a decrease): a reset is reported
	 * done, and a new controller of the same host starts, only once the
	 * old queues' writes can no longer land on the media. */
	unsigned io_live;
};

enum tgt_conn_state {
	TGT_CONN_WAIT_ICREQ,
	TGT_CONN_WAIT_CONNECT,
	TGT_CONN_LIVE,
	TGT_CONN_CLOSING,
};
const char *tgt_conn_state_str(enum tgt_conn_state s);

/* A write (or a Fabrics/admin command with data) waiting for H2CData after
 * our R2T; the transfer tag is its index in the connection's table. */
struct tgt_r2t {
	int active;
	struct nvme_sqe sqe;
	uint32_t len;      /* bytes the R2T asked for (the command's data) */
	uint32_t done;     /* bytes received so far, in order */
	struct tgt_ns *ns; /* I/O write: data goes straight to ns at off */
	uint64_t off;
	uint8_t *buf;    /* admin/Fabrics: data collected here (len bytes) */
	uint16_t err;    /* status to report once all data is in (digest error, write fault) */
	uint64_t r2t_ms; /* when the R2T went out */
};

struct tgt_conn {
	struct fx_target *t;
	struct tgt_conn *next;
	int fd;
	pthread_t thread;
	int thread_started;
	atomic_int done; /* thread finished; the listener joins and frees */
	atomic_int live; /* Connect done: no handshake deadline any more */
	/* When the thread began waiting for the next PDU with nothing in hand
	 * (0: it is inside a PDU or busy with a command): the idle reaper's
	 * clock for queues whose controller has no keep alive. */
	_Atomic uint64_t wait_since_ms;
	/* R2Ts sent and still waiting for their data: the queue is in the
	 * middle of a write, not idle, however long the host takes. */
	atomic_uint r2t_busy;
	/* Writes whose R2T went out and whose data is not all in: each one's
	 * data is due within 2 x stall_ms of its R2T (a host that sends part
	 * of it and falls silent, or chats on with other commands, would
	 * otherwise hold its buffers for ever).  data_check_ms: next check. */
	atomic_uint h2c_wait;
	uint64_t data_check_ms;
	/* When write data last came in, or the connection began waiting for
	 * some (h2c_wait 0 -> 1): a connection that holds more than its
	 * address's share of the I/O budget while others wait for room must
	 * keep its data coming (FX_TGT_SQUEEZE_MS; conn.c, data_overdue). */
	_Atomic uint64_t h2c_last_ms;
	uint64_t pdu_deadline_ms; /* the PDU being received must be complete by then */
	uint32_t rcvtimeo_ms;     /* SO_RCVTIMEO now set on fd */
	uint64_t accepted_ms;
	int deadline_hit; /* the listener shut it (handshake deadline, limit, idle; under lock) */
	char peer[80];
	/* The secure channel's records: sealed and opened by us (tls), or by
	 * the kernel (ktls: kTLS, nvme_tcp/ktls.h; tls is then NULL and the
	 * data path is the clear-text one); both NULL: clear text. */
	struct fx_tls *tls;
	struct fx_ktls *ktls;
	int tls_open_counted; /* in t->tls_open until the connection ends */
	/* read data sent, in 16 KiB units of each C2HData's data (rounded
	 * up; headers not counted), the same on both record layers: not the
	 * records on the wire, which on kTLS the kernel cuts as it likes
	 * (--fault-tls-record counts these) */
	uint64_t tls_data_recs;
	/* whom its PSK identity named: Connect must name the same */
	char tls_hostnqn[NVMF_NQN_SIZE], tls_subnqn[NVMF_NQN_SIZE];
	/* In its TLS handshake, unproven, since (0: not, or its key proven),
	 * and whether a newer one pushed it out (tls.c; both under t->lock) */
	uint64_t tls_hs_ms;
	int tls_hs_evicted;
	char peer_key[64];         /* the peer's address as per-peer bounds count it (target.c) */
	struct tgt_iopeer *iopeer; /* its account in the I/O buffer budget */
	char local_addr[64];       /* address the host reached us at (discovery traddr) */
	int local_family;
	enum tgt_conn_state state;
	int hdgst, ddgst;
	uint8_t hpda;
	struct tgt_ctrl *ctrl; /* set under t->lock */
	uint16_t qid;
	int qid_released; /* a controller reset already freed qid (under t->lock) */
	/* qid is ours in ctrl->qid_used (under t->lock): at Connect for a host
	 * without a secret, only once its host has proved itself otherwise
	 * (tgt_ctrl_claim_qid), so that a queue that cannot authenticate
	 * never keeps the real host from connecting that qid. */
	int qid_claimed;
	int io_counted;  /* counted in ctrl->io_live until drained (under t->lock) */
	uint16_t sqsize; /* 0's based */
	uint16_t sqhd;
	uint32_t pdus_sent;
	/* The last send call returned short: the host took nothing more for
	 * stall_ms (our send timeout), or TCP closed the connection in the
	 * middle of the call, which then returns the bytes it moved and the
	 * error it took is lost (see send_errno).  Under the send lock. */
	int send_short;
	uint32_t c2h_sent;
	unsigned port; /* index in t->ports it was accepted on */
	/* Async Event Requests held (an admin queue, under t->lock): their
	 * CIDs, answered by this connection's own thread when an event comes
	 * (ana.c, tgt_ana_deliver). */
	unsigned aers;
	uint16_t aer_cid[FX_TGT_AERL + 1];
	/* The admin queue of an NVM controller: an eventfd (non-blocking) that
	 * the listener writes to wake this thread for an event to announce,
	 * polled with the socket (conn.c, recv_bytes); closed by conn_free, so
	 * it stays valid while the connection is on t->conns.  -1: none (I/O
	 * and discovery queues, which thus keep within the three descriptors
	 * a connection may use). */
	int evfd;
	/* DH-HMAC-CHAP of this queue (NULL: its host needs none).  Until it
	 * succeeds, the queue takes only AUTH_Send/AUTH_Receive (and
	 * Disconnect), and stays under the handshake deadline: live is set
	 * only once it is authenticated. */
	struct tgt_auth *auth;
	/* Buffers are allocated when first needed (icd, the R2T table) or once
	 * the queue is Connected (chunk, abuf), and authenticated where its host
	 * must (until then abuf is FX_TGT_AUTH_BUF bytes, and no chunk and no
	 * R2T table for the queue's depth), so that a connection that never
	 * gets that far costs a thread and a socket, not half a megabyte. */
	uint8_t *icd;   /* in-capsule data (FX_TGT_ICD_MAX) */
	uint8_t *chunk; /* data staging (FX_TGT_CHUNK >= FX_TGT_MAXH2CDATA) */
	uint8_t *abuf;  /* admin data out (abuf_len: FX_TGT_ADMIN_BUF once live) */
	uint32_t abuf_len;
	struct tgt_r2t *r2t; /* [r2t_n]: one per command the queue may hold */
	uint16_t *r2t_free;
	unsigned r2t_n, r2t_nfree;
	unsigned r2t_bufs; /* R2Ts whose data is collected in a buffer (admin, Fabrics) */
	/* A live I/O queue's engine (NULL: admin queue, not live yet, or no
	 * io_uring here: commands are then served one at a time, in line).
	 * Set and cleared by the connection's own thread only. */
	struct tgt_ioq *ioq;
	int ioq_failed;        /* could not start it: serve in line */
	atomic_int engine_err; /* the engine's first failed send (it shut the socket) */
	/* Why the connection ends was logged: the engine's sends and this
	 * thread's receive may both see one broken connection, and one line
	 * says it (say_why_first in conn.c). */
	atomic_int why_said;
	/* We shut the socket on purpose (keep-alive, a controller reset,
	 * idle or handshake deadlines, eviction, a fault, our own stop): a
	 * send that fails after it says nothing new (tgt_conn_shut). */
	atomic_int shut_by_us;
	/* Held around every PDU sent (and every command's whole response)
	 * once the engine's thread sends too; NULL before (recursive). */
	pthread_mutex_t *send_lock;
};

/* The log's rate limit (target.c, tgt_log). */
/* Lines that must not be lost (failed authentications, refusals, internal
 * errors) that the bucket left out, counted per address and kind and said
 * once a second (target.c, tgt_log_must). */
struct tgt_log_agg {
	char peer[64]; /* "": a free slot */
	char what[200];
	unsigned n;
};

struct tgt_loglim {
	pthread_mutex_t lock;
	uint64_t milli; /* lines that may be written now, in thousandths */
	uint64_t refill_ms;
	unsigned dropped; /* lines left out since the last one written */
	struct tgt_log_agg agg[FX_TGT_LOG_AGG];
	unsigned agg_other; /* ... of addresses that found no slot */
	uint64_t agg_ms;    /* last said */
};

struct fx_target {
	struct fx_target *next_global;
	struct tgt_loglim loglim;
	pthread_mutex_t lock;
	char subnqn[NVMF_NQN_SIZE];
	struct tgt_ns *ns;
	unsigned n_ns;
	char **allow;
	unsigned n_allow;
	struct tgt_dhchap_host *dhchap; /* hosts that must authenticate */
	unsigned n_dhchap;
	uint32_t dhchap_hashes, dhchap_dhgroups; /* allowed ids, bit 1u << id */
	int tls;                                 /* FX_TARGET_TLS_* */
	int ktls;                                /* FX_TARGET_KTLS_* */
	/* TLS connections whose records the kernel carried (kTLS) and ours
	 * (the control socket's `tls` command says both) */
	atomic_uint_fast64_t ktls_conns, tls_user_conns;
	/* TLS connections not yet ended, on either layer (`tls` too: a test
	 * sees a host's connections end even where their end is quiet) */
	atomic_uint_fast64_t tls_open;
	struct tgt_tls_host *tls_hosts; /* their configured PSKs (tls.c) */
	unsigned n_tls_hosts;
	uint32_t block_size;
	unsigned lba_shift;
	uint32_t max_io_queues;
	uint32_t fault_drop_after, fault_delay_ms, fault_corrupt_ddgst;
	uint32_t fault_tls_after, fault_tls_kind; /* --fault-tls-record (conn.c) */
	atomic_int fault_tls_fired;               /* it fires once per target */
	uint32_t max_conns, handshake_ms, stall_ms;
	uint32_t idle_ms; /* 0: never reap idle queues */
	struct tgt_iobufs iobufs;
	int verbose, quiet;
	uint8_t serial[20];
	struct tgt_port ports[FX_TGT_MAX_PORTS];
	unsigned n_ports;
	/* Discovery log generation: 1, and one more each time a port closes
	 * or opens (its entries change) */
	_Atomic uint64_t disc_genctr;
	int ctl_fd; /* control socket (control.c), -1: none */
	char ctl_path[108];
	uint64_t ctl_dev, ctl_ino; /* the file we bound: the only one we unlink */
	int wake[2];               /* self-pipe: fx_target_stop() wakes the listener */
	volatile sig_atomic_t stop;
	struct tgt_conn *conns; /* under lock */
	unsigned n_conns;       /* in conns, finished or not; under lock */
	/* listener only: what the connection limit did since the last line */
	uint64_t lim_log_ms;
	unsigned lim_refused, lim_evicted, lim_idle_evicted;
	char lim_peer[80];
	struct tgt_ctrl *ctrls; /* under lock */
	/* DH-HMAC-CHAP: DH operations running (under lock; dh_cond signals a
	 * free one), DH operations done (for tests and logs), and the
	 * failures per host and address */
	pthread_cond_t dh_cond;
	unsigned dh_running;
	_Atomic uint64_t dh_ops;
	struct tgt_auth_backoff auth_backoff[FX_TGT_AUTH_BACKOFF_SLOTS];
	struct tgt_dh_peer dh_peers[FX_TGT_AUTH_DH_PEERS];
	struct tgt_dh_peer dh_overflow; /* addresses that found no slot */
	struct tgt_dh_trust dh_trusted[FX_TGT_AUTH_DH_TRUSTED];
	pthread_cond_t drain_cond; /* a controller's io_live went down (with lock) */
	/* Test knobs from the environment (read once at create; see
	 * target.c): FX100IO_TARGET_INLINE=1 serves I/O queues one command
	 * at a time, in line, as where io_uring is missing;
	 * FX100IO_TARGET_FAULT_DISK_DELAY_MS delays each write's disk I/O. */
	int force_inline;
	atomic_int ioq_cant_logged; /* "no I/O engine" said once per target */
	uint32_t fault_disk_delay_ms;
	uint16_t next_cntlid;
};

/* A command as the executors see it. */
struct tgt_req {
	const struct nvme_sqe *sqe;
	const uint8_t *data; /* host-to-controller data, data_len bytes (NULL: none) */
	uint32_t data_len;
	uint32_t sgl_len; /* the host's buffer for controller-to-host data */
	uint8_t *out;     /* controller-to-host data goes here (out_cap bytes) ... */
	uint32_t out_cap;
	uint32_t out_len;  /* ... this many bytes (set by the executor) */
	uint32_t dw0, dw1; /* CQE result */
	int hold;          /* no response now (Async Event Request) */
	int close_after;   /* Disconnect: close the queue after answering */
};

/* End a connection on purpose from any thread: its threads wake up, and
 * the sends that fail because of it are not taken for its reason (the
 * one who shuts it says why). */
static inline void tgt_conn_shut(struct tgt_conn *c)
{
	atomic_store(&c->shut_by_us, 1);
	shutdown(c->fd, SHUT_RDWR);
}

/* TCP_USER_TIMEOUT of a connection: twice the stall timeout, so that a
 * blocked send reports the stall itself when it can. */
static inline uint32_t tgt_user_timeout_ms(const struct fx_target *t)
{
	return t->stall_ms > 0x7FFFFFFFu ? 0xFFFFFFFFu : 2 * t->stall_ms;
}

void tgt_log(const struct fx_target *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void tgt_log_must(const struct fx_target *t, const char *peer, const char *what, const char *fmt,
		  ...) __attribute__((format(printf, 4, 5)));
uint64_t tgt_now_ms(void);
/* s made safe to log (NQNs come from the wire): non-printable bytes become
 * '?'; returns buf. */
const char *tgt_printable(char *buf, size_t n, const char *s);

/* ana.c: Asymmetric Namespace Access */
/* The ANA state of ns as seen by the connection's port. */
uint8_t tgt_ana_state(const struct tgt_conn *c, const struct tgt_ns *ns);
/* 0 when I/O to ns may run through this connection, else the status. */
uint16_t tgt_ana_io_status(const struct tgt_conn *c, const struct tgt_ns *ns);
/* The ANA log page (for the controller's port) into out (cap bytes);
 * its length (may exceed cap: the caller copies the window it wants). */
size_t tgt_ana_log(struct tgt_conn *c, int rgo, uint8_t *out, size_t cap);
/* An AER arrived on an admin queue: 1 when it completes now with an
 * event (*dw0), 0 when held, or a status field (AER limit) as -sf. */
int tgt_ana_aer(struct tgt_conn *c, uint16_t cid, uint32_t *dw0);
/* The ANA log was read without RAE: the next change is reported. */
void tgt_ana_log_read(struct tgt_conn *c);
/* On the admin queue's own thread, woken by its evfd: answer the oldest
 * held AER with a notice waiting for one.  0, or -errno when the send
 * broke the connection. */
int tgt_ana_deliver(struct tgt_conn *c);
/* Set port's (index) state of group (0: every group); where that changes
 * the port's ANA log, bumps its change counts and flags the notice for
 * each controller of that port, waking their admin queues' threads
 * (listener thread; never writes to a host's socket).  A group put in
 * change leaves it by itself after after_ms (0: ANATT; at most ANATT) for
 * then (0: the state it had before).  0 or -EINVAL (then or after_ms
 * without change, then change, after_ms above ANATT). */
int tgt_ana_set(struct fx_target *t, unsigned port, uint32_t group, uint8_t state, uint8_t then,
		uint32_t after_ms);
/* The listener's tick: groups whose change is over go to their state. */
void tgt_ana_tick(struct fx_target *t);
/* Close the port (its connections end, new connects are refused) or open
 * it again on the same address and TCP port (listener thread). */
int tgt_port_close(struct fx_target *t, unsigned port);
int tgt_port_open(struct fx_target *t, unsigned port);
int tgt_port_listen(struct fx_target *t, struct tgt_port *p);
/* State names ("optimized", ...): the value, or 0 when unknown. */
uint8_t tgt_ana_state_parse(const char *s);
const char *tgt_ana_state_str(uint8_t st);

/* control.c: the control socket (fx_target_config.control_path) */
int tgt_control_open(struct fx_target *t, const char *path);
void tgt_control_serve(struct fx_target *t); /* one client, when the socket is readable */
void tgt_control_close(struct fx_target *t);

/* admin.c */
uint16_t tgt_exec_fabrics(struct tgt_conn *c, struct tgt_req *r);
uint16_t tgt_exec_admin(struct tgt_conn *c, struct tgt_req *r);

/* target.c: controller registry */
int tgt_host_allowed(const struct fx_target *t, const char *hostnqn);
/* Admin Connect: a new controller owned by conn (conn->ctrl, qid 0); NULL when
 * out of memory or controller IDs. */
struct tgt_ctrl *tgt_ctrl_new(struct tgt_conn *conn, int discovery, const char *hostnqn,
			      const uint8_t hostid[16], uint32_t kato_ms);
/* I/O Connect: join controller cntlid as queue qid.  0, or a status field
 * (with *ipo_attr the Connect Invalid Parameters dw0). */
uint16_t tgt_ctrl_attach_io(struct tgt_conn *conn, uint16_t cntlid, const char *hostnqn,
			    uint16_t qid, uint32_t *ipo_attr);
void tgt_conn_detach(struct tgt_conn *c);
/* The connection's disk I/O is over (its engine stopped or its thread
 * left the command loop): it no longer counts in ctrl->io_live. */
void tgt_conn_drained(struct tgt_conn *c);
/* Wait until the controller's killed I/O queues have drained (under
 * t->lock, which it releases while waiting). */
void tgt_ctrl_wait_drained_locked(struct fx_target *t, struct tgt_ctrl *ctrl);
/* The I/O queue's host has authenticated: take its qid in the controller
 * (nothing when already ours or an admin queue).  0, or -EBUSY when
 * another queue holds that qid (or the controller is going away). */
int tgt_ctrl_claim_qid(struct tgt_conn *c);
/* A capsule or a write's data arrived on conn: its controller's sign of
 * life, checked against the clock now.  0: run it (the KATO timer restarts);
 * -ETIMEDOUT: the KATO had run out first (the process was stalled, say),
 * the controller is torn down as the keep-alive tick would, and what
 * arrived must not run (a host may already have re-issued it elsewhere). */
int tgt_ctrl_alive(struct tgt_conn *conn);
/* Shut the sockets of a controller's I/O queues (reset, keep-alive expiry). */
void tgt_ctrl_kill_io_locked(struct fx_target *t, struct tgt_ctrl *ctrl);
void tgt_ctrl_flush_all(struct fx_target *t);

/* Serve one connected socket on the calling thread until it ends, as if
 * accepted (takes fd; a harness that feeds a connection bytes, e.g. over a
 * socketpair, without the listener).  0, or -ENOMEM. */
int tgt_serve_fd(struct fx_target *t, int fd);

/* auth.c: DH-HMAC-CHAP, the controller's side */
/* fx_target_create: parse the config's secrets (never logged) and allowed
 * ids.  0, -EINVAL (logged: which host, what is wrong), -ENOMEM. */
int tgt_auth_config(struct fx_target *t, const struct fx_target_config *cfg);

/* The secure channel (tls.c): the hosts' keys, parsed once (-EINVAL with a
 * log line naming the host for a bad one) and wiped at the end; and a
 * connection's start: with TLS optional, the host's first byte says which
 * (0x16: a TLS handshake); with TLS required anything else is closed.  0
 * with c->tls set, or c->ktls (the kernel took the records: --ktls auto
 * where it has the tls ULP), or neither for a clear-text host; or
 * -ECONNABORTED after a log line. */
struct tgt_tls_host {
	char hostnqn[NVMF_NQN_SIZE];
	struct fx_tls_key key;
};
int tgt_tls_config(struct fx_target *t, const struct fx_target_config *cfg);
void tgt_tls_config_free(struct fx_target *t);
int tgt_tls_accept(struct tgt_conn *c);
/* Which record layer a connection's secure channel uses, for the log: "by
 * the kernel (kTLS)", "by fx100io" or "in clear text". */
const char *tgt_tls_layer(const struct tgt_conn *c);
void tgt_auth_config_free(struct fx_target *t);
/* The host's authentication entry, NULL when it needs none. */
const struct tgt_dhchap_host *tgt_auth_host(const struct fx_target *t, const char *hostnqn);
/* A successful Connect of a host with an entry: the queue must
 * authenticate (c->auth).  0 or -ENOMEM. */
int tgt_auth_queue_start(struct tgt_conn *c, const struct tgt_dhchap_host *h);
/* 1 when the queue may run this command now: no authentication needed or
 * done, or the command is one of those that authenticate (or Disconnect). */
int tgt_auth_allows(const struct tgt_conn *c, const struct nvme_sqe *sqe);
/* 1 when the queue needs no authentication or has completed it (and
 * stays 1 while the host re-authenticates). */
int tgt_auth_done(const struct tgt_conn *c);
/* 1 when a re-authentication of this queue failed: it is to be closed
 * rather than answer commands with errors. */
int tgt_auth_must_close(const struct tgt_conn *c);
/* AUTH_Send (Fabrics 05h) and AUTH_Receive (06h). */
uint16_t tgt_auth_send(struct tgt_conn *c, struct tgt_req *r);
uint16_t tgt_auth_receive(struct tgt_conn *c, struct tgt_req *r);
void tgt_auth_queue_free(struct tgt_conn *c);

/* conn.c */
void *tgt_conn_main(void *arg);
/* Sending, for io.c (each under c->send_lock; 0 or -errno when the
 * connection broke).  tgt_send_read: C2HData for len bytes of ns at off,
 * page cache -> socket (chunk: FX_TGT_CHUNK bytes of staging); returns the
 * response's status (>= 0) or -errno.  tgt_send_data: C2HData from buf. */
int tgt_send_resp(struct tgt_conn *c, uint16_t cid, uint16_t sf, uint32_t dw0, uint32_t dw1);
int tgt_send_r2t(struct tgt_conn *c, uint16_t cid, uint16_t ttag, uint32_t len);
int tgt_send_read(struct tgt_conn *c, uint8_t *chunk, uint16_t cid, struct tgt_ns *ns, uint64_t off,
		  uint32_t len);
int tgt_send_data(struct tgt_conn *c, uint16_t cid, const uint8_t *buf, uint32_t len, uint16_t sf);
void tgt_send_lock(struct tgt_conn *c);
void tgt_send_unlock(struct tgt_conn *c);

/* io.c: the I/O engine of a live I/O queue */
/* The I/O buffer budget: set up (budget bytes; 0 or -ENOMEM), freed;
 * a connection's peer account taken (0 or -ENOMEM) and given back;
 * admin/Fabrics data of n bytes taken (0, or -ENOBUFS when there is no
 * room now) and given back; the listener's tick (frees what the cache
 * keeps beyond what was recently used). */
int tgt_iobufs_init(struct fx_target *t, size_t budget);
void tgt_iobufs_fini(struct fx_target *t);
int tgt_iopeer_get(struct tgt_conn *c);
void tgt_iopeer_put(struct tgt_conn *c);
int tgt_iobufs_try(struct tgt_conn *c, size_t n);
void tgt_iobufs_give(struct tgt_conn *c, size_t n);
int tgt_iobufs_over_share(struct tgt_conn *c);
void tgt_h2c_wait_add(struct tgt_conn *c);
void tgt_iobufs_tick(struct fx_target *t);
/* Start it (c->ioq, c->send_lock) for a queue of c->sqsize + 1 entries:
 * 0, or -errno when io_uring is not to be had (the queue then serves in
 * line; logged once per target). */
int tgt_ioq_start(struct tgt_conn *c);
/* 1 on an engine's thread (which must not touch the connection's state). */
int tgt_ioq_on_engine_thread(void);
/* The connection's thread prepares disk I/O without handing it to the
 * kernel (so that neighbouring reads merge: io.c, queue_locked); before it
 * may wait for anything it kicks them off.  unsent: how many are prepared
 * (0 when c->ioq is NULL). */
int tgt_ioq_unsent(struct tgt_conn *c);
void tgt_ioq_kick(struct tgt_conn *c);
/* Stop it: no PDU is sent any more (the socket is shut only when the
 * engine is in the middle of a send), waits for the disk I/O in flight,
 * frees every buffer.  Nothing when c->ioq is NULL. */
void tgt_ioq_stop(struct tgt_conn *c);
/* Under the send lock: the engine sends nothing more (after a
 * C2HTermReq, or the answer to a Disconnect, must come nothing).
 * Nothing when c->ioq is NULL. */
void tgt_ioq_quiesce(struct tgt_conn *c);
/* Read / Write (data by R2T) of a validated range; the engine answers.
 * 0, or -errno when the connection broke. */
int tgt_ioq_read(struct tgt_conn *c, uint16_t cid, struct tgt_ns *ns, uint64_t off, uint32_t len);
int tgt_ioq_write(struct tgt_conn *c, const struct nvme_sqe *sqe, struct tgt_ns *ns, uint64_t off,
		  uint32_t len);
/* H2CData for one of the engine's R2Ts (ttag has TGT_TTAG_IO): checks it
 * as on_h2c_data does for the table's (NULL when the PDU is to be refused,
 * *why and *fei saying why); else where the datal bytes go. */
uint8_t *tgt_ioq_h2c_dest(struct tgt_conn *c, uint16_t ttag, uint16_t cccid, uint32_t datao,
			  uint32_t datal, const char **why, uint32_t *fei, uint16_t *fes);
/* When the oldest write still waiting for its data got its R2T (0: none). */
uint64_t tgt_ioq_oldest_r2t_ms(struct tgt_conn *c);
/* The datal bytes are in (bad: their digest did not match). */
int tgt_ioq_h2c_done(struct tgt_conn *c, uint16_t ttag, uint32_t datal, int bad);

#endif
