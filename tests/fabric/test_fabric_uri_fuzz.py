"""Property tests of the nvme+tcp:// URI parser (fx100io.fabric_uri), the
parser of what users type: any string either parses or raises
InvalidArgumentError (nothing else), what it accepts reaches the C
transport as a target string that C reads back exactly (the contract that
tests/fuzz/fuzz_uri.c checks on the C side), and valid URIs round-trip."""

from __future__ import annotations

import re
import string
from urllib.parse import quote

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from support.target_process import serve

import fx100io
from fx100io import fabric_options as fo
from fx100io import fabric_uri
from fx100io.errors import InvalidArgumentError

SETTINGS = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
HOSTID = "00112233445566778899aabbccddeeff"
ME = f"hostnqn=nqn.2014-08.io.fx100:me&hostid={HOSTID}"

# What C's parse_kv (csrc/host/dev.c) reads exactly: its field sizes
# and integer types.
STR_MAX = {"host": 255, "port": 15, "subnqn": 223, "hostnqn": 223}
U32 = 2**32 - 1
INT_MAX = {"nsid": U32 - 1, "queues": 64, "kato_ms": U32, "max_xfer": U32,
           "connect_timeout_ms": 2**31 - 1, "io_timeout_ms": 2**31 - 1,
           "reconnect_ms": 2**31 - 1, "max_reconnects": 2**31 - 1}
INT_MIN = {"kato_ms": 0, "reconnect_ms": 0, "max_reconnects": 0}


def check_contract(target: str) -> dict[str, str]:
    """The target string as C will read it: one key=value per line, known
    keys, no control characters, values that fit C's fields."""
    opts: dict[str, str] = {}
    for line in target.split("\n"):
        key, sep, value = line.partition("=")
        assert sep, line
        assert key not in opts, f"{key} twice"
        assert not re.search(r"[\x00-\x1f\x7f]", value), (key, value)
        opts[key] = value
    for key, limit in STR_MAX.items():
        assert 0 < len(opts[key].encode()) <= limit, (key, opts[key])
    assert re.fullmatch(r"[0-9]{1,5}", opts["port"]) and 0 < int(opts["port"]) < 65536
    assert re.fullmatch(r"[0-9a-f]{32}", opts["hostid"]), opts["hostid"]
    for key, hi in INT_MAX.items():
        if key in opts:
            assert re.fullmatch(r"[0-9]{1,10}", opts[key]), (key, opts[key])
            assert INT_MIN.get(key, 1) <= int(opts[key]) <= hi, (key, opts[key])
    for key in ("hdgst", "ddgst", "tls"):
        if key in opts:
            assert opts[key] in ("0", "1")
    # every key C reads, as fabric_options declares them (test_fabric_options.py checks
    # that list against C's own)
    assert set(opts) <= {*STR_MAX, "hostid", *fo.target_keys()}, opts
    return opts


def parse_or_invalid(uri: str) -> dict[str, str] | None:
    try:
        target = fabric_uri.to_transport_target(uri)
    except InvalidArgumentError:
        return None
    return check_contract(target)


option_values = st.one_of(
    st.text(max_size=12),
    st.integers(-5, 2**40).map(str),
    st.sampled_from(["0", "1", "true", "false", "²", "١", "٣٢", " 1", "1 ", "+1", "0x10",
                     HOSTID, HOSTID.upper(), "z" * 32, "0" * 31, "%0A", "%00"]),
)
option_keys = st.sampled_from([*fabric_uri.INT_OPTIONS, *fabric_uri.BOOL_OPTIONS,
                               *fabric_uri.STR_OPTIONS, "bogus", ""])
nqn_chars = st.text(alphabet=st.characters(min_codepoint=0, max_codepoint=0x2FF), max_size=260)
hosts = st.one_of(
    st.sampled_from(["192.0.2.1", "[fe80::1]", "[::1", "h", "", "a" * 256, "[v1.x]", "ex%0Aample",
                     "USER@h", "h:0", "h:65536", "h:-1", "h: 1"]),
    st.text(max_size=20),
)


@st.composite
def uris(draw) -> str:
    host = draw(hosts)
    path = draw(st.one_of(nqn_chars, nqn_chars.map(lambda s: quote(s, safe=":"))))
    pairs = draw(st.lists(st.tuples(option_keys, option_values), max_size=6))
    query = "&".join(f"{k}={v}" for k, v in pairs)
    scheme = draw(st.sampled_from(["nvme+tcp", "nvme+tcp", "nvme+rdma", ""]))
    return f"{scheme}://{host}/{path}" + (f"?{query}" if query else "")


@SETTINGS
@given(st.text(max_size=300))
@example("nvme+tcp://[::1/nqn")
@example("nvme+tcp://h/nqn?ns=²")
@example("nvme+tcp://192.0.2.1/0?tls=0")
def test_any_string_parses_or_is_invalid_argument(s):
    parse_or_invalid(s)


