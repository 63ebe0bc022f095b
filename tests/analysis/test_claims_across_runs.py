"""A single run's claims are decided on across-runs intervals (the within-run interval
widened by the device kind's between-run allowance), exponents likewise; pooled claims pool
the within-run intervals (their Hartung-Knapp interval already holds the runs' spread).
All on injected records."""

import math

import numpy as np
import pandas as pd
import pytest

from attnbench.analysis.claims import claims_table, measure_claim, pooled_table
from attnbench.stats import fits, intervals, pooling, run_to_run
from attnbench.stats.intervals import Interval

# Tight samples about 1.0 (median exactly 1.0): a within-run interval well inside 1%.
TIGHT = [0.998, 1.0, 1.002, 0.999, 1.001, 1.0, 0.9995, 1.0005]


def _row(backend, n, time, key=None, group=None, **extra):
    row = {"backend": backend, "status": "ok", "seq_q": n, "seq_k": n, "mask": "none",
           "key": key or f"k{n}", "time_ms_median": time,
           "samples_ms": [time * f for f in TIGHT], "device": "cpu"}
    if group:
        row["pair_group"] = group
    return row | extra


def test_a_time_claim_that_holds_within_run_is_inconclusive_across_runs():
    """10 ms +-0.2% holds 'at most 10.3 ms' on this run's samples; a rerun moves a record by
    up to 5% (the cpu record allowance), so the across-runs interval reaches 10.3."""
    df = pd.DataFrame([_row("naive", 1024, 10.0)])
    claim = {"text": "t", "kind": "value", "backend": "naive", "expected": [0, 10.3]}
    (within,), _ = measure_claim(df, claim, across=False)
    (across,), _ = measure_claim(df, claim)
    assert within.high < 10.03 and claims_table(df, [claim], across=False)["verdict"][0] \
        == "holds"
    a = math.log1p(run_to_run.CPU.record)
    assert across.high == pytest.approx(10.0 * math.exp(math.hypot(math.log(within.high / 10),
                                                                     a)))
    assert across.high > 10.3 and across.method.endswith("/runs")
    assert claims_table(df, [claim])["verdict"][0] == "inconclusive"


def test_a_ratio_claim_carries_the_ratio_allowance():
    """Two records in the same rounds, ratio 2.04 with tight per-round ratios: holds 'at
    least 2' within the run; the 3% ratio allowance brings the low bound under 2."""
    df = pd.DataFrame([_row("naive", 1024, 2.04, group="g"), _row("sdpa", 1024, 1.0, group="g")])
    claim = {"text": "r", "kind": "ratio", "numerator": "naive", "denominator": "sdpa",
             "expected": [2.0]}
    (within,), _ = measure_claim(df, claim, across=False)
    (across,), _ = measure_claim(df, claim)
    assert within.method.startswith("paired") and within.low > 2.0
    assert across == run_to_run.across_runs(within, "cpu", "ratio")
    assert across.low < 2.0
    table = claims_table(df, [claim])
    assert table["verdict"][0] == "inconclusive"
    assert "paired" in table["measured (95% interval)"][0]


def test_a_fraction_of_a_ceiling_is_a_ratio_and_a_rate_a_record():
    """frac_matmul divides by a ceiling measured in the same run: the ratio allowance; tflops
    is a rate of one record: the record allowance."""
    row = _row("naive", 1024, 10.0, frac_matmul=0.6, tflops=1.2)
    df = pd.DataFrame([row])
    for metric, what in (("frac_matmul", "ratio"), ("tflops", "record")):
        claim = {"text": metric, "kind": "value", "backend": "naive", "metric": metric,
                 "expected": [0.1]}
        (within,), _ = measure_claim(df, claim, across=False)
        (across,), _ = measure_claim(df, claim)
        assert across == run_to_run.widen(within, run_to_run.allowance("cpu", what))


def test_an_untimed_metric_and_a_point_are_not_widened():
    row = _row("naive", 1024, 10.0, peak_mem_bytes=1000.0)
    claim = {"text": "m", "kind": "value", "backend": "naive", "metric": "peak_mem_bytes",
             "expected": [0, 1000.0]}
    (iv,), _ = measure_claim(pd.DataFrame([row]), claim)
    assert iv.low == iv.high == 1000.0
    bare = {k: v for k, v in row.items() if k != "samples_ms"}
    time_claim = {"text": "t", "kind": "value", "backend": "naive", "expected": [0, 11]}
    (point,), _ = measure_claim(pd.DataFrame([bare]), time_claim)
    assert point.method == "point" and point.low == point.high == 10.0


