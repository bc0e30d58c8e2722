# Binding of our NVMe/TCP target (csrc/target/); included by _core.pyx.

import os as _os

cdef extern from "target/target.h" nogil:
    struct fx_target:
        pass
    struct fx_target_dhchap_host:
        const char *hostnqn
        const char *secret
        const char *ctrl_secret
    struct fx_target_tls_host:
        const char *hostnqn
        const char *key
    struct fx_target_listen:
        const char *host
        const char *port
    struct fx_target_ana:
        unsigned portid
        uint32_t group
        uint8_t state
    struct fx_target_config:
        const char *host
        const char *port
        const fx_target_listen *listens
        unsigned n_listens
        const fx_target_ana *ana
        unsigned n_ana
        const uint32_t *ns_ana_groups
        const char *control_path
        const char *subnqn
        const char **ns_paths
        unsigned n_ns
        const char **allow_hosts
        unsigned n_allow
        const fx_target_dhchap_host *dhchap_hosts
        unsigned n_dhchap_hosts
        uint32_t dhchap_hashes
        uint32_t dhchap_dhgroups
        int tls
        const fx_target_tls_host *tls_hosts
        unsigned n_tls_hosts
        int ktls
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
        uint32_t fault_tls_after
        uint32_t fault_tls_kind
        int verbose
        int quiet
    uint32_t FX_TARGET_IDLE_NEVER
    uint32_t FX_TARGET_DHCHAP_HASHES_ALL
    uint32_t FX_TARGET_DHCHAP_DHGROUPS_ALL
    int fx_target_create(const fx_target_config *cfg, fx_target **out)
    int fx_target_port(const fx_target *t)
    int fx_target_port_of(const fx_target *t, unsigned portid)
    int fx_target_run(fx_target *t)
    void fx_target_stop(fx_target *t)
    void fx_target_stop_all()
    void fx_target_destroy(fx_target *t)


# DH-HMAC-CHAP ids by name (NVMe Base 2.x; Linux nvmet's names, "hmac(sha256)" too)
TARGET_DHCHAP_HASHES = {"sha256": 1, "sha384": 2, "sha512": 3}
TARGET_DHCHAP_DHGROUPS = {"null": 0, "ffdhe2048": 1, "ffdhe3072": 2, "ffdhe4096": 3,
                          "ffdhe6144": 4, "ffdhe8192": 5}
# ANA states by name (the control socket's names)
TARGET_ANA_STATES = {"optimized": 0x01, "non-optimized": 0x02, "inaccessible": 0x03,
                     "persistent-loss": 0x04, "change": 0x0F}
