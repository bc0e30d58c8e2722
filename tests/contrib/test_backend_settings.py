"""The settings every engine adapter shares (fx100io.contrib._settings): values as strings,
errors that name the key as the user wrote it, and a store opened the safe way."""

from __future__ import annotations

import multiprocessing
import os

import numpy as np
import pytest

from fx100io.contrib._settings import (
    BackendConfigError,
    BackendStartError,
    open_backend_store,
    parse_settings,
)

WHERE = "adapter_params."


def test_string_values_are_read_like_typed_ones(tmp_path):
    s = parse_settings({"devices": f"file://{tmp_path}/a.img, file://{tmp_path}/b.img",
                        "size": "64M", "capacity": "1G", "queue_depth": "8", "max_io": "1M",
                        "direct": "false", "register_buffers": "no", "timeout_s": "2.5"}, WHERE)
    assert s.devices == (f"file://{tmp_path}/a.img", f"file://{tmp_path}/b.img")
    assert (s.size, s.capacity, s.queue_depth, s.max_io) == (64 << 20, 1 << 30, 8, 1 << 20)
    assert s.direct is False and s.register_buffers is False and s.timeout_s == 2.5
    assert s.where == WHERE and s.create == "auto" and s.path == "user"


def test_errors_name_the_key_with_the_engines_prefix():
    with pytest.raises(BackendConfigError, match=r"adapter_params\.devices is required"):
        parse_settings({}, WHERE)
    with pytest.raises(BackendConfigError, match=r"adapter_params\.sise"):
        parse_settings({"devices": "/tmp/x.img", "sise": "1G"}, WHERE)
    with pytest.raises(BackendConfigError, match=r"adapter_params\.queue_depth: expected an integer"):
        parse_settings({"devices": "/tmp/x.img", "queue_depth": "many"}, WHERE)
    with pytest.raises(BackendConfigError, match=r"adapter_params\.size: cannot read"):
        parse_settings({"devices": "/tmp/x.img", "size": "lots"}, WHERE)
    with pytest.raises(BackendConfigError, match=r"adapter_params\.devices: .* not a device URI"):
        parse_settings({"devices": "http://example.invalid/x"}, WHERE)
    # an engine's own keys beside ours are not typos
    parse_settings({"devices": "/tmp/x.img", "backend_name": "fx100io"}, WHERE,
                   extra_keys=("backend_name",))


def test_worker_placeholders_and_secrets_stay_hidden():
    s = parse_settings({"devices": "file:///kv/{worker_id}-of-{world_size}.img"}, WHERE,
                       worker_id=3, world_size=4)
    assert s.devices == ("file:///kv/3-of-4.img",)
    secret = "DHHC-1:00:" + "A" * 44 + ":"
    s = parse_settings({"devices": f"nvme+tcp://127.0.0.1:4420/nqn.x?dhchap_secret={secret}"}, WHERE)
    assert "A" * 44 not in s.describe() and "A" * 44 not in repr(s)


def test_open_formats_a_new_file_and_reopens_it(tmp_path):
    s = parse_settings({"devices": f"file://{tmp_path}/sub/kv.img", "size": "32M",
                        "direct": "false"}, WHERE)
    data = np.arange(1 << 20, dtype=np.uint8)
    with open_backend_store(s) as b:
        b.store.batch_put_blocking(["k"], [data])
    with open_backend_store(s) as b:  # the file exists now: opened, not formatted
        out = np.zeros_like(data)
        assert b.store.batch_get_blocking(["k"], [out]) == [True]
        assert np.array_equal(out, data)


def test_size_is_required_to_create_a_file(tmp_path):
    s = parse_settings({"devices": f"file://{tmp_path}/kv.img"}, WHERE)
    with pytest.raises(BackendConfigError, match=r"adapter_params\.size is required"):
        open_backend_store(s)
    assert not os.path.exists(tmp_path / "kv.img")


def test_a_file_that_is_not_a_store_is_never_formatted(tmp_path):
    path = tmp_path / "kv.img"
    path.write_bytes(b"not a store" * 100_000)
    s = parse_settings({"devices": str(path), "size": "32M"}, WHERE)
    with pytest.raises(BackendStartError, match="not an fx100io store"):
        open_backend_store(s)
    assert path.read_bytes() == b"not a store" * 100_000


def _open_in_child(uri: str, q) -> None:
    s = parse_settings({"devices": uri, "size": "32M"}, WHERE)
    try:
        open_backend_store(s).close()
        q.put("opened")
    except BackendStartError as exc:
        q.put(str(exc))


def _open_in_another_process(uri: str) -> str:
    """What a second process opening uri's store says ("opened", or its error)."""
    ctx = multiprocessing.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=_open_in_child, args=(uri, q))
    p.start()
    said = q.get(timeout=60)
    p.join(60)
    return said


