"""Pooled verdicts over runs: DerSimonian-Laird weights on per-run log-ratios with a
Hartung-Knapp interval, on injected intervals and injected samples (no timing measured)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from attnbench.analysis.claims import pooled_table
from attnbench.stats import pooling
from attnbench.stats.intervals import Interval, paired_ratio_interval


def _iv(est, low, high, conf=0.95):
    return Interval(est, low, high, conf, 12, "paired-order-statistics")


def test_agreeing_runs_pool_with_no_spread_and_a_t_quantile():
    one = _iv(8.3, 7.6, 9.1)
    pooled = pooling.random_effects([one, one, one])
    assert pooled.tau == 0 and pooled.runs == 3 and pooled.interval.method == "hartung-knapp"
    assert pooled.interval.estimate == pytest.approx(8.3)
    # the scatter multiplier is floored at 1: se = one run's / sqrt(3), times t(2 df)
    se = pooling.log_se(one) / math.sqrt(3)
    t2 = 4.302652729911275
    assert math.log(pooled.interval.high / 8.3) == pytest.approx(t2 * se, rel=1e-6)
    # six agreeing runs: narrower than one run's
    six = pooling.random_effects([one] * 6)
    assert six.interval.high - six.interval.low < one.high - one.low
    assert pooled.method_text() == "pooled over 3 runs, Hartung-Knapp t quantile with 2 df"


def test_three_runs_with_a_normal_quantile_would_hold_and_with_t_do_not():
    """Three runs a little apart: a normal quantile excludes the bound, the t quantile on
    2 df does not (the small-k coverage the normal one claims but lacks)."""
    runs = [_iv(0.60, 0.57, 0.63), _iv(0.55, 0.52, 0.58), _iv(0.52, 0.49, 0.55)]
    pooled = pooling.random_effects(runs)
    y = np.log([r.estimate for r in runs])
    w = 1 / (np.array([pooling.log_se(r) for r in runs]) ** 2 + pooled.tau ** 2)
    mu = float(np.sum(w * y) / np.sum(w))
    normal_low = math.exp(mu - 1.959964 * math.sqrt(1 / np.sum(w)))
    assert normal_low > 0.5 > pooled.interval.low
    assert (pooled.runs_low, pooled.runs_high) == pytest.approx((0.52, 0.60))


def test_scattered_runs_widen_past_their_own_errors():
    """Hartung-Knapp re-estimates the variance from the runs' scatter about the pooled
    value: here it exceeds what tau and the runs' errors give (multiplier above 1)."""
    runs = [_iv(1.0, 0.98, 1.02), _iv(1.3, 1.27, 1.33), _iv(1.1, 1.08, 1.12),
            _iv(1.25, 1.22, 1.28), _iv(1.02, 1.0, 1.04)]
    pooled = pooling.random_effects(runs)
    y = np.log([r.estimate for r in runs])
    w = 1 / (np.array([pooling.log_se(r) for r in runs]) ** 2 + pooled.tau ** 2)
    mu = float(np.sum(w * y) / np.sum(w))
    scatter = float(np.sum(w * (y - mu) ** 2)) / (len(runs) - 1)
    half = math.log(pooled.interval.high / pooled.interval.estimate)
    t4 = 2.7764451051977987
    assert half == pytest.approx(t4 * math.sqrt(max(1.0, scatter) / np.sum(w)), rel=1e-6)
    assert pooled.interval.method == "hartung-knapp" and pooled.runs == 5


def test_disagreeing_runs_add_their_spread():
    runs = [_iv(6.0, 5.8, 6.2), _iv(8.0, 7.8, 8.2), _iv(10.0, 9.7, 10.3)]
    pooled = pooling.random_effects(runs)
    assert pooled.tau > 0.15  # log-ratios differ by ~0.25 while each run's se is ~0.02
    fixed_se = math.sqrt(1 / sum(1 / pooling.log_se(r) ** 2 for r in runs))
    assert math.log(pooled.interval.high / pooled.interval.low) / 2 > 5 * fixed_se
    assert pooled.interval.contains(8.0)


def test_a_run_without_interval_is_left_out():
    assert pooling.random_effects([_iv(8.0, 8.0, 8.0, 1.0), _iv(8.0, 7.0, 9.0)]) is None


def _run(label: str, scale: float, rng) -> pd.DataFrame:
    """A sliding-window-like pair timed in 12 paired rounds, true ratio ``scale``."""
    slow = list(8.0 * rng.lognormal(0, 0.12, 12))
    fast = [s / (scale * float(rng.lognormal(0, 0.12))) for s in slow]
    base = {"run_id": label, "key": "k", "status": "ok", "seq_q": 8192, "seq_k": 8192,
            "pair_group": "g"}
    return pd.DataFrame([base | {"backend": "sdpa", "samples_ms": slow,
                                 "time_ms_median": float(np.median(slow))},
                         base | {"backend": "sliding_window", "samples_ms": fast,
                                 "time_ms_median": float(np.median(fast))}])


def test_pooled_claim_beside_each_runs_own():
    claim = {"text": "window >= 8x", "kind": "ratio", "numerator": "sdpa",
             "denominator": "sliding_window", "where": {}, "expected": [8.0]}
    rng = np.random.default_rng(4)
    runs = [(f"r{i}", _run(f"r{i}", 8.6, rng), [claim]) for i in range(3)]
    table = pooled_table(runs).set_index("claim")
    row = table.loc["window >= 8x"]
    assert {"r0", "r1", "r2"} <= set(table.columns)
    own = [paired_ratio_interval(d[d.backend == "sdpa"].samples_ms.iloc[0],
                                 d[d.backend == "sliding_window"].samples_ms.iloc[0])
           for _, d, _ in runs]
    pooled = pooling.random_effects(own).interval
    assert f"{pooled.estimate:.3g} [{pooled.low:.3g}, {pooled.high:.3g}" in \
        row["pooled (95% interval)"]
    assert row["verdict"] == ("holds" if pooled.low >= 8 else
                              "does not hold" if pooled.high < 8 else "inconclusive")
    # one run alone is not pooled
    assert pooled_table(runs[:1]).empty
