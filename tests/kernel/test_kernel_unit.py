"""fx100io.kernel without a lab: parsing what the real nvme-cli 2.3 printed and what sysfs
held in the lab guest (tests/data/nvme_cli, see its README), the URI -> nvme-cli argument
mapping, and error mapping with a stand-in `nvme` on PATH (tests/support/fake_nvme.py) that replays
the real error texts and kernel log lines.  The same paths against the real kernel and
nvme-cli: tests/guest/test_kernel_path.py."""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
from pathlib import Path

import pytest

import fx100io
from fx100io import errors, kernel
from fx100io.kernel.cli import _parser, connect_options

DATA = Path(__file__).parents[1] / "data" / "nvme_cli"
RAM = "nqn.2026-11.io.fx100:lab-ram"
NV = "nqn.2026-11.io.fx100:lab-nvme"
HOST = "nqn.2026-11.io.fx100:lab-host"
HID = "0b9e7d1c-3f2a-4e5d-8c6b-7a9f0e1d2c3b"
SECRET = "DHHC-1:00:ia6zGodOr4SEG0Zzaw398rpY0wqipUWj4jWjUh4HWUz6aQ2n:"
CTRL_SECRET = "DHHC-1:00:Vse+lQXC74j55LLeogykqUyoq6cyGRWl2MHdprBpN13YAtvd:"
URI = f"nvme+tcp://10.88.0.2:4420/{RAM}?hostnqn={HOST}&hostid={HID}"


def cap(name: str) -> str:
    return (DATA / name).read_text()


def kmsg_of(dmesg: str) -> list[str]:
    """dmesg lines without their timestamps: what /dev/kmsg records carry."""
    return [re.sub(r"^\[\s*[\d.]+\]\s*", "", line) for line in dmesg.splitlines() if line]


# ---------------------------------------------------------------- captured output
def test_connect_output_names_the_controller():
    assert kernel.parse_connect_output(cap("connect-tcp-ram.out")) == "nvme1"
    assert kernel.parse_connect_output(cap("connect-rdma-nvme.out")) == "nvme2"
    # --dump-config prints the configuration first
    assert kernel.parse_connect_output(cap("connect-config-file.out")) == "nvme3"
    with pytest.raises(errors.DeviceIOError, match="no controller name"):
        kernel.parse_connect_output(cap("connect-tcp-ram-again.out"))


@pytest.mark.parametrize("transport,port", [("tcp", "4420"), ("rdma", "4421")])
def test_discover_output(transport, port):
    recs = kernel.parse_discover_output(cap(f"discover-{transport}.out"))
    assert [(r["subtype"], r["subnqn"]) for r in recs] == [
        ("discovery", kernel.DISCOVERY_NQN), ("nvme", RAM), ("nvme", NV)]
    assert {(r["trtype"], r["traddr"], r["trsvcid"], r["adrfam"]) for r in recs} == {
        (transport, "10.88.0.2", port, "ipv4")}
    assert recs[1]["subtype_text"] == "nvme subsystem"
    assert recs[0]["portid"] == (1 if transport == "tcp" else 2)
    if transport == "rdma":
        assert recs[1]["rdma_cms"] == "rdma-cm"


def test_list_ns_output():
    assert kernel.parse_list_ns_output(cap("list-ns-nvme1.out")) == (1,)


def test_address_attribute():
    assert kernel.parse_address("traddr=10.88.0.2,trsvcid=4420,src_addr=10.88.0.2") == {
        "traddr": "10.88.0.2", "trsvcid": "4420", "src_addr": "10.88.0.2"}
    assert kernel.parse_address("0000:00:06.0") == {"traddr": "0000:00:06.0"}


@pytest.fixture
def fake_sys(tmp_path, monkeypatch):
    """A sysfs and /dev built from the captured tree; regular files stand for block nodes."""
    sysfs, dev = tmp_path / "sys", tmp_path / "dev"
    for cls in ("nvme", "nvme-subsystem"):
        src = DATA / "sys" / "class" / cls
        for d in src.iterdir():
            if not d.is_dir():
                continue
            dst = sysfs / "class" / cls / d.name
            shutil.copytree(d, dst)
            for entry in (src / f"{d.name}.ls").read_text().split():
                if re.fullmatch(r"nvme\d+(c\d+)?n\d+|ng\d+n\d+|nvme\d+", entry):
                    (dst / entry).mkdir(exist_ok=True)
    shutil.copytree(DATA / "sys" / "block", sysfs / "block")
    dev.mkdir()
    for line in cap("dev-nvme.ls").splitlines():
        name = line.split()[-1]
        if line.startswith("b"):
            Path(name.replace("/dev", str(dev))).write_text("")
    (dev / "nvme-fabrics").write_text("")
    (dev / "kmsg").write_text("")
    (sysfs / "module" / "nvme_tcp").mkdir(parents=True)
    (sysfs / "module" / "nvme_rdma").mkdir(parents=True)
    monkeypatch.setattr(kernel.sysfs, "SYSFS", sysfs)
    monkeypatch.setattr(kernel.sysfs, "DEVDIR", dev)
    monkeypatch.setattr(kernel.sysfs, "_is_block_device", lambda p: Path(p).is_file())
    # the cross-process lock files and the secrets' temporary directories
    monkeypatch.setattr(kernel.holds, "RUNDIR", tmp_path / "run")
    (tmp_path / "shm").mkdir()
    monkeypatch.setattr(kernel.secrets, "SECRET_TMPDIR", str(tmp_path / "shm"))
    monkeypatch.setattr(kernel.holds, "_attached", {})
    return sysfs, dev


def test_controllers_from_captured_sysfs(fake_sys):
    ctrls = kernel.list()
    assert [(c.name, c.subsysnqn, c.transport, c.traddr, c.trsvcid, c.state) for c in ctrls] == [
        ("nvme1", RAM, "tcp", "10.88.0.2", "4420", "live"),
        ("nvme2", NV, "rdma", "10.88.0.2", "4421", "live")]
    c1, c2 = ctrls
    assert (c1.hostnqn, c1.hostid, c1.cntlid, c1.queue_count, c1.kato) == (HOST, HID, 1, 3, 5)
    assert c2.kato == 7  # connect-rdma-nvme: -k 7
    # the multipath path nvme1c1n1 is served by the subsystem's head nvme1n1
    assert c1.block_devices() == {1: f"{kernel.sysfs.DEVDIR}/nvme1n1"}
    assert c1.namespaces == [f"{kernel.sysfs.DEVDIR}/nvme1n1"]
    assert [c.name for c in kernel.list(all_transports=True)] == ["nvme0", "nvme1", "nvme2"]
    assert kernel.subsystems() == {"nvme-subsys0": "nqn.2019-08.org.qemu:fxlab0",
                                   "nvme-subsys1": RAM, "nvme-subsys2": NV}
    d = c2.as_dict()
    assert d["namespaces"] == [f"{kernel.sysfs.DEVDIR}/nvme2n1"] and d["address"].startswith("traddr=")


def test_namespace_wait_is_bounded_with_a_clear_error(fake_sys):
    sysfs, _ = fake_sys
    c = kernel.read_controller("nvme1")
    (sysfs / "block" / "nvme1n1" / "size").write_text("0\n")  # not ready yet
    with pytest.raises(errors.FxTimeoutError, match=r"namespace\(s\) \[1\] did not show up .* 0.2 s"):
        c.namespace(1, timeout=0.2)
    with pytest.raises(errors.FxTimeoutError):
        c.wait_namespaces((1, 2), timeout=0.1)


