# C declarations of csrc/include/fx100io.h used by the binding.
from libc.stdint cimport uint8_t, uint16_t, uint32_t, uint64_t, int64_t


cdef extern from "fx100io.h" nogil:
    uint32_t fx_crc32c(uint32_t crc, const void *buf, size_t len)
    uint32_t fx_crc32c_combine(uint32_t crc1, uint32_t crc2, uint64_t len2)

    struct fx_alloc:
        pass
    int fx_alloc_create(uint64_t base, uint64_t size, uint32_t align, fx_alloc **out)
    void fx_alloc_destroy(fx_alloc *a)
    int fx_alloc_alloc(fx_alloc *a, uint64_t len, uint64_t *off)
    int fx_alloc_free(fx_alloc *a, uint64_t off, uint64_t len)
    int fx_alloc_reserve(fx_alloc *a, uint64_t off, uint64_t len)
    uint64_t fx_alloc_free_bytes(const fx_alloc *a)
    uint64_t fx_alloc_largest_free(const fx_alloc *a)
    uint64_t fx_alloc_free_extents(const fx_alloc *a)

    enum:
        FX_SEG_HDR_SIZE
        FX_REC_HDR_SIZE
        FX_KEY_MAX
        FX_REC_PUT
        FX_REC_DEL

    struct fx_index_rec:
        uint8_t type
        uint8_t flags
        uint16_t key_len
        uint32_t data_crc
        uint64_t off
        uint64_t len
        uint32_t dev
        const uint8_t *key

    size_t fx_index_rec_size(unsigned key_len)
    int64_t fx_index_seg_encode(uint64_t generation, uint64_t seq,
                                const fx_index_rec *recs, unsigned n,
                                void *out, size_t cap)
    int64_t fx_index_seg_decode(const void *buf, size_t len, uint64_t generation,
                                uint64_t *seq, fx_index_rec *recs,
                                unsigned max, unsigned *nrecs)

    struct fx_pool:
        pass
    enum:
        FX_POOL_REQUIRE_PINNED
        FX_POOL_NO_HUGE
    int fx_pool_create(uint64_t size, unsigned flags, fx_pool **out)
    int fx_pool_wrap(void *addr, uint64_t size, fx_pool **out)
    void fx_pool_destroy(fx_pool *p)
    void *fx_pool_base(const fx_pool *p)
    uint64_t fx_pool_size(const fx_pool *p)
    int fx_pool_pinned(const fx_pool *p)
    int fx_pool_huge(const fx_pool *p)

    enum:
        FX_OP_READ
        FX_REQ_CRC32C
        FX_PRIO_LOAD
        FX_PRIO_STORE
        FX_PRIO_BACKGROUND
        FX_PRIO_SHARE
        FX_WRITE_DEPTH_DEFAULT
        FX_OP_WRITE
        FX_OP_FLUSH

    struct fx_req:
        uint64_t tag
        void *addr
        uint64_t len
        uint64_t off
        uint8_t op
        uint8_t flags
        uint8_t prio
        uint32_t stream

    struct fx_cqe:
        uint64_t tag
        int64_t res
        uint16_t status
        uint32_t crc32c

    struct fx_dev_opts:
        int direct
        int readonly
        int create
        uint64_t size
        int no_ioprio

    struct fx_dev_info:
        uint64_t size
        uint32_t block_size
        uint32_t caps
        uint8_t nguid[16]
        uint8_t eui64[8]
        uint8_t uuid[16]

    struct fx_queue_opts:
        uint32_t depth
        uint32_t max_io
        uint32_t slots
        uint32_t flags
        uint32_t write_depth

    enum: FX_QUEUE_FD_WAKE
    enum: FX_QUEUE_DEFER_ENABLE

    struct fx_dev:
        pass
    struct fx_queue:
        pass

    int fx_dev_open(const char *transport, const char *target,
                    const fx_dev_opts *opts, fx_dev **out)
    void fx_dev_get_info "fx_dev_info"(const fx_dev *d, fx_dev_info *info)
    int fx_dev_ana(fx_dev *d, uint32_t *grpid, uint8_t *state)
    void fx_dev_close(fx_dev *d)
    int fx_queue_create(fx_dev *d, const fx_queue_opts *opts, fx_queue **out)
    void fx_queue_destroy(fx_queue *q)
    enum: FX_QUEUE_DRAIN_MS
    int fx_queue_quiesce(fx_queue *q, int timeout_ms)
    uint64_t fx_queue_leaked_ios()
    int fx_queue_enable(fx_queue *q)
    int fx_queue_submit(fx_queue *q, const fx_req *reqs, unsigned n)
    int fx_queue_reap(fx_queue *q, fx_cqe *out, unsigned max)
    int fx_queue_wait(fx_queue *q, unsigned min, int timeout_ms)
    int fx_queue_fd(const fx_queue *q)
    unsigned fx_queue_pending(const fx_queue *q)
    unsigned fx_queue_features(const fx_queue *q)
    struct fx_queue_stats:
        uint64_t ios
        uint64_t bytes
        uint64_t fixed_ios
        uint64_t bytes_direct
        uint64_t bytes_copied
        uint64_t reconnects
        uint64_t conn_errors
        uint64_t remote_invalidations
        uint64_t local_invalidations
        uint64_t prio_pieces[3]
        uint64_t prio_shares
        uint64_t conn_fallbacks
        uint64_t load_conn_writes
        uint64_t ioprio_ios
        uint64_t ktls_conns
        uint64_t tls_user_conns
    void fx_queue_get_stats "fx_queue_stats"(const fx_queue *q, fx_queue_stats *out)
