"""The target's test-only fault `--fault-tls-record KIND:N`, declared once.

Its kinds, in the order of target.h's FX_TARGET_FAULT_TLS_* (from 1), and the
parse of KIND:N that both `fx100io target` (target_cli) and the binding's
target_serve() use.  Pure data and parsing, no C core.
"""

from __future__ import annotations

# a NewSessionTicket, close_notify, a fatal alert, a warning alert
FAULT_TLS_KINDS = ("ticket", "close_notify", "fatal", "warning")
MAX_AFTER = 0xFFFFFFFF


def parse_fault_tls_record(spec: str) -> tuple[int, int]:
    """'KIND:N' -> (FX_TARGET_FAULT_TLS_* number, N); N is ASCII digits, 1..2^32-1.
    ValueError names what is wrong."""
    kind, sep, after = spec.partition(":")
    if kind not in FAULT_TLS_KINDS or not sep or not (after.isascii() and after.isdigit()) \
            or not 1 <= int(after) <= MAX_AFTER:
        raise ValueError(f"--fault-tls-record: KIND:N, KIND one of {', '.join(FAULT_TLS_KINDS)} "
                         f"and N >= 1, not {spec!r}")
    return FAULT_TLS_KINDS.index(kind) + 1, int(after)
