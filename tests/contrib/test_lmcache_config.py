"""The plugin's option parsing and store naming, on their own (no LMCache engine).

The config part needs nothing but fx100io; the naming part uses lmcache's real key
classes and skips without lmcache.
"""

from __future__ import annotations

import pytest

from fx100io.contrib._lmcache_config import (
    PluginConfigError,
    parse_options,
    parse_size,
    should_create,
)

PREFIX = "storage_plugin.fx100io."


def options(plugins=("fx100io",), worker_id=0, world_size=1, **keys):
    extra = {
        PREFIX + "module_path": "fx100io.contrib.lmcache",
        PREFIX + "class_name": "FX100ioBackend",
        PREFIX + "devices": "file:///tmp/fx/kv.img",
    }
    extra.update({PREFIX + k: v for k, v in keys.items()})
    return parse_options(list(plugins), extra, "FX100ioBackend", worker_id, world_size)


@pytest.mark.parametrize(
    "text, size",
    [
        ("64G", 64 << 30),
        ("512MiB", 512 << 20),
        ("1.5T", int(1.5 * (1 << 40))),
        ("4096", 4096),
        (8192, 8192),
        ("2 gb", 2 << 30),
        ("10k", 10 << 10),
        (None, None),
        ("", None),
    ],
)
def test_sizes(text, size):
    assert parse_size(text, "size") == size


@pytest.mark.parametrize("bad", ["lots", "-1G", "0", "1X", True])
def test_bad_sizes(bad):
    with pytest.raises(PluginConfigError):
        parse_size(bad, "size")


def test_defaults():
    o = options()
    assert o.name == "fx100io"
    assert o.devices == ("file:///tmp/fx/kv.img",)
    assert (o.size, o.create, o.queue_depth, o.direct, o.engine) == (None, "auto", 16, "auto", "auto")
    assert (o.capacity, o.host_nqn, o.timeout_s, o.retry_after_s) == (None, None, 30.0, 10.0)
    assert o.register_buffers is True
    assert o.max_io == 4 << 20


def test_all_keys_and_yaml_types():
    o = options(
        devices="/dev/nvme1n1, file:///data/kv.img",
        size="64G",
        create="never",
        queue_depth=128,  # YAML gives ints and bools, env/JSON gives strings: both work
        max_io="4M",
        o_direct=False,
        engine="psync",
        capacity="1T",
        timeout_s="2.5",
        retry_after_s=0,
        register_buffers="no",
    )
    assert o.devices == ("/dev/nvme1n1", "file:///data/kv.img")
    assert (o.size, o.capacity) == (64 << 30, 1 << 40)
    assert (o.create, o.queue_depth, o.direct, o.engine) == ("never", 128, False, "psync")
    assert (o.timeout_s, o.retry_after_s, o.register_buffers) == (2.5, 0.0, False)
    assert o.max_io == 4 << 20


def test_the_plugin_finds_its_own_name():
    extra = {
        "storage_plugin.other.module_path": "somewhere.else",
        "storage_plugin.other.class_name": "Other",
        "storage_plugin.kvssd.module_path": "fx100io.contrib.lmcache",
        "storage_plugin.kvssd.class_name": "FX100ioBackend",
        "storage_plugin.kvssd.devices": "/dev/nvme2n1",
    }
    o = parse_options(["other", "kvssd"], extra, "FX100ioBackend")
    assert (o.name, o.devices) == ("kvssd", ("/dev/nvme2n1",))


def test_two_entries_for_the_plugin_are_refused():
    extra = {}
    for name in ("a", "b"):
        extra[f"storage_plugin.{name}.module_path"] = "fx100io.contrib.lmcache"
        extra[f"storage_plugin.{name}.class_name"] = "FX100ioBackend"
        extra[f"storage_plugin.{name}.devices"] = f"/tmp/{name}.img"
    with pytest.raises(PluginConfigError, match="use one entry"):
        parse_options(["a", "b"], extra, "FX100ioBackend")


def test_worker_placeholders():
    o = options(devices="file:///kv/{world_size}/w{worker_id}.img", worker_id=3, world_size=4)
    assert o.devices == ("file:///kv/4/w3.img",)
    with pytest.raises(PluginConfigError, match="unknown placeholder"):
        options(devices="file:///kv/{rank}.img")


def test_host_nqn_goes_to_fabric_uris_only():
    nqn = "nqn.2014-08.org.nvmexpress:uuid:1b4e28ba-2fa1-11d2-883f-0016d3cca427"
    o = options(devices="nvme+tcp://10.0.0.2:4420/nqn.2024-01.io.fx100io:kv,/dev/nvme1n1", host_nqn=nqn)
    assert o.devices[0] == f"nvme+tcp://10.0.0.2:4420/nqn.2024-01.io.fx100io:kv?hostnqn={nqn}"
    assert o.devices[1] == "/dev/nvme1n1"
    assert o.host_nqn == nqn


