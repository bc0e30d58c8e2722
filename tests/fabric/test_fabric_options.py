"""The NVMe-oF URI option table (fx100io/fabric_options.py) against the three
places that read options: the C transport's key list (csrc/host/dev.c), the
Python parser (fabric_uri) and the kernel path's nvme-cli flags (kernel)."""

from __future__ import annotations

import re

import pytest

from fx100io import _core, fabric_uri, kernel, uri_redact
from fx100io import fabric_options as fo
from fx100io.errors import InvalidArgumentError, KernelSupportError
from fx100io.kernel import uri_args

SECRET = "DHHC-1:00:ia6zGodOr4SEG0Zzaw398rpY0wqipUWj4jWjUh4HWUz6aQ2n:"
CTRL_SECRET = "DHHC-1:00:Vse+lQXC74j55LLeogykqUyoq6cyGRWl2MHdprBpN13YAtvd:"
NQN = "nqn.2024-01.io.fx100io:test"
HOSTID = "0b9e7d1c3f2a4e5d8c6b7a9f0e1d2c3b"
TLS_KEY = "NVMeTLSkey-1:01:VRLbtnN9AQb2WXW3c9+wEf/DRLz0QuLdbYvEhwtdWwNf9LrZ:"
TLS_OPTIONS = ("tls", "tls_key")


def test_c_reads_exactly_the_tables_keys():
    c_keys = _core.fabric_target_keys()
    assert len(set(c_keys)) == len(c_keys), c_keys
    assert sorted(c_keys) == sorted(fo.target_keys())


def test_the_table_has_one_row_per_name_and_key():
    assert len(fo.BY_NAME) == len(fo.OPTIONS)
    keys = fo.target_keys()
    assert len(set(keys)) == len(keys)
    for o in fo.OPTIONS:
        assert o.kind in (fo.INT, fo.BOOL, fo.TEXT, fo.SECRET, fo.CHOICE), o
        assert bool(o.choices) == (o.kind == fo.CHOICE), o
        # the multipath layer's options never reach the kernel path or C
        assert not o.multipath or (o.userspace_only and o.key not in keys), o
        assert (o.range is not None) == (o.kind == fo.INT), o
        assert o.schemes and set(o.schemes) <= set(fabric_uri.SCHEMES), o
        assert (o.kernel_config_key is not None) == o.secret, o


def _value(o: fo.FabricOption) -> str:
    """A value the option takes (its range's top, to test the bound too)."""
    if o.kind == fo.INT:
        assert o.range is not None
        return str(o.range[1])
    if o.kind == fo.BOOL:
        return "1"
    if o.kind == fo.CHOICE:
        return o.choices[-1]
    if o.kind == fo.SECRET:
        return {"dhchap_secret": SECRET, "tls_key": TLS_KEY}.get(o.name, CTRL_SECRET)
    return HOSTID if o.name == "hostid" else NQN + ":host"


def _uri(scheme: str, names: list[str]) -> str:
    query = "&".join(f"{n}={_value(fo.BY_NAME[n])}" for n in names)
    return f"{scheme}://127.0.0.1:4420/{NQN}?{query}"


@pytest.mark.parametrize("scheme", sorted(fabric_uri.SCHEMES))
def test_the_parser_takes_every_option_of_its_transport_and_names_the_c_key(scheme):
    mine = [o for o in fo.OPTIONS if scheme in o.schemes]
    target, secrets = fabric_uri.to_transport(_uri(scheme, [o.name for o in mine]))
    lines = dict(line.split("=", 1) for line in [*target.split("\n"), *secrets.split("\n")])
    for o in mine:
        if o.multipath:  # checked, then left to fx100io/multipath.py
            assert o.key not in lines, o
            continue
        want = "1" if o.kind == fo.BOOL else _value(o)
        assert lines[o.key] == want, o
    assert set(lines) <= set(_core.fabric_target_keys())
    # the secrets never travel in the target string
    assert not set(fo.SECRET_OPTIONS) & {line.split("=")[0] for line in target.split("\n")}


@pytest.mark.parametrize("o", [o for o in fo.OPTIONS if len(o.schemes) == 1], ids=lambda o: o.name)
def test_the_parser_refuses_an_option_on_the_other_transport(o):
    other = next(s for s in fabric_uri.SCHEMES if s not in o.schemes)
    with pytest.raises(InvalidArgumentError, match=re.escape(f"{o.name} is for {o.schemes[0]} URIs")):
        fabric_uri.parse(_uri(other, [o.name]))


@pytest.mark.parametrize("o", [o for o in fo.OPTIONS if o.kind == fo.INT], ids=lambda o: o.name)
def test_the_parser_holds_integers_to_the_tables_range(o):
    assert o.range is not None
    lo, hi = o.range
    scheme = o.schemes[0]
    for bad in (hi + 1, lo - 1):
        if bad < 0:
            continue
        uri = f"{scheme}://127.0.0.1/{NQN}?{o.name}={bad}"
        with pytest.raises(InvalidArgumentError, match=re.escape(f"{o.name} must be an integer in {lo}..{hi}")):
            fabric_uri.parse(uri)


