# Binding of our NVMe/TCP target (csrc/target/); included by _core.pyx.

import os as _os

cdef extern from "target/target.h" nogil:
    struct fx_target:
        pass
    struct fx_target_config:
        const char *host
        const char *port
        const char *subnqn
        const char **ns_paths
        unsigned n_ns
        const char **allow_hosts
        unsigned n_allow
        uint32_t block_size
        uint32_t max_io_queues
        uint32_t max_connections
        uint32_t handshake_timeout_ms
        uint32_t stall_timeout_ms
        uint32_t idle_timeout_ms
        uint32_t fault_drop_after
        uint32_t fault_delay_ms
        uint32_t fault_corrupt_ddgst
        int verbose
        int quiet
    uint32_t FX_TARGET_IDLE_NEVER
    int fx_target_create(const fx_target_config *cfg, fx_target **out)
    int fx_target_port(const fx_target *t)
    int fx_target_run(fx_target *t)
    void fx_target_stop(fx_target *t)
    void fx_target_stop_all()
    void fx_target_destroy(fx_target *t)


def target_serve(str host, str port, str subnqn, namespaces, *, unsigned int block_size=512,
                 allow_hosts=(), unsigned int max_io_queues=0, unsigned int max_connections=0,
                 unsigned int handshake_timeout_ms=0, unsigned int stall_timeout_ms=0,
                 unsigned int idle_timeout_ms=300000,
                 unsigned int fault_drop_after=0,
                 unsigned int fault_delay_ms=0, unsigned int fault_corrupt_ddgst=0,
                 bint verbose=False, bint quiet=False, ready=None):
    """Serve namespaces (paths of files or block devices) as NVMe/TCP subsystem
    subnqn on host:port until target_stop() (from another thread or a signal
    handler).  ready(port) is called once the socket listens (port "0" picks
    a free one).  Blocks without the GIL; returns 0.

    Limits (0: the default): max_connections (1024) open at once, more are
    closed at once; handshake_timeout_ms (10000) from accept to a completed
    ICReq and Connect; stall_timeout_ms (30000) for a whole PDU from its first
    byte, and without progress on a host that stopped reading;
    idle_timeout_ms (300000 = 5 min; 0: never) of nothing received on a
    Connected queue whose controller has keep alive off (KATO 0).  At the
    connection limit a new connection evicts one still in its handshake, else
    the longest idle KATO-0 queue idle for 1 s (or handshake_timeout_ms when
    shorter), else it is closed."""
    cdef fx_target_config cfg
    cdef fx_target *t = NULL
    cdef const char **paths = NULL
    cdef const char **allow = NULL
    cdef int rc
    keep = [host.encode(), port.encode(), subnqn.encode()]
    ns_b = [_os.fsencode(p) for p in namespaces]
    allow_b = [h.encode() for h in allow_hosts]
    if not ns_b:
        raise error_from_errno(22, "target: no namespaces")
    memset(&cfg, 0, sizeof(cfg))
    paths = <const char **>malloc(len(ns_b) * sizeof(char *))
    allow = <const char **>malloc((len(allow_b) or 1) * sizeof(char *))
    try:
        if paths == NULL or allow == NULL:
            raise MemoryError()
        for i, b in enumerate(ns_b):
            paths[i] = b
        for i, b in enumerate(allow_b):
            allow[i] = b
        cfg.host = keep[0]
        cfg.port = keep[1]
        cfg.subnqn = keep[2]
        cfg.ns_paths = paths
        cfg.n_ns = len(ns_b)
        cfg.allow_hosts = allow
        cfg.n_allow = len(allow_b)
        cfg.block_size = block_size
        cfg.max_io_queues = max_io_queues
        cfg.max_connections = max_connections
        cfg.handshake_timeout_ms = handshake_timeout_ms
        cfg.stall_timeout_ms = stall_timeout_ms
        cfg.idle_timeout_ms = idle_timeout_ms if idle_timeout_ms else FX_TARGET_IDLE_NEVER
        cfg.fault_drop_after = fault_drop_after
        cfg.fault_delay_ms = fault_delay_ms
        cfg.fault_corrupt_ddgst = fault_corrupt_ddgst
        cfg.verbose = verbose
        cfg.quiet = quiet
        with nogil:
            rc = fx_target_create(&cfg, &t)
        check(rc, f"target on {host}:{port}")
        try:
            if ready is not None:
                ready(fx_target_port(t))
            with nogil:
                rc = fx_target_run(t)
        finally:
            with nogil:
                fx_target_destroy(t)
        check(rc, "target")
    finally:
        free(paths)
        free(allow)
    return 0


def target_stop():
    """Make every running target_serve() return (safe from any thread and
    from a Python signal handler)."""
    with nogil:
        fx_target_stop_all()
