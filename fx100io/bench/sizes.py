"""Parsing and printing of quantities the way fio users write and read them.

fio's default ``kb_base=1024`` makes the plain prefixes binary ("4k" == 4096)
and, for compatibility with old scripts, the "i" prefixes decimal
("1mi" == 1000000).  We follow that default exactly so that job files written
for fio mean the same thing here; ``kb_base=1000`` flips to SI meaning.
"""

from __future__ import annotations

import math
import re

from .errors import BenchError

_PREFIX_POWER = {"": 0, "k": 1, "m": 2, "g": 3, "t": 4, "p": 5, "e": 6}

_SIZE_RE = re.compile(r"^\s*(0x[0-9a-f]+|\d+(?:\.\d*)?|\.\d+)\s*([kmgtpe]?)(i?)(b?)\s*$", re.IGNORECASE)


def parse_size(text: str, option: str = "size", kb_base: int = 1024) -> int:
    """Bytes from fio's size syntax: 4096, 4k, 4KiB, 1.5g, 0x1000, 1mi.

    Raises BenchError naming ``option`` on anything else, so the user sees
    which of their settings was wrong rather than a ValueError.
    """
    if kb_base not in (1000, 1024):
        raise BenchError(f"--kb_base: must be 1000 or 1024, not {kb_base}")
    m = _SIZE_RE.match(str(text))
    if not m:
        raise BenchError(f"--{option}: cannot parse size {text!r} (examples: 4096, 4k, 1m, 2g)")
    number, prefix, i_flag, _b = m.groups()
    if number.lower().startswith("0x"):
        value: float = int(number, 16)
    else:
        value = float(number) if "." in number else int(number)
    power = _PREFIX_POWER[prefix.lower()]
    # With kb_base=1024 a bare prefix is binary and "i" means decimal (fio's
    # documented inversion); kb_base=1000 follows SI / IEC literally.
    binary = (not i_flag) if kb_base == 1024 else bool(i_flag)
    base = 1024 if binary else 1000
    result = value * base**power
    if isinstance(result, float):
        if not math.isfinite(result):
            raise BenchError(f"--{option}: size {text!r} is out of range")
        result = round(result)
    return int(result)


def parse_size_or_percent(text: str, option: str, kb_base: int = 1024) -> int | float:
    """A size in bytes, or a float fraction in (0, 1] for "NN%" forms.

    fio lets size= and offset= be a percentage of the file; the caller
    resolves the fraction once the target's real size is known.
    """
    s = str(text).strip()
    if s.endswith("%"):
        try:
            pct = float(s[:-1])
        except ValueError:
            raise BenchError(f"--{option}: cannot parse percentage {text!r}") from None
        if not 0 <= pct <= 100:
            raise BenchError(f"--{option}: percentage must be between 0 and 100, not {text!r}")
        return pct / 100.0
    return parse_size(s, option, kb_base)


_TIME_UNITS_NS = {
    "": 1_000_000_000,  # fio's default unit for time options is seconds
    "s": 1_000_000_000,
    "sec": 1_000_000_000,
    "ms": 1_000_000,
    "msec": 1_000_000,
    "us": 1_000,
    "usec": 1_000,
    "m": 60 * 1_000_000_000,
    "min": 60 * 1_000_000_000,
    "h": 3600 * 1_000_000_000,
    "d": 86400 * 1_000_000_000,
}

_TIME_RE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-z]*)\s*$", re.IGNORECASE)


def parse_time_ns(text: str, option: str) -> int:
    """Nanoseconds from fio's time syntax: 10 (seconds), 500ms, 2m, 1h, 100us."""
    m = _TIME_RE.match(str(text))
    unit = m.group(2).lower() if m else None
    if not m or unit not in _TIME_UNITS_NS:
        raise BenchError(f"--{option}: cannot parse time {text!r} (examples: 10, 10s, 500ms, 2m)")
    return round(float(m.group(1)) * _TIME_UNITS_NS[unit])


def parse_bool(text: str | None, option: str) -> bool:
    """fio booleans: 1/0 (plus true/false/yes/no/on/off); a bare flag means true."""
    if text is None:
        return True
    s = str(text).strip().lower()
    if s in ("1", "true", "yes", "on"):
        return True
    if s in ("0", "false", "no", "off"):
        return False
    raise BenchError(f"--{option}: expected 1 or 0, not {text!r}")


def parse_int(text: str, option: str, minimum: int | None = None, maximum: int | None = None) -> int:
    """An integer option with bounds, errors naming the option."""
    s = str(text).strip()
    try:
        value = int(s, 16) if s.lower().startswith("0x") else int(s)
    except ValueError:
        raise BenchError(f"--{option}: expected an integer, not {text!r}") from None
    if minimum is not None and value < minimum:
        raise BenchError(f"--{option}: must be at least {minimum}, not {value}")
    if maximum is not None and value > maximum:
        raise BenchError(f"--{option}: must be at most {maximum}, not {value}")
    return value


# ---------------------------------------------------------------- printing


def num2str(value: float, base: int = 1000, unit: str = "", maxlen: int = 4) -> str:
    """Compact human number in fio's summary style: 67.9k, 265MiB, 5704KiB.

    The rule (read off fio's output, not its code): scale by ``base`` until the
    integer part has at most ``maxlen`` digits, then spend the remaining width
    on decimals.  Binary scaling writes Ki/Mi/..; decimal writes k/M/G for
    bytes ("kB", "MB") and lower-case k for plain counts ("67.9k").
    """
    if value < 0:
        return "-" + num2str(-value, base, unit, maxlen)
    prefixes_bin = ["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"]
    prefixes_dec = ["", "k", "M", "G", "T", "P", "E"]
    prefixes = prefixes_bin if base == 1024 else prefixes_dec
    idx = 0
    v = float(value)
    while idx < len(prefixes) - 1 and len(str(int(v))) > maxlen:
        v /= base
        idx += 1
    if idx == 0:
        return f"{int(v)}{unit}"
    int_digits = len(str(round(v)))
    if int_digits > maxlen and idx < len(prefixes) - 1:
        # Rounding widened it (9999.7k): one more step down in scale.
        v /= base
        idx += 1
        int_digits = len(str(round(v)))
    # Spend the width left over on decimals (fio prints "4.00MiB", "67.9k");
    # rounding can carry into a new digit (9.997 -> "10.00"), so re-check.
    decimals = max(0, maxlen - int_digits - 1)
    text = f"{v:.{decimals}f}"
    while decimals > 0 and len(text) > maxlen:
        decimals -= 1
        text = f"{v:.{decimals}f}"
    return f"{text}{prefixes[idx]}{unit}"


def fmt_bytes_bin(n: float) -> str:
    """265MiB style (fio: BW=265MiB/s, io=5704KiB)."""
    return num2str(n, 1024, "B")


def fmt_bytes_dec(n: float) -> str:
    """278MB style; fio writes the decimal kilo as lower-case 'kB'."""
    return num2str(n, 1000, "B")


def fmt_count(n: float) -> str:
    """67.9k style for IOPS and counts."""
    return num2str(n, 1000, "")


def fmt_duration_ns(ns: int) -> str:
    """Short run length for the summary: 21msec, 10001msec (fio keeps msec)."""
    return f"{int(ns // 1_000_000)}msec"
