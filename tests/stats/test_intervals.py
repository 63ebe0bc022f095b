"""attnbench.stats.intervals: intervals, tests and verdicts, checked against hand-computed
numbers and seeded simulations (no timing involved)."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attnbench.stats import intervals, significance
from attnbench.stats.intervals import Interval

# ---------------------------------------------------------------- median interval


def test_median_ranks_n10_by_hand():
    # P(2 <= B <= 8), B ~ Bin(10, 1/2) = 1 - 2 * (1 + 10) / 1024
    assert intervals.median_ranks(10, 0.95) == (2, 9, pytest.approx(1 - 22 / 1024))
    assert 1 - 22 / 1024 == pytest.approx(0.9785, abs=1e-4)
    # the next narrower pair (3, 8) covers only 1 - 2 * 56 / 1024 < 0.95
    assert intervals.median_rank_coverage(10, 3) == pytest.approx(1 - 112 / 1024)


def test_median_interval_of_known_samples_uses_ranks_2_and_9():
    samples = [7.0, 3.0, 10.0, 1.0, 5.0, 9.0, 2.0, 8.0, 4.0, 6.0]  # 1..10 shuffled
    iv = intervals.median_interval(samples)
    assert (iv.low, iv.estimate, iv.high) == (2.0, 5.5, 9.0)
    assert iv.confidence == pytest.approx(0.978515625)
    assert iv.n == 10 and iv.method == "order-statistics"


def test_median_interval_n20_and_lower_confidence():
    x = np.arange(1.0, 21.0)
    iv = intervals.median_interval(x)  # k = 6: 1 - 2 * P(B <= 5), B ~ Bin(20, 1/2)
    assert (iv.low, iv.high) == (6.0, 15.0)
    assert iv.confidence == pytest.approx(1 - 2 * 21700 / 2**20)
    narrow = intervals.median_interval(x, confidence=0.8)
    assert narrow.low > iv.low and narrow.high < iv.high and narrow.confidence >= 0.8


@pytest.mark.parametrize("n", [2, 3, 4, 5])
def test_small_n_gives_range_and_reduced_confidence(n):
    x = np.linspace(1.0, 2.0, n)[::-1]
    iv = intervals.median_interval(x)
    assert (iv.low, iv.high) == (1.0, 2.0)
    assert iv.confidence == pytest.approx(1 - 2 * 0.5**n) and iv.confidence < 0.95


def test_six_samples_reach_95_percent_with_the_range():
    iv = intervals.median_interval([3.0, 1.0, 2.0, 6.0, 5.0, 4.0])
    assert (iv.low, iv.high) == (1.0, 6.0)
    assert iv.confidence == pytest.approx(1 - 2 / 64) and iv.confidence >= 0.95


def test_single_sample_says_nothing():
    iv = intervals.median_interval([4.0])
    assert (iv.low, iv.estimate, iv.high, iv.n) == (4.0, 4.0, 4.0, 1)
    assert iv.confidence == 0.0
    assert iv.half_width_rel == math.inf
    assert significance.interval_verdict(iv, 3.0, 5.0) == "inconclusive"


def test_median_interval_rejects_bad_input():
    with pytest.raises(ValueError):
        intervals.median_interval([])
    with pytest.raises(ValueError):
        intervals.median_interval([1.0, float("nan")])
    with pytest.raises(ValueError):
        intervals.median_interval([1.0, 2.0], confidence=1.0)


def test_median_interval_coverage_simulation():
    rng = np.random.default_rng(12345)
    true_median = 3.0  # median of lognormal(log 3, s) is 3
    draws = rng.lognormal(mean=math.log(true_median), sigma=0.5, size=(1000, 20))
    hits = sum(intervals.median_interval(row).contains(true_median) for row in draws)
    # exact coverage for n = 20 is 0.9586; the interval is not trivially wide either
    assert 930 <= hits <= 985, hits


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0.01, 1e3), min_size=1, max_size=60),
       st.sampled_from([0.5, 0.9, 0.95, 0.99]))
def test_median_interval_properties(xs, confidence):
    iv = intervals.median_interval(xs, confidence)
    assert min(xs) <= iv.low <= iv.estimate <= iv.high <= max(xs)
    assert iv.n == len(xs)
    full = 1 - 2 * 0.5 ** len(xs)
    # either the requested coverage is reached, or the range is returned with what it has
    assert iv.confidence >= confidence or iv.confidence == pytest.approx(full)


# ---------------------------------------------------------------- Interval


def test_interval_half_width_and_contains():
    iv = Interval(2.0, 1.9, 2.3, 0.95, 10, "x")
    assert iv.half_width_rel == pytest.approx(0.15)
    assert iv.contains(1.9) and iv.contains(2.3) and not iv.contains(2.31)
    assert Interval(0.0, -1.0, 1.0, 0.95, 10, "x").half_width_rel == math.inf
    assert Interval(1.0, 1.0, 1.0, 1.0, 1, "point").half_width_rel == math.inf


# ---------------------------------------------------------------- ratios


def _drift_rounds(n=30, seed=7):
    """a is exactly 2x b in every round; the machine slows 3x over the rounds."""
    rng = np.random.default_rng(seed)
    d = np.linspace(1.0, 3.0, n)
    a = 2.0 * d * rng.lognormal(0.0, 0.03, n)
    b = d * rng.lognormal(0.0, 0.03, n)
    return a, b


def test_paired_ratio_cancels_drift_that_unpaired_does_not():
    a, b = _drift_rounds()
    paired = intervals.paired_ratio_interval(a, b)
    assert paired.contains(2.0), paired
    assert paired.half_width_rel < 0.05
    assert paired.method == "paired-order-statistics" and paired.n == 30
    assert paired.estimate == pytest.approx(np.median(a / b))
    # a timed early (fast machine) against b timed late (slow machine): reads ~1.2, not 2
    half = len(a) // 2
    unpaired = intervals.ratio_interval(a[:half], b[half:])
    assert not unpaired.contains(2.0), unpaired
    assert unpaired.high < 1.6


def test_paired_ratio_validates_lengths():
    with pytest.raises(ValueError):
        intervals.paired_ratio_interval([1.0, 2.0], [1.0])
    with pytest.raises(ValueError):
        intervals.paired_ratio_interval([], [])
    with pytest.raises(ValueError):
        intervals.paired_ratio_interval([1.0], [0.0])


def test_paired_ratio_small_n_uses_range_of_ratios():
    iv = intervals.paired_ratio_interval([2.0, 4.0, 9.0], [1.0, 2.0, 3.0])  # ratios 2, 2, 3
    assert (iv.low, iv.estimate, iv.high) == (2.0, 2.0, 3.0)
    assert iv.confidence == pytest.approx(0.75)


def test_ratio_interval_is_seeded_and_sensible():
    rng = np.random.default_rng(3)
    a = 1.5 * rng.lognormal(0.0, 0.1, 100)
    b = rng.lognormal(0.0, 0.1, 100)
    iv = intervals.ratio_interval(a, b)
    assert iv == intervals.ratio_interval(a, b)  # same seed, same interval
    assert iv.estimate == pytest.approx(np.median(a) / np.median(b))
    assert iv.low < iv.estimate < iv.high and iv.contains(1.5)
    assert iv.half_width_rel < 0.1
    assert (iv.confidence, iv.n, iv.method) == (0.95, 100, "bootstrap")
    other = intervals.ratio_interval(a, b, seed=1)
    assert other.estimate == iv.estimate and (other.low, other.high) != (iv.low, iv.high)
    wide = intervals.ratio_interval(a, b, confidence=0.99)
    assert wide.low <= iv.low and wide.high >= iv.high


def test_ratio_interval_single_sample_side_has_no_confidence():
    iv = intervals.ratio_interval([4.0], [1.0, 2.0, 3.0])
    assert (iv.estimate, iv.low, iv.high, iv.confidence, iv.n) == (2.0, 2.0, 2.0, 0.0, 1)
    with pytest.raises(ValueError):
        intervals.ratio_interval([1.0], [])


# ---------------------------------------------------------------- verdicts


@pytest.mark.parametrize(("low", "high", "expected"), [
    (1.5, 2.5, "holds"),
    (1.8, None, "holds"),
    (None, 2.2, "holds"),
    (None, None, "holds"),
    (2.2, 3.0, "does not hold"),   # interval wholly below low
    (1.0, 1.8, "does not hold"),   # wholly above high
    (None, 1.8, "does not hold"),
    (2.2, None, "does not hold"),
    (2.0, 3.0, "inconclusive"),    # straddles low
    (1.0, 2.0, "inconclusive"),    # straddles high
    (1.95, 1.99, "inconclusive"),  # bounds inside the interval
])
def test_interval_verdict(low, high, expected):
    iv = Interval(2.0, 1.9, 2.1, 0.95, 20, "order-statistics")
    assert significance.interval_verdict(iv, low, high) == expected


def test_exact_point_verdicts():
    point = Interval(3.0, 3.0, 3.0, 1.0, 1, "point")  # e.g. a memory ratio, no noise
    assert significance.interval_verdict(point, 2.0, 4.0) == "holds"
    assert significance.interval_verdict(point, 3.5, None) == "does not hold"


# ---------------------------------------------------------------- compare_samples


def _compare(base, new, threshold, lower_is_better):
    iv = intervals.ratio_interval(new, base)
    return significance.decide(iv, threshold, lower_is_better), iv


def _timings(rng, n, scale):
    return scale * rng.lognormal(0.0, 0.05, n)


def test_compare_clear_slowdown_is_worse():
    rng = np.random.default_rng(11)
    base, new = _timings(rng, 30, 1.0), _timings(rng, 30, 1.3)
    verdict, iv = _compare(base, new, threshold=0.1, lower_is_better=True)
    assert verdict == "worse"
    assert iv.contains(1.3) and iv.low > 1.1
    # the same change in a higher-is-better metric (e.g. throughput) is an improvement
    verdict, _ = _compare(base, new, threshold=0.1, lower_is_better=False)
    assert verdict == "better"
    # and the reverse direction
    assert _compare(new, base, 0.1, lower_is_better=True)[0] == "better"
    assert _compare(new, base, 0.1, lower_is_better=False)[0] == "worse"


def test_compare_identical_distributions_is_unchanged():
    rng = np.random.default_rng(5)
    base, new = _timings(rng, 30, 1.0), _timings(rng, 30, 1.0)
    verdict, iv = _compare(base, new, threshold=0.05, lower_is_better=True)
    assert verdict == "unchanged" and iv.contains(1.0)


def test_compare_two_samples_cannot_tell():
    rng = np.random.default_rng(11)
    base, new = _timings(rng, 2, 1.0), _timings(rng, 2, 1.3)
    verdict, iv = _compare(base, new, threshold=0.1, lower_is_better=True)
    assert verdict == "cannot tell" and iv.estimate > 1.1


def test_compare_significant_but_below_threshold_is_unchanged():
    rng = np.random.default_rng(2)
    base = 1.00 * rng.lognormal(0.0, 0.005, 50)
    new = 1.03 * rng.lognormal(0.0, 0.005, 50)
    verdict, iv = _compare(base, new, threshold=0.1, lower_is_better=True)
    assert iv.low > 1 and iv.estimate == pytest.approx(1.03, abs=0.01)
    assert verdict == "unchanged"


def test_an_exponent_from_few_samples_carries_its_coverage():
    import pandas as pd

    from attnbench.stats.fits import exponent_interval

    rng = np.random.default_rng(1)
    rows = [{"seq_q": n, "time_ms_median": 1e-6 * n * n,
             "samples_ms": list(1e-6 * n * n * rng.lognormal(0, 0.05, k))}
            for n in (256, 512, 1024) for k in (3,)]
    iv = exponent_interval(pd.DataFrame(rows))
    assert iv.confidence == pytest.approx(0.75) and intervals.coverage_note(iv.confidence)
    rows = [r | {"samples_ms": list(1e-6 * r["seq_q"] ** 2 * rng.lognormal(0, 0.05, 8))}
            for r in rows]
    assert exponent_interval(pd.DataFrame(rows)).confidence == 0.95
