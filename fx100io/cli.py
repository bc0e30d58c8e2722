"""The `fx100io` command: one subcommand per job."""

from __future__ import annotations

import sys

USAGE = """usage: fx100io <command> [options]

commands:
  demo     put and get KV-sized chunks in a local file-backed store, print throughput
  bench    fio-like microbenchmark (fio's options, job files and output formats)
  target   serve files and block devices as an NVMe/TCP target
  target-ctl PATH CMD  change a running target (ANA states, ports) through its --control socket
  rdma-devices  list RDMA devices and ports (state, MTU, GIDs, netdev) through pyverbs
  discover URI    read a discovery log through the kernel (nvme-cli)
  connect URI     attach a subsystem through the kernel (nvme-cli); prints /dev/nvmeXnY
  disconnect URI  detach the kernel's controller(s) of a subsystem (or one: nvme3)
  list [URI]      NVMe-oF controllers the kernel holds, and their block devices
  shared-rebuild  re-derive a shared pool's Redis index from its namespaces

`fx100io <command> --help` for a command's options."""


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    if not args or args[0] in ("-h", "--help", "help"):
        print(USAGE)
        return 0
    cmd, rest = args[0], args[1:]
    try:
        if cmd == "demo":
            from fx100io.demo import main as demo
            return demo(rest)
        if cmd == "target":
            from fx100io.target_cli import main as target
            return target(rest)
        if cmd == "target-ctl":
            from fx100io.target_ctl import main as target_ctl
            return target_ctl(rest)
        if cmd == "bench":
            from fx100io.bench import main as bench
            return bench(rest)
        if cmd in ("discover", "connect", "disconnect", "list"):
            from fx100io.kernel.cli import main as kernel_cli
            return kernel_cli(cmd, rest)
        if cmd == "rdma-devices":
            from fx100io.rdma_devices import main as rdma_devices
            return rdma_devices(rest)
        if cmd == "shared-rebuild":
            from fx100io.store.shared.rebuild import main as shared_rebuild
            return shared_rebuild(rest)
    except OSError as e:  # fx100io errors are OSErrors with a clear message
        print(f"fx100io {cmd}: {e}", file=sys.stderr)
        return 1
    print(f"fx100io: unknown command {cmd!r}\n\n{USAGE}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
