"""Power laws in N: fitted exponents with their fit quality, and crossover lengths.

Attention's cost is a power of the sequence length (N^2 for exact attention, N for the
linear-time family), so both fits here work on log-log axes: the exponent is the slope of
log(value) over log(N); a crossover is where log(ratio) crosses 0, interpolated linearly in
log N between the two measured sizes that bracket it (exact when both sides are power laws).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from attnbench.stats import intervals, run_to_run
from attnbench.stats.ratios import samples


@dataclass(frozen=True)
class PowerLaw:
    """value ~ coefficient * N ** exponent over ``n_min..n_max`` (``points`` sizes)."""

    exponent: float
    coefficient: float
    r2: float  # of the log-log fit: 1.0 is a perfect power law
    points: int
    n_min: int
    n_max: int


def power_law(ns, values) -> PowerLaw | None:
    """Least-squares fit on log-log axes; None with fewer than 3 sizes or a value <= 0."""
    n = np.asarray(ns, dtype=float)
    y = np.asarray(values, dtype=float)
    if n.size < 3 or len(set(n.tolist())) < 3 or np.any(y <= 0) or not np.all(np.isfinite(y)):
        return None
    x, ly = np.log(n), np.log(y)
    slope, intercept = np.polyfit(x, ly, 1)
    residual = float(np.sum((ly - (slope * x + intercept)) ** 2))
    total = float(np.sum((ly - ly.mean()) ** 2))
    r2 = 1.0 - residual / total if total > 0 else 1.0
    return PowerLaw(float(slope), float(math.exp(intercept)), r2, int(n.size), int(n.min()),
                    int(n.max()))


def exponent_interval(d: pd.DataFrame, n_boot: int = 400) -> intervals.Interval | None:
    """Slope of log(median time) over log(N) of one line's records (one per size), with a
    bootstrap over each size's samples; None with fewer than 3 sizes."""
    by_n = {}
    for n, g in d.groupby("seq_q"):
        pooled = [x for _, r in g.iterrows() for x in samples(r.get("samples_ms"))]
        by_n[int(n)] = np.asarray(pooled or list(g["time_ms_median"]), dtype=float)
    if len(by_n) < 3:
        return None
    sizes = sorted(by_n)
    ns = np.log(np.array(sizes, dtype=float))
    meds = np.log([np.median(by_n[n]) for n in sizes])
    slope = float(np.polyfit(ns, meds, 1)[0])
    rng = np.random.default_rng(0)
    boots = []
    for _ in range(n_boot):
        m = [np.median(rng.choice(by_n[n], size=len(by_n[n]))) for n in sizes]
        boots.append(np.polyfit(ns, np.log(m), 1)[0])
    low, high = np.quantile(boots, [0.025, 0.975])
    # a bootstrap of medians from few samples covers less than it says: quote the coverage
    # the fewest samples' median interval reaches, as every other interval does
    fewest = min(len(x) for x in by_n.values())
    if fewest == 1 and low == high == slope:  # medians without samples: a point, as a value
        return intervals.Interval(slope, slope, slope, 1.0, len(by_n), "point")
    confidence = min(intervals.LEVEL, intervals.median_ranks(fewest)[2])
    return intervals.Interval(slope, float(min(low, slope)), float(max(high, slope)),
                              confidence, len(by_n), "bootstrap-fit")


def exponent_across_runs(iv: intervals.Interval, ns, device=None) -> intervals.Interval:
    """An exponent's interval over sizes ``ns`` that a rerun respects: the bootstrap's
    (within run) widened in quadrature by the slope's between-run half-width
    (``run_to_run.slope_allowance``: the ratio allowance between any two sizes, through
    the least-squares slope; a shift of the whole run cancels in it). A
    point (medians without samples) stays one, as a value claim's does."""
    if iv.method == "point":
        return iv
    xs = np.log(np.asarray(sorted(set(float(n) for n in ns)), dtype=float))
    return run_to_run.widen_linear(iv, run_to_run.slope_allowance(xs, device))


@dataclass(frozen=True)
class Crossing:
    """The ratio crosses 1 between measured sizes ``below`` and ``above``, at ``n`` by
    log-log interpolation; ``rising`` when it goes from below 1 to above 1."""

    below: int
    above: int
    n: float
    rising: bool


def crossings(ns, ratios) -> list[Crossing]:
    """Every place a ratio (over increasing N) crosses 1."""
    points = sorted((int(n), float(r)) for n, r in zip(ns, ratios)
                    if r > 0 and math.isfinite(r))
    out = []
    for (n0, r0), (n1, r1) in zip(points, points[1:]):
        l0, l1 = math.log(r0), math.log(r1)
        if l0 == 0 or l0 * l1 > 0:  # no sign change (a ratio of exactly 1 counts once)
            continue
        t = -l0 / (l1 - l0)
        n = math.exp(math.log(n0) + t * (math.log(n1) - math.log(n0)))
        out.append(Crossing(n0, n1, n, rising=l1 > l0))
    return out