# ---------------------------------------------------------------- URI -> nvme-cli arguments
def test_argv_mapping():
    t = kernel.target_of(f"{URI}&queues=4&kato_ms=1500&hdgst=1&ddgst=true&ns=2&io_timeout_ms=5"
                         "&max_xfer=4096", ctrl_loss_tmo=-1, reconnect_delay=2,
                         host_iface="eth1", duplicate_connect=True)
    assert t.nsid == 2
    assert t.argv() == [
        "nvme", "connect", "--transport", "tcp", "--traddr", "10.88.0.2", "--trsvcid", "4420",
        "--nqn", RAM, "--hostnqn", HOST, "--hostid", HID, "--nr-io-queues=4",
        "--keep-alive-tmo=2", "--hdr-digest", "--data-digest", "--ctrl-loss-tmo=-1",
        "--reconnect-delay=2", "--host-iface=eth1", "--duplicate-connect",
        "--output-format=json"]
    # RDMA's qsize, the default port; a 32-hex hostid goes to the kernel as a UUID
    t = kernel.target_of(f"nvme+rdma://[fd00::2]/{NV}?qsize=64&hostid=0b9e7d1c3f2a4e5d8c6b7a9f0e1d2c3b")
    assert (t.transport, t.traddr, t.trsvcid, t.hostid) == ("rdma", "fd00::2", "4420", HID)
    assert ("--queue-size", "64") in t.options
    # keywords override the URI's options
    t = kernel.target_of(URI + "&queues=4", queues=1, hdgst=True)
    assert t.options == (("--nr-io-queues", "1"), ("--hdr-digest", ""))


def test_default_host_identity_is_nvme_clis(tmp_path, monkeypatch):
    (tmp_path / "hostnqn").write_text("nqn.2014-08.org.nvmexpress:uuid:1234\n")
    (tmp_path / "hostid").write_text("ab9e7d1c-3f2a-4e5d-8c6b-7a9f0e1d2c3b\n")
    monkeypatch.setattr(kernel.uri_args, "ETC_NVME", tmp_path)
    t = kernel.target_of(f"nvme+tcp://h/{RAM}")
    assert (t.hostnqn, t.hostid) == ("nqn.2014-08.org.nvmexpress:uuid:1234",
                                     "ab9e7d1c-3f2a-4e5d-8c6b-7a9f0e1d2c3b")
    monkeypatch.setattr(kernel.uri_args, "ETC_NVME", tmp_path / "none")
    nqn, hid = fx100io.host_identity()
    t = kernel.target_of(f"nvme+tcp://h/{RAM}")
    assert (t.hostnqn, t.hostid.replace("-", "")) == (nqn, hid)


@pytest.mark.parametrize("uri,match", [
    (f"nvme+tcp://h/{RAM}?kato_ms=0", "keep alive off"),
    (f"nvme+tcp://h/{RAM}?qsize=4", "qsize is for nvme\\+rdma"),
    ("nvme+tcp://h:4420", "subsystem NQN"),
    (f"nvme+tcp://h/{RAM}?bogus=1", "unknown URI option 'bogus'"),
    (f"nvme+tcp://h/{RAM}?hostid=xyz", "hostid must be 32 hex digits"),
    (f"nvme+tcp://h/{RAM}?dhchap_ctrl_secret={CTRL_SECRET}", "needs dhchap_secret too"),
    ("file:///tmp/x", "starts with nvme\\+tcp"),
])
def test_bad_uris(uri, match):
    with pytest.raises(errors.InvalidArgumentError, match=match):
        kernel.target_of(uri)


def test_a_malformed_secret_is_refused_without_being_repeated():
    bad = "DHHC-1:00:not-base64-at-all:"
    with pytest.raises(errors.InvalidArgumentError, match="dhchap_secret: the secret") as ei:
        kernel.target_of(f"nvme+tcp://h/{RAM}?dhchap_secret={bad}&queues=2")
    assert bad not in str(ei.value) and "dhchap_secret=***" in str(ei.value)
    with pytest.raises(errors.InvalidArgumentError) as ei:
        kernel.target_of(f"nvme+tcp://h/{RAM}", dhchap_secret=bad)
    assert bad not in str(ei.value)


def test_secrets_go_in_a_config_file_not_in_argv():
    t = kernel.target_of(f"{URI}&dhchap_secret={SECRET}", dhchap_ctrl_secret=CTRL_SECRET)
    assert not any(SECRET in a or CTRL_SECRET in a for a in t.argv())
    assert SECRET not in repr(t) and SECRET not in kernel.options_text(t)
    assert t.config_json() == [{
        "hostnqn": HOST, "hostid": HID, "dhchap_key": SECRET,
        "subsystems": [{"nqn": RAM, "ports": [{"transport": "tcp", "traddr": "10.88.0.2",
                                                "trsvcid": "4420",
                                                "dhchap_ctrl_key": CTRL_SECRET}]}]}]
    assert kernel.redact(f"{URI}&dhchap_secret={SECRET}").endswith("dhchap_secret=***")


def test_fabric_uris_one_parser_reads_the_kernel_paths_uris_and_keywords():
    # a secret with "+" from the URI, the other as a keyword: both reach the kernel as written
    t = kernel.target_of(f"{URI}&dhchap_ctrl_secret={CTRL_SECRET}", dhchap_secret=SECRET)
    assert t.secrets == {"dhchap_secret": SECRET, "dhchap_ctrl_secret": CTRL_SECRET}
    # a keyword secret overrides the URI's
    t = kernel.target_of(f"{URI}&dhchap_secret={CTRL_SECRET}", dhchap_secret=SECRET)
    assert t.secrets == {"dhchap_secret": SECRET}
    # the userspace initiator's options are ignored here, even ones it would refuse
    t = kernel.target_of(f"{URI}&io_timeout_ms=0&max_xfer=x&queues=2")
    assert t.options == (("--nr-io-queues", "2"),)
    with pytest.raises(errors.InvalidArgumentError, match="queues must be an integer"):
        kernel.target_of(URI, queues=0)
    # the pair rule names the kernel path's words, whichever side gave the secrets
    with pytest.raises(errors.InvalidArgumentError, match=r"needs dhchap_secret too"):
        kernel.target_of(URI, dhchap_ctrl_secret=CTRL_SECRET)
    with pytest.raises(errors.InvalidArgumentError, match=r"needs dhchap_secret too"):
        kernel.target_of(f"{URI}&dhchap_ctrl_secret={CTRL_SECRET}")


def test_cli_options_are_nvme_clis():
    a = _parser("connect").parse_args([
        "nvme+tcp://h/n", "--hostnqn", HOST, "--hostid", HID, "--nr-io-queues", "3",
        "--keep-alive-tmo", "15", "--hdr-digest", "--data-digest", "--ctrl-loss-tmo", "-1"])
    o = connect_options(a, env={"FX100IO_DHCHAP_SECRET": SECRET})
    assert o == {"hostnqn": HOST, "hostid": HID, "queues": 3, "kato_ms": 15000, "hdgst": True,
                 "ddgst": True, "ctrl_loss_tmo": -1, "dhchap_secret": SECRET}
    t = kernel.target_of("nvme+tcp://h/n", **o)
    assert ("--keep-alive-tmo", "15") in t.options and ("--nr-io-queues", "3") in t.options
    a = _parser("connect").parse_args(["nvme+tcp://h/n", "-S", SECRET, "-C", CTRL_SECRET, "-g"])
    assert connect_options(a, env={}) == {"dhchap_secret": SECRET,
                                          "dhchap_ctrl_secret": CTRL_SECRET, "hdgst": True}


