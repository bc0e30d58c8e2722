"""Sizes as people write them for disks and caches: '64G', '512MiB', '1.5T'.

Binary units (K = 1024), as disk tools use.  `fx100io bench` has its own
parser because it follows fio's rules instead.
"""

from __future__ import annotations

import re

_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgtp]?)(i?b?)\s*$", re.IGNORECASE)
_SIZE_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40, "p": 1 << 50}


def parse_size(text: str | int) -> int:
    """Bytes for '64G', '512MiB', '1.5T', '4096' or an int; ValueError otherwise."""
    if isinstance(text, bool):
        raise ValueError(f"not a size: {text!r}")
    if isinstance(text, int):
        return text
    m = _SIZE_RE.match(str(text))
    if not m:
        raise ValueError(f"cannot read {text!r} as a size; use bytes or a number with K, M, G, T")
    return int(float(m.group(1)) * _SIZE_UNITS[m.group(2).lower()])