@SETTINGS
@given(uris())
@example(f"nvme+tcp://h/nqn%0Ahost=evil?{ME}")
@example(f"nvme+tcp://h/nqn%00x?{ME}")
@example(f"nvme+tcp://h/nqn?hostnqn=a%0Ansid=7&hostid={HOSTID}")
@example(f"nvme+tcp://h/nqn?ns=99999999999&{ME}")
@example(f"nvme+tcp://h/nqn?ns=4294967295&{ME}")
@example(f"nvme+tcp://h/nqn?queues=65&{ME}")
@example(f"nvme+tcp://h/nqn?ns=١&{ME}")
@example("nvme+tcp://h/nqn?hostnqn=n&hostid=" + "z" * 32)
@example(f"nvme+tcp://h/{'n' * 224}?{ME}")
@example(f"nvme+tcp://{'a' * 256}/nqn?{ME}")
@example(f"nvme+tcp://h:0/nqn?{ME}")
def test_accepted_uris_reach_c_intact(uri):
    parse_or_invalid(uri)


@SETTINGS
@given(uris())
def test_discover_refuses_bad_uris_before_connecting(uri):
    """discover() checks its URI the same way (no network: only the
    argument checks run, so only rejection is tested here)."""
    try:
        where = fabric_uri.discovery_target(uri)
    except InvalidArgumentError:
        return
    host, port, hostnqn, hostid = where
    assert 0 < len(host.encode()) <= STR_MAX["host"]
    assert 0 < int(port) < 65536
    assert 0 < len(hostnqn.encode()) <= STR_MAX["hostnqn"]
    assert re.fullmatch(r"[0-9a-f]{32}", hostid)


# ------------------------------------------------------------- round trip
nqn_text = st.text(alphabet=string.ascii_letters + string.digits + ".:-_", min_size=1, max_size=223)
ipv4 = st.tuples(*[st.integers(0, 255)] * 4).map(lambda t: ".".join(map(str, t)))
hostname = st.from_regex(r"[a-z][a-z0-9-]{0,30}(\.[a-z][a-z0-9-]{0,20}){0,3}", fullmatch=True)
ipv6 = st.ip_addresses(v=6).map(str)


@SETTINGS
@given(host=st.one_of(ipv4, hostname, ipv6), port=st.one_of(st.none(), st.integers(1, 65535)),
       subnqn=nqn_text, hostnqn=nqn_text, hostid=st.from_regex(r"[0-9a-fA-F]{32}", fullmatch=True),
       nsid=st.integers(1, U32 - 1), queues=st.integers(1, 64), kato=st.integers(0, U32),
       timeout=st.integers(1, 2**31 - 1), hdgst=st.sampled_from(["0", "1", "true", "false"]))
def test_valid_uris_round_trip(host, port, subnqn, hostnqn, hostid, nsid, queues, kato, timeout,
                               hdgst):
    netloc = f"[{host}]" if ":" in host else host
    if port is not None:
        netloc += f":{port}"
    uri = (f"nvme+tcp://{netloc}/{quote(subnqn, safe=':')}?ns={nsid}&queues={queues}"
           f"&kato_ms={kato}&io_timeout_ms={timeout}&hdgst={hdgst}"
           f"&hostnqn={quote(hostnqn, safe=':')}&hostid={hostid}")
    opts = check_contract(fabric_uri.to_transport_target(uri))
    assert opts["host"] == host.lower()
    assert opts["port"] == str(port or 4420)
    assert opts["subnqn"] == subnqn
    assert opts["hostnqn"] == hostnqn
    assert opts["hostid"] == hostid.lower()
    assert (opts["nsid"], opts["queues"], opts["kato_ms"], opts["io_timeout_ms"]) == \
        (str(nsid), str(queues), str(kato), str(timeout))
    assert opts["hdgst"] == ("1" if hdgst in ("1", "true") else "0")


@pytest.mark.parametrize("uri", [
    "nvme+tcp://h/nqn%0Ahost=evil", "nvme+tcp://h/nqn?hostnqn=a%0Ansid=7",
    "nvme+tcp://h/nqn?ns=99999999999", "nvme+tcp://h/nqn?ns=١", "nvme+tcp://h/nqn?ns=²",
    "nvme+tcp://h/nqn?queues=65", "nvme+tcp://[::1/nqn", "nvme+tcp://h:0/nqn",
    "nvme+tcp://h/nqn?hostid=" + "z" * 32, "nvme+tcp://h/" + "n" * 224,
])
def test_refused_with_invalid_argument(uri):
    with pytest.raises(InvalidArgumentError):
        fabric_uri.to_transport_target(uri)


def test_hostid_as_uuid():
    u = "00112233-4455-6677-8899-AABBCCDDEEFF"
    opts = check_contract(fabric_uri.to_transport_target(f"nvme+tcp://h/nqn?hostid={u}"))
    assert opts["hostid"] == HOSTID


def test_discover_end_to_end(tmp_path):
    """fx100io.discover() through the C discovery log reader against our
    own target: the URI checks above do not refuse a good discovery URI."""
    img = tmp_path / "ns.img"
    img.write_bytes(bytes(1 << 20))
    nqn = "nqn.2014-08.io.fx100:fuzz-discover"
    with serve([str(img)], nqn) as (host, port, _p):
        entries = fx100io.discover(f"nvme+tcp://{host}:{port}?{ME}")
    assert [(e["subnqn"], e["trtype"], e["trsvcid"]) for e in entries if e["subtype"] == "nvme"] \
        == [(nqn, "tcp", str(port))]
