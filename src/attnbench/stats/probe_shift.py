"""Whether the machine under one record differed between two runs unlike the rest of the run.

The drift probe is read between a group's rounds, so each record carries the probe's
readings from its own rounds. Paired rounds divide out a move that slows every backend of
the group alike, but a neighbour's burst on a shared host does not: a memory-bound backend
slows more than a compute-bound one in the same rounds, so their ratio moves with no change
of code. When the probe's level in one record's rounds moved between the runs unlike the
run's own move (the median of every record's), beyond the two medians' own intervals and
what two runs of one machine state may differ by, that record's change says nothing about
its code.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from attnbench.stats import run_to_run
from attnbench.stats.intervals import median_interval

MIN_READINGS = 4  # fewer probe readings give the level no interval


@dataclass(frozen=True)
class Shift:
    """The probe's time ratio new / base in one record's rounds, over the run's (``factor``:
    > 1 the machine ran that record's rounds slower than the run's move), and the factor it
    had to pass (``limit``)."""

    factor: float
    limit: float

    def text(self) -> str:
        return f"{self.factor:.3g}x, beyond {self.limit:.3g}x"


def _level(readings) -> tuple[float, float] | None:
    """The probe's median rate in a group's rounds and its interval's half-width (log)."""
    x = np.asarray(readings if readings is not None else [], dtype=float).ravel()
    x = x[np.isfinite(x) & (x > 0)]
    if x.size < MIN_READINGS:
        return None
    iv = median_interval(x)
    return iv.estimate, max(math.log(iv.estimate / iv.low), math.log(iv.high / iv.estimate))


def time_ratio(base_readings, new_readings) -> float | None:
    """The probe's time new / base in one record's rounds (its rate inverted); None
    without enough readings on either side."""
    a, b = _level(base_readings), _level(new_readings)
    return a[0] / b[0] if a and b else None


def shift(base_readings, new_readings, run_move: float | None, device=None) -> Shift | None:
    """The record's shift (``Shift``) when its probe's time ratio over ``run_move`` (the
    median of every record's probe time ratio) lies beyond the two levels' own half-widths
    (in quadrature) plus two runs' record allowance on ``device``; None when it does not,
    or without readings or a run move."""
    a, b = _level(base_readings), _level(new_readings)
    if a is None or b is None or not run_move or run_move <= 0:
        return None
    factor = (a[0] / b[0]) / run_move
    reach = math.hypot(a[1], b[1]) + run_to_run.two_runs(device)
    if abs(math.log(factor)) <= reach:
        return None
    return Shift(factor, math.exp(reach))
