"""Run-to-run variation: what a ratio between two runs must allow for beyond its samples.

A record's interval describes the samples of one process in one run; a second run of the
same code (another process, memory layout, machine state) lands elsewhere by more than
that interval says. So a ratio of two runs' records carries a between-run component, added
to its own interval's half-width in quadrature on the log scale:

* estimated, when replicate measurements exist: the records of unchanged code that agree
  on the machine's move are replicates of one another, and how far 95% of their
  log-ratios reach from their median, beyond their own intervals, is the between-run
  half-width of one record;
* never below ``FLOOR``, a declared 95% half-width (a relative change) that a rerun of the
  same code reaches on a shared CPU machine (docs/design.md, Statistics).
"""

from __future__ import annotations

import math

import numpy as np

from attnbench.stats.intervals import LEVEL, Interval

# A rerun of unchanged code moves a record's median by up to this much (95% half-width,
# relative) beyond its own interval; set from repeated CPU runs of one commit.
FLOOR = 0.05


def log_half_width(iv: Interval) -> float:
    """The larger distance of the bounds from the estimate, on the log scale (0: none)."""
    if not (iv.low > 0 and iv.high > 0 and iv.estimate > 0):
        return 0.0
    return max(math.log(iv.estimate / iv.low), math.log(iv.high / iv.estimate))


def spread_from_replicates(ratios: list[float], intervals: list[Interval],
                           level: float = LEVEL) -> float | None:
    """The between-run half-width at ``level`` (log scale) that replicate ratios show: the
    ``level`` quantile of their distances from their median (reruns have heavy tails, so
    no normal model), with their own intervals' typical half-width removed in quadrature;
    None with fewer than 3 replicates."""
    logs = np.log([r for r in ratios if r > 0])
    if logs.size < 3:
        return None
    reach = float(np.quantile(np.abs(logs - np.median(logs)), level))
    own = float(np.median([log_half_width(iv) for iv in intervals])) if intervals else 0.0
    return math.sqrt(max(0.0, reach ** 2 - own ** 2))


def half_width(replicates: float | None = None) -> float:
    """The between-run 95% half-width (log scale) a comparison of two runs allows: the
    replicates' estimate when there is one, never less than ``FLOOR``."""
    floor = math.log1p(FLOOR)
    return floor if replicates is None else max(floor, replicates)


def widen(iv: Interval, between: float) -> Interval:
    """``iv`` with a between-run half-width ``between`` (log scale) added to each side's own
    in quadrature: the interval a rerun respects."""
    if not (iv.low > 0 and iv.high > 0 and iv.estimate > 0) or between <= 0:
        return iv
    lo = math.sqrt(math.log(iv.estimate / iv.low) ** 2 + between ** 2)
    hi = math.sqrt(math.log(iv.high / iv.estimate) ** 2 + between ** 2)
    return Interval(iv.estimate, iv.estimate * math.exp(-lo), iv.estimate * math.exp(hi),
                    iv.confidence, iv.n, iv.method + "/runs")
