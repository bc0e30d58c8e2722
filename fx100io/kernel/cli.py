"""`fx100io discover|connect|disconnect|list`: the kernel path (fx100io.kernel) from the shell.

    fx100io connect nvme+tcp://10.0.0.5:4420/nqn.2026-01.io.example:kv --hostnqn NQN
    /dev/nvme1n1
    fx100io list -o json
    fx100io disconnect nvme+tcp://10.0.0.5:4420/nqn.2026-01.io.example:kv

Options carry nvme-cli's names.  Secrets given with --dhchap-secret are visible in the
process list like any argument; FX100IO_DHCHAP_SECRET / FX100IO_DHCHAP_CTRL_SECRET in the
environment keep them out of it.  fx100io hands them on to nvme-cli in a 0600 file, never
on its command line.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

COMMANDS = ("discover", "connect", "disconnect", "list")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        self.print_usage(sys.stderr)
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        raise SystemExit(2)


def _parser(cmd: str) -> argparse.ArgumentParser:
    what = {"discover": "Read a discovery controller's log through the kernel (nvme discover).",
            "connect": "Attach a subsystem through the kernel (nvme connect) and print the "
                       "block device path(s) of its namespaces.",
            "disconnect": "Detach the kernel's controller(s) of a URI's subsystem, or one "
                          "controller by name (nvme3).",
            "list": "List the NVMe-oF controllers the kernel holds (sysfs), each a path of "
                    "its subsystem with its ANA state per namespace, optionally only those of "
                    "a URI's subsystem (at each of its paths)."}[cmd]
    p = _Parser(prog=f"fx100io {cmd}", description=what)
    p.add_argument("uri", nargs="?" if cmd == "list" else None,
                   help="nvme+tcp://HOST[:PORT]/SUBNQN or nvme+rdma://... (URI options as for "
                   "open_device)" + (", or a controller name" if cmd == "disconnect" else ""))
    p.add_argument("-o", "--output-format", choices=("normal", "json"), default="normal")
    if cmd in ("discover", "connect"):
        p.add_argument("-q", "--hostnqn", help="host NQN (default: /etc/nvme/hostnqn)")
        p.add_argument("-I", "--hostid", help="host ID, a UUID (default: /etc/nvme/hostid)")
    if cmd == "connect":
        p.add_argument("-i", "--nr-io-queues", type=int, metavar="N", help="I/O queues")
        p.add_argument("-k", "--keep-alive-tmo", type=int, metavar="SECONDS",
                       help="keep alive timeout")
        p.add_argument("-g", "--hdr-digest", action="store_true", help="NVMe/TCP header digest")
        p.add_argument("-G", "--data-digest", action="store_true", help="NVMe/TCP data digest")
        p.add_argument("-S", "--dhchap-secret", metavar="DHHC-1:...",
                       help="host DH-HMAC-CHAP secret (or FX100IO_DHCHAP_SECRET)")
        p.add_argument("-C", "--dhchap-ctrl-secret", metavar="DHHC-1:...",
                       help="controller secret, bidirectional authentication "
                       "(or FX100IO_DHCHAP_CTRL_SECRET)")
        p.add_argument("-l", "--ctrl-loss-tmo", type=int, metavar="SECONDS",
                       help="give up reconnecting after this long (-1: never)")
        p.add_argument("-c", "--reconnect-delay", type=int, metavar="SECONDS")
        p.add_argument("-D", "--duplicate-connect", action="store_true",
                       help="connect even if this host already has a controller there")
        p.add_argument("--ns-timeout", type=float, default=30.0, metavar="SECONDS",
                       help="wait this long for the namespaces' block devices (default 30)")
    return p


def connect_options(a: argparse.Namespace, env: dict[str, str] | None = None) -> dict[str, Any]:
    """fx100io.kernel.connect() keywords from the connect command's options."""
    env = os.environ if env is None else env  # type: ignore[assignment]
    assert env is not None
    o: dict[str, Any] = {}
    for name in ("hostnqn", "hostid"):
        if getattr(a, name, None):
            o[name] = getattr(a, name)
    if a.nr_io_queues is not None:
        o["queues"] = a.nr_io_queues
    if a.keep_alive_tmo is not None:
        o["kato_ms"] = a.keep_alive_tmo * 1000
    if a.hdr_digest:
        o["hdgst"] = True
    if a.data_digest:
        o["ddgst"] = True
    secret = a.dhchap_secret or env.get("FX100IO_DHCHAP_SECRET")
    ctrl = a.dhchap_ctrl_secret or env.get("FX100IO_DHCHAP_CTRL_SECRET")
    if secret:
        o["dhchap_secret"] = secret
    if ctrl:
        o["dhchap_ctrl_secret"] = ctrl
    if a.ctrl_loss_tmo is not None:
        o["ctrl_loss_tmo"] = a.ctrl_loss_tmo
    if a.reconnect_delay is not None:
        o["reconnect_delay"] = a.reconnect_delay
    if a.duplicate_connect:
        o["duplicate_connect"] = True
    return o


