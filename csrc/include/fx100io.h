/*
 * fx100io public C API.
 *
 * Conventions (liburing style): every function returns an int (or documented
 * type); >= 0 is success or a count, < 0 is -errno.  Nothing reports through
 * the global errno.  Objects are opaque and are used by one thread at a time
 * unless a comment says otherwise.
 */
#ifndef FX100IO_H
#define FX100IO_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------ CRC32C */

/*
 * CRC32C (Castagnoli), chainable: fx_crc32c(0, "123456789", 9) == 0xE3069283
 * and fx_crc32c(fx_crc32c(0, a, n), b, m) == crc of a followed by b.
 * Uses SSE4.2 when the CPU has it, a table otherwise.  Thread-safe.
 */
uint32_t fx_crc32c(uint32_t crc, const void *buf, size_t len);
/*
 * The CRC32C of a followed by b, from crc1 = crc of a, crc2 = crc of b and
 * len2 = the length of b: lets pieces be checksummed apart (in any order,
 * as they land) and joined without touching the bytes again.
 */
uint32_t fx_crc32c_combine(uint32_t crc1, uint32_t crc2, uint64_t len2);

/* ------------------------------------------------------- extent allocator */

struct fx_alloc;

/*
 * Allocator of [base, base+size) in units of `align` (a power of two).
 * Lengths are rounded up to `align`.  -EINVAL (bad align, base not aligned),
 * -ENOMEM.
 */
int fx_alloc_create(uint64_t base, uint64_t size, uint32_t align, struct fx_alloc **out);
void fx_alloc_destroy(struct fx_alloc *a);
/* Best fit.  -EINVAL (len 0), -ENOSPC (no free extent large enough). */
int fx_alloc_alloc(struct fx_alloc *a, uint64_t len, uint64_t *off);
/* Return an extent.  -EINVAL if it is out of range, unaligned or not fully
 * allocated (double free). Adjacent free extents are merged. */
int fx_alloc_free(struct fx_alloc *a, uint64_t off, uint64_t len);
/* Mark an extent used (index replay).  -EINVAL out of range/unaligned,
 * -EEXIST if any part of it is already used. */
int fx_alloc_reserve(struct fx_alloc *a, uint64_t off, uint64_t len);
uint64_t fx_alloc_free_bytes(const struct fx_alloc *a);
uint64_t fx_alloc_largest_free(const struct fx_alloc *a);
/* Number of free extents (fragmentation gauge). */
uint64_t fx_alloc_free_extents(const struct fx_alloc *a);

/* ---------------------------------------------------- index log encoding */

/*
 * The chunk store's on-device index is a log of segments.  A segment is
 * written with one block-aligned write and is valid only as a whole (its CRC
 * covers header and payload), so a torn write drops the whole batch.
 *
 * Segment header (64 bytes, little endian):
 *   u64 magic FX_SEG_MAGIC; u64 generation; u64 seq; u32 payload_len;
 *   u32 nrecs; u32 crc (of header with crc=0, then payload); u8 pad[28]
 * Record (8-byte aligned, 32 + key_len rounded up to 8):
 *   u8 type; u8 flags; u16 key_len; u32 data_crc; u64 off; u64 len;
 *   u32 dev; u32 reserved; u8 key[key_len]; zero pad
 */
#define FX_SEG_MAGIC 0x3130474553584646ULL /* "FFXSEG01" */
#define FX_SEG_HDR_SIZE 64
#define FX_REC_HDR_SIZE 32
#define FX_KEY_MAX 1024

enum fx_rec_type { FX_REC_PUT = 1, FX_REC_DEL = 2 };

struct fx_index_rec {
	uint8_t type;
	uint8_t flags;
	uint16_t key_len;
	uint32_t data_crc;
	uint64_t off;
	uint64_t len;
	uint32_t dev;
	const uint8_t *key; /* on decode: points into the decoded buffer */
};

/* Encoded size of one record with this key length. */
size_t fx_index_rec_size(unsigned key_len);
/*
 * Encode header + records into out (zeroing the tail up to the returned
 * size).  Returns the segment size in bytes (header + payload, not padded
 * to a block).  -EINVAL (key_len 0 or > FX_KEY_MAX, bad type), -ENOSPC.
 */
int64_t fx_index_seg_encode(uint64_t generation, uint64_t seq, const struct fx_index_rec *recs,
			    unsigned n, void *out, size_t cap);
/*
 * Decode the segment at buf.  On success fills *seq, up to max records into
 * recs, *nrecs, and returns the segment size in bytes.  Returns 0 when the
 * bytes are not a segment of this generation (end of log: zeros, stale
 * data, other generation); -EBADMSG when magic and generation match but the
 * CRC or a length is wrong (torn write: also end of log); -ENOSPC if more
 * than max records.  Never reads outside [buf, buf+len).
 */
