"""How an interval reads: as a ratio or a relative half-width, or "too noisy to say" when it
reaches more than the value itself away from the value (a ±6831% says nothing a reader can
use)."""

from __future__ import annotations

import math

from attnbench.stats import ratios
from attnbench.stats.intervals import Interval

TOO_NOISY = "too noisy to say"
MAX_REACH = 1.0  # relative: the interval reaches past 0 or past twice the value


def reach(value: float, low: float, high: float) -> float:
    """How far the interval reaches from the value, relative to it (inf when undefined)."""
    if not all(map(math.isfinite, (value, low, high))) or value == 0:
        return math.inf
    return max(high - value, value - low) / abs(value)


def too_noisy(value: float, low: float, high: float) -> bool:
    return reach(value, low, high) > MAX_REACH


def ratio_text(iv: Interval, unit: str = "x") -> str:
    """'8.31x [7.92, 8.80]', or 'too noisy to say' with the estimate beside it."""
    if iv.low != iv.high and too_noisy(iv.estimate, iv.low, iv.high):
        return f"{TOO_NOISY} ({iv.estimate:.3g}{unit})"
    return ratios.format_ratio(iv, unit)


def half_width_text(value: float, low: float, high: float) -> str:
    """' ±12%' of a value's interval, or ' (too noisy to say)'."""
    if too_noisy(value, low, high):
        return f" ({TOO_NOISY})"
    return f" ±{reach(value, low, high):.0%}"
