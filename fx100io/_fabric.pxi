# Binding of the NVMe-oF control path (csrc/host/): discovery; included by _core.pyx.
from libc.stdint cimport uint8_t as _u8, uint16_t as _u16, uint32_t as _u32

cdef extern from "host/ctrl.h" nogil:
    struct fx_nvmf_addr:
        char host[256]
        char port[16]
    struct fx_nvmf_params:
        char hostnqn[256]
        _u8 hostid[16]
        char subnqn[256]
        int hdgst
        int ddgst
        _u32 kato_ms
        int timeout_ms
        int tls
    struct nvmf_disc_log_entry:
        _u8 trtype
        _u8 adrfam
        _u8 subtype
        _u8 treq
        _u16 portid
        _u16 cntlid
        char trsvcid[32]
        char subnqn[256]
        char traddr[256]
        _u8 tsas[256]
    struct fx_nvmf_transport:
        pass
    int fx_nvmf_discover(const fx_nvmf_transport *tr, const fx_nvmf_addr *a,
                         const fx_nvmf_params *p, nvmf_disc_log_entry **entries, _u32 *n,
                         _u16 *status)
    int fx_nvmf_params_set_secret(fx_nvmf_params *p, int ctrl, const char *text,
                                  const char **why)
    int fx_nvmf_params_set_tls_key(fx_nvmf_params *p, const char *text, const char **why)
    void fx_nvmf_params_wipe(fx_nvmf_params *p)
    const char *fx_nvmf_auth_error()

cdef extern from "host/dev.h" nogil:
    const char *const *fx_nvmf_dev_keys()


def fabric_target_keys():
    """The keys the C transport reads from a target string (csrc/host/dev.c),
    for the test that holds them to fx100io/fabric_options.py."""
    cdef const char *const *keys = fx_nvmf_dev_keys()
    out = []
    cdef int i = 0
    while keys[i] != NULL:
        out.append(keys[i].decode())
        i += 1
    return tuple(out)


cdef extern from "transport/tcp_ctrl.h" nogil:
    const fx_nvmf_transport fx_tcp_transport

cdef extern from "transport/rdma_conn.h" nogil:
    const fx_nvmf_transport fx_rdma_transport

cdef extern from "auth/auth_crypto.h" nogil:
    struct fx_auth_key:
        _u8 len
    int fx_auth_key_parse(const char *text, fx_auth_key *key, const char **why)
    void fx_auth_key_wipe(fx_auth_key *key)

from libc.string cimport strncpy as _strncpy

_TRTYPES = {1: "rdma", 2: "fc", 3: "tcp", 254: "loop"}
_SUBTYPES = {1: "discovery-referral", 2: "nvme", 3: "discovery"}
_ADRFAMS = {1: "ipv4", 2: "ipv6", 3: "ib", 4: "fc"}
# the secure channel: TREQ bits 1:0, and TCP's TSAS SECTYPE
_TREQ = {0: "not specified", 1: "required", 2: "not required"}
_SECTYPES = {0: "none", 1: "tls1.2", 2: "tls1.3"}


cdef str _fixed(const char *p, size_t n):
    return p[:n].split(b"\0", 1)[0].decode("ascii", "replace").strip()


def dhchap_secret_error(str text):
    """None when text is a well-formed DH-HMAC-CHAP secret (DHHC-1:HH:...:),
    else why not, in words that never quote it (csrc/auth/auth_crypto.c
    parses it: the one parser, also used at open)."""
    cdef fx_auth_key k
    cdef const char *why = NULL
    b = text.encode("utf-8", "replace")
    cdef int rc = fx_auth_key_parse(b, &k, &why)
    fx_auth_key_wipe(&k)
    if rc == 0:
        return None
    return why.decode() if why != NULL else "malformed secret"


cdef extern from "nvme_tcp/tls_psk.h" nogil:
    struct fx_tls_key:
        _u8 len
    struct fx_tls_psk:
        _u8 len
        _u8 psk[48]
        char identity[528]
    int fx_tls_key_parse(const char *text, fx_tls_key *key, const char **why)
    void fx_tls_key_wipe(fx_tls_key *key)
    void fx_tls_psk_wipe(fx_tls_psk *psk)
    int fx_tls_psk_derive(const fx_tls_key *key, const char *hostnqn, const char *subnqn,
                          int idver, int kdf, fx_tls_psk *out)


def tls_key_error(str text):
    """None when text is a well-formed TLS PSK in the interchange format
    (NVMeTLSkey-1:HH:...:), else why not, in words that never quote it
    (csrc/nvme_tcp/tls_psk.c parses it: the one parser, also used at open)."""
    cdef fx_tls_key k
    cdef const char *why = NULL
    b = text.encode("utf-8", "replace")
    cdef int rc = fx_tls_key_parse(b, &k, &why)
    fx_tls_key_wipe(&k)
    if rc == 0:
        return None
    return why.decode() if why != NULL else "malformed TLS key"