int64_t fx_index_seg_decode(const void *buf, size_t len, uint64_t generation, uint64_t *seq,
			    struct fx_index_rec *recs, unsigned max, unsigned *nrecs);

/* ------------------------------------------------------------ buffer pool */

struct fx_pool;

#define FX_POOL_REQUIRE_PINNED 0x1 /* fail with -ENOMEM/-EPERM if mlock fails */
#define FX_POOL_NO_HUGE 0x2        /* do not try huge pages */

/*
 * Anonymous mmap (MAP_POPULATE, 2 MiB huge pages when available), mlock'ed,
 * and published so that every io_uring queue registers it as fixed buffers
 * on first use.  Thread-safe.  -EINVAL (size 0), -ENOMEM, -EPERM/-EAGAIN
 * (mlock refused, only with FX_POOL_REQUIRE_PINNED), -ENOSPC (too many pools).
 */
int fx_pool_create(uint64_t size, unsigned flags, struct fx_pool **out);
/*
 * Publish memory the caller owns (e.g. another library's pinned pool) so
 * queues register it as fixed buffers.  It is neither mapped, locked nor
 * freed here; it must stay valid until fx_pool_destroy.  -EINVAL (NULL or
 * size 0), -ENOMEM, -ENOSPC (registry full).
 */
int fx_pool_wrap(void *addr, uint64_t size, struct fx_pool **out);
void fx_pool_destroy(struct fx_pool *p);
void *fx_pool_base(const struct fx_pool *p);
uint64_t fx_pool_size(const struct fx_pool *p);
/* 1 if mlock succeeded, 0 otherwise. */
int fx_pool_pinned(const struct fx_pool *p);
/* 1 if backed by huge pages. */
int fx_pool_huge(const struct fx_pool *p);

/* -------------------------------------------------- devices and queues */

enum fx_op { FX_OP_READ = 0, FX_OP_WRITE = 1, FX_OP_FLUSH = 2 };

/*
 * Request flags.  FX_REQ_CRC32C: also compute the CRC32C of the request's
 * bytes, piece by piece as each piece lands (reads) or leaves (writes), on
 * the thread that reaps, while later pieces are still on the wire; the
 * result comes back in fx_cqe.crc32c.  Saves a second pass over the buffer
 * and hides the checksum behind the I/O.
 */
#define FX_REQ_CRC32C 0x1

/*
 * Priority classes of a request (docs/architecture.md, "Priority and write
 * admission").  A queue issues the pieces of load requests first, then
 * store, then background ones, yet gives each lower class at least one
 * piece in FX_PRIO_SHARE while it waits, so none starves; load requests of
 * different streams take turns piece by piece.  While a load read waits or
 * is in flight, store and background writes in flight are capped at the
 * queue's write_depth: what is already submitted to a device cannot be
 * overtaken.
 */
enum fx_prio { FX_PRIO_LOAD = 0, FX_PRIO_STORE = 1, FX_PRIO_BACKGROUND = 2 };
#define FX_PRIO_CLASSES 3
#define FX_PRIO_SHARE 8
#define FX_WRITE_DEPTH_DEFAULT 4

/* One I/O request.  addr must stay valid until its completion is reaped. */
struct fx_req {
	uint64_t tag; /* returned in the completion */
	void *addr;
	uint64_t len;
	uint64_t off;
	uint8_t op;    /* enum fx_op */
	uint8_t flags; /* FX_REQ_* */
	uint8_t prio;  /* enum fx_prio; 0 (load) unless set */
	/* load requests with one stream id (e.g. one batch's chunks) are one
	 * turn of the round robin between loads; any value, 0 included */
	uint32_t stream;
};

/* One completion record for every request (docs/architecture.md rule 3). */
struct fx_cqe {
	uint64_t tag;
	int64_t res;     /* bytes transferred, or -errno */
	uint16_t status; /* raw NVMe status (SC | SCT << 8 | DNR << 14), 0 if none */
	/* with FX_REQ_CRC32C and res == len: CRC32C of the len bytes; else 0 */
	uint32_t crc32c;
};

struct fx_dev_opts {
	int direct; /* use O_DIRECT (1, default in Python) or the page cache */
	int readonly;
	int create;    /* create the file if missing */
	uint64_t size; /* grow a regular file to at least this size (0: keep) */
	/* never set an I/O priority on a load read (FX_CAP_IOPRIO stays off):
	 * the realtime class also holds back other processes' I/O on the disk */
	int no_ioprio;
};

