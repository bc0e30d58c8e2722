"""The io_uring data path over the NVMe/TCP secure channel (TLS 1.3 with a PSK):
our initiator against our target on loopback, every I/O queue behind its own
handshake and every PDU in records (csrc/transport/tcp.c).  Bytes are checked
against what was written and against the target's backing file; digests and
DH-HMAC-CHAP ride on the same connections; a wrong key is a clear error; a
target restarted mid-run is reconnected with a new handshake; a read in flight
is cancelled cleanly."""

from __future__ import annotations

import asyncio
import errno

import numpy as np
import pytest
from support import chunk_bytes, read_once_reconnected
from support.ktls import kernel_has_ktls
from support.record_proxy import RecordProxy
from support.target_auth_host import SECRET_A
from support.target_process import serve, sparse_image, tls_args, wait_port_free
from support.tls_keys import KEY, KEY48, OTHER

import fx100io
from fx100io import errors

NQN = "nqn.2026-12.io.fx100:tlsio"
HOST = "nqn.2014-08.org.nvmexpress:uuid:f0100000-0000-4000-8000-00000000f101"
SIZE = 96 << 20


@pytest.fixture
def backing(tmp_path):
    return sparse_image(tmp_path, SIZE, "ns1.img")


def uri(host, port, key=KEY, **q):
    q = {"hostnqn": HOST, "tls_key": key, **q}
    return f"nvme+tcp://{host}:{port}/{NQN}?" + "&".join(f"{k}={v}" for k, v in q.items())


def target_args(key=KEY, auth=False):
    args = tls_args(HOST, key)
    if auth:
        args += ["--dhchap-key", f"{HOST}={SECRET_A}"]
    return args


@pytest.mark.parametrize("auth", [False, True], ids=["no-auth", "dhchap"])
@pytest.mark.parametrize("digests", [(0, 0), (1, 1), (1, 0)],
                         ids=["plain", "digests", "header-digest"])
def test_reads_and_writes_at_depth_are_byte_exact(backing, digests, auth):
    """1 MiB..32 MiB buffers, written then read back at queue depth over two
    connections, compared with what was written and with the target's file."""
    q = {"queues": 2, "hdgst": digests[0], "ddgst": digests[1]}
    if auth:
        q["dhchap_secret"] = SECRET_A
    sizes = [1 << 20, 3 << 20, 8 << 20, 32 << 20]
    with serve([backing], NQN, *target_args(auth=auth)) as (host, port, _):
        with fx100io.open_device(uri(host, port, **q), queue_depth=32) as dev:
            pool = fx100io.BufferPool(96 << 20)
            off = 0
            written = []
            for n in sizes:
                buf = pool.alloc(n)
                buf[:] = chunk_bytes(f"tls-{digests}-{auth}-{n}", n)
                assert dev.write_from_blocking(off, buf) == n
                written.append((off, buf))
                off += n
            dev.flush_blocking()
            for o, buf in written:
                out = pool.alloc(len(buf))
                before = dev.queue_stats()
                assert dev.read_into_blocking(o, out) == len(buf)
                assert np.array_equal(out, buf)
                after = dev.queue_stats()
                # payload decrypted straight into `out`, also where a record
                # held the PDU's header before it (fx_tls_open_head)
                direct = after["bytes_direct"] - before["bytes_direct"]
                copied = after["bytes_copied"] - before["bytes_copied"]
                assert (direct, copied) == (len(buf), 0)
            # small reads, many PDUs to a record
            out = pool.alloc(4096)
            for i in range(0, 64):
                assert dev.read_into_blocking(i * 4096, out) == 4096
                assert np.array_equal(out, written[0][1][i * 4096:(i + 1) * 4096])
    with open(backing, "rb") as f:
        for o, buf in written:
            f.seek(o)
            assert f.read(len(buf)) == buf.tobytes()


def test_sha384_key_and_asyncio_batch(backing):
    data = chunk_bytes("sha384", 4 << 20)
    with open(backing, "r+b") as f:
        f.write(data.tobytes())
    with serve([backing], NQN, *target_args(KEY48)) as (host, port, _):
        dev = fx100io.open_device(uri(host, port, KEY48, queues=2), queue_depth=32)

        async def main():
            outs = [np.empty(64 << 10, np.uint8) for _ in range(64)]
            got = await asyncio.wait_for(
                asyncio.gather(*(dev.read_into(i * (64 << 10), o) for i, o in enumerate(outs))),
                60)
            assert got == [64 << 10] * 64
            assert np.array_equal(np.concatenate(outs), data)

        try:
            asyncio.run(main())
        finally:
            dev.close()


