"""Units: quantities written by people ("200 Gb/s", "2 us", "80 GiB") to SI floats, and back.

Inside the emulator everything is SI: bytes, seconds, bytes/s, FLOPs, FLOP/s.
Strings are converted once, at the config boundary, by the ``parse_*`` functions:

- sizes: B, kB/KB, MB, GB, TB, PB (powers of 1000); KiB, MiB, GiB, TiB, PiB (powers of 1024);
- durations: s, ms, us, µs, ns, min, h;
- bandwidths: b/s, Kb/s, Mb/s, Gb/s, Tb/s (bits, divided by 8), B/s, KB/s, MB/s, GB/s,
  TB/s, KiB/s, MiB/s, GiB/s (bytes); "Gbps" / "GBps" spellings too;
- FLOP rates: FLOP/s, GFLOP/s, TFLOP/s, PFLOP/s, also "TFLOPS";
- FLOP counts: FLOP, GFLOP, TFLOP, PFLOP.

Case matters for b (bit) against B (byte). The space between number and unit is
optional. In a scenario a bare number where a unit is needed is an error
(:class:`UnitError`); in files written by programs (traces, graph files)
:func:`parse_si` reads a plain number as SI.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Callable

from emulator.errors import UnitError

__all__ = [
    "UnitError", "parse_bytes", "parse_time", "parse_bandwidth", "parse_flops_rate",
    "parse_flops", "parse_si", "format_bytes", "format_time", "format_bandwidth",
    "format_flops_rate", "UNIT_PATTERNS", "KINDS", "parse_ratio", "RATIO_PATTERN",
]

_NUMBER = r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?"
_QUANTITY = re.compile(rf"^\s*({_NUMBER})\s*(\S.*?)?\s*$", re.DOTALL)

_SI_PREFIX = {"": 1.0, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15}
_BIN_PREFIX = {"Ki": 2.0**10, "Mi": 2.0**20, "Gi": 2.0**30, "Ti": 2.0**40, "Pi": 2.0**50}


def _byte_units() -> dict[str, float]:
    units = {p + "B": f for p, f in {**_SI_PREFIX, **_BIN_PREFIX}.items()}
    return units


def _bandwidth_units() -> dict[str, float]:
    units: dict[str, float] = {}
    for prefix, factor in {**_SI_PREFIX, **_BIN_PREFIX}.items():
        for base, per in (("b", factor / 8.0), ("B", factor)):
            units[f"{prefix}{base}/s"] = per
            units[f"{prefix}{base}ps"] = per
    return units


_TIME_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ns": 1e-9,
               "min": 60.0, "h": 3600.0}
_FLOP_PREFIX = {"": 1.0, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18}


def _flop_units(bodies: tuple[str, ...]) -> dict[str, float]:
    """Prefix + body; the body (FLOP, FLOP/s, ...) is matched case-insensitively."""
    return {p + b: f for p, f in _FLOP_PREFIX.items() for b in bodies}


@dataclass(frozen=True)
class _Kind:
    name: str  # "a bandwidth"
    examples: str  # '"200 Gb/s" or "25 GB/s"'
    units: dict[str, float]
    si_unit: str
    maximum: float  # larger values are refused as absurd
    fold_case: bool = False  # units compared upper-cased (FLOP spellings)

    def factor(self, unit: str) -> float | None:
        if self.fold_case:
            for prefix, f in _FLOP_PREFIX.items():
                if prefix and unit.startswith(prefix) and unit[len(prefix):].upper() in self.units:
                    return f * self.units[unit[len(prefix):].upper()]
            return self.units.get(unit.upper())
        return self.units.get(unit)


KINDS: dict[str, _Kind] = {
    "bytes": _Kind("a size", '"80 GiB" or "25 MB"', _byte_units(), "B", 1e18),
    "time": _Kind("a duration", '"2 us" or "1.5 ms"', _TIME_UNITS, "s", 1e7),
    "bandwidth": _Kind("a bandwidth", '"200 Gb/s" or "25 GB/s"', _bandwidth_units(), "B/s", 1e16),
    "flops_rate": _Kind("a FLOP rate", '"312 TFLOP/s"',
                        {"FLOP/S": 1.0, "FLOPS": 1.0, "FLOPS/S": 1.0}, "FLOP/s", 1e19, True),
    "flops": _Kind("a FLOP count", '"4.2 TFLOP"', {"FLOP": 1.0, "FLOPS": 1.0}, "FLOP", 1e24, True),
}


def _show(v: object) -> str:
    """How a found value is described in a message."""
    if v is None:
        return "nothing (null)"
    if isinstance(v, bool):
        return f"the boolean {str(v).lower()}"
    if isinstance(v, (int, float)):
        text = repr(v) if not isinstance(v, int) or abs(v) < 10**30 else f"a {len(str(abs(v)))}-digit number"
        return f"the bare number {text}"
    if isinstance(v, str):
        text = v if len(v) <= 40 else v[:37] + "..."
        return '"' + text.encode("unicode_escape").decode("ascii").replace('"', '\\"') + '"'
    return f"a {type(v).__name__}"


def _expected(kind: _Kind) -> str:
    return f"expected {kind.name} with a unit such as {kind.examples}"


def _check_magnitude(value: float, kind: _Kind, found: object) -> float:
    if math.isnan(value) or math.isinf(value):
        raise UnitError(f"{_expected(kind)}, got {_show(found)}, which is not a finite number")
    if value < 0:
        raise UnitError(f"{_expected(kind)}, got {_show(found)}: it must not be negative")
    if value > kind.maximum:
        raise UnitError(f"{_expected(kind)}, got {_show(found)}: more than "
                        f"{kind.maximum:g} {kind.si_unit} is not plausible")
    return value


def _unit_hint(kind_key: str, unit: str) -> str:
    if kind_key == "bytes" and unit.endswith("b"):
        return '; a lowercase "b" means bits, sizes are in bytes ("B")'
    if kind_key == "bandwidth" and KINDS["bytes"].factor(unit) is not None:
        return f'; a bandwidth needs a rate, e.g. "{unit}/s"'
    if kind_key == "bytes" and unit.endswith(("/s", "ps")):
        return "; that is a bandwidth, a size has no /s"
    if kind_key == "flops_rate" and KINDS["flops"].factor(unit) is not None:
        return f'; a FLOP rate needs a rate, e.g. "{unit}/s"'
    return ""


def _parse(v: object, kind_key: str, bare_ok: bool) -> float:
    kind = KINDS[kind_key]
    if isinstance(v, bool):
        raise UnitError(f"{_expected(kind)}, got {_show(v)}")
    if isinstance(v, (int, float)):
        if not bare_ok:
            raise UnitError(f"{_expected(kind)}, got {_show(v)}")
        try:
            value = float(v)
        except OverflowError:
            raise UnitError(f"{_expected(kind)}, got {_show(v)}: too large") from None
        return _check_magnitude(value, kind, v)
    if not isinstance(v, str):
        raise UnitError(f"{_expected(kind)}, got {_show(v)}")
    m = _QUANTITY.match(v)
    if not m:
        raise UnitError(f"{_expected(kind)}, got {_show(v)}, which does not start with a number")
    number, unit = m.group(1), m.group(2)
    value = float(number)
    if unit is None:
        if not bare_ok:
            raise UnitError(f"{_expected(kind)}, got {_show(v)}, which has no unit")
        return _check_magnitude(value, kind, v)
    factor = kind.factor(unit)
    if factor is None:
        raise UnitError(f'{_expected(kind)}, got {_show(v)}: unknown unit "{unit}" '
                        f"for {kind.name}{_unit_hint(kind_key, unit)}")
    return _check_magnitude(value * factor, kind, v)


def parse_bytes(v: object) -> float:
    """A size with a unit ("80 GiB", "25 MB") in bytes."""
    return _parse(v, "bytes", bare_ok=False)


def parse_time(v: object) -> float:
    """A duration with a unit ("2 us", "1.5 ms") in seconds."""
    return _parse(v, "time", bare_ok=False)


def parse_bandwidth(v: object) -> float:
    """A bandwidth with a unit ("200 Gb/s" = 25e9, "25 GB/s") in bytes per second."""
    return _parse(v, "bandwidth", bare_ok=False)


def parse_flops_rate(v: object) -> float:
    """A FLOP rate with a unit ("312 TFLOP/s", "989.4 TFLOPS") in FLOP/s."""
    return _parse(v, "flops_rate", bare_ok=False)


def parse_flops(v: object) -> float:
    """A FLOP count with a unit ("4.2 TFLOP") in FLOPs."""
    return _parse(v, "flops", bare_ok=False)


def parse_si(v: object, kind: str) -> float:
    """For files written by programs: a plain number (or numeric string) is already SI;
    a string with a unit is converted. ``kind``: bytes | time | bandwidth | flops | flops_rate."""
    if kind not in KINDS:
        raise ValueError(f"unknown quantity kind {kind!r}; known: {', '.join(KINDS)}")
    return _parse(v, kind, bare_ok=True)


_RATIO = re.compile(rf"^\s*({_NUMBER})\s*(?:([/:])\s*({_NUMBER}))?\s*$")


def parse_ratio(v: object) -> float:
    """A plain ratio: a number (0.8), a fraction ("230/300") or a proportion ("2:1" = 2.0)."""
    expected = 'expected a number or a ratio such as 0.8, "230/300" or "2:1"'
    if isinstance(v, bool) or not isinstance(v, (int, float, str)):
        raise UnitError(f"{expected}, got {_show(v)}")
    shown = _show(v).replace("the bare number ", "")
    if isinstance(v, str):
        m = _RATIO.match(v)
        if not m:
            raise UnitError(f"{expected}, got {shown}")
        value = float(m.group(1))
        if m.group(3) is not None:
            denominator = float(m.group(3))
            if denominator == 0:
                raise UnitError(f"{expected}, got {shown}, which divides by zero")
            value = value / denominator
    else:
        try:
            value = float(v)
        except OverflowError:
            raise UnitError(f"{expected}, got {shown}: too large") from None
    if math.isnan(value) or math.isinf(value) or value < 0 or value > 1e12:
        raise UnitError(f"{expected}, got {shown}: it must be a finite, non-negative number")
    return value


_NUMBER_PATTERN = r"\+?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?"
RATIO_PATTERN = rf"^\s*{_NUMBER_PATTERN}\s*(?:[/:]\s*{_NUMBER_PATTERN})?\s*$"


PARSERS: dict[str, Callable[[object], float]] = {
    "bytes": parse_bytes, "time": parse_time, "bandwidth": parse_bandwidth,
    "flops_rate": parse_flops_rate, "flops": parse_flops,
}


def _pattern(kind: _Kind) -> str:
    """An anchored ECMA-262 regex (for JSON Schema) of the strings ``_parse`` accepts."""
    def spell(unit: str) -> str:
        if not kind.fold_case:
            return re.escape(unit)
        return "".join(f"[{c.upper()}{c.lower()}]" if c.isalpha() else re.escape(c) for c in unit)
    bodies = sorted(kind.units, key=len, reverse=True)
    units = "|".join(spell(u) for u in bodies)
    if kind.fold_case:
        prefixes = "".join(p for p in _FLOP_PREFIX if p)
        units = f"[{prefixes}]?(?:{units})"
    number = r"\+?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?"
    return rf"^\s*{number}\s*(?:{units})\s*$"


UNIT_PATTERNS: dict[str, str] = {k: _pattern(kind) for k, kind in KINDS.items()}


def _scaled(value: float, steps: list[tuple[float, str]], decimals: int = 1) -> str:
    for factor, unit in steps:
        if abs(value) >= factor:
            return f"{value / factor:.{decimals}f} {unit}"
    factor, unit = steps[-1]
    return f"{value / factor:.{decimals}f} {unit}"


def format_bytes(b: float) -> str:
    """Binary units for people: 1610612736 -> "1.5 GiB"; below 1 KiB, whole bytes ("512 B")."""
    if abs(b) < 1024:
        return f"{b:.0f} B"
    return _scaled(b, [(2.0**50, "PiB"), (2.0**40, "TiB"), (2.0**30, "GiB"), (2.0**20, "MiB"),
                       (2.0**10, "KiB")])


def format_time(s: float) -> str:
    """0.0123 -> "12.3 ms"; picks s, ms, us or ns."""
    if s == 0:
        return "0 s"
    return _scaled(s, [(1.0, "s"), (1e-3, "ms"), (1e-6, "us"), (1e-9, "ns")])


def format_bandwidth(bps: float) -> str:
    """Decimal bytes per second, as nccl-tests: 230e9 -> "230.0 GB/s"."""
    return _scaled(bps, [(1e12, "TB/s"), (1e9, "GB/s"), (1e6, "MB/s"), (1e3, "KB/s"), (1.0, "B/s")])


def format_flops_rate(fps: float) -> str:
    """312e12 -> "312.0 TFLOP/s"."""
    return _scaled(fps, [(1e15, "PFLOP/s"), (1e12, "TFLOP/s"), (1e9, "GFLOP/s"), (1e6, "MFLOP/s"),
                         (1.0, "FLOP/s")])