def tls_psk(str text, str hostnqn, str subnqn):
    """(identity, TLS PSK bytes) of the version-0 identity for hostnqn and subnqn from a
    configured key's text, as our initiator offers them (csrc/nvme_tcp/tls_psk.c, RFC 8446
    HkdfLabel): what the Linux kernel's `.nvme` keyring must hold for its nvme-tcp host to
    offer the same (libnvme inserts the same).  ValueError for a malformed key or NQN."""
    cdef fx_tls_key k
    cdef fx_tls_psk out
    cdef const char *why = NULL
    b, h, n = text.encode("utf-8", "replace"), hostnqn.encode(), subnqn.encode()
    if fx_tls_key_parse(b, &k, &why) != 0:
        fx_tls_key_wipe(&k)
        raise ValueError(why.decode() if why != NULL else "malformed TLS key")
    cdef int rc = fx_tls_psk_derive(&k, h, n, 0, 0, &out)
    fx_tls_key_wipe(&k)
    if rc != 0:
        raise ValueError(f"cannot derive a TLS PSK for these NQNs (errno {-rc})")
    try:
        return out.identity.decode(), bytes(out.psk[:out.len])
    finally:
        fx_tls_psk_wipe(&out)


def auth_error():
    """Why the calling thread's last NVMe-oF connect failed in-band
    authentication ("" when it did not)."""
    return fx_nvmf_auth_error().decode("utf-8", "replace")


def discover(str host, str port, str hostnqn, str hostid, int timeout_ms=10000,
             str transport="tcp", str dhchap_secret="", str dhchap_ctrl_secret="",
             str tls_key=""):
    """Raw discovery over transport "tcp" or "rdma" (see fx100io.fabric_uri.discover)."""
    cdef const fx_nvmf_transport *tr
    cdef fx_nvmf_addr a
    cdef fx_nvmf_params p
    cdef nvmf_disc_log_entry *e = NULL
    cdef _u32 n = 0
    cdef _u16 status = 0
    cdef int rc
    if transport == "tcp":
        tr = &fx_tcp_transport
    elif transport == "rdma":
        tr = &fx_rdma_transport
    else:
        raise error_from_errno(22, f"discover: unknown transport {transport!r}")
    memset(&a, 0, sizeof(a))
    memset(&p, 0, sizeof(p))
    hb, pb, nb = host.encode(), port.encode(), hostnqn.encode()
    if len(hb) >= 256 or len(pb) >= 16 or len(nb) >= 256 or len(hostid) != 32:
        raise error_from_errno(22, "discover: bad host, port, host NQN or host ID")
    _strncpy(a.host, hb, 255)
    _strncpy(a.port, pb, 15)
    _strncpy(p.hostnqn, nb, 255)
    raw = bytes.fromhex(hostid)
    for i in range(16):
        p.hostid[i] = raw[i]
    p.timeout_ms = timeout_ms
    cdef const char *why = NULL
    for ctrl, text in ((0, dhchap_secret), (1, dhchap_ctrl_secret)):
        if text and fx_nvmf_params_set_secret(&p, ctrl, text.encode(), &why):
            fx_nvmf_params_wipe(&p)
            raise error_from_errno(22, "discover: malformed "
                                   + ("dhchap_ctrl_secret" if ctrl else "dhchap_secret"))
    if tls_key:
        if transport != "tcp" or fx_nvmf_params_set_tls_key(&p, tls_key.encode(), &why):
            fx_nvmf_params_wipe(&p)
            raise error_from_errno(22, "discover: malformed tls_key, or not over tcp")
        p.tls = 1
    with nogil:
        rc = fx_nvmf_discover(tr, &a, &p, &e, &n, &status)
        fx_nvmf_params_wipe(&p)
    check(rc, f"discover nvme+{transport}://{host}:{port}")
    out = []
    try:
        for i in range(n):
            out.append(dict(
                trtype=_TRTYPES.get(e[i].trtype, str(e[i].trtype)),
                adrfam=_ADRFAMS.get(e[i].adrfam, str(e[i].adrfam)),
                subtype=_SUBTYPES.get(e[i].subtype, str(e[i].subtype)),
                portid=e[i].portid, cntlid=e[i].cntlid,
                trsvcid=_fixed(e[i].trsvcid, 32), traddr=_fixed(e[i].traddr, 256),
                subnqn=_fixed(e[i].subnqn, 256),
                treq=_TREQ.get(e[i].treq & 3, "reserved"),
                sectype=_SECTYPES.get(e[i].tsas[0], str(e[i].tsas[0])) if e[i].trtype == 3
                else "none"))
    finally:
        free(e)
    return out
