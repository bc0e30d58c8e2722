"""A port of the lab guest's Linux target (nvmet configfs) made for one test."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

NVMET = Path("/sys/kernel/config/nvmet")


@contextlib.contextmanager
def extra_port(port_id: int, nqn: str, attrs: dict[str, str]) -> Iterator[Path]:
    """Port port_id with attrs (addr_trtype, addr_traddr, ...) serving subsystem
    nqn; yields its configfs folder and removes it at the end (and first, one
    that a run which died before left behind)."""
    d = NVMET / "ports" / str(port_id)
    link = d / "subsystems" / nqn

    def drop() -> None:
        with contextlib.suppress(OSError):
            link.unlink()
        with contextlib.suppress(OSError):
            d.rmdir()

    drop()
    d.mkdir()
    try:
        for k, v in attrs.items():
            (d / k).write_text(v)
        link.symlink_to(NVMET / "subsystems" / nqn)
        yield d
    finally:
        drop()
