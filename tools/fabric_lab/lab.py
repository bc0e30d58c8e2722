#!/usr/bin/env python3
"""fx100io fabric lab: Debian's Linux NVMe-oF target (nvmet-tcp) in a QEMU guest.

    python3 tools/fabric_lab/lab.py build              # fetch Debian packages, build the image
    python3 tools/fabric_lab/lab.py start [--rdma]     # boot; prints the endpoint when listening
    python3 tools/fabric_lab/lab.py status [--json]
    python3 tools/fabric_lab/lab.py exec -- CMD...     # run CMD inside the lab's netns
    python3 tools/fabric_lab/lab.py run -- CMD...      # start if needed, exec, stop if we started
    python3 tools/fabric_lab/lab.py guest -- CMD...    # run CMD in the guest's userland (chroot)
    python3 tools/fabric_lab/lab.py stop [--lock-holder]
    python3 tools/fabric_lab/lab.py tlshd              # fetch + cache tlshd for the guest

See tools/fabric_lab/README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

# Run as a script: make the fabric_lab package next to this file importable.
sys.path.insert(0, str(Path(__file__).resolve().parent))

from fabric_lab import initramfs, lab_control, lab_paths, tlshd
from fabric_lab.lab_config import LabConfig, LabConfigError


def log(message: str) -> None:
    # Progress goes to stderr so that stdout carries only the endpoint lines scripts parse.
    print(message, file=sys.stderr, flush=True)


def config_from_args(args: argparse.Namespace) -> LabConfig:
    config = LabConfig.load(args.config) if args.config else LabConfig.default()
    if args.net:
        config.net = args.net
    elif not args.config and os.environ.get("FX100IO_LAB_NET"):
        config.net = os.environ["FX100IO_LAB_NET"]
    if args.rdma:
        config.rdma = True
    if args.host_port:
        config.host_forward_port = args.host_port
    config.validate()
    return config


def print_endpoint(state: dict) -> None:
    where = f"netns {state['netns']}" if state["netns"] else "user-mode networking, host loopback"
    print(f"FX100IO_LAB_ENDPOINT={state['host']}:{state['port']}")
    print(f"fabric lab listening on nvme+tcp://{state['host']}:{state['port']} ({where}), "
          f"kernel {state['kernel_release']}, ready {state['boot_seconds']} s after launch")
    if state.get("rdma"):
        print(f"  rdma port (inside the guest, soft-RoCE rxe0): "
              f"{state['rdma']['traddr']}:{state['rdma']['trsvcid']}")
    for sub in state["config"]["subsystems"]:
        access = ("any host" if sub["allow_any_host"]
                  else "hosts " + ", ".join(sub["allowed_hosts"]))
        namespaces = ", ".join(f"ns{ns['nsid']} {ns['backend']} {ns['size_mib']} MiB "
                               f"{ns['block_size']} B blocks" for ns in sub["namespaces"])
        print(f"  {sub['nqn']}: {namespaces}; {access}")
    print(f"  discovery: {state['discovery_nqn']}; state file: {lab_paths.state_file()}")


def command_build(args: argparse.Namespace) -> int:
    # Under the lab lock: a build prunes superseded images, which a concurrent start may use.
    with lab_control.lab_state.locked():
        image = initramfs.build(force=args.force, log=log)
    print(f"kernel {image.kernel}\ninitramfs {image.initramfs}")
    return 0


def command_tlshd(args: argparse.Namespace) -> int:
    try:
        path = tlshd.ensure(log=log)
    except tlshd.TlshdUnavailable as err:
        print(f"lab.py tlshd: {err}", file=sys.stderr)
        return 3
    print(path)
    return 0


def command_start(args: argparse.Namespace) -> int:
    state = lab_control.start(config_from_args(args), log=log)
    print_endpoint(state)
    return 0


def command_stop(args: argparse.Namespace) -> int:
    if args.lock_holder:
        stopped = lab_control.stop_lock_holder(log=log)
        log(f"fabric lab: stopped QEMU pid {', '.join(map(str, stopped))}" if stopped
            else "fabric lab: no lab QEMU this user can see holds the machine lock")
        return 0
    was_running = lab_control.stop(log=log)
    log("fabric lab stopped" if was_running else "fabric lab was not running (cleaned up)")
    return 0


def command_status(args: argparse.Namespace) -> int:
    state = lab_control.status()
    if args.json:
        print(json.dumps(state, indent=2))
    elif state is None:
        print("fabric lab is not running")
    else:
        print_endpoint(state)
        print(f"  probe: {state['probe']}")
    return 0 if state else 3


def _running_state() -> dict:
    state = lab_control.lab_state.read()
    if state is None or not lab_control.is_running(state):
        raise lab_control.LabError("the fabric lab is not running; start it with "
                                   "`python3 tools/fabric_lab/lab.py start`")
    return state


def command_exec(args: argparse.Namespace) -> int:
    return lab_control.exec_in_lab(args.command, _running_state())


def command_run(args: argparse.Namespace) -> int:
    # only a lab this call booted is stopped after (not one another start of this checkout
    # booted while this one waited for the machine)
    state, booted = lab_control.start_booted(config_from_args(args), log=log)
    if booted:
        print_endpoint(state)
    try:
        return lab_control.exec_in_lab(args.command, state)
    finally:
        if booted and not args.keep:
            lab_control.stop(log=log)


def command_guest(args: argparse.Namespace) -> int:
    state = _running_state()
    if args.initramfs:
        status, output = lab_control.guest_command(state, " ".join(args.command),
                                                   timeout=args.timeout)
        sys.stdout.write(output)
        return status
    if not args.command:
        raise lab_control.LabError("guest: no command given")
    env = {}
    for item in args.env:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise lab_control.LabError(f"guest: --env wants NAME=VALUE, not {item!r}")
        env[name] = value
    # One argument is a shell command line; several are an argv, run without a shell.
    command = args.command[0] if len(args.command) == 1 else args.command

    def show(text: str) -> None:
        sys.stdout.write(text)
        sys.stdout.flush()

    status, _ = lab_control.guest_run(state, command, cwd=args.cwd or os.getcwd(), env=env,
                                      timeout=args.timeout, on_output=show)
    return status


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="lab.py", description=__doc__,
                                  formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = top.add_subparsers(dest="name", required=True)

    def config_options(sub: argparse.ArgumentParser) -> None:
        sub.add_argument("--config", type=Path, help="JSON lab config (see README.md)")
        sub.add_argument("--net", choices=("netns", "user"),
                         help="netns: tap in a lab namespace (fast, root); user: QEMU user-mode "
                              "networking forwarded to 127.0.0.1 (default from FX100IO_LAB_NET)")
        sub.add_argument("--rdma", action="store_true",
                         help="also export an NVMe/RDMA port (soft-RoCE in the guest)")
        sub.add_argument("--host-port", type=int, help="loopback port for --net user")

    build = commands.add_parser("build", help="build (or reuse) the cached guest image")
    build.add_argument("--force", action="store_true", help="rebuild even if cached")
    build.set_defaults(func=command_build)
    fetch_tlshd = commands.add_parser(
        "tlshd", help="fetch and cache tlshd (the kernel's TLS handshake daemon) for the "
                      "guest; prints its path (exit 3: the Debian archive is unreachable)")
    fetch_tlshd.set_defaults(func=command_tlshd)
    start = commands.add_parser("start", help="boot the target; idempotent")
    config_options(start)
    start.set_defaults(func=command_start)
    stop = commands.add_parser("stop", help="quit QEMU, remove the netns")
    stop.add_argument("--lock-holder", action="store_true",
                      help="stop the lab QEMU holding the machine lock instead, whichever "
                           "checkout started it (a lab left booting by a killed start)")
    stop.set_defaults(func=command_stop)
    status = commands.add_parser("status", help="is it running, where, does it answer")
    status.add_argument("--json", action="store_true")
    status.set_defaults(func=command_status)
    exec_ = commands.add_parser("exec", help="run a command inside the lab's network")
    exec_.add_argument("command", nargs=argparse.REMAINDER)
    exec_.set_defaults(func=command_exec)
    run = commands.add_parser("run", help="start if needed, run a command inside the lab's "
                                          "network, then stop the lab if this started it")
    config_options(run)
    run.add_argument("--keep", action="store_true", help="leave the lab running afterwards")
    run.add_argument("command", nargs=argparse.REMAINDER)
    run.set_defaults(func=command_run)
    guest = commands.add_parser(
        "guest", help="run a command inside the guest, in its userland (this host's root "
                      "read-only, chroot'ed, with the guest's RDMA devices); one argument is a "
                      "shell command line, several an argv")
    guest.add_argument("--timeout", type=float, default=600.0)
    guest.add_argument("--cwd", help="working directory in the guest (default: the current one)")
    guest.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                       help="extra environment variable for the command (repeatable)")
    guest.add_argument("--initramfs", action="store_true",
                       help="run a shell command in the guest's busybox initramfs instead, "
                            "through the serial console (no chroot)")
    guest.add_argument("command", nargs=argparse.REMAINDER)
    guest.set_defaults(func=command_guest)
    return top


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if getattr(args, "command", None) and args.command[:1] == ["--"]:
        args.command = args.command[1:]
    try:
        return args.func(args)
    except (lab_control.LabError, LabConfigError, RuntimeError, OSError) as err:
        # Every lab error type is a RuntimeError subclass with a message meant for people.
        print(f"lab.py {args.name}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
