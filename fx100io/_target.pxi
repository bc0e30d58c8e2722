# Binding of our NVMe/TCP target (csrc/target/); included by _core.pyx.

import os as _os

cdef extern from "target/target.h" nogil:
    struct fx_target:
        pass
    struct fx_target_dhchap_host:
        const char *hostnqn
        const char *secret
        const char *ctrl_secret
    struct fx_target_config:
        const char *host
        const char *port
        const char *subnqn
        const char **ns_paths
        unsigned n_ns
        const char **allow_hosts
        unsigned n_allow
        const fx_target_dhchap_host *dhchap_hosts
        unsigned n_dhchap_hosts
        uint32_t dhchap_hashes
        uint32_t dhchap_dhgroups
        uint32_t block_size
        uint32_t max_io_queues
        uint32_t max_connections
        uint32_t io_buffer_budget_mib
        uint32_t handshake_timeout_ms
        uint32_t stall_timeout_ms
        uint32_t idle_timeout_ms
        uint32_t fault_drop_after
        uint32_t fault_delay_ms
        uint32_t fault_corrupt_ddgst
        int verbose
        int quiet
    uint32_t FX_TARGET_IDLE_NEVER
    uint32_t FX_TARGET_DHCHAP_HASHES_ALL
    uint32_t FX_TARGET_DHCHAP_DHGROUPS_ALL
    int fx_target_create(const fx_target_config *cfg, fx_target **out)
    int fx_target_port(const fx_target *t)
    int fx_target_run(fx_target *t)
    void fx_target_stop(fx_target *t)
    void fx_target_stop_all()
    void fx_target_destroy(fx_target *t)


# DH-HMAC-CHAP ids by name (NVMe Base 2.x; Linux nvmet's names, "hmac(sha256)" too)
TARGET_DHCHAP_HASHES = {"sha256": 1, "sha384": 2, "sha512": 3}
TARGET_DHCHAP_DHGROUPS = {"null": 0, "ffdhe2048": 1, "ffdhe3072": 2, "ffdhe4096": 3,
                          "ffdhe6144": 4, "ffdhe8192": 5}


def _dhchap_mask(names, table, what):
    cdef uint32_t mask = 0
    for n in names:
        key = n.strip().lower()
        if key.startswith("hmac(") and key.endswith(")"):
            key = key[5:len(key) - 1]
        if key not in table:
            raise ValueError(f"unknown DH-HMAC-CHAP {what} {n!r} (one of {', '.join(table)})")
        mask |= 1u << table[key]
    return mask


def target_serve(str host, str port, str subnqn, namespaces, *, unsigned int block_size=512,
                 allow_hosts=(), dhchap_hosts=(), dhchap_hashes=(), dhchap_dhgroups=(),
                 unsigned int max_io_queues=0, unsigned int max_connections=0,
                 unsigned int io_buffer_budget_mib=0,
                 unsigned int handshake_timeout_ms=0, unsigned int stall_timeout_ms=0,
                 unsigned int idle_timeout_ms=300000,
                 unsigned int fault_drop_after=0,
                 unsigned int fault_delay_ms=0, unsigned int fault_corrupt_ddgst=0,
                 bint verbose=False, bint quiet=False, ready=None):
    """Serve namespaces (paths of files or block devices) as NVMe/TCP subsystem
    subnqn on host:port until target_stop() (from another thread or a signal
    handler).  ready(port) is called once the socket listens (port "0" picks
    a free one).  Blocks without the GIL; returns 0.

    DH-HMAC-CHAP: dhchap_hosts is a sequence of (hostnqn, secret,
    ctrl_secret or None), secrets in the DHHC-1 text form; those hosts must
    authenticate on every queue (and are allowed; naming any turns "any
    host" off).  dhchap_hashes / dhchap_dhgroups name the hash functions
    ("sha256", "sha384", "sha512") and DH groups ("null", "ffdhe2048" ...
    "ffdhe8192") we accept (empty: all); the strongest the host offers too is
    used.

    Limits (0: the default): max_connections (1024) open at once, more are
    closed at once; handshake_timeout_ms (10000) from accept to a completed
    ICReq and Connect; stall_timeout_ms (30000) for a whole PDU from its first
    byte, and without progress on a host that stopped reading;
    idle_timeout_ms (300000 = 5 min; 0: never) of nothing received on a
    Connected queue whose controller has keep alive off (KATO 0).  At the
    connection limit a new connection evicts one still in its handshake, else
    the longest idle KATO-0 queue idle for 1 s (or handshake_timeout_ms when
    shorter), else it is closed.  io_buffer_budget_mib (256, at least 8): MiB
    of data buffers of all connections together (commands in flight, admin
    data), each I/O queue at most 32 MiB, shared between peer addresses:
    while n addresses hold some or wait, one may take more only up to 1/n of
    it, a lone one 3/4; commands that do not fit wait for room."""
    cdef fx_target_config cfg
    cdef fx_target *t = NULL
    cdef const char **paths = NULL
    cdef const char **allow = NULL
    cdef fx_target_dhchap_host *keys = NULL
    cdef int rc
    keep = [host.encode(), port.encode(), subnqn.encode()]
    ns_b = [_os.fsencode(p) for p in namespaces]
    allow_b = [h.encode() for h in allow_hosts]
    keys_b = [(h.encode(), s.encode(), c.encode() if c else None)
              for h, s, c in dhchap_hosts]
    if not ns_b:
        raise error_from_errno(22, "target: no namespaces")
    hash_mask = _dhchap_mask(dhchap_hashes, TARGET_DHCHAP_HASHES, "hash")
    group_mask = _dhchap_mask(dhchap_dhgroups, TARGET_DHCHAP_DHGROUPS, "DH group")
    memset(&cfg, 0, sizeof(cfg))
    paths = <const char **>malloc(len(ns_b) * sizeof(char *))
    allow = <const char **>malloc((len(allow_b) or 1) * sizeof(char *))
    keys = <fx_target_dhchap_host *>malloc((len(keys_b) or 1) * sizeof(fx_target_dhchap_host))
    try:
        if paths == NULL or allow == NULL or keys == NULL:
            raise MemoryError()
        memset(keys, 0, (len(keys_b) or 1) * sizeof(fx_target_dhchap_host))
        for i, (hb, sb, cb) in enumerate(keys_b):
            keys[i].hostnqn = hb
            keys[i].secret = sb
            if cb is not None:
                keys[i].ctrl_secret = cb
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
        cfg.dhchap_hosts = keys
        cfg.n_dhchap_hosts = len(keys_b)
        cfg.dhchap_hashes = hash_mask
        cfg.dhchap_dhgroups = group_mask
        cfg.block_size = block_size
        cfg.max_io_queues = max_io_queues
        cfg.max_connections = max_connections
        cfg.io_buffer_budget_mib = io_buffer_budget_mib
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
        free(keys)
    return 0


def target_stop():
    """Make every running target_serve() return (safe from any thread and
    from a Python signal handler)."""
    with nogil:
        fx_target_stop_all()