def test_a_sequential_claim_scales_the_allowance_to_its_level():
    a = run_to_run.allowance("cpu", "ratio")
    assert run_to_run.at_level(a, intervals.LEVEL) == a
    wider = run_to_run.at_level(a, 0.9875)
    assert wider == pytest.approx(a * 2.4977 / 1.95996, rel=1e-3)


def _sweep(exponent=2.0, sizes=(256, 512, 1024, 2048)):
    return pd.DataFrame([_row("naive", n, 1e-6 * n ** exponent) for n in sizes])


def test_an_exponent_claim_carries_the_slopes_share_of_the_ratio_allowance():
    """A clean N^2 sweep: the bootstrap interval sits within +-0.01 of 2, so 'between 1.99
    and 2.01' holds within the run; any two sizes' ratio moving by the 3% ratio allowance
    between runs moves a slope over 256..2048 by a / sqrt(2 sum (log N - mean)^2), about
    0.015."""
    df = _sweep()
    claim = {"text": "e", "kind": "exponent", "backend": "naive", "expected": [1.99, 2.01]}
    (within,), _ = measure_claim(df, claim, across=False)
    (across,), _ = measure_claim(df, claim)
    xs = np.log([256.0, 512, 1024, 2048])
    between = math.log1p(run_to_run.CPU.ratio) / math.sqrt(2 * np.sum((xs - xs.mean()) ** 2))
    assert run_to_run.slope_allowance(xs, "cpu") == pytest.approx(between)
    assert 0.013 < between < 0.017
    assert within.low > 1.99 and within.high < 2.01
    assert across.high == pytest.approx(within.estimate + math.hypot(
        within.high - within.estimate, between))
    assert across.low == pytest.approx(within.estimate - math.hypot(
        within.estimate - within.low, between))
    assert claims_table(df, [claim], across=False)["verdict"][0] == "holds"
    assert claims_table(df, [claim])["verdict"][0] == "inconclusive"
    assert fits.exponent_across_runs(within, df["seq_q"], "cpu") == across


def test_a_pooled_claim_pools_within_run_intervals_not_widened_twice():
    """Three runs of one ratio claim: the pooled interval is Hartung-Knapp of the runs'
    within-run intervals, not of their across-runs ones (which would add the between-run
    spread a second time), and it is narrower than the latter."""
    claim = {"text": "r", "kind": "ratio", "numerator": "naive", "denominator": "sdpa",
             "expected": [2.0]}
    runs = []
    for label, ratio in (("r1", 2.10), ("r2", 2.14), ("r3", 2.12)):
        df = pd.DataFrame([_row("naive", 1024, ratio, group="g"),
                           _row("sdpa", 1024, 1.0, group="g", samples_ms=TIGHT[::-1])])
        runs.append((label, df, [claim]))
    within = [measure_claim(df, claim, across=False)[0][0] for _, df, _ in runs]
    across = [measure_claim(df, claim)[0][0] for _, df, _ in runs]
    once = pooling.random_effects(within).interval
    twice = pooling.random_effects(across).interval
    table = pooled_table(runs)
    text = table["pooled (95% interval)"][0]
    assert text.startswith(f"{once.estimate:.3g} [{once.low:.3g}, {once.high:.3g}")
    assert (twice.high - twice.low) > (once.high - once.low)
    for label, iv in zip(("r1", "r2", "r3"), within):
        assert table[label][0].startswith(f"{iv.estimate:.3g} [{iv.low:.3g}, {iv.high:.3g}")


def test_widen_linear_adds_in_quadrature_on_the_slopes_own_scale():
    iv = Interval(-0.5, -0.53, -0.46, 0.95, 4, "bootstrap-fit")
    wide = run_to_run.widen_linear(iv, 0.04)
    assert wide.low == pytest.approx(-0.5 - 0.05) and wide.high == pytest.approx(-0.5 + 0.04 *
                                                                                 math.sqrt(2))
    assert run_to_run.widen_linear(iv, 0.0) == iv
