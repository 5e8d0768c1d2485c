"""Human units for bytes, seconds and rates (tables, plot labels and the console summary)."""

from __future__ import annotations

import math
from typing import TypeGuard

_BYTE_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")
MISSING = "—"


def is_number(value: object) -> TypeGuard[int | float]:
    """True for a finite int or float (bools are not numbers here)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    return math.isfinite(value)


def human_bytes(n: object) -> str:
    """`1536` -> `1.5 KiB` (binary units, three significant digits); `—` when unknown."""
    if not is_number(n):
        return MISSING
    value = float(n)
    sign = "-" if value < 0 else ""
    value = abs(value)
    for unit in _BYTE_UNITS:
        if value < 1024 or unit == _BYTE_UNITS[-1]:
            if unit == "B":
                return f"{sign}{value:.0f} B"
            return f"{sign}{_three_digits(value)} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def human_seconds(s: object) -> str:
    """`0.0123` -> `12.3 ms`, `12.34` -> `12.3 s`, `200` -> `3 min 20 s`; `—` when unknown."""
    if not is_number(s):
        return MISSING
    value = float(s)
    if value < 0:
        return "-" + human_seconds(-value)
    if value == 0:
        return "0 s"
    if value < 1e-3:
        return f"{_three_digits(value * 1e6)} µs"
    if value < 1:
        return f"{_three_digits(value * 1e3)} ms"
    if value < 60:
        return f"{_three_digits(value)} s"
    minutes, seconds = divmod(round(value), 60)
    if minutes < 60:
        return f"{minutes} min {seconds} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min"


def human_rate(samples_per_s: object) -> str:
    """`1234.5` -> `1,234 samples/s`; small rates keep three significant digits."""
    if not is_number(samples_per_s):
        return MISSING
    value = float(samples_per_s)
    if abs(value) >= 100:
        return f"{value:,.0f} samples/s"
    return f"{_three_digits(value)} samples/s"


def human_number(value: object) -> str:
    """A metric value for a table: ints with separators, floats with four significant digits."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)
        return f"{value:.4g}"
    if value is None:
        return MISSING
    return str(value)


def percent(fraction: object) -> str:
    """`0.9375` -> `93.8 %`; `—` when unknown."""
    if not is_number(fraction):
        return MISSING
    return f"{float(fraction) * 100:.1f} %"


def _three_digits(value: float) -> str:
    """Three significant digits without scientific notation: 1.50, 15.0, 150."""
    if value >= 100:
        return f"{value:.0f}"
    if value >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"