#define FX_CAP_DIRECT 0x1        /* O_DIRECT in use: aligned I/O bypasses cache */
#define FX_CAP_FIXED_BUF 0x2     /* queues use registered buffers */
#define FX_CAP_BLOCKDEV 0x4      /* target is a block device */
#define FX_CAP_FLUSH 0x8         /* FX_OP_FLUSH makes writes durable */
#define FX_CAP_ALIGNED_ONLY 0x10 /* offsets and lengths must be block multiples */
#define FX_CAP_READONLY 0x20     /* opened read-only */
/* load reads carry the realtime I/O priority class to a block device whose
 * I/O scheduler orders requests by class (mq-deadline, bfq) */
#define FX_CAP_IOPRIO 0x40

struct fx_dev_info {
	uint64_t size;       /* bytes */
	uint32_t block_size; /* logical block size: alignment for direct I/O */
	uint32_t caps;       /* FX_CAP_* */
	/* NVMe-oF: the namespace's identifiers (all zeroes where it has none,
	 * and for files), so that several paths can be checked to reach one
	 * namespace. */
	uint8_t nguid[16];
	uint8_t eui64[8];
	uint8_t uuid[16];
};

struct fx_queue_opts {
	uint32_t depth;  /* pieces in flight (ring entries); default 64 */
	uint32_t max_io; /* split requests into pieces of at most this; 1 MiB */
	uint32_t slots;  /* requests accepted before submit says -EAGAIN; 4096 */
	uint32_t flags;  /* FX_QUEUE_* */
	/* store and background writes in flight while a load read waits;
	 * 0: FX_WRITE_DEPTH_DEFAULT */
	uint32_t write_depth;
};

/* The queue's completions are waited for through fx_queue_fd() by an event
 * loop (epoll), not by fx_queue_wait().  Its ring is then set up without
 * IORING_SETUP_DEFER_TASKRUN: with it, work the kernel queues for the ring
 * from interrupt context (socket data arriving, a disk completing) signals
 * the eventfd only through an RCU callback, 10-40 ms later, and an event
 * loop sleeps that long per wake-up; without it the same work wakes the
 * sleeping thread at once and runs as it returns from its wait. */
#define FX_QUEUE_FD_WAKE 0x1
/* The queue is made (connected, for NVMe-oF) on one thread and used on
 * another: an event loop must never wait for a connect (docs/architecture.md
 * rule 14), and a ring with IORING_SETUP_SINGLE_ISSUER belongs to the thread
 * that makes it.  Its ring starts disabled (IORING_SETUP_R_DISABLED) and
 * nothing is submitted until fx_queue_enable() on the thread that will use
 * it, which makes that thread the ring's issuer.  Ignored by transports
 * without a ring of their own (NVMe/RDMA, psync). */
#define FX_QUEUE_DEFER_ENABLE 0x2

/* Ring features a queue ended up with (for logs and tests). */
#define FX_RING_SINGLE_ISSUER 0x1
#define FX_RING_DEFER_TASKRUN 0x2
#define FX_RING_COOP_TASKRUN 0x4
#define FX_RING_FIXED_FILES 0x10
#define FX_RING_FIXED_BUFS 0x20

struct fx_dev;
struct fx_queue;

/*
 * Open a device.  transport: "file" (io_uring) or "psync" (pread/pwrite,
 * for where io_uring is unavailable).  target: a path.
 * -ENOENT, -EACCES, -EROFS, -EINVAL (unknown transport), -ENOTSUP (direct I/O
 * not supported by the filesystem), -ENOSPC (cannot grow the file), -errno of
 * open/fstat/ioctl.  fx_dev may be shared by threads; each thread makes its
 * own queue.
 */
int fx_dev_open(const char *transport, const char *target, const struct fx_dev_opts *opts,
		struct fx_dev **out);
void fx_dev_info(const struct fx_dev *d, struct fx_dev_info *info);
/*
 * An NVMe-oF namespace's ANA group and its Asymmetric Namespace Access
 * state now (1 optimized, 2 non-optimized, 3 inaccessible, 4 persistent
 * loss, 15 change), read from the controller's ANA log page; blocks on the
 * network (call it off any event loop).  -EOPNOTSUPP (not NVMe-oF, or the
 * namespace reports no ANA group), -ENOTCONN (no controller now), -ENOENT,
 * -EPROTO (a malformed log page), the admin queue's errors.
 */
int fx_dev_ana(struct fx_dev *d, uint32_t *grpid, uint8_t *state);
/* Close the device; all its queues must be destroyed first. */
void fx_dev_close(struct fx_dev *d);

/*
 * Create a queue on a device; use it from one thread.  -ENOMEM, -ENOSYS or
 * -EPERM (io_uring unavailable: seccomp, kernel.io_uring_disabled), -errno of
 * io_uring_setup.
 */