# ---------------------------------------------------------------- errors, with a fake nvme-cli
@pytest.fixture
def fake_nvme(fake_sys, tmp_path, monkeypatch):
    sysfs, dev = fake_sys
    bindir = tmp_path / "bin"
    bindir.mkdir()
    exe = bindir / "nvme"
    exe.write_text(f"#!/bin/sh\nexec {sys.executable} {Path(__file__).parents[1] / 'support' / 'fake_nvme.py'} \"$@\"\n")
    exe.chmod(0o755)
    scenario, logf = tmp_path / "scenario.json", tmp_path / "calls.log"
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_NVME_SCENARIO", str(scenario))
    monkeypatch.setenv("FAKE_NVME_LOG", str(logf))
    monkeypatch.setenv("FAKE_NVME_SYSFS", str(sysfs))
    monkeypatch.setenv("FAKE_NVME_DEV", str(dev))
    # start from the state before the captures' connects: only the PCIe drive
    for name in ("nvme1", "nvme2"):
        shutil.rmtree(sysfs / "class" / "nvme" / name)

    class Fake:
        def play(self, **steps):
            scenario.write_text(json.dumps(steps))

        def add(self, name, attrs, paths=("nvme1c3n1",)):
            """A controller some other process (or the admin) attached."""
            d = sysfs / "class" / "nvme" / name
            d.mkdir()
            for k, v in attrs.items():
                (d / k).write_text(v + "\n")
            for p in paths:
                (d / p).mkdir()

        def calls(self):
            return [json.loads(line) for line in logf.read_text().splitlines()] if logf.exists() else []

    return Fake()


NVME3 = {"address": "traddr=10.88.0.2,trsvcid=4420,src_addr=10.88.0.2", "subsysnqn": RAM,
         "transport": "tcp", "state": "live", "hostnqn": HOST, "hostid": HID, "cntlid": "3",
         "queue_count": "2", "kato": "5"}


def failing(name: str, dmesg: str | None = None, **extra) -> dict:
    step = {"stdout": cap(f"{name}.out"), "stderr": cap(f"{name}.err"), "rc": int(cap(f"{name}.rc"))}
    if dmesg:
        step["kmsg"] = kmsg_of(cap(dmesg))
    step.update(extra)
    return {"connect": step}


@pytest.mark.parametrize("name,dmesg,uri,exc,match", [
    ("connect-not-allowed", "dmesg-not-allowed.txt",
     f"nvme+tcp://10.88.0.2/{NV}?hostnqn=nqn.2026-11.io.fx100:not-allowed",
     errors.DevicePermissionError, "does not allow host nqn.2026-11.io.fx100:not-allowed"),
    ("connect-no-subsys", "dmesg-no-subsys.txt",
     f"nvme+tcp://10.88.0.2/nqn.2026-11.io.fx100:no-such?hostnqn={HOST}",
     errors.DeviceNotFoundError, "has no subsystem nqn.2026-11.io.fx100:no-such"),
    ("connect-rdma-no-subsys", "dmesg-rdma-no-subsys.txt",
     f"nvme+rdma://10.88.0.2:4421/nqn.2026-11.io.fx100:no-such?hostnqn={HOST}",
     errors.DeviceNotFoundError, "has no subsystem"),
    ("connect-refused", "dmesg-refused.txt", f"nvme+tcp://10.88.0.2:4999/{RAM}?hostnqn={HOST}",
     errors.FxConnectionError, "connection refused: no NVMe-oF port listens at 10.88.0.2:4999"),
    ("connect-tcp-ram-again", None, URI, errors.DeviceBusyError, "already connected"),
    ("connect-hostid-not-uuid", None, URI, errors.InvalidArgumentError, "refused the connect options"),
    # no kernel log to read: still an error that lists what it may be
    ("connect-not-allowed", None, f"nvme+tcp://10.88.0.2/{NV}?hostnqn={HOST}",
     errors.DeviceIOError, "a host that is not allowed, a missing subsystem and a failed authentication"),
])
def test_connect_failures_map_to_clear_errors(fake_nvme, name, dmesg, uri, exc, match):
    fake_nvme.play(**failing(name, dmesg))
    with pytest.raises(exc, match=match) as ei:
        kernel.connect(uri)
    assert ei.value.target == uri
    assert kernel.list() == []


AUTH = "nqn.2026-11.io.fx100:lab-auth"
AUTH_URI = f"nvme+tcp://10.88.0.2/{AUTH}?hostnqn=nqn.2026-11.io.fx100:lab-auth-host"


@pytest.mark.parametrize("name,uri,match", [
    # captured on 6.12 (the 6.1 lab kernel has no authentication)
    ("connect-auth-wrong", f"{AUTH_URI}&dhchap_secret={SECRET}", "authentication with the target failed"),
    ("connect-auth-rdma-wrong", f"{AUTH_URI}&dhchap_secret={SECRET}".replace("tcp://10.88.0.2/", "rdma://10.88.0.2:4421/"),
     "authentication with the target failed"),
    ("connect-auth-none", AUTH_URI, "requires DH-HMAC-CHAP authentication .* no secret was given"),
    ("connect-auth-bidir-wrong-ctrl",
     f"nvme+tcp://10.88.0.2/{AUTH}?hostnqn=nqn.2026-11.io.fx100:lab-auth-bidir"
     f"&dhchap_secret={SECRET}&dhchap_ctrl_secret={CTRL_SECRET}",
     "controller failed DH-HMAC-CHAP authentication"),
])
@pytest.mark.parametrize("with_kmsg", [True, False])
def test_authentication_failures_are_permission_errors(fake_nvme, name, uri, match, with_kmsg):
    dmesg = f"6.12/dmesg-{name.removeprefix('connect-')}.txt" if with_kmsg else None
    fake_nvme.play(**failing(f"6.12/{name}", dmesg))
    if not with_kmsg and "bidir" in name:
        match = "authentication with the target failed"  # nvme-cli's words alone
    with pytest.raises(errors.DevicePermissionError, match=match) as ei:
        kernel.connect(uri)
    assert SECRET not in str(ei.value) and CTRL_SECRET not in str(ei.value)
    assert kernel.list() == []


def test_a_host_nqn_the_kernel_knows_keeps_its_host_id(fake_nvme, fake_sys):
    """6.12 refuses a known host NQN with another host ID (captured: 6.12/dmesg-no-subsys.txt):
    a default host ID yields to the one in use; a given one that differs is a clear error."""
    sysfs, _ = fake_sys
    d = sysfs / "class" / "nvme" / "nvme4"
    d.mkdir()
    for k, v in {**NVME3, "hostid": HID, "subsysnqn": NV}.items():
        (d / k).write_text(v)
    fake_nvme.play(**failing("6.12/connect-no-subsys", "6.12/dmesg-no-subsys.txt"))
    with pytest.raises(errors.InvalidArgumentError, match="already knows host .* another host ID"):
        kernel.connect(f"nvme+tcp://10.88.0.2/{RAM}?hostnqn={HOST}&hostid=d60d019b-fe7d-4aa0-81f6-783e65f548a9")
    assert fake_nvme.calls()[-1]["argv"][12] == "d60d019b-fe7d-4aa0-81f6-783e65f548a9"
    with pytest.raises(errors.InvalidArgumentError):
        kernel.connect(f"nvme+tcp://10.88.0.2/{RAM}?hostnqn={HOST}")
    assert fake_nvme.calls()[-1]["argv"][11:13] == ["--hostid", HID]  # the one in use
    fake_nvme.play(discover={"stdout": cap("discover-tcp.out")})
    kernel.discover(f"nvme+tcp://10.88.0.2?hostnqn={HOST}")
    assert fake_nvme.calls()[-1]["argv"][-3:] == ["--hostid", HID, "--output-format=json"]


