"""Strict parsing and formatting of units: bandwidth (bits/s), sizes (bytes), durations (s).

Accepted spellings (case of the prefix letter matters only for ``m`` vs ``M``
in durations, where ``ms`` is milliseconds):

- bandwidth: ``10Gbit``, ``10Gbit/s``, ``10Gbps``, ``100Mbit``, ``1.25GB/s``,
  ``125MB/s``, ``800Kbit/s``; decimal prefixes (k = 10³ … T = 10¹²); ``B`` is a
  byte (8 bits), ``bit``/``b``+``ps`` a bit. A bare number, or ``10G``, is ambiguous
  and rejected.
- sizes: ``64KB``, ``1MB`` (decimal, 10⁶ bytes), ``1MiB`` (binary, 2²⁰ bytes),
  ``512B``; a bare integer is taken as bytes only when ``bare_ok=True``.
- durations: ``50us``, ``50µs``, ``1.5ms``, ``2s``, ``100ns``; a bare number is rejected.
"""

from __future__ import annotations

import decimal
import math
import numbers
import re
from typing import NamedTuple

_NUMBER = r"(?P<num>[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)"
_DECIMAL = {"": 1.0, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}
_BINARY = {"Ki": 2.0**10, "Mi": 2.0**20, "Gi": 2.0**30, "Ti": 2.0**40}

_BANDWIDTH = re.compile(
    _NUMBER + r"\s*(?P<prefix>[kKMGT]?)(?P<unit>bit/s|bits/s|bit|bits|bps|b/s|B/s|Bps|B)$"
)
_SIZE = re.compile(_NUMBER + r"\s*(?P<prefix>Ki|Mi|Gi|Ti|[kKMGT]?)(?P<unit>B|bytes?)?$")
_DURATION = re.compile(_NUMBER + r"\s*(?P<unit>ns|us|µs|ms|s|min)$")
_DURATION_SCALE = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "min": 60.0}

MIN_BANDWIDTH_BPS = 1e3
"""Slowest link a projection or emulation accepts (bits/s): 1 kbit/s."""
MAX_BANDWIDTH_BPS = 1e15
"""Fastest link accepted (bits/s): 1 Pbit/s, above any NIC or NVLink."""
MAX_LATENCY_S = 60.0
"""Longest per-message latency accepted (seconds)."""


def check_bandwidth(bps: float, what: str = "bandwidth") -> float:
    """``bps`` (bits/s) when inside [:data:`MIN_BANDWIDTH_BPS`, :data:`MAX_BANDWIDTH_BPS`];
    ValueError (one line) otherwise."""
    if not (MIN_BANDWIDTH_BPS <= bps <= MAX_BANDWIDTH_BPS):
        raise ValueError(f"{what} {bps!r} bits/s is outside the physical range "
                         f"{format_bandwidth(MIN_BANDWIDTH_BPS)} … {format_bandwidth(MAX_BANDWIDTH_BPS)}")
    return bps


def check_latency(seconds: float, what: str = "latency") -> float:
    """``seconds`` when inside [0, :data:`MAX_LATENCY_S`]; ValueError (one line) otherwise."""
    if not (0 <= seconds <= MAX_LATENCY_S):
        raise ValueError(f"{what} {seconds!r} s is outside the physical range 0 s … {MAX_LATENCY_S:g} s")
    return seconds


def _refuse_negative(text: str, what: str, rule: str) -> None:
    """ValueError naming the sign when ``text`` is a negative quantity (``-10Gbit`` has its unit)."""
    if str(text).strip().startswith("-"):
        raise ValueError(f"invalid {what} {text!r}: negative, {what} {rule}")


def parse_bandwidth(text: str) -> float:
    """Parse a bandwidth such as ``10Gbit`` or ``1.25GB/s``; return bits per second, inside
    [:data:`MIN_BANDWIDTH_BPS`, :data:`MAX_BANDWIDTH_BPS`]."""
    _refuse_negative(text, "bandwidth", "must be > 0")
    match = _BANDWIDTH.match(str(text).strip())
    if not match:
        raise ValueError(
            f"invalid bandwidth {text!r}: give a unit, e.g. 10Gbit, 100Mbit/s or 1.25GB/s"
        )
    value = float(match["num"]) * _DECIMAL[match["prefix"]]
    if match["unit"] in ("B/s", "Bps", "B"):
        value *= 8.0
    if not value > 0:
        raise ValueError(f"invalid bandwidth {text!r}: must be > 0")
    if not MIN_BANDWIDTH_BPS <= value <= MAX_BANDWIDTH_BPS:
        raise ValueError(f"invalid bandwidth {text!r}: outside the physical range "
                         f"{format_bandwidth(MIN_BANDWIDTH_BPS)} … {format_bandwidth(MAX_BANDWIDTH_BPS)}")
    return value


def parse_bytes(text: str, *, bare_ok: bool = False) -> int:
    """Parse a size such as ``64KB``, ``1MiB`` or ``512B``; return bytes (≥ 0)."""
    _refuse_negative(text, "size", "must be >= 0")
    raw = str(text).strip()
    match = _SIZE.match(raw)
    if not match or (match["unit"] is None and not bare_ok) or (match["unit"] is None and match["prefix"]):
        raise ValueError(f"invalid size {text!r}: give a unit, e.g. 64KB, 1MB or 1MiB")
    prefix = match["prefix"]
    scale = _BINARY[prefix] if prefix in _BINARY else _DECIMAL[prefix]
    value = float(match["num"]) * scale
    if value != int(value):
        raise ValueError(f"invalid size {text!r}: not a whole number of bytes")
    return int(value)


