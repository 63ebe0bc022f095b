"""Statistics for benchmark timings taken on noisy machines.

Timings are skewed (a floor plus occasional long stalls) and the machine drifts, so the
summaries here are medians with distribution-free or resampling intervals, never means with
normal-theory errors:

* :func:`median_interval` -- the median and its confidence interval from order statistics;
* :func:`paired_ratio_interval` -- the ratio of two backends timed in interleaved rounds,
  from the per-round ratios, so drift shared by both sides of a round cancels;
* :func:`ratio_interval` -- the ratio of medians of two independent sample sets (bootstrap);

What an interval allows one to conclude (two measurements differ, a claim's range holds)
is decided in one place, ``stats.significance``.

All functions are pure; randomness (the bootstrap) is seeded.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

HOLDS, DOES_NOT_HOLD, INCONCLUSIVE = "holds", "does not hold", "inconclusive"
LEVEL = 0.95  # the coverage every interval is meant to have, and every decision claims


@dataclass(frozen=True)
class Interval:
    """A point estimate with a confidence interval ``[low, high]``.

    ``confidence`` is the coverage actually achieved, which is below the requested one when
    there were too few samples to reach it (0.0 when the interval says nothing, e.g. n = 1).
    """

    estimate: float
    low: float
    high: float
    confidence: float
    n: int
    method: str

    @property
    def half_width_rel(self) -> float:
        """The larger distance from the estimate to a bound, relative to the estimate: the
        precision of the estimate. ``inf`` when there is no meaningful precision (estimate 0,
        or fewer than 2 samples)."""
        if self.n < 2 or self.estimate == 0:
            return math.inf
        return max(self.estimate - self.low, self.high - self.estimate) / abs(self.estimate)

    def contains(self, x: float) -> bool:
        """Whether ``x`` lies in the closed interval ``[low, high]``."""
        return self.low <= x <= self.high


def short_of_level(confidence: float, level: float = LEVEL) -> bool:
    """Whether an interval covers less than ``level`` (too few samples to reach it)."""
    return confidence < level - 1e-9


def coverage_note(confidence: float, level: float = LEVEL) -> str:
    """'' for an interval at the level, else its coverage ('75%'): shown next to it."""
    return f"{confidence:.0%}" if short_of_level(confidence, level) else ""


def quantile_ratio(level: float, base: float = LEVEL) -> float:
    """How much wider a two-sided normal interval at ``level`` is than one at ``base``."""
    from statistics import NormalDist

    z = NormalDist().inv_cdf
    return z(0.5 + level / 2) / z(0.5 + base / 2)


def rescaled(iv: Interval, level: float) -> Interval:
    """``iv`` at a wider ``level``: each side's log half-width scaled by the ratio of normal
    quantiles (an interval built at ``iv.confidence`` knows no finer shape in its tails).
    Unchanged at or below its own coverage, or when its bounds are not positive."""
    if level <= iv.confidence or not (iv.low > 0 and iv.high > 0 and iv.estimate > 0) \
            or not 0 < iv.confidence < 1:
        return iv
    k = quantile_ratio(level, iv.confidence)
    lo, hi = math.log(iv.estimate / iv.low) * k, math.log(iv.high / iv.estimate) * k
    return Interval(iv.estimate, iv.estimate * math.exp(-lo), iv.estimate * math.exp(hi),
                    level, iv.n, iv.method)


def _as_samples(samples, name: str = "samples") -> np.ndarray:
    x = np.asarray(samples, dtype=float).ravel()
    if x.size < 1:
        raise ValueError(f"{name}: need at least one sample")
    if not np.all(np.isfinite(x)):
        raise ValueError(f"{name}: samples must be finite")
    return x


def _sps():
    """scipy.stats, imported where a distribution is needed (about 1 s of imports): what
    only holds or names intervals (a suite's load) goes without it."""
    from scipy import stats

    return stats


def _check_confidence(confidence: float) -> None:
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")


def median_rank_coverage(n: int, k: int) -> float:
    """Coverage of the order-statistic interval ``[x_(k), x_(n+1-k)]`` (1-based ranks) for the
    median of ``n`` i.i.d. continuous samples: P(k <= B <= n - k), B ~ Binomial(n, 1/2),
    the number of samples below the true median."""
    binom = _sps().binom
    return float(binom.cdf(n - k, n, 0.5) - binom.cdf(k - 1, n, 0.5))


@functools.lru_cache(maxsize=1024)  # adaptive sampling asks after every round
def median_ranks(n: int, confidence: float = 0.95) -> tuple[int, int, float]:
    """The narrowest symmetric rank pair ``(k, n + 1 - k)`` (1-based) whose coverage of the
    median is >= ``confidence``, with that coverage. When ``n`` is too small for any pair to
    reach it (n < 6 at 95%), ``(1, n)`` -- the range -- with the coverage it achieves,
    ``1 - 2 * 0.5**n``."""
    if n < 1:
        raise ValueError("need n >= 1")
    _check_confidence(confidence)
    ks = np.arange(1, (n + 1) // 2 + 1)
    binom = _sps().binom
    coverage = binom.cdf(n - ks, n, 0.5) - binom.cdf(ks - 1, n, 0.5)
    ok = np.nonzero(coverage >= confidence)[0]
    k = int(ks[ok[-1]]) if ok.size else 1  # coverage falls as k grows: take the last one
    return k, n + 1 - k, median_rank_coverage(n, k)


def median_interval(samples, confidence: float = 0.95) -> Interval:
    """The sample median with a distribution-free confidence interval from order statistics.

    No assumption on the shape of the timing distribution is needed: only that the samples
    are independent draws, so the count below the true median is Binomial(n, 1/2). With too
    few samples the interval is min..max and ``confidence`` reports the lower coverage it has.
    """
    x = np.sort(_as_samples(samples))
    lo, hi, coverage = median_ranks(x.size, confidence)
    return Interval(float(np.median(x)), float(x[lo - 1]), float(x[hi - 1]), coverage,
                    int(x.size), "order-statistics")


def paired_ratio_interval(a, b, confidence: float = 0.95) -> Interval:
    """The ratio ``a / b`` from paired rounds: the median of the per-round ratios
    ``a[i] / b[i]``, with the order-statistics interval of those ratios.

    ``a[i]`` and ``b[i]`` were measured in the same round, so a slowdown of the machine that
    hits both alike divides out of each ratio; the interval then reflects only the noise
    within rounds, not the drift across them.
    """
    a, b = _as_samples(a, "a"), _as_samples(b, "b")
    if a.size != b.size:
        raise ValueError(f"paired samples differ in length: {a.size} vs {b.size}")
    if np.any(b == 0):
        raise ValueError("b: zero sample, ratio undefined")
    iv = median_interval(a / b, confidence)
    return Interval(iv.estimate, iv.low, iv.high, iv.confidence, iv.n,
                    "paired-order-statistics")


def _ratio_of_medians(x, y, axis=-1):
    return np.median(x, axis=axis) / np.median(y, axis=axis)


def ratio_interval(a, b, confidence: float = 0.95, n_boot: int = 2000, seed: int = 0
                   ) -> Interval:
    """The ratio of medians ``median(a) / median(b)`` of two independent sample sets, with a
    percentile bootstrap interval (each side resampled on its own; seeded, so repeatable).

    ``n`` is the smaller side's size. With fewer than 2 samples on a side there is nothing
    to resample: the interval is the point estimate with confidence 0.
    """
    a, b = _as_samples(a, "a"), _as_samples(b, "b")
    _check_confidence(confidence)
    if np.median(b) == 0:
        raise ValueError("b: median is zero, ratio undefined")
    estimate = float(_ratio_of_medians(a, b))
    n = int(min(a.size, b.size))
    if n < 2:
        return Interval(estimate, estimate, estimate, 0.0, n, "bootstrap")
    res = _sps().bootstrap((a, b), _ratio_of_medians, n_resamples=n_boot, vectorized=True,
                           paired=False, confidence_level=confidence, method="percentile",
                           rng=np.random.default_rng(seed))
    ci = res.confidence_interval
    # a percentile interval of a skewed statistic can, rarely, sit beside the estimate
    low, high = min(float(ci.low), estimate), max(float(ci.high), estimate)
    return Interval(estimate, low, high, confidence, n, "bootstrap")
