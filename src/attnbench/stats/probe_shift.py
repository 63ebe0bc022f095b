"""Whether the machine under one record differed between two runs.

The drift probe is read between a group's rounds, so each record carries the probe's
readings from its own rounds. Paired rounds divide out a move that slows every backend of
the group alike, but a neighbour's burst on a shared host does not: a memory-bound backend
slows more than a compute-bound one in the same rounds, so their ratio moves with no change
of code. When the probe's median in one record's rounds moved between the runs beyond what
it moves between two runs of one machine state (the declared ``probe`` allowance,
``run_to_run``), that record's change says nothing about its code.

A change over partners is read against the probe's own move (the rounds' machine itself);
a change over the machine's move against the probe's move over the run's (``run_move``),
since the run's move is already divided out of it. The probe's median over a group is not
widened by its own interval: a burst makes the readings scatter, and an interval that grew
with it would hide exactly the records it has to catch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from attnbench.stats import run_to_run

MIN_READINGS = 4  # fewer probe readings are no level for a group


@dataclass(frozen=True)
class Shift:
    """The probe's time ratio new / base in one record's rounds (over the run's, when read
    against the run's move): ``factor`` > 1, that record's machine ran slower; and the
    factor it had to pass (``limit``)."""

    factor: float
    limit: float


def _level(readings) -> float | None:
    """The probe's median rate in a group's rounds; None with too few readings."""
    x = np.asarray(readings if readings is not None else [], dtype=float).ravel()
    x = x[np.isfinite(x) & (x > 0)]
    return float(np.median(x)) if x.size >= MIN_READINGS else None


def time_ratio(base_readings, new_readings) -> float | None:
    """The probe's time new / base in one record's rounds (its rate inverted); None
    without enough readings on either side."""
    a, b = _level(base_readings), _level(new_readings)
    return a / b if a and b else None


def limit(device=None) -> float:
    """The largest probe move under one record that two runs of one machine state show."""
    return math.exp(run_to_run.two_runs(device, "probe"))


def shift(base_readings, new_readings, run_move: float = 1.0, device=None) -> Shift | None:
    """The record's ``Shift`` when its probe's time ratio (over ``run_move``, the median
    of every record's, when the record is read against the run's move) lies beyond
    ``limit``; None when it does not, or without readings."""
    t = time_ratio(base_readings, new_readings)
    if t is None or not run_move or run_move <= 0:
        return None
    factor, most = t / run_move, limit(device)
    return Shift(factor, most) if abs(math.log(factor)) > math.log(most) else None


def excess(readings, run_rate, device=None) -> float:
    """How far (log scale) the probe's median in one record's rounds (``readings``,
    GFLOP/s) stood from its run's level (``run_rate``) when that is beyond the probe's
    declared per-run scatter; 0 within it (the record allowance covers an ordinary
    wobble), or without enough readings or a level. A machine that departed further was
    another machine for that record, which a rerun would not repeat."""
    level = _level(readings)
    try:
        run = float(run_rate)
    except (TypeError, ValueError):
        return 0.0
    if level is None or not (run > 0 and math.isfinite(run)):
        return 0.0
    away = abs(math.log(run / level))
    return away if away > run_to_run.allowance(device, "probe") else 0.0
