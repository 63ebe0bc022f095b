"""One estimate from several runs: a random-effects combination of per-run log-ratios.

Each run measures a claim's ratio with its own interval; runs on a shared machine also
differ from each other by more than their intervals say (the machine's state moves between
runs). A fixed-effect average would ignore that and be overconfident; the DerSimonian-Laird
random-effects estimate adds the between-run variance ``tau^2`` (estimated from how much
the runs disagree beyond their own errors) to each run's variance before weighting.

Each run's standard error on the log scale is read back from its interval: half the
log-width over the normal quantile of its coverage. The pooled interval is the standard
DerSimonian-Laird one (normal quantile). Its known weakness: with few runs tau^2 is itself
uncertain, so when runs disagree the interval can cover less than stated; a Student t on
k - 1 degrees of freedom would fix that for disagreeing runs but make 3 agreeing runs
wider than one, which is why it is not used.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import stats as sps

from attnbench.stats.intervals import LEVEL, Interval


@dataclass(frozen=True)
class Pooled:
    interval: Interval  # the pooled ratio, its interval at ``LEVEL``
    tau: float  # between-run standard deviation on the log scale
    runs: int


def log_se(iv: Interval) -> float | None:
    """A run's standard error of log(ratio), from its interval; None when it has none."""
    if not (iv.low > 0 and iv.high > 0 and iv.estimate > 0) or iv.confidence <= 0:
        return None
    z = sps.norm.ppf(0.5 + min(iv.confidence, 0.9999) / 2)
    width = math.log(iv.high) - math.log(iv.low)
    return width / (2 * z) if width > 0 else None


def random_effects(runs: list[Interval], level: float = LEVEL) -> Pooled | None:
    """DerSimonian-Laird pooling of per-run ratios; None with fewer than 2 usable runs."""
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
    se = math.sqrt(1 / float(np.sum(w_star)))
    t = float(sps.norm.ppf(0.5 + level / 2))
    iv = Interval(math.exp(mu), math.exp(mu - t * se), math.exp(mu + t * se), level, k,
                  "random-effects")
    return Pooled(iv, math.sqrt(tau2), k)