int fx_queue_create(struct fx_dev *d, const struct fx_queue_opts *opts, struct fx_queue **out);
/*
 * Destroy waits up to FX_QUEUE_DRAIN_MS for the I/Os the kernel holds (an
 * io_uring read still landing in its buffer); from a thread that cannot wait
 * on the ring (not a DEFER_TASKRUN ring's own), not at all.  What is left
 * is left to the kernel, logged and counted (fx_queue_leaked_ios): the
 * caller must then keep those requests' buffers for good.
 */
void fx_queue_destroy(struct fx_queue *q);
#define FX_QUEUE_DRAIN_MS 5000
/*
 * Closing a queue: issue nothing more (queued requests stay unissued) and
 * wait up to timeout_ms (< 0: with no limit, for the thread whose call owns
 * the buffers) for the I/Os the kernel holds to come back.  Returns
 * how many it still holds: 0 (every buffer is the caller's again), > 0 (the
 * time ran out), or -EEXIST at once while it holds some that only the ring's
 * own thread can wait for (DEFER_TASKRUN): call it there.  After it, only
 * fx_queue_reap and fx_queue_destroy.  0 for transports without it (their
 * destroy does its own bounded wait).
 */
int fx_queue_quiesce(struct fx_queue *q, int timeout_ms);
/* I/Os queue destroys left with the kernel in this process, in all. */
uint64_t fx_queue_leaked_ios(void);
/*
 * Hand a queue made with FX_QUEUE_DEFER_ENABLE to the calling thread: from
 * now on only this thread submits and waits on it.  Does not block on the
 * network.  Call it once, from that thread.  0 (also for a queue made
 * without the flag, or one enabled already), -errno of io_uring_register.
 */
int fx_queue_enable(struct fx_queue *q);
/*
 * Queue requests and submit what fits in the ring.  Returns how many
 * requests were accepted (<= n); fewer than n (possibly 0) when the request
 * slots are full: reap and retry.  -EINVAL (bad op/len/offset), -EBADFD (made
 * with FX_QUEUE_DEFER_ENABLE and not enabled yet).
 */
int fx_queue_submit(struct fx_queue *q, const struct fx_req *reqs, unsigned n);
/* Non-blocking: move finished requests into out.  Returns the count. */
int fx_queue_reap(struct fx_queue *q, struct fx_cqe *out, unsigned max);
/*
 * Block until at least min requests are ready to reap, or timeout_ms passes
 * (-ETIME; < 0 waits forever).  -EINTR if a signal arrived.
 */
int fx_queue_wait(struct fx_queue *q, unsigned min, int timeout_ms);
/* A pollable fd (eventfd) that becomes readable when completions arrive. */
int fx_queue_fd(const struct fx_queue *q);
/* Requests accepted and not yet reaped. */
unsigned fx_queue_pending(const struct fx_queue *q);
/* FX_RING_* flags. */
unsigned fx_queue_features(const struct fx_queue *q);

/* Counters of one queue, so properties such as "registered buffers are
 * used" and "received bytes land in the caller's buffer" can be checked. */
struct fx_queue_stats {
	uint64_t ios;          /* device I/Os issued (pieces, NVMe commands) */
	uint64_t bytes;        /* bytes transferred */
	uint64_t fixed_ios;    /* I/Os that used a registered (fixed) buffer */
	uint64_t bytes_direct; /* received bytes placed straight in the caller's buffer */
	uint64_t bytes_copied; /* received bytes copied in user space */
	uint64_t reconnects;   /* connections re-made after a failure */
	uint64_t conn_errors;  /* connections taken down by an error */
	/* NVMe/RDMA: command keys the target invalidated with its response,
	 * and those we invalidated ourselves (it did not) */
	uint64_t remote_invalidations;
	uint64_t local_invalidations;
	/* the priority scheduler: pieces issued per class (enum fx_prio), and
	 * how many of them a lower class took on its guaranteed share */
	uint64_t prio_pieces[FX_PRIO_CLASSES];
	uint64_t prio_shares;
	/* NVMe/TCP, queues >= 2: pieces a connection the class split does not
	 * prefer carried because none it prefers was up, and writes the load
	 * connection (the first) carried while a load read waited or was in
	 * flight (each such one is a fallback) */
	uint64_t conn_fallbacks;
	uint64_t load_conn_writes;
	/* files and block devices: reads the kernel completed with the realtime
	 * I/O priority (a try it refused, retried without, does not count) */
	uint64_t ioprio_ios;
	/* NVMe/TCP secure channels: connections made whose records the
	 * kernel seals and opens (kTLS), and those on our userspace record
	 * layer (the kernel has no tls ULP, or ktls=off) */
	uint64_t ktls_conns;
	uint64_t tls_user_conns;
};
void fx_queue_stats(const struct fx_queue *q, struct fx_queue_stats *out);

#ifdef __cplusplus
}
#endif
#endif