def test_a_failed_connect_leaves_no_controller_behind(fake_nvme):
    fake_nvme.play(**failing("connect-no-subsys", "dmesg-no-subsys.txt",
                             create={"nvme3": NVME3}))
    with pytest.raises(errors.DeviceNotFoundError):
        kernel.connect(URI)
    assert kernel.list() == []
    assert ["disconnect", "--device", "nvme3"] in [c["argv"] for c in fake_nvme.calls()]


def test_connect_and_disconnect(fake_nvme):
    fake_nvme.play(connect={"stdout": cap("connect-tcp-ram.out").replace("nvme1", "nvme3"),
                            "create": {"nvme3": NVME3}, "namespaces": {"nvme3": ["nvme1c3n1"]}},
                   **{"list-ns": {"stdout": cap("list-ns-nvme1.out")}})
    with kernel.connect(URI + "&queues=1") as c:
        assert (c.name, c.subsysnqn, c.transport, c.address) == ("nvme3", RAM, "tcp", NVME3["address"])
        assert c.expected_nsids == (1,)
        assert c.namespaces == [f"{kernel.sysfs.DEVDIR}/nvme1n1"]
        assert [x.name for x in kernel.list()] == ["nvme3"]
    assert kernel.list() == []
    argvs = [c["argv"] for c in fake_nvme.calls()]
    assert argvs[0][:2] == ["connect", "--transport"] and "--nr-io-queues=1" in argvs[0]
    assert argvs[1] == ["list-ns", f"{kernel.sysfs.DEVDIR}/nvme3", "--output-format=json"]
    assert argvs[2] == ["disconnect", "--device", "nvme3"]


def test_secrets_reach_nvme_cli_in_a_private_file_and_are_checked_in_sysfs(fake_nvme):
    attrs = {**NVME3, "dhchap_secret": SECRET}
    fake_nvme.play(connect={"stdout": '{\n  "device":"nvme3"\n}\n', "create": {"nvme3": attrs},
                            "namespaces": {"nvme3": ["nvme1c3n1"]}})
    with kernel.connect(f"{URI}&dhchap_secret={SECRET}") as c:
        assert c.name == "nvme3"
    call = fake_nvme.calls()[0]
    assert not any(SECRET in a for a in call["argv"])
    assert call["config"][0]["dhchap_key"] == SECRET and call["config_mode"] == "0o600"
    cfg_path = next(a for a in call["argv"] if a.startswith("--config=")).split("=", 1)[1]
    assert not os.path.exists(cfg_path) and not os.path.exists(os.path.dirname(cfg_path))


def test_a_kernel_without_authentication_gets_its_controller_detached(fake_nvme):
    # Debian's 6.1: the controller comes up, but has no dhchap_secret attribute
    fake_nvme.play(connect={"stdout": cap("connect-tcp-ram.out").replace("nvme1", "nvme3"),
                            "create": {"nvme3": NVME3}})
    with pytest.raises(errors.KernelSupportError, match="CONFIG_NVME_AUTH") as ei:
        kernel.connect(f"{URI}&dhchap_secret={SECRET}")
    assert SECRET not in str(ei.value)
    assert kernel.list() == []