def _with_host(uri: str, a: argparse.Namespace) -> str:
    from fx100io.kernel.uri_args import with_query

    return with_query(uri, {name: getattr(a, name) for name in ("hostnqn", "hostid")
                            if getattr(a, name, None)})


def main(cmd: str, argv: list[str]) -> int:
    from fx100io import kernel

    a = _parser(cmd).parse_args(argv)
    as_json = a.output_format == "json"
    if cmd == "discover":
        records = kernel.discover(_with_host(a.uri, a))
        if as_json:
            print(json.dumps({"records": records}, indent=2))
        else:
            for r in records:
                print(f"{r.get('subtype', ''):9} {r.get('trtype', '')}://{r.get('traddr', '')}:"
                      f"{r.get('trsvcid', '')} {r.get('subnqn', '')}")
        return 0
    if cmd == "connect":
        c = kernel.connect(a.uri, ns_timeout=a.ns_timeout, **connect_options(a))
        try:
            paths = c.namespaces
        except BaseException:
            kernel.disconnect(c)
            raise
        from fx100io.kernel.connections import keep
        keep(c)  # (the admin's now: it outlives this command)
        if as_json:
            name = {"device": c.name} if isinstance(c, kernel.Controller) else {}
            print(json.dumps({**name, **c.as_dict(), "namespaces": paths}, indent=2))
        else:
            print("\n".join(paths))
        return 0
    if cmd == "disconnect":
        names = kernel.disconnect(a.uri)
        if as_json:
            print(json.dumps({"disconnected": names}))
        else:
            print(f"disconnected {len(names)} controller(s){': ' if names else ''}{' '.join(names)}")
        return 0
    # list
    ctrls = kernel.list()
    if a.uri:
        from fx100io.kernel.uri_args import query_keys

        ts = [kernel.target_of(u) for u in kernel.split_paths(a.uri)]
        host = "hostnqn" in query_keys(a.uri)
        ctrls = [c for c in ctrls if any(kernel.matches(c, t, host=host) for t in ts)]
    if as_json:
        print(json.dumps({"controllers": [c.as_dict() for c in ctrls]}, indent=2))
    else:
        for c in ctrls:
            d = c.as_dict()
            # one line per controller: with native multipath, each is a path of its subsystem,
            # and the ANA state is per namespace (nsid=state)
            ana = ",".join(f"{p['nsid']}={p['ana_state'] or '-'}" for p in d["paths"]) or "-"
            print(f"{c.name:8} {c.state:10} {c.transport:5} {c.traddr}:{c.trsvcid} "
                  f"{d['subsystem'] or '-'} ana:{ana} {c.subsysnqn} {' '.join(d['namespaces'])}")
    return 0
