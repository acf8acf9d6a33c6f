"""Kubernetes resource quantities and Go durations as plain numbers.

What it owns: exact parsing of the quantity strings the API accepts (``64Gi``, ``500m``, ``1.5T``)
into bytes or cores, and of Go duration strings (``30s``, ``1h30m``) into seconds. The CEL
``quantity()`` and ``duration()`` functions used by ``tandem validate`` and the pure planners both
rely on these, so the offline validator and the planners agree with the API server's arithmetic.

Worked example: ``parse_quantity("64Gi") == 68719476736``; ``parse_quantity("500m") == Fraction(1, 2)``;
``parse_duration("1h30m") == 5400.0``; ``parse_duration("2562048h")`` raises (beyond Go's int64 nanoseconds).
"""

from __future__ import annotations

import re
from fractions import Fraction

_BINARY: dict[str, int] = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL: dict[str, Fraction | int] = {
    "m": Fraction(1, 1000),
    "": 1,
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "P": 10**15,
    "E": 10**18,
}
_QUANTITY = re.compile(r"^([0-9]+(?:\.[0-9]+)?)(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E|m)?$")
_DURATION_PART = re.compile(r"([0-9]+(?:\.[0-9]+)?)(ms|s|m|h)")
_DURATION_UNITS_NS = {"ms": 10**6, "s": 10**9, "m": 60 * 10**9, "h": 3600 * 10**9}
# Go's time.Duration is an int64 of nanoseconds: about 292 years. The API server's CEL `duration()`
# refuses anything longer, and so must every parser here (a longer one overflowed timedelta arithmetic).
MAX_DURATION_NS = 2**63 - 1
MAX_DURATION = "2562047h"  # the longest whole-hour duration Go can hold; what CRD rules compare against


def parse_quantity(text: str) -> Fraction:
    """Return the exact value of a Kubernetes quantity; raise ValueError on anything else."""
    match = _QUANTITY.match(text.strip())
    if not match:
        raise ValueError(f"not a quantity: {text!r}")
    number, suffix = match.group(1), match.group(2) or ""
    scale: Fraction | int = _BINARY.get(suffix) or _DECIMAL[suffix]
    return Fraction(number) * scale


def quantity_bytes(text: str) -> int:
    """A memory quantity in whole bytes (rounded down)."""
    return int(parse_quantity(text))


def parse_duration_ns(text: str) -> int:
    """A Go duration string in whole nanoseconds, exactly as Go's ``time.ParseDuration`` reads it.

    Raise ValueError on anything else, including a duration beyond Go's int64 nanoseconds (~292 years).
    """
    text = text.strip()
    pos, total = 0, Fraction(0)
    for match in _DURATION_PART.finditer(text):
        if match.start() != pos:
            break
        total += Fraction(match.group(1)) * _DURATION_UNITS_NS[match.group(2)]
        if total > MAX_DURATION_NS:
            raise ValueError(f"duration out of range (more than {MAX_DURATION}, Go's limit): {text[:40]!r}")
        pos = match.end()
    if pos != len(text) or not text:
        raise ValueError(f"not a duration: {text[:40]!r}")
    return int(total)


def parse_duration(text: str) -> float:
    """Return a Go duration string in seconds; raise ValueError on anything else (see parse_duration_ns)."""
    return parse_duration_ns(text) / 10**9


def format_bytes(value: int) -> str:
    """A byte count as the shortest exact binary quantity (``68719476736`` → ``64Gi``)."""
    for suffix in ("Ei", "Pi", "Ti", "Gi", "Mi", "Ki"):
        unit = _BINARY[suffix]
        if value and value % unit == 0:
            return f"{value // unit}{suffix}"
    return str(value)