def test_chunk_store_over_tls(backing):
    keys = [f"c{i}" for i in range(6)]
    sizes = [3, 5000, 1 << 20, 123_457, 2 << 20, 16384]
    with serve([backing], NQN, *target_args()) as (host, port, _):
        u = uri(host, port, queues=2)
        with fx100io.ChunkStore(u, create=True) as st:
            st.batch_put_blocking(keys, [chunk_bytes(k, n) for k, n in zip(keys, sizes)])
        with fx100io.ChunkStore(u) as st:
            outs = [np.empty(n, np.uint8) for n in sizes]
            assert st.batch_get_blocking(keys, outs) == [True] * 6
            assert all(np.array_equal(o, chunk_bytes(k, n)) for o, k, n in zip(outs, keys, sizes))


@pytest.mark.parametrize("cached", [True, False], ids=["page-cache", "disk"])
@pytest.mark.parametrize("inline", [False, True], ids=["engine", "inline"])
def test_a_read_and_its_response_in_shared_records_are_byte_exact(tmp_path, monkeypatch, inline,
                                                                  cached):
    """Our target seals a read's C2HData header, data and CapsuleResp together
    (one record for a small read; a large one's first and last records shared,
    15 records per send from the page cache, read straight into them): every
    size around the
    record and chunk edges reads back what the file holds, from the page cache
    (pread) and from a buffer (a read from the disk), on the I/O engine and in
    line (FX100IO_TARGET_INLINE); and our initiator decrypts the payload that
    shares a record with its header straight into the buffer too."""
    size = 16 << 20
    data = chunk_bytes(f"packed-{inline}-{cached}", size)
    img = tmp_path / "ns.img"
    if cached:
        img.write_bytes(data.tobytes())  # (buffered: in the page cache)
    else:
        with open(img, "wb") as f:
            f.truncate(size)
    if inline:
        monkeypatch.setenv("FX100IO_TARGET_INLINE", "1")
    # (the target sends 15 records of 16 KiB at a time: 15 * 16384 - 512 ends
    # inside the first send, 15 * 16384 puts its last data and the response
    # in the second, 30 * 16384 + 512 takes three)
    reads = [(0, 512), (512, 4096), (8192, 16384 - 512), (65536, 16384), (1 << 20, 16384 + 512),
             (2 << 20, 256 << 10), (3 << 20, (256 << 10) + 4096), (4 << 20, (1 << 20) + 512),
             (6 << 20, 3 << 20), (size - 4096, 4096), (10 << 20, 15 * 16384 - 512),
             (11 << 20, 15 * 16384), (12 << 20, 30 * 16384 + 512)]
    with serve([str(img)], NQN, *target_args()) as (host, port, _):
        # (our record layer's placement is what is checked: ktls=off where the kernel has it)
        with fx100io.open_device(uri(host, port, ktls="off"), queue_depth=8) as dev:
            pool = fx100io.BufferPool(32 << 20)
            if not cached:  # written through the target: O_DIRECT, not in its page cache
                src = pool.alloc(size // 2)
                for base in (0, size // 2):
                    src[:] = data[base:base + size // 2]
                    assert dev.write_from_blocking(base, src) == size // 2
                dev.flush_blocking()
            before = dev.queue_stats()
            for off, n in reads:
                out = pool.alloc(n)
                assert dev.read_into_blocking(off, out) == n
                assert np.array_equal(out, data[off:off + n]), (off, n)
            # many at once: records shared between answers
            outs = [pool.alloc(n) for _, n in reads[:6]]
            done = dev.submit_blocking([(fx100io.OP_READ, off, o) for (off, _), o
                                        in zip(reads[:6], outs)])
            assert [c[0] for c in done] == [n for _, n in reads[:6]]
            for (off, n), o in zip(reads[:6], outs):
                assert np.array_equal(o, data[off:off + n]), (off, n)
            after = dev.queue_stats()
            # every answer starts a record with its header: all of it direct
            assert after["bytes_copied"] == before["bytes_copied"]
            assert (after["bytes_direct"] - before["bytes_direct"]
                    == sum(n for _, n in reads) + sum(n for _, n in reads[:6]))


@pytest.mark.parametrize("inline", [False, True], ids=["engine", "inline"])
def test_a_read_past_a_shrunk_file_fails_and_the_stream_goes_on(tmp_path, monkeypatch, inline):
    """The target reads a read's data from the page cache straight into its
    records: when the file shrank under it, the bytes past its end go out as
    zeros (the records stay whole) and the read is answered with an error; the
    next reads on the same connection are byte-exact."""
    size = 8 << 20
    data = chunk_bytes(f"shrunk-{inline}", size)
    img = tmp_path / "ns.img"
    img.write_bytes(data.tobytes())
    if inline:
        monkeypatch.setenv("FX100IO_TARGET_INLINE", "1")
    with serve([str(img)], NQN, *target_args()) as (host, port, _):
        with fx100io.open_device(uri(host, port), queue_depth=8) as dev:
            pool = fx100io.BufferPool(4 << 20)
            # a read first: the target's record buffer then holds other bytes,
            # which must not go out in place of the missing ones
            warm = pool.alloc(1 << 20)
            assert dev.read_into_blocking(0, warm) == 1 << 20
            end = (4 << 20) + 300 * 1024  # inside the second send of a 1 MiB read
            with open(img, "r+b") as f:
                f.truncate(end)
            out = pool.alloc(1 << 20)
            out[:] = 0x77
            with pytest.raises(errors.Fx100ioError):
                dev.read_into_blocking(4 << 20, out)
            # (our host lands a failed read's payload as it came: what the
            # target sent is in the buffer) the file's bytes, then zeros
            k = end - (4 << 20)
            assert np.array_equal(out[:k], data[4 << 20:end])
            assert not out[k:].any(), "the target sent other bytes than zeros past the file's end"
            for off, n in [(0, 1 << 20), (end - (1 << 20), 1 << 20), (4096, 512)]:
                o = pool.alloc(n)
                assert dev.read_into_blocking(off, o) == n
                assert np.array_equal(o, data[off:off + n]), (off, n)


@pytest.mark.parametrize("ktls", ["auto", "off"])
def test_records_go_where_the_kernel_allows(backing, ktls):
    """ktls=auto takes the kernel's record layer where it has the tls ULP and
    stays on ours, silently, where it has not (this machine's kernel: the
    connections then count as tls_user_conns); ktls=off always stays on ours.
    Bytes are exact either way."""
    data = chunk_bytes("ktls-" + ktls, 4 << 20)
    with open(backing, "r+b") as f:
        f.write(data.tobytes())
    with serve([backing], NQN, *target_args()) as (host, port, _):
        with fx100io.open_device(uri(host, port, queues=2, ktls=ktls), queue_depth=32) as dev:
            out = np.empty(4 << 20, np.uint8)
            assert dev.read_into_blocking(0, out) == 4 << 20
            assert np.array_equal(out, data)
            st = dev.queue_stats()
            kernel = ktls == "auto" and kernel_has_ktls()
            assert (st["ktls_conns"], st["tls_user_conns"]) == ((2, 0) if kernel else (0, 2))


def test_wrong_key_is_a_clear_error(backing):
    with serve([backing], NQN, *target_args()) as (host, port, _):
        with pytest.raises(errors.Fx100ioError, match="wrong key") as e:
            fx100io.open_device(uri(host, port, OTHER))
        assert "MDAxMTIy" not in str(e.value)


def test_restarted_target_reconnects_with_a_new_handshake(backing):
    data = chunk_bytes("restart", 8 << 20)
    with open(backing, "r+b") as f:
        f.write(data.tobytes())
    cm = serve([backing], NQN, *target_args())
    host, port, proc = cm.__enter__()
    try:
        dev = fx100io.open_device(uri(host, port, queues=2, io_timeout_ms=10000,
                                      connect_timeout_ms=3000, reconnect_ms=100),
                                  queue_depth=32)
        try:
            out = np.empty(8 << 20, np.uint8)
            assert dev.read_into_blocking(0, out) == 8 << 20
            assert np.array_equal(out, data)
            proc.kill()
            proc.wait()
            cm.__exit__(None, None, None)
            wait_port_free(port)
            cm = serve([backing], NQN, *target_args(), port=port)
            cm.__enter__()
            read_once_reconnected(dev, out, 30, 0.1)
            assert np.array_equal(out, data)
            assert dev.queue_stats()["reconnects"] >= 1
        finally:
            dev.close()
    finally:
        cm.__exit__(None, None, None)


def test_cancelling_a_read_in_flight(backing):
    """A 32 MiB read cancelled while its records arrive: the cancel is
    prompt, the device stays usable and the next reads are byte-exact."""
    data = chunk_bytes("cancel", 32 << 20)
    with open(backing, "r+b") as f:
        f.write(data.tobytes())
    with serve([backing], NQN, *target_args()) as (host, port, _):
        dev = fx100io.open_device(uri(host, port), queue_depth=32)

        async def main():
            out = np.empty(32 << 20, np.uint8)
            for _ in range(3):
                task = asyncio.ensure_future(dev.read_into(0, out))
                await asyncio.sleep(0.002)
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await asyncio.wait_for(task, 30)
            out2 = np.empty(32 << 20, np.uint8)
            assert await asyncio.wait_for(dev.read_into(0, out2), 30) == 32 << 20
            assert np.array_equal(out2, data)

        try:
            asyncio.run(main())
        finally:
            dev.close()


@pytest.mark.parametrize("how", ["tag", "oversize", "cut"])
def test_a_broken_record_mid_transfer_fails_the_queue_then_it_reconnects(backing, how, capfd):
    """A tampered record, an oversized one, or a connection cut mid-record
    while 8 MiB reads are in flight: the read fails with a protocol or
    connection error, its buffer holds no byte that no tag vouched for, the
    reason is logged, and the next read reconnects with a new handshake and is
    byte-exact."""
    data = chunk_bytes("broken-" + how, 8 << 20)
    with open(backing, "r+b") as f:
        f.write(data.tobytes())
    with serve([backing], NQN, *target_args()) as (host, port, _):
        proxy = RecordProxy(port, how)
        try:
            dev = fx100io.open_device(uri(host, proxy.listen_port, io_timeout_ms=5000,
                                          reconnect_ms=50), queue_depth=32)
            try:
                out = np.full(8 << 20, 0x77, np.uint8)
                with pytest.raises((errors.FxProtocolError, errors.FxConnectionError)) as e:
                    dev.read_into_blocking(0, out)
                assert proxy.fired.is_set()
                # the records' payload was decrypted straight into out: a
                # broken record's is wiped when its tag fails (a flipped
                # ciphertext bit flips one plaintext bit: a byte left from it
                # would be none of these), and the inner type after a good
                # record's data is zeroed (the next record, which would have
                # written over it, never came): data, zeros or untouched
                assert np.all((out == data) | (out == 0) | (out == 0x77))
                if how == "tag":
                    assert e.value.errno == errno.EBADMSG
                err = capfd.readouterr().err
                if how == "tag":
                    assert "TLS: a TLS record failed its integrity check" in err
                elif how == "oversize":
                    assert "TLS: the TLS peer sent a record of a size TLS 1.3 forbids" in err
                out[:] = 0
                assert dev.read_into_blocking(0, out) == 8 << 20
                assert np.array_equal(out, data)
                assert dev.queue_stats()["reconnects"] >= 1
            finally:
                dev.close()
        finally:
            proxy.close()


def test_a_broken_record_that_starts_with_a_read_header_fails_the_read_and_leaves_no_bytes(
        backing, capfd):
    """A 4 KiB read's answer from our target is one record that starts with
    the C2HData header, its payload decrypted straight into the read's buffer
    before the tag is checked (tls_peek_dest, fx_tls_open_head): one flipped
    bit in the payload fails the read (EBADMSG), the buffer then holds only
    zeros or what it held before, never data no tag vouched for, and the next
    read reconnects and is byte-exact."""
    data = chunk_bytes("broken-head", 4096)
    with open(backing, "r+b") as f:
        f.write(data.tobytes())
    with serve([backing], NQN, *target_args()) as (host, port, _):
        proxy = RecordProxy(port, "tag", longer_than=4096)
        try:
            dev = fx100io.open_device(uri(host, proxy.listen_port, io_timeout_ms=5000,
                                          reconnect_ms=50, ktls="off"))
            try:
                proxy.armed.set()  # (not the admin queue's Identify data, during the open)
                out = np.full(4096, 0x77, np.uint8)
                with pytest.raises(errors.FxProtocolError) as e:
                    dev.read_into_blocking(0, out)
                assert proxy.fired.is_set()
                assert e.value.errno == errno.EBADMSG
                assert np.all((out == 0) | (out == 0x77))
                assert "TLS: a TLS record failed its integrity check" in capfd.readouterr().err
                assert dev.read_into_blocking(0, out) == 4096
                assert np.array_equal(out, data)
                stats = dev.queue_stats()
                assert stats["reconnects"] >= 1 and stats["bytes_direct"] >= 4096
            finally:
                dev.close()
        finally:
            proxy.close()