TARGET_MAX_PORTS = 16
# --fault-tls-record's kinds and its KIND:N (declared once, in fx100io/target_faults.py)
from fx100io.target_faults import FAULT_TLS_KINDS, parse_fault_tls_record as _fault_tls_parse
# --ktls: fx_target_config.ktls by name (the URI key ktls's choices)
TARGET_KTLS = {"auto": 0, "off": 1}
TARGET_ANA_GROUPS = 32


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
                 str fault_tls_record="",
                 bint verbose=False, bint quiet=False, ready=None,
                 listens=(), ana_states=(), ns_ana_groups=None, control_path=None,
                 ready_ports=None, str tls="", tls_hosts=(), str ktls="auto"):
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

    Secure channel: tls "" (off), "optional" or "required"; tls_hosts a
    sequence of (hostnqn, key), keys in the NVMeTLSkey-1 text form; ktls
    "auto" (after the handshake the kernel seals and opens the records,
    kTLS, where it has the tls module; else fx100io does) or "off" (always
    fx100io).

    Asymmetric Namespace Access: listens, a sequence of (host, port) strings
    (at most 16), replaces host:port with several ports, port id i+1 each;
    ana_states, (port id, group 1..32 or 0 for every group, state name from
    TARGET_ANA_STATES), sets initial states (default: optimized);
    ns_ana_groups, namespace i+1's group (default 1); control_path, a unix
    socket taking control commands (docs/target.md).  ready_ports(list of the
    bound ports) is called once they listen.

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
    it, a lone one 3/4; commands that do not fit wait for room.

    Fault injection (tests; off by default): fault_tls_record "KIND:N" (KIND
    from FAULT_TLS_KINDS, TLS only) sends, once, a TLS record of that kind
    between two records of the first C2HData of more than 16 KiB whose data
    reaches a connection's Nth 16 KiB record of read data (docs/target.md)."""
    cdef fx_target_config cfg
    cdef fx_target *t = NULL
    cdef const char **paths = NULL
    cdef const char **allow = NULL
    cdef fx_target_dhchap_host *keys = NULL
    cdef fx_target_tls_host *tkeys = NULL
    cdef fx_target_listen *lst = NULL
    cdef fx_target_ana *ana = NULL
    cdef uint32_t *groups = NULL
    cdef int rc
    keep = [host.encode(), port.encode(), subnqn.encode()]
    ns_b = [_os.fsencode(p) for p in namespaces]
    allow_b = [h.encode() for h in allow_hosts]
    keys_b = [(h.encode(), s.encode(), c.encode() if c else None)
              for h, s, c in dhchap_hosts]
    tkeys_b = [(h.encode(), k.encode()) for h, k in tls_hosts]
    tls_modes = {"": 0, "optional": 1, "required": 2}
    if tls not in tls_modes:
        raise ValueError(f"target: tls {tls!r} (one of optional, required, or empty for off)")
    if ktls not in TARGET_KTLS:
        raise ValueError(f"target: ktls {ktls!r} (one of {', '.join(TARGET_KTLS)})")
    if not ns_b:
        raise error_from_errno(22, "target: no namespaces")
    listens_b = [(h.encode(), str(pt).encode()) for h, pt in listens]
    if len(listens_b) > TARGET_MAX_PORTS:
        raise ValueError(f"target: {len(listens_b)} listening ports, at most {TARGET_MAX_PORTS}")
    ana_l = []
    for pid, grp, st in ana_states:
        if st not in TARGET_ANA_STATES:
            raise ValueError(f"unknown ANA state {st!r} (one of {', '.join(TARGET_ANA_STATES)})")
        if not 0 <= grp <= TARGET_ANA_GROUPS:
            raise ValueError(f"ANA group {grp}: 1..{TARGET_ANA_GROUPS} (0: every group)")
        if not 1 <= pid <= max(1, len(listens_b)):
            raise ValueError(f"ANA state for port {pid}: no such port")
        ana_l.append((pid, grp, TARGET_ANA_STATES[st]))
    if ns_ana_groups is not None:
        ns_ana_groups = list(ns_ana_groups)
        if len(ns_ana_groups) != len(ns_b):
            raise ValueError("ns_ana_groups: one group per namespace")
        for g in ns_ana_groups:
            if not 1 <= g <= TARGET_ANA_GROUPS:
                raise ValueError(f"ANA group {g}: 1..{TARGET_ANA_GROUPS}")
    ctl_b = _os.fsencode(control_path) if control_path is not None else None
    hash_mask = _dhchap_mask(dhchap_hashes, TARGET_DHCHAP_HASHES, "hash")
    group_mask = _dhchap_mask(dhchap_dhgroups, TARGET_DHCHAP_DHGROUPS, "DH group")
    memset(&cfg, 0, sizeof(cfg))
    paths = <const char **>malloc(len(ns_b) * sizeof(char *))
    allow = <const char **>malloc((len(allow_b) or 1) * sizeof(char *))
    keys = <fx_target_dhchap_host *>malloc((len(keys_b) or 1) * sizeof(fx_target_dhchap_host))
    tkeys = <fx_target_tls_host *>malloc((len(tkeys_b) or 1) * sizeof(fx_target_tls_host))
    lst = <fx_target_listen *>malloc((len(listens_b) or 1) * sizeof(fx_target_listen))
    ana = <fx_target_ana *>malloc((len(ana_l) or 1) * sizeof(fx_target_ana))
    groups = <uint32_t *>malloc((len(ns_b) or 1) * sizeof(uint32_t))
    try:
        if (paths == NULL or allow == NULL or keys == NULL or lst == NULL or ana == NULL
                or groups == NULL or tkeys == NULL):
            raise MemoryError()
        for i, (hb, pb) in enumerate(listens_b):
            lst[i].host = hb
            lst[i].port = pb
        for i, (pid, grp, st) in enumerate(ana_l):
            ana[i].portid = pid
            ana[i].group = grp
            ana[i].state = st
        if ns_ana_groups is not None:
            for i, g in enumerate(ns_ana_groups):
                groups[i] = g
        memset(keys, 0, (len(keys_b) or 1) * sizeof(fx_target_dhchap_host))
        for i, (hb, sb, cb) in enumerate(keys_b):
            keys[i].hostnqn = hb
            keys[i].secret = sb
            if cb is not None:
                keys[i].ctrl_secret = cb
        for i, (hb, kb) in enumerate(tkeys_b):
            tkeys[i].hostnqn = hb
            tkeys[i].key = kb
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
        cfg.tls = tls_modes[tls]
        cfg.tls_hosts = tkeys
        cfg.n_tls_hosts = len(tkeys_b)
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
        cfg.ktls = TARGET_KTLS[ktls]
        if fault_tls_record:
            # KIND:N (test knob): KIND's record once, mid-C2HData, once a
            # connection sent N records of read data
            cfg.fault_tls_kind, cfg.fault_tls_after = _fault_tls_parse(fault_tls_record)
        cfg.verbose = verbose
        cfg.quiet = quiet
        cfg.listens = lst
        cfg.n_listens = len(listens_b)
        cfg.ana = ana
        cfg.n_ana = len(ana_l)
        cfg.ns_ana_groups = groups if ns_ana_groups is not None else NULL
        if ctl_b is not None:
            cfg.control_path = ctl_b
        with nogil:
            rc = fx_target_create(&cfg, &t)
        check(rc, f"target on {host}:{port}")
        try:
            if ready is not None:
                ready(fx_target_port(t))
            if ready_ports is not None:
                ready_ports([fx_target_port_of(t, i + 1)
                             for i in range(max(1, len(listens_b)))])
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
        free(tkeys)
        free(lst)
        free(ana)
        free(groups)
    return 0


def target_stop():
    """Make every running target_serve() return (safe from any thread and
    from a Python signal handler)."""
    with nogil:
        fx_target_stop_all()