def parse_duration(text: str) -> float:
    """Parse a duration such as ``50us``, ``1.5ms`` or ``2s``; return seconds (≥ 0)."""
    _refuse_negative(text, "duration", "must be >= 0")
    match = _DURATION.match(str(text).strip())
    if not match:
        raise ValueError(f"invalid duration {text!r}: give a unit, e.g. 50us, 1.5ms or 2s")
    value = float(match["num"]) * _DURATION_SCALE[match["unit"]]
    if not math.isfinite(value):
        raise ValueError(f"invalid duration {text!r}: too large")
    return value


def parse_list(text: str, parse) -> list:
    """Parse a comma-separated list with ``parse`` applied to each item; an empty list or an
    empty item (``4,,8``, ``4,``) is an error. A value given twice (``0.01,0.01``, or ``1MB,1000KB``
    once parsed) is kept once, at its first place."""
    items = [item.strip() for item in str(text).split(",")]
    if not any(items):
        raise ValueError(f"empty list {text!r}")
    if not all(items):
        raise ValueError(f"empty item in list {text!r}: separate values with single commas, e.g. 4,8")
    return list(dict.fromkeys(parse(item) for item in items))


def format_bandwidth(bps: float) -> str:
    """Format bits per second with a decimal prefix, e.g. ``10 Gbit/s``."""
    for prefix, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if bps >= scale:
            return f"{bps / scale:g} {prefix}bit/s"
    return f"{bps:g} bit/s"


def format_bytes(nbytes: float) -> str:
    """Format bytes with a decimal prefix, e.g. ``1.5 MB`` (10⁶ bytes)."""
    for prefix, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if nbytes >= scale:
            return f"{nbytes / scale:.3g} {prefix}B"
    return f"{nbytes:g} B"


def format_seconds(seconds: float) -> str:
    """Format a duration with a readable unit, e.g. ``12.3 ms``; zero is ``0 s``."""
    if seconds == 0 or seconds >= 1:
        return f"{seconds:.3g} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.3g} ms"
    if seconds >= 1e-6:
        return f"{seconds * 1e6:.3g} µs"
    return f"{seconds * 1e9:.3g} ns"


PLAIN_COUNT_BELOW = 1e15
"""Counts below this print in full with thousands separators; larger ones in exponent form."""


def format_count(value: float, decimals: int = 0) -> str:
    """A count (nodes, messages; or a size in a named unit, ``decimals`` digits after the point) for
    people: ``1,024`` (thousands separators) below :data:`PLAIN_COUNT_BELOW`, else the exponent form
    with up to 3 significant digits (``1e308``, ``2.5e20``), never hundreds of digits. An int too
    large for a float prints the same way."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if abs(value) < PLAIN_COUNT_BELOW:
        return f"{value:,.{decimals}f}" if decimals or not isinstance(value, int) else f"{value:,}"
    mantissa, exponent = format(decimal.Decimal(value), ".2e").split("e")
    return f"{mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"


def check_density(value: object, what: str = "density") -> float:
    """The one density rule: a target density (the fraction of elements sent) is a real number in
    (0, 1]. Returns it as a float; ``ValueError`` naming ``what`` otherwise (NaN and ±inf fail)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{what} must be a number in (0, 1], got {value!r}")
    if not 0 < float(value) <= 1:
        raise ValueError(f"{what} must be in (0, 1], got {value!r}")
    return float(value)


NO_DENSITY_STORED = 1.0
"""The number a store row or a replay records for a pair without a density (a store's density
columns key their rows, so they hold a number): read back as ``None`` by :func:`pipeline.request.pair`."""


class Pair(NamedTuple):
    """A (compressor, density) pair: ``density`` the target fraction of elements sent, in (0, 1],
    or ``None`` (the one "no density") for a compressor whose message ignores it (``none``, the
    dense casts, PowerSGD). Which compressors take a density is the compressors' rule:
    :func:`pipeline.request.pair` builds a pair by it, from a door's input or a stored row."""

    compressor: str
    density: float | None = None

    @property
    def label(self) -> str:
        """The one label rule: ``topk@0.01``, or the bare name when there is no density (``fp16``)."""
        return self.compressor if self.density is None else f"{self.compressor}@{self.density:g}"

    @property
    def stored_density(self) -> float:
        """The density a store row and a replay record for this pair (:data:`NO_DENSITY_STORED`
        for a pair without one)."""
        return NO_DENSITY_STORED if self.density is None else self.density


def check_count(value: object, what: str) -> int:
    """The one count rule: a count of things (nodes, ranks, rounds, seeds, a batch's samples) is a
    whole number >= 1 (a bool is not). Returns it as an int; ``ValueError`` naming ``what`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{what} must be an integer >= 1, got {value!r}")
    return int(value)


def parse_count(text: object, what: str) -> int:
    """A count given as text (an option's value, a form's field), read as an integer and held to
    :func:`check_count`; ``ValueError`` naming ``what`` otherwise."""
    try:
        number = int(str(text).strip())
    except ValueError:
        raise ValueError(f"{what} must be an integer >= 1, got {text!r}") from None
    return check_count(number, what)


def parse_density(text: str) -> float:
    """Parse a target density: the fraction of elements sent, a number in (0, 1]."""
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"invalid density {text!r}: give a fraction in (0, 1], e.g. 0.01") from None
    return check_density(value, f"invalid density {text!r}:")
