"""`fx100io target --tls / --tls-key`: keys checked by the one C parser, errors that
name the host and never the key (test_target_tls.py serves with them)."""

from __future__ import annotations

import pytest

from fx100io import target_cli

KEY = "NVMeTLSkey-1:01:VRLbtnN9AQb2WXW3c9+wEf/DRLz0QuLdbYvEhwtdWwNf9LrZ:"
HOST = "nqn.2014-08.org.nvmexpress:uuid:tls-host"


def _run(tmp_path, capsys, *extra: str) -> tuple[int, str]:
    ns = tmp_path / "ns.img"
    ns.write_bytes(b"\0" * (1 << 20))
    rc = target_cli.main(["--listen", "127.0.0.1:0", "--namespace", str(ns), *extra])
    return rc, capsys.readouterr().err


@pytest.mark.parametrize("args, why", [
    (["--tls", "required", "--tls-key", f"{HOST}={KEY[:-2]}Y:"], f"--tls-key for {HOST}: the TLS key's CRC"),
    (["--tls", "required", "--tls-key", f"{HOST}=DHHC-1:00:abc:"], "NVMeTLSkey-1:"),
    (["--tls", "required", "--tls-key", f"{HOST}={KEY}", "--tls-key", f"{HOST}={KEY}"],
     "two keys for"),
    (["--tls-key", f"{HOST}={KEY}"], "needs --tls required or --tls optional"),
    (["--tls", "required"], "needs a --tls-key"),
    (["--ktls", "off"], "--ktls off needs --tls required or --tls optional"),
    (["--tls", "required", "--tls-key", f"not an nqn={KEY}"], "--tls-key"),
])
def test_bad_tls_options_are_refused_with_why(tmp_path, capsys, args, why):
    rc, err = _run(tmp_path, capsys, *args)
    assert rc == 2
    assert why in err
    assert "VRLbtnN9" not in err