def test_nvme_cli_missing_names_the_package(fake_sys, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(errors.NvmeCliNotFoundError, match="package nvme-cli") as ei:
        kernel.connect(URI)
    assert isinstance(ei.value, FileNotFoundError)
    with pytest.raises(errors.NvmeCliNotFoundError, match="nvme-cli"):
        kernel.discover("nvme+tcp://10.88.0.2")


def test_missing_modules_are_named(fake_nvme, fake_sys):
    sysfs, dev = fake_sys
    (dev / "nvme-fabrics").unlink()
    with pytest.raises(errors.KernelSupportError, match="nvme-fabrics is not loaded.*nvme-rdma"):
        kernel.connect(f"nvme+rdma://10.88.0.2:4421/{RAM}")
    (dev / "nvme-fabrics").write_text("")
    (sysfs / "module" / "nvme_rdma").rmdir()
    fake_nvme.play(connect={"stderr": cap("connect-hostid-not-uuid.err"), "rc": 1})
    with pytest.raises(errors.KernelSupportError, match="module nvme-rdma is not loaded"):
        kernel.connect(f"nvme+rdma://10.88.0.2:4421/{RAM}")


def test_discover_with_fake_nvme(fake_nvme):
    fake_nvme.play(discover={"stdout": cap("discover-tcp.out")})
    recs = kernel.discover(f"nvme+tcp://10.88.0.2?hostnqn={HOST}&hostid={HID}")
    assert [r["subnqn"] for r in recs if r["subtype"] == "nvme"] == [RAM, NV]
    assert fake_nvme.calls()[0]["argv"] == [
        "discover", "--transport", "tcp", "--traddr", "10.88.0.2", "--trsvcid", "4420",
        "--hostnqn", HOST, "--hostid", HID, "--output-format=json"]
    fake_nvme.play(discover={"stderr": cap("discover-refused.err"), "rc": 1})
    with pytest.raises(errors.FxConnectionError, match="connection refused"):
        kernel.discover("nvme+tcp://10.88.0.2:4999")


def test_disconnect_by_uri_only_takes_that_subsystem_at_that_address(fake_nvme, fake_sys):
    sysfs, _ = fake_sys
    for name, attrs in (("nvme3", NVME3), ("nvme4", {**NVME3, "address": "traddr=10.0.0.9,trsvcid=4420"}),
                        ("nvme5", {**NVME3, "subsysnqn": NV})):
        d = sysfs / "class" / "nvme" / name
        d.mkdir()
        for k, v in attrs.items():
            (d / k).write_text(v)
    fake_nvme.play()
    assert kernel.disconnect(f"nvme+tcp://10.88.0.2/{RAM}") == ["nvme3"]
    assert [c.name for c in kernel.list()] == ["nvme4", "nvme5"]
    assert kernel.disconnect("nvme5") == ["nvme5"]
    assert [c.name for c in kernel.list()] == ["nvme4"]


# ---------------------------------------------------------------- path= on devices and stores
def test_path_must_be_user_or_kernel(tmp_path):
    f = tmp_path / "x.img"
    with pytest.raises(ValueError, match="path must be 'user'.*or 'kernel'"):
        fx100io.open_device(str(f), create=True, size=1 << 20, path="kernal")
    with pytest.raises(ValueError, match="path must be"):
        fx100io.ChunkStore(str(f), create=True, size=8 << 20, path="")
    # files are opened as they are on either path
    with fx100io.open_device(str(f), create=True, size=1 << 20, path="kernel") as dev:
        assert dev.path == "kernel" and dev.kernel_attachment is None and dev.size == 1 << 20


def test_a_secret_pasted_into_a_uri_keeps_its_plus_signs():
    # base64 has "+"; form decoding would make it a space and the secret invalid
    assert "+" in CTRL_SECRET
    t = kernel.target_of(f"{URI}&dhchap_secret={CTRL_SECRET}&dhchap_ctrl_secret={SECRET}")
    assert dict(t.secrets) == {"dhchap_secret": CTRL_SECRET, "dhchap_ctrl_secret": SECRET}


def test_lmcache_plugin_path_key():
    from fx100io.contrib._lmcache_config import PluginConfigError, parse_options

    def opts(**keys):
        extra = {"storage_plugin.fx100io.module_path": "fx100io.contrib.lmcache",
                 "storage_plugin.fx100io.class_name": "FX100ioBackend",
                 "storage_plugin.fx100io.devices": f"nvme+tcp://10.0.0.5/{RAM}"}
        extra.update({f"storage_plugin.fx100io.{k}": v for k, v in keys.items()})
        return parse_options(["fx100io"], extra, "FX100ioBackend")

    assert opts().path == "user"
    assert opts(path="kernel").path == "kernel" and "path=kernel" in opts(path=" Kernel").describe()
    with pytest.raises(PluginConfigError, match="path: expected one of \\['user', 'kernel'\\]"):
        opts(path="spdk")


def test_a_store_names_its_kernel_device_without_the_secret(tmp_path, monkeypatch):
    """ChunkStore's messages use the device's URI, which the kernel path redacts."""
    f = tmp_path / "ns.img"
    f.write_bytes(b"\x5a" * (8 << 20))  # not a store
    uri = f"nvme+tcp://10.0.0.5/{RAM}?dhchap_secret={SECRET}"

    class FakeAttachment:
        path = str(f)

        def release(self):
            pass

    monkeypatch.setattr(kernel, "attach", lambda u: FakeAttachment())
    with pytest.raises(errors.NotAStoreError) as ei:
        fx100io.ChunkStore(uri, path="kernel")
    assert SECRET not in str(ei.value) and "dhchap_secret=***" in str(ei.value)


# ---------------------------------------------------------------- attach(): sharing across processes
def _play_nvme3(fake_nvme, attrs=NVME3, **connect):
    fake_nvme.play(connect={"stdout": '{\n  "device":"nvme3"\n}\n', "create": {"nvme3": attrs},
                            "namespaces": {"nvme3": ["nvme1c3n1"]}, **connect},
                   **{"list-ns": {"stdout": cap("list-ns-nvme1.out")}})


def _connects(fake_nvme):
    return [c for c in fake_nvme.calls() if c["argv"][0] == "connect"]


def test_one_process_release_does_not_detach_a_controller_another_process_uses(fake_nvme):
    """One process per GPU: worker 0 attaches the controller, worker 1 reuses it; worker 0's
    close must leave it to worker 1, and worker 1's close (the last user) detaches it."""
    _play_nvme3(fake_nvme)
    a = kernel.attach(URI)                          # process A connects
    reg_a = dict(kernel.holds._attached)
    kernel.holds._attached.clear()                        # process B: its own, empty registry
    b = kernel.attach(URI.replace("?", "?ns=1&"))   # B reuses A's live controller
    assert len(_connects(fake_nvme)) == 1 and b.controller.name == a.controller.name
    reg_b = dict(kernel.holds._attached)
    kernel.holds._attached.clear()
    kernel.holds._attached.update(reg_a)                  # back in process A
    a.release()
    assert b.controller.sysfs_path.exists(), "detached under process B"
    kernel.holds._attached.clear()
    kernel.holds._attached.update(reg_b)                  # process B closes: nobody uses it now
    b.release()
    assert not b.controller.sysfs_path.exists()


def test_a_controller_nobody_here_attached_is_never_detached(fake_nvme):
    fake_nvme.add("nvme3", NVME3)                   # `nvme connect` by the admin
    fake_nvme.play()
    a = kernel.attach(URI)
    assert a.path.endswith("/nvme1n1") and _connects(fake_nvme) == []
    a.release()
    assert kernel.read_controller("nvme3") is not None


def test_a_failed_connect_does_not_detach_another_process_controller(fake_nvme):
    """Another process's fresh controller shows up while this connect fails: it is claimed
    (its holder lock is taken), so the cleanup leaves it."""
    import fcntl
    kernel.holds.RUNDIR.mkdir(parents=True, exist_ok=True)
    fd = os.open(kernel.holds.RUNDIR / "ctrl-nvme3.lock", os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_SH)                  # "process A" holds nvme3
    try:
        fake_nvme.play(**failing("connect-no-subsys", "dmesg-no-subsys.txt",
                                 create={"nvme3": NVME3}))
        with pytest.raises(errors.DeviceNotFoundError):
            kernel.connect(URI)
        assert [c.name for c in kernel.list()] == ["nvme3"]
        assert ["disconnect", "--device", "nvme3"] not in [c["argv"] for c in fake_nvme.calls()]
    finally:
        os.close(fd)


def test_a_failed_connect_detaches_only_the_controller_it_named(fake_nvme, monkeypatch):
    """The controller check fails after nvme-cli named nvme3; nvme4, which another connect
    made meanwhile, stays."""
    attrs = {**NVME3}
    fake_nvme.play(connect={"stdout": '{"device":"nvme3"}\n',
                            "create": {"nvme3": attrs, "nvme4": {**NVME3, "cntlid": "4"}}})
    with pytest.raises(errors.KernelSupportError):
        kernel.connect(f"{URI}&dhchap_secret={SECRET}")   # no dhchap_secret in sysfs
    assert [c.name for c in kernel.list()] == ["nvme4"]


def test_a_reused_device_name_of_another_subsystem_is_never_opened(fake_nvme, fake_sys):
    """Right before the path is handed out, its block device must still be uri's namespace:
    nvme1n1 now belongs to another subsystem."""
    sysfs, _ = fake_sys
    fake_nvme.add("nvme3", NVME3)
    fake_nvme.play()
    (sysfs / "class" / "nvme-subsystem" / "nvme-subsys1" / "subsysnqn").write_text(NV + "\n")
    with pytest.raises(errors.DeviceNotFoundError, match="belongs to .*lab-nvme"):
        kernel.attach(URI)
    assert [c.name for c in kernel.list()] == ["nvme3"]
    (sysfs / "class" / "nvme-subsystem" / "nvme-subsys1" / "subsysnqn").write_text(RAM + "\n")
    kernel.attach(URI).release()


# ---------------------------------------------------------------- attach(): secrets and options
def test_attach_with_a_secret_does_not_reuse_an_unauthenticated_controller(fake_nvme):
    fake_nvme.add("nvme3", NVME3)                  # attached without authentication
    fake_nvme.play()
    with pytest.raises(errors.DeviceBusyError, match="dhchap_secret") as ei:
        kernel.attach(f"{URI}&dhchap_secret={SECRET}")
    assert SECRET not in str(ei.value) and _connects(fake_nvme) == []


def test_attach_with_a_wrong_secret_does_not_reuse_an_authenticated_controller(fake_nvme, caplog):
    fake_nvme.add("nvme3", {**NVME3, "dhchap_secret": SECRET})
    fake_nvme.play()
    with pytest.raises(errors.DeviceBusyError, match="dhchap_secret") as ei:
        kernel.attach(f"{URI}&dhchap_secret={CTRL_SECRET}")
    assert SECRET not in str(ei.value) and CTRL_SECRET not in str(ei.value)
    # the right one is reused
    a = kernel.attach(f"{URI}&dhchap_secret={SECRET}")
    assert a.controller.name == "nvme3" and _connects(fake_nvme) == []
    a.release()
    # a controller key that the live controller does not hold is refused too
    with pytest.raises(errors.DeviceBusyError, match="dhchap_ctrl_secret"):
        kernel.attach(f"{URI}&dhchap_secret={SECRET}&dhchap_ctrl_secret={CTRL_SECRET}")
    assert SECRET not in caplog.text and CTRL_SECRET not in caplog.text


@pytest.mark.parametrize("query,kw,match", [
    ("hdgst=1", {}, "hdgst"), ("ddgst=1", {}, "ddgst"), ("kato_ms=9000", {}, "kato_ms"),
    ("queues=2", {}, "queues"), ("ns=1", {"ctrl_loss_tmo": 30}, "ctrl_loss_tmo")])
def test_attach_refuses_a_live_controller_with_other_options(fake_nvme, query, kw, match):
    fake_nvme.add("nvme3", {**NVME3, "ctrl_loss_tmo": "600"})  # kato 5 s, no digests
    fake_nvme.play()
    with pytest.raises(errors.DeviceBusyError, match=match):
        kernel.attach(f"{URI}&{query}", **kw)
    assert _connects(fake_nvme) == []
    kernel.attach(f"{URI}&kato_ms=5000", ctrl_loss_tmo=600).release()  # what it has: reused
    assert _connects(fake_nvme) == [] and kernel.read_controller("nvme3") is not None


def test_attach_compares_options_with_what_this_host_attached(fake_nvme):
    _play_nvme3(fake_nvme)
    a = kernel.attach(f"{URI}&hdgst=1&queues=2")
    b = kernel.attach(f"{URI}&hdgst=1")            # asks for less: reused
    with pytest.raises(errors.DeviceBusyError, match="ddgst"):
        kernel.attach(f"{URI}&ddgst=1")
    with pytest.raises(errors.DeviceBusyError, match="queues"):
        kernel.attach(f"{URI}&queues=4")
    assert len(_connects(fake_nvme)) == 1
    b.release()
    a.release()
    assert kernel.list() == []


# ---------------------------------------------------------------- attach(): smaller things
def test_stale_secret_files_of_dead_processes_are_removed(fake_nvme):
    import subprocess
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()                                       # a pid that is gone
    shm = Path(kernel.secrets.SECRET_TMPDIR)
    stale = shm / f"fx100io-nvme-{p.pid}-abcd"
    stale.mkdir()
    (stale / "config.json").write_text(json.dumps([{"dhchap_key": SECRET}]))
    live = shm / f"fx100io-nvme-{os.getpid()}-efgh"  # a connect of a live process
    live.mkdir()
    other = shm / "fx100io-nvme-notapid"
    other.mkdir()
    _play_nvme3(fake_nvme, {**NVME3, "dhchap_secret": SECRET})
    kernel.connect(f"{URI}&dhchap_secret={SECRET}").disconnect()
    assert not stale.exists() and live.exists() and other.exists()


def test_attach_to_another_target_does_not_wait_for_a_slow_connect(fake_nvme):
    import threading
    import time
    fake_nvme.add("nvme5", {**NVME3, "subsysnqn": NV, "cntlid": "5"}, paths=("nvme2c5n1",))
    _play_nvme3(fake_nvme, sleep=1.5)
    slow = threading.Thread(target=lambda: kernel.attach(URI).release())
    slow.start()
    time.sleep(0.4)                                # the connect to RAM is under way
    t0 = time.monotonic()
    kernel.attach(f"nvme+tcp://10.88.0.2:4420/{NV}?hostnqn={HOST}&hostid={HID}").release()
    took = time.monotonic() - t0
    slow.join()
    assert took < 0.8, f"waited {took:.1f} s for another target's connect"


def test_a_reconnecting_controller_is_waited_for(fake_nvme, fake_sys):
    import threading
    sysfs, _ = fake_sys
    fake_nvme.add("nvme3", {**NVME3, "state": "connecting"})
    fake_nvme.play()
    state = sysfs / "class" / "nvme" / "nvme3" / "state"
    timer = threading.Timer(0.3, lambda: state.write_text("live\n"))
    timer.start()
    a = kernel.attach(URI)
    timer.join()
    assert a.controller.name == "nvme3" and _connects(fake_nvme) == []
    a.release()
    state.write_text("connecting\n")
    with pytest.raises(errors.DeviceBusyError, match="nvme3 .*connecting"):
        kernel.attach(URI, timeout=0.3)
    assert _connects(fake_nvme) == []


# ---------------------------------------------------------------- several paths (native multipath)
MP_URI = (f"nvme+tcp://10.88.0.2:4420,10.88.0.2:4422/{RAM}?hostnqn={HOST}&hostid={HID}")
NGUID = "e3b0c442-98fc-1c14-9afb-f4c8996fb924"


def _multipath(sysfs, on: str = "Y") -> None:
    d = sysfs / "module" / "nvme_core" / "parameters"
    d.mkdir(parents=True, exist_ok=True)
    (d / "multipath").write_text(on + "\n")


def _path_block(sysfs, name: str, ana: str = "optimized", nguid: str = NGUID, nsid: int = 1):
    b = sysfs / "block" / name
    b.mkdir(parents=True, exist_ok=True)
    for k, v in {"nsid": str(nsid), "ana_state": ana, "nguid": nguid, "size": "65536"}.items():
        (b / k).write_text(v + "\n")


def _ctrl(name: str, port: str, cntlid: str) -> dict:
    return {**NVME3, "address": f"traddr=10.88.0.2,trsvcid={port},src_addr=10.88.0.1",
            "cntlid": cntlid}


def _connect_step(name: str, port: str, cntlid: str, paths: list[str], **extra) -> dict:
    return {"stdout": f'{{\n  "device":"{name}"\n}}\n', "create": {name: _ctrl(name, port, cntlid)},
            "namespaces": {name: paths}, **extra}


def test_split_paths_is_fabric_uris_grammar():
    assert kernel.split_paths(MP_URI) == [
        f"nvme+tcp://10.88.0.2:4420/{RAM}?hostnqn={HOST}&hostid={HID}",
        f"nvme+tcp://10.88.0.2:4422/{RAM}?hostnqn={HOST}&hostid={HID}"]
    assert kernel.split_paths(URI) == [URI]
    with pytest.raises(errors.InvalidArgumentError, match="empty path"):
        kernel.split_paths(f"nvme+tcp://10.88.0.2:4420,/{RAM}")
    with pytest.raises(errors.InvalidArgumentError, match="listed twice"):
        kernel.split_paths(f"nvme+tcp://10.88.0.2,10.88.0.2:4420/{RAM}")
    with pytest.raises(errors.InvalidArgumentError, match="bad port"):
        kernel.split_paths(f"nvme+tcp://10.88.0.2:4420,10.88.0.3:x/{RAM}")
    # one-path calls say which calls take several
    with pytest.raises(errors.InvalidArgumentError, match=r"kernel.connect\(\)"):
        kernel.target_of(MP_URI)


def test_two_paths_make_one_block_device_and_list_shows_each_path(fake_nvme, fake_sys, capsys):
    sysfs, dev = fake_sys
    _multipath(sysfs)
    _path_block(sysfs, "nvme1c3n1")
    _path_block(sysfs, "nvme1c4n1", ana="non-optimized")
    fake_nvme.play(connect=[_connect_step("nvme3", "4420", "3", ["nvme1c3n1"]),
                            _connect_step("nvme4", "4422", "4", ["nvme1c4n1"])],
                   **{"list-ns": {"stdout": cap("list-ns-nvme1.out")}})
    (sysfs / "class" / "nvme-subsystem" / "nvme-subsys1" / "nvme3").mkdir()
    with kernel.connect(MP_URI, ns_timeout=5) as ps:
        assert isinstance(ps, kernel.Paths) and ps.names == ["nvme3", "nvme4"]
        assert ps.namespaces == [f"{dev}/nvme1n1"]  # one block device for both paths
        assert [(s["trsvcid"], s["state"], s["ana_state"]) for s in ps.states()] == [
            ("4420", "live", "optimized"), ("4422", "live", "non-optimized")]
        ctrls = kernel.list()
        assert [(c.name, c.trsvcid, [p.ana_state for p in c.paths()]) for c in ctrls] == [
            ("nvme3", "4420", ["optimized"]), ("nvme4", "4422", ["non-optimized"])]
        d = ctrls[0].as_dict()
        assert d["subsystem"] == "nvme-subsys1"
        assert d["paths"] == [{"name": "nvme1c3n1", "nsid": 1, "head": "nvme1n1",
                               "ana_state": "optimized", "ids": {"nguid": NGUID}}]
        from fx100io.kernel.cli import main
        assert main("list", [MP_URI]) == 0
        out = capsys.readouterr().out.splitlines()
        assert len(out) == 2 and "4420 nvme-subsys1 ana:1=optimized" in out[0]
        assert "10.88.0.2:4422" in out[1] and "ana:1=non-optimized" in out[1]
        # a path changes state: list shows it
        (sysfs / "block" / "nvme1c4n1" / "ana_state").write_text("inaccessible\n")
        assert [s["ana_state"] for s in ps.states()] == ["optimized", "inaccessible"]
    assert kernel.list() == []
    argvs = [c["argv"] for c in fake_nvme.calls()]
    assert [a[a.index("--trsvcid") + 1] for a in argvs if a[0] == "connect"] == ["4420", "4422"]
    assert [a[2] for a in argvs if a[0] == "disconnect"] == ["nvme3", "nvme4"]


def test_disconnect_by_a_uri_with_several_paths_takes_each(fake_nvme, fake_sys):
    sysfs, _ = fake_sys
    _multipath(sysfs)
    fake_nvme.play()
    fake_nvme.add("nvme3", _ctrl("nvme3", "4420", "3"))
    fake_nvme.add("nvme4", _ctrl("nvme4", "4422", "4"), paths=["nvme1c4n1"])
    fake_nvme.add("nvme5", _ctrl("nvme5", "4423", "5"), paths=["nvme1c5n1"])
    assert kernel.disconnect(MP_URI) == ["nvme3", "nvme4"]
    assert [c.name for c in kernel.list()] == ["nvme5"]


@pytest.mark.parametrize("second,block,kmsg,match", [
    # the kernel put the second path's namespace under another head
    (["nvme2c4n1"], dict(name="nvme2c4n1"), [], "block device nvme2n1, not nvme1n1"),
    # the same head but other identifiers (a kernel that did not compare them)
    (["nvme1c4n1"], dict(name="nvme1c4n1", nguid="00000000-0000-0000-0000-000000000001"), [],
     "shows another namespace than path 10.88.0.2:4420: nguid"),
    # the kernel refused the namespace on the second controller and said why
    ([], None, ["nvme nvme4: IDs don't match for shared namespace 1"], "the kernel refused it"),
])
def test_a_path_to_another_namespace_is_refused_and_every_path_detached(
        fake_nvme, fake_sys, second, block, kmsg, match):
    sysfs, _ = fake_sys
    _multipath(sysfs)
    _path_block(sysfs, "nvme1c3n1")
    if block:
        _path_block(sysfs, **block)
    fake_nvme.play(connect=[_connect_step("nvme3", "4420", "3", ["nvme1c3n1"]),
                            _connect_step("nvme4", "4422", "4", second, kmsg=kmsg)])
    with pytest.raises(errors.PathMismatchError, match=match) as e:
        kernel.connect(MP_URI, ns_timeout=20)
    assert "10.88.0.2:4422 (nvme4)" in str(e.value) and "detached" in str(e.value)
    assert kernel.list() == []


def test_a_path_that_shows_nothing_is_refused_within_ns_timeout(fake_nvme, fake_sys):
    sysfs, _ = fake_sys
    _multipath(sysfs)
    _path_block(sysfs, "nvme1c3n1")
    fake_nvme.play(connect=[_connect_step("nvme3", "4420", "3", ["nvme1c3n1"]),
                            _connect_step("nvme4", "4422", "4", [])])
    with pytest.raises(errors.PathMismatchError, match="no path to namespace 1 within 0.3 s"):
        kernel.connect(MP_URI, ns_timeout=0.3)
    assert kernel.list() == []


def test_a_path_that_fails_to_connect_detaches_the_paths_made(fake_nvme, fake_sys):
    sysfs, _ = fake_sys
    _multipath(sysfs)
    _path_block(sysfs, "nvme1c3n1")
    bad = failing("connect-no-subsys", "dmesg-no-subsys.txt")["connect"]
    fake_nvme.play(connect=[_connect_step("nvme3", "4420", "3", ["nvme1c3n1"]), bad])
    with pytest.raises(errors.DeviceNotFoundError):
        kernel.connect(MP_URI)
    assert kernel.list() == []


def test_several_paths_without_native_multipath_are_refused_before_any_connect(fake_nvme,
                                                                               fake_sys):
    sysfs, _ = fake_sys
    _multipath(sysfs, "N")
    with pytest.raises(errors.KernelSupportError, match="nvme_core.multipath=Y"):
        kernel.connect(MP_URI)
    assert fake_nvme.calls() == [] and kernel.list() == []
    assert kernel.native_multipath() is False


def test_cli_connect_and_disconnect_with_several_paths(fake_nvme, fake_sys, capsys):
    from fx100io.kernel.cli import main

    sysfs, dev = fake_sys
    _multipath(sysfs)
    _path_block(sysfs, "nvme1c3n1")
    _path_block(sysfs, "nvme1c4n1")
    fake_nvme.play(connect=[_connect_step("nvme3", "4420", "3", ["nvme1c3n1"]),
                            _connect_step("nvme4", "4422", "4", ["nvme1c4n1"])],
                   **{"list-ns": {"stdout": cap("list-ns-nvme1.out")}})
    assert main("connect", [MP_URI, "-o", "json", "--ns-timeout", "5"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["controllers"] == ["nvme3", "nvme4"] and out["namespaces"] == [f"{dev}/nvme1n1"]
    assert [(p["trsvcid"], p["state"], p["ana_state"]) for p in out["paths"]] == [
        ("4420", "live", "optimized"), ("4422", "live", "optimized")]
    assert main("disconnect", [MP_URI]) == 0
    assert capsys.readouterr().out.strip() == "disconnected 2 controller(s): nvme3 nvme4"
    assert kernel.list() == []


def test_kernel_path_shares_the_several_paths_grammar_and_refuses_paths_discover():
    from fx100io import fabric_uri, kernel
    from fx100io.errors import InvalidArgumentError

    uri = "nvme+tcp://127.0.0.1:4420,127.0.0.1:4421/nqn.2014-08.org.example:a?kato_ms=5000"
    assert kernel.split_paths(uri) == fabric_uri.split_authority(uri) == [
        "nvme+tcp://127.0.0.1:4420/nqn.2014-08.org.example:a?kato_ms=5000",
        "nvme+tcp://127.0.0.1:4421/nqn.2014-08.org.example:a?kato_ms=5000"]
    with pytest.raises(InvalidArgumentError, match="paths=discover"):
        kernel.target_of("nvme+tcp://127.0.0.1:4420/nqn.2014-08.org.example:a?paths=discover")
    for bad in ("nvme+tcp://127.0.0.1:4420,,127.0.0.1:4421/nqn.2014-08.org.example:a",
                "nvme+tcp://127.0.0.1:4420, /nqn.2014-08.org.example:a"):
        with pytest.raises(InvalidArgumentError, match="empty path"):
            kernel.split_paths(bad)


# ---------------------------------------------------------------- holds: one rule for every connect
def _as_process(reg: dict) -> dict:
    """Switch this test to another "process": its own registry of holds (flocks are per
    open file, so the lock files themselves already behave as two processes')."""
    mine = dict(kernel.holds._attached)
    kernel.holds._attached.clear()
    kernel.holds._attached.update(reg)
    return mine


@pytest.mark.parametrize("several", [True, False])
def test_a_connects_exit_leaves_a_controller_another_process_attached_to(
        fake_nvme, fake_sys, several):
    """Process A connects (several paths: a Paths; one: a Controller); process B's attach()
    reuses A's controller for port 4420.  A's with-exit must not pull B's block device: it
    detaches only what nobody else holds, and B's release, the last, detaches the rest."""
    sysfs, _ = fake_sys
    _multipath(sysfs)
    _path_block(sysfs, "nvme1c3n1")
    _path_block(sysfs, "nvme1c4n1")
    steps = [_connect_step("nvme3", "4420", "3", ["nvme1c3n1"])]
    if several:
        steps.append(_connect_step("nvme4", "4422", "4", ["nvme1c4n1"]))
    fake_nvme.play(connect=steps, **{"list-ns": {"stdout": cap("list-ns-nvme1.out")}})
    a = kernel.connect(MP_URI if several else kernel.split_paths(MP_URI)[0], ns_timeout=5)
    reg_a = _as_process({})                                   # process B
    b = kernel.attach(kernel.split_paths(MP_URI)[0])
    assert b.controller.name == "nvme3" and len(_connects(fake_nvme)) == len(steps)
    reg_b = _as_process(reg_a)                                # back in A
    with a:
        pass
    assert kernel.read_controller("nvme3") is not None, "detached under process B"
    assert kernel.read_controller("nvme4") is None
    _as_process(reg_b)                                        # B closes: the last user
    b.release()
    assert kernel.list() == []


def test_disconnect_by_uri_leaves_what_another_process_holds_and_its_record(fake_nvme, fake_sys):
    """disconnect(URI) without a host NQN matches every host's controllers there: one another
    process holds (its store is live on it) stays attached, with its hold record, unless
    force=True."""
    import fcntl
    sysfs, _ = fake_sys
    _multipath(sysfs)
    fake_nvme.play()
    fake_nvme.add("nvme3", _ctrl("nvme3", "4420", "3"))
    fake_nvme.add("nvme4", _ctrl("nvme4", "4422", "4"), paths=["nvme1c4n1"])
    kernel.holds.write_record(kernel.read_controller("nvme3"), [])
    record = kernel.holds.RUNDIR / "ctrl-nvme3.json"
    fd = os.open(kernel.holds.RUNDIR / "ctrl-nvme3.lock", os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_SH)                  # "process B" holds nvme3
    try:
        uri = f"nvme+tcp://10.88.0.2:4420,10.88.0.2:4422/{RAM}"
        assert kernel.disconnect(uri) == ["nvme4"]
        assert [c.name for c in kernel.list()] == ["nvme3"] and record.exists()
        assert kernel.disconnect("nvme3") == []
        assert kernel.disconnect(uri, force=True) == ["nvme3"]
        assert kernel.list() == [] and not record.exists()
    finally:
        os.close(fd)


def test_the_process_that_connected_disconnects_by_uri_but_not_under_its_own_attach(
        fake_nvme, fake_sys):
    """A process's own connect (no with) does not block its disconnect(URI); an attach() of
    the same process, a live device, does."""
    sysfs, _ = fake_sys
    _multipath(sysfs)
    _path_block(sysfs, "nvme1c3n1")
    _path_block(sysfs, "nvme1c4n1")
    fake_nvme.play(connect=[_connect_step("nvme3", "4420", "3", ["nvme1c3n1"]),
                            _connect_step("nvme4", "4422", "4", ["nvme1c4n1"])],
                   **{"list-ns": {"stdout": cap("list-ns-nvme1.out")}})
    ps = kernel.connect(MP_URI, ns_timeout=5)
    b = kernel.attach(kernel.split_paths(MP_URI)[1])  # this process's device on nvme4
    assert b.controller.name == "nvme4"
    assert kernel.disconnect(MP_URI) == ["nvme3"] and not ps.owned
    assert [c.name for c in kernel.list()] == ["nvme4"]
    b.release()                                       # its last user: detached (recorded)
    assert kernel.list() == []


# ---------------------------------------------------------------- TLS: refused, never in clear
TLS_KEY = "NVMeTLSkey-1:01:VRLbtnN9AQb2WXW3c9+wEf/DRLz0QuLdbYvEhwtdWwNf9LrZ:"


@pytest.mark.parametrize("how", ["tls_key", "tls=1", "bare tls=1", "tls=true", "keyword",
                                 "key file unreadable", "tls=1 keyword", "several paths", "store"])
def test_tls_is_refused_before_nvme_cli_runs(fake_nvme, how, monkeypatch):
    """The kernel path cannot do TLS without tlshd running (nvme-cli 2.3 has no --tls either;
    docs/kernel-path.md): every way of asking for it is refused with the reason, before
    nvme-cli is run, so nothing is ever attached in clear text, and the key is never shown."""
    from fx100io.kernel import keyring

    monkeypatch.setattr(keyring, "tlshd_running", lambda: False)
    fake_nvme.play(connect={"stdout": cap("connect-tcp-ram.out").replace("nvme1", "nvme3"),
                            "create": {"nvme3": NVME3}})
    with pytest.raises(errors.KernelSupportError) as ei:
        if how == "tls_key":
            kernel.connect(f"{URI}&tls_key={TLS_KEY}")
        elif how == "tls=1":
            kernel.connect(f"{URI}&tls=1&tls_key={TLS_KEY}")
        elif how == "bare tls=1":  # not "tls=1 needs tls_key": the key would not help
            kernel.connect(f"{URI}&tls=1")
        elif how == "tls=true":
            kernel.connect(f"{URI}&tls=true")
        elif how == "keyword":
            kernel.connect(URI, tls_key=TLS_KEY)
        elif how == "key file unreadable":  # not a file error: the file would not help
            kernel.connect(f"{URI}&tls_key=@/nonexistent/psk")
        elif how == "tls=1 keyword":
            kernel.connect(URI, tls=1)
        elif how == "several paths":
            kernel.connect(f"nvme+tcp://10.88.0.2:4420,10.88.0.3:4420/{RAM}?hostnqn={HOST}"
                           f"&tls_key={TLS_KEY}")
        else:
            fx100io.ChunkStore(f"{URI}&tls_key={TLS_KEY}", path="kernel", create=True)
    text = str(ei.value)
    assert ei.value.errno == 93  # EPROTONOSUPPORT
    assert "tlshd" in text and "ktls-utils" in text and "--tls" in text
    assert "userspace initiator" in text
    assert TLS_KEY not in text and TLS_KEY[16:40] not in text
    assert fake_nvme.calls() == [] and kernel.list() == []


def test_tls_is_refused_by_the_connect_command(fake_nvme, capsys):
    from fx100io.cli import main

    assert main(["connect", f"{URI}&tls_key={TLS_KEY}"]) != 0
    err = capsys.readouterr().err
    assert "tlshd" in err and TLS_KEY[16:40] not in err
    assert fake_nvme.calls() == []


@pytest.mark.parametrize("query", [f"tls_key={TLS_KEY}", "tls=1", "tls_key=@/nonexistent/psk"])
def test_tls_discovery_is_refused_through_the_kernel(fake_nvme, query):
    """Discovery gives the same reason as connect, whatever form TLS was asked in."""
    from fx100io.kernel.uri_args import TLS_REFUSAL

    with pytest.raises(errors.KernelSupportError) as ei:
        kernel.discover(f"nvme+tcp://10.88.0.2:4420/?{query}")
    assert ei.value.errno == 93 and ei.value.strerror == TLS_REFUSAL
    assert TLS_KEY[16:40] not in str(ei.value)
    assert fake_nvme.calls() == []