@pytest.mark.parametrize(
    "keys, message",
    [
        ({"devices": ""}, "devices is required"),
        ({"devices": "a.img"}, "not a device URI"),
        ({"devices": "/x.img,/x.img"}, "listed twice"),
        ({"devices": "/x.img,,/y.img"}, "empty entry"),
        ({"queue_depth": "deep"}, "expected an integer"),
        ({"max_io": "1000"}, "max_io: expected a multiple of 4KiB"),
        ({"max_io": "2G"}, "max_io: expected a multiple of 4KiB"),
        ({"timeout_s": "0"}, "timeout_s: must be >="),
        ({"direct": "1", "o_direct": "0"}, "same option"),
        ({"capacity": "lots"}, "capacity"),
        ({"typo": "1"}, "unknown key"),
    ],
)
def test_mistakes_are_named(keys, message):
    with pytest.raises(PluginConfigError, match=message):
        options(**keys)


def test_create_auto_formats_only_fresh_files(tmp_path):
    img = tmp_path / "kv.img"
    assert should_create(options(devices=f"file://{img}")) is True  # missing
    img.write_bytes(b"")
    assert should_create(options(devices=f"file://{img}")) is True  # empty
    img.write_bytes(b"x" * 4096)
    assert should_create(options(devices=f"file://{img}")) is False  # has data: open it
    assert should_create(options(devices=f"file://{img}", create="always")) is True
    missing = tmp_path / "gone.img"
    assert should_create(options(devices=f"file://{missing}", create="never")) is False
    # A block device or fabric namespace is never formatted implicitly.
    assert should_create(options(devices="/dev/nvme9n9")) is False


def test_create_auto_refuses_a_half_present_stripe(tmp_path):
    (tmp_path / "a.img").write_bytes(b"x" * 4096)
    with pytest.raises(PluginConfigError, match="partial stripe"):
        should_create(options(devices=f"file://{tmp_path}/a.img,file://{tmp_path}/b.img"))


# ------------------------------------------------------------------ naming


def test_store_names_keep_distinct_keys_apart():
    lm = pytest.importorskip("lmcache.utils", reason="lmcache is not installed: run tools/install_lmcache.sh")
    import torch

    from fx100io.contrib import _lmcache_codec as codec

    key = lm.CacheEngineKey
    variants = [
        key("m", 1, 0, 0x1234, torch.bfloat16),
        key("m", 1, 0, b"\x12\x34", torch.bfloat16),  # to_string() renders the same hex
        key("m", 1, 0, -0x1234, torch.bfloat16),
        key("m", 2, 1, 0x1234, torch.bfloat16),
        key("m", 1, 0, 0x1234, torch.float16),
        key("m", 1, 0, 0x1234, torch.bfloat16).split_layers(2)[1],
    ]
    texts = [codec.lmcache_key_text(k) for k in variants]
    assert len(set(texts)) == len(texts)
    assert variants[0].to_string() == variants[1].to_string()  # why the type tag exists
    names = {codec.data_key(t) for t in texts} | {codec.record_key(t) for t in texts}
    assert len(names) == 2 * len(texts)

    long_key = key("m" * 2000, 1, 0, 7, torch.bfloat16)
    name = codec.data_key(codec.lmcache_key_text(long_key))
    assert len(name.encode()) <= 1024


def test_records_round_trip_and_reject_damage():
    pytest.importorskip("lmcache.utils", reason="lmcache is not installed: run tools/install_lmcache.sh")
    import torch

    from fx100io.contrib import _lmcache_codec as codec

    rec = codec.ChunkRecord(
        "Ci/m@1@0@7@bfloat16", 6144, "KV_2LTD", ((2, 4, 16, 24),), ("bfloat16",), (0, 1, 2)
    )
    blob = rec.encode()
    assert codec.ChunkRecord.decode(blob, rec.key_text) == rec
    assert codec.dtype_from_name(torch, "bfloat16") is torch.bfloat16

    with pytest.raises(codec.RecordError, match="belongs to"):
        codec.ChunkRecord.decode(blob, "Ci/m@1@0@8@bfloat16")
    with pytest.raises(codec.RecordError, match="not an fx100io"):
        codec.ChunkRecord.decode(b"XXXXX" + blob[5:], rec.key_text)
    with pytest.raises(codec.RecordError, match="truncated"):
        codec.ChunkRecord.decode(blob[:-3], rec.key_text)
    with pytest.raises(codec.RecordError, match="unknown dtype"):
        codec.dtype_from_name(torch, "load")  # a torch attribute, but not a dtype