def test_a_second_process_on_the_same_file_is_refused(tmp_path):
    uri = f"file://{tmp_path}/kv.img"
    s = parse_settings({"devices": uri, "size": "32M", "direct": "false"}, WHERE)
    b = open_backend_store(s)
    msg = _open_in_another_process(uri)
    assert "in use by another process" in msg and "adapter_params.devices" in msg
    b.close()
    b.close()  # idempotent
    assert _open_in_another_process(uri) == "opened"


def test_the_claim_outlives_another_descriptor_of_the_file_closing(tmp_path):
    # a POSIX lock (lockf) was dropped when any descriptor of the file closed, e.g. a probe
    uri = f"file://{tmp_path}/kv.img"
    s = parse_settings({"devices": uri, "size": "32M", "direct": "false"}, WHERE)
    with open_backend_store(s):
        os.close(os.open(tmp_path / "kv.img", os.O_RDONLY))
        msg = _open_in_another_process(uri)
    assert "in use by another process" in msg and "adapter_params.devices" in msg


def test_each_setting_is_declared_once_and_everything_reads_that_declaration():
    """The known keys, the defaults, describe() and the documented list all come from the
    settings' one declaration (their fields of BackendSettings)."""
    from fx100io.contrib._settings import KNOWN_KEYS, SETTINGS, documented_settings

    names = [f.name for f in SETTINGS]
    assert {*names, "o_direct"} == KNOWN_KEYS
    s = parse_settings({"devices": "/tmp/x.img"}, WHERE)
    for f in SETTINGS:
        if f.name != "devices":
            assert getattr(s, f.name) == f.metadata["default"], f.name
    doc = documented_settings()
    assert [line.split(":")[0].split(" ")[0] for line in doc] == names
    shown = [part.split("=")[0] for part in s.describe().split(" ")]
    assert shown == [n for n in names if n not in ("shared_index", "shared_name")]
    with_pool = parse_settings({"devices": "/tmp/x.img", "shared_index": "redis://:pw@h/0"}, WHERE)
    assert with_pool.describe().endswith(" shared_index=redis://:***@h/0")


def test_priority_keys_parse_and_refuse_bad_values(tmp_path):
    """io_priority and prefetch_priority: absent, null or empty is the default for both
    (on; load), any case and spaces around are read, and anything else is refused
    with the key named."""
    dev = f"file://{tmp_path}/p.img"
    s = parse_settings({"devices": dev}, WHERE)
    assert s.io_priority is True and s.prefetch_priority == "load"
    for empty in (None, "", "  "):
        s = parse_settings({"devices": dev, "io_priority": empty, "prefetch_priority": empty},
                           WHERE)
        assert s.io_priority is True and s.prefetch_priority == "load"
    s = parse_settings({"devices": dev, "io_priority": "off",
                        "prefetch_priority": " Background "}, WHERE)
    assert s.io_priority is False and s.prefetch_priority == "background"
    for bad in ("prefetch", 2, "maybe"):
        with pytest.raises(BackendConfigError, match=r"adapter_params\.prefetch_priority: "
                                                     r"expected one of"):
            parse_settings({"devices": dev, "prefetch_priority": bad}, WHERE)
    for bad in ("maybe", 2, "realtime"):
        with pytest.raises(BackendConfigError, match=r"adapter_params\.io_priority: "
                                                     r"expected true or false"):
            parse_settings({"devices": dev, "io_priority": bad}, WHERE)


def test_an_adapters_io_priority_false_reaches_the_device():
    """io_priority: false in an engine's settings opens every device of the store with
    no I/O priority (Device.io_priority False, no read counted with it), where the
    default on the same disk carries it.  On /var/tmp: a disk, not tmpfs."""
    import shutil
    import tempfile

    base = tempfile.mkdtemp(dir="/var/tmp")
    try:
        src = np.arange(64 << 10, dtype=np.uint8) % 251
        claimed = {}
        for setting in (None, "false"):
            more = {} if setting is None else {"io_priority": setting}
            s = parse_settings({"devices": f"file://{base}/io{setting}.img", "size": "16M",
                                **more}, WHERE)
            with open_backend_store(s) as b:
                dst = np.zeros_like(src)
                b.store.batch_put_blocking(["k"], [src])
                assert b.store.batch_get_blocking(["k"], [dst]) == [True]
                assert np.array_equal(dst, src)
                members = b.store._members
                claimed[setting] = [m.dev.io_priority for m in members]
                ran = sum(m.dev.queue_stats()["ioprio_ios"] for m in members)
                assert (ran > 0) == all(claimed[setting]), (setting, ran)
        assert claimed["false"] == [False]
        if claimed[None] != [True]:
            pytest.skip("the disk under /var/tmp does not order by class (or the kernel "
                        "refused it): the default carries no priority either")
    finally:
        shutil.rmtree(base, ignore_errors=True)
