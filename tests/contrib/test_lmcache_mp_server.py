"""The real ``lmcache server`` process loads our adapter from ``--l2-adapter`` and, after a
restart, lists through its own HTTP API every chunk a previous server left on the device
(the reuse after restart LMCache#1175 asks for), and deletes through it.

The server runs on CPU here (an L1 in host memory, no engine attached). It needs the
server's HTTP stack (fastapi, uvicorn, httpx, opentelemetry), installed by
tools/install_lmcache.sh.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("lmcache", reason="the real lmcache package is needed: run tools/install_lmcache.sh")
try:
    import lmcache.v1.multiprocess.http_server  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the machine
    pytest.skip(f"lmcache's server stack is missing ({exc}): run tools/install_lmcache.sh",
                allow_module_level=True)

from support.lmcache_mp import Arena, content, fill, key, load, load_adapter, spec, store  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http(method: str, url: str, body: dict | None = None) -> dict:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())


class Server:
    def __init__(self, tmp_path: Path, adapter_json: str) -> None:
        self.http_port = free_port()
        self.log = tmp_path / f"server-{self.http_port}.log"
        env = dict(os.environ, LMCACHE_DISABLE_BANNER="1",
                   PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
        cmd = [sys.executable, "-m", "lmcache.cli.main", "server",
               "--host", "127.0.0.1", "--port", str(free_port()),
               "--http-host", "127.0.0.1", "--http-port", str(self.http_port),
               "--l1-size-gb", "0.05", "--eviction-policy", "LRU",
               "--disable-observability", "--l2-adapter", adapter_json]
        self._out = open(self.log, "w")  # noqa: SIM115 - lives as long as the server
        self.proc = subprocess.Popen(cmd, stdout=self._out, stderr=subprocess.STDOUT, env=env,
                                     cwd=str(tmp_path))
        deadline = time.monotonic() + 180
        while True:
            if self.proc.poll() is not None:
                raise AssertionError(f"server exited rc={self.proc.returncode}:\n{self.text()}")
            try:
                if http("GET", self.url("/")).get("status") == "ok":
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise AssertionError(f"server never answered:\n{self.text()}")
            time.sleep(0.5)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.http_port}{path}"

    def text(self) -> str:
        self._out.flush()
        return self.log.read_text(errors="replace")[-6000:]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=30)
        self._out.close()


def test_lmcache_server_lists_and_deletes_chunks_a_previous_server_left(tmp_path):
    device = f"file://{tmp_path}/kv.img"
    arena = Arena(2 << 20)
    keys = [key(i, model="org/model-7b", rank=i % 2) for i in range(5)]
    first = load_adapter(spec(device), arena)
    try:
        srcs = [arena.obj(8192 + i) for i in range(5)]
        want = [fill(o, 50 + i) for i, o in enumerate(srcs)]
        assert store(first, keys, srcs)
    finally:
        first.close()

    server = Server(tmp_path, spec(device))
    try:
        assert "fx100io LMCache MP adapter ready" in server.text()
        listing = http("GET", server.url("/cache/objects?tier=l2&page_size=100"))
        got = {(e["key"]["chunk_hash_hex"], e["key"]["kv_rank"]): e["size_bytes"]
               for e in listing["entries"]}
        assert got == {(k.chunk_hash.hex(), k.kv_rank): 8192 + i for i, k in enumerate(keys)}
        assert listing["next_page_token"] is None
        gone = keys[0].to_encoded_object_key()
        body = {"keys": [{"chunk_hash_hex": gone.chunk_hash_hex, "model_name": gone.model_name,
                          "kv_rank": gone.kv_rank, "object_group_id": gone.object_group_id,
                          "cache_salt": gone.cache_salt}], "tier": "l2"}
        assert http("DELETE", server.url("/cache/objects"), body).get("ok") is True
        after = http("GET", server.url("/cache/objects?tier=l2&page_size=100"))
        assert len(after["entries"]) == 4
    finally:
        server.stop()

    # the server closed the adapter and released the device: open it again here
    again = load_adapter(spec(device), arena)
    try:
        dsts = [arena.obj(8192 + i) for i in range(5)]
        assert load(again, keys, dsts) == [False, True, True, True, True]
        assert [content(o) for o in dsts[1:]] == want[1:]
    finally:
        again.close()
