"""One estimate from several runs: a random-effects combination of per-run log-ratios,
with a small-sample (Hartung-Knapp) interval.

Each run measures a ratio with its own interval; runs on a shared machine also differ from
each other by more than their intervals say (the machine's state moves between runs). The
DerSimonian-Laird estimate adds the between-run variance ``tau^2`` (how much the runs
disagree beyond their own errors) to each run's variance before weighting.

The interval is Hartung-Knapp's: the variance of the weighted mean re-estimated from the
runs' own scatter about it, with a t quantile on k - 1 degrees of freedom, because with 3
runs tau^2 is itself barely known and a normal quantile covers far less than it says. The
re-estimated variance multiplier is floored at 1 (never narrower than the runs' own
intervals imply), the modification that keeps agreeing runs from looking more certain
than each run's own interval allows.

Each run's standard error on the log scale is read back from its interval: half the
log-width over the normal quantile of its coverage.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import stats as sps

from attnbench.stats.intervals import LEVEL, Interval

METHOD = "hartung-knapp"


@dataclass(frozen=True)
class Pooled:
    interval: Interval  # the pooled ratio, its interval at ``LEVEL``
    tau: float  # between-run standard deviation on the log scale
    runs: int
    runs_low: float = math.nan  # the smallest and largest per-run estimate
    runs_high: float = math.nan

    @property
    def df(self) -> int:
        return self.runs - 1

    def method_text(self) -> str:
        """'pooled over 3 runs, Hartung-Knapp t quantile with 2 df': said beside every
        pooled figure."""
        return describe(self.runs)


def describe(runs: int) -> str:
    """How a figure pooled over ``runs`` runs was made, in words."""
    return f"pooled over {runs} runs, Hartung-Knapp t quantile with {runs - 1} df"


def log_se(iv: Interval) -> float | None:
    """A run's standard error of log(ratio), from its interval; None when it has none."""
    if not (iv.low > 0 and iv.high > 0 and iv.estimate > 0) or iv.confidence <= 0:
        return None
    z = sps.norm.ppf(0.5 + min(iv.confidence, 0.9999) / 2)
    width = math.log(iv.high) - math.log(iv.low)
    return width / (2 * z) if width > 0 else None


def random_effects(runs: list[Interval], level: float = LEVEL) -> Pooled | None:
    """Pooled ratio of per-run intervals: DerSimonian-Laird weights, Hartung-Knapp interval
    (t quantile, k - 1 df, variance multiplier floored at 1); None with fewer than 2 usable
    runs."""
    pairs = [(math.log(iv.estimate), se) for iv in runs if (se := log_se(iv))]
    k = len(pairs)
    if k < 2:
        return None
    y = np.array([p[0] for p in pairs])
    v = np.array([p[1] ** 2 for p in pairs])
    w = 1 / v
    fixed = float(np.sum(w * y) / np.sum(w))
    q = float(np.sum(w * (y - fixed) ** 2))
    c = float(np.sum(w) - np.sum(w ** 2) / np.sum(w))
    tau2 = max(0.0, (q - (k - 1)) / c) if c > 0 else 0.0
    w_star = 1 / (v + tau2)
    mu = float(np.sum(w_star * y) / np.sum(w_star))
    scatter = float(np.sum(w_star * (y - mu) ** 2)) / (k - 1)
    se = math.sqrt(max(1.0, scatter) / float(np.sum(w_star)))
    t = float(sps.t.ppf(0.5 + level / 2, k - 1))
    iv = Interval(math.exp(mu), math.exp(mu - t * se), math.exp(mu + t * se), level, k,
                  METHOD)
    return Pooled(iv, math.sqrt(tau2), k, float(np.exp(y.min())), float(np.exp(y.max())))