def test_unknown_options_are_named_with_the_tables_list():
    with pytest.raises(InvalidArgumentError) as e:
        fabric_uri.parse(f"nvme+tcp://127.0.0.1/{NQN}?bogus=1")
    assert f"(known: {', '.join(sorted(fo.BY_NAME))})" in str(e.value)


def test_redaction_hides_the_tables_secrets():
    assert set(uri_redact.SECRET_OPTIONS) == {o.name for o in fo.OPTIONS if o.secret}
    assert set(fo.SECRET_OPTIONS) <= uri_redact.SECRET_QUERY_KEYS
    for name in fo.SECRET_OPTIONS:
        value = _value(fo.BY_NAME[name])
        uri = f"nvme+tcp://h/{NQN}?{name}={value}"
        assert value not in uri_redact.redact(uri)
        assert value not in uri_redact.redact_url(uri)


@pytest.mark.parametrize("scheme", sorted(fabric_uri.SCHEMES))
def test_the_kernel_path_gives_nvme_cli_the_tables_flags(scheme):
    """Every option the table gives a flag reaches `nvme connect` as that flag, every
    option flag of the connect command is the table's (or a kernel-only keyword's),
    userspace-only options are dropped, and secrets go by the table's config keys.  The TLS
    options are refused by the kernel path for now (the next test)."""
    # paths=discover is refused by the kernel path (tests/kernel/test_kernel_unit.py)
    mine = [o for o in fo.OPTIONS
            if scheme in o.schemes and o.name not in TLS_OPTIONS and o.name != "paths"]
    # kato_ms's top (in ms) is more seconds than the kernel is asked for; any value will do
    uri = _uri(scheme, [o.name for o in mine]).replace(
        f"kato_ms={_value(fo.BY_NAME['kato_ms'])}", "kato_ms=5000")
    t = kernel.target_of(uri)
    argv = t.argv()
    given_flags = {a.split("=", 1)[0] for a in argv if a.startswith("--")}
    endpoint_flags = {"--transport", "--traddr", "--trsvcid", "--nqn", "--output-format"}
    table_flags = {o.kernel_flag for o in mine if o.kernel_flag}
    assert given_flags - endpoint_flags == table_flags
    # the kernel path's own names for its flags agree with the table's
    for flag, name in uri_args.OPTION_NAMES.items():
        if name in fo.BY_NAME:
            assert fo.BY_NAME[name].kernel_flag == flag
        else:
            assert name in uri_args.KERNEL_ONLY
    assert set(uri_args.USERSPACE_ONLY) == {o.name for o in fo.OPTIONS if o.userspace_only}
    assert all(o.kernel_flag is None for o in fo.OPTIONS if o.userspace_only)
    assert set(uri_args.SECRET_KEYS) == set(fo.SECRET_OPTIONS)
    cfg = t.config_json()[0]
    port = cfg["subsystems"][0]["ports"][0]
    carried = {**{k: v for k, v in cfg.items() if k.startswith("dhchap")},
               **{k: v for k, v in port.items() if k.startswith("dhchap")}}
    assert carried == {o.kernel_config_key: _value(o) for o in mine if o.secret}
    assert not any(SECRET in a or CTRL_SECRET in a for a in argv)


@pytest.mark.parametrize("query", ["tls=1&tls_key=" + TLS_KEY, "tls_key=" + TLS_KEY, "tls=1",
                                   "tls=true", "tls_key=@/nonexistent/psk"])
def test_the_kernel_path_refuses_tls_rather_than_attach_in_clear(query, monkeypatch):
    """Without tlshd running; bare tls=1 and an unreadable key file too: why the kernel path
    cannot do TLS here comes first (docs/kernel-path.md, TLS)."""
    from fx100io.kernel import keyring

    monkeypatch.setattr(keyring, "tlshd_running", lambda: False)
    with pytest.raises(KernelSupportError, match="needs the tlshd daemon") as e:
        kernel.target_of(f"nvme+tcp://127.0.0.1:4420/{NQN}?{query}")
    assert TLS_KEY not in str(e.value)


@pytest.mark.parametrize("key", ["hostnqn", "hostid"])
def test_discovery_refuses_a_blank_identity_as_parse_does(key):
    """A blank hostnqn= or hostid= is refused by discovery as by every other parse, never
    quietly replaced by this machine's identity."""
    uri = f"nvme+tcp://127.0.0.1:4420/?{key}="
    with pytest.raises(InvalidArgumentError):
        fabric_uri.discovery_options(uri)
    with pytest.raises(InvalidArgumentError):
        fabric_uri.parse(f"nvme+tcp://127.0.0.1:4420/{NQN}?{key}=")
