"""Coverage is part of every interval shown, and noise is flagged from the samples too.
Samples are injected; nothing is timed."""

from __future__ import annotations

import pandas as pd

from attnbench.core.case import Case
from attnbench.measure.execute import timing_columns
from attnbench.measure.timing import TimingBudget
from attnbench.reporting import findings, tables
from attnbench.stats import ratios

CASE = Case(batch=1, heads_q=1, heads_kv=1, seq_q=8, seq_k=8, head_dim=4, head_dim_v=4)


def test_a_wide_sample_interval_is_flagged_whatever_the_probe_says():
    budget = TimingBudget(noise_threshold=0.10, unsteady_rel=0.25)
    steady_probe = [100.0, 101.0, 100.5]  # the probe saw a steady machine
    wide = [1.0, 1.0, 1.05, 1.1, 1.0, 3.5, 1.02, 2.9]  # interval reaches 3.5 from ~1.03
    cols = timing_columns(CASE, 1e6, wide, "budget", steady_probe, budget)
    assert cols["noisy"] is True and cols["noisy_by"] == "spread+samples"
    tight = [1.0, 1.01, 1.02, 0.99, 1.0, 1.01]
    cols = timing_columns(CASE, 1e6, tight, "precision", steady_probe, budget)
    assert cols["noisy"] is False and "noisy_by" not in cols
    # without any probe reading, the samples still flag it
    cols = timing_columns(CASE, 1e6, wide, "budget", [], budget)
    assert cols["noisy"] is True and cols["noisy_by"] == "samples"
    # both
    cols = timing_columns(CASE, 1e6, wide, "budget", [100.0, 101.0, 50.0, 51.0], budget)
    assert cols["noisy_by"] == "probe+samples"


def _row(samples, conf=None):
    cols = timing_columns(CASE, 1e6, samples, "budget", [], TimingBudget())
    row = {"status": "ok", **cols}
    if conf is not None:
        row["time_ci_confidence"] = conf
    return row


def test_time_cells_say_their_coverage_below_95_percent():
    few = _row([1.0, 1.1, 1.2])  # 3 samples: the range, 75%
    assert few["time_ci_confidence"] == 0.75
    assert tables._cell(few, "time_ms_median") == "1.1 ±9% (75%)"
    wide = _row([1.0, 1.1, 1.6])  # reaches 45% above its median: noisy too
    assert tables._cell(wide, "time_ms_median") == "1.1 ±45% (75%) ~"
    many = _row([1.0, 1.01, 1.02, 1.0, 1.01, 1.02, 1.0, 1.01])
    assert "(" not in tables._cell(many, "time_ms_median")


def _pair(n: int, ratio: float):
    a = {"samples_ms": [ratio * (1 + 0.01 * i) * (1 + 0.02 * (i % 3)) for i in range(n)],
         "pair_group": "g"}
    b = {"samples_ms": [1.0 + 0.01 * i for i in range(n)], "pair_group": "g"}
    return a, b


def test_paired_ratio_short_of_95_percent_is_shown_so_and_never_significant():
    d = ratios.difference(*_pair(4, 3.0))  # excludes 1, but 4 rounds cover 88%
    assert not d.significant
    assert ratios.format_ratio(d.interval).endswith(", 88%]")
    d = ratios.difference(*_pair(8, 3.0))
    assert d.significant and "%" not in ratios.format_ratio(d.interval)


def test_speedup_cells_and_headline_carry_the_coverage():
    row = {"speedup": 3.05, "speedup_low": 3.05, "speedup_high": 3.47, "significant": False,
           "speedup_confidence": 0.75, "speedup_method": "paired-order-statistics",
           "status": "ok", "baseline_status": "ok"}
    assert findings._ratio_cell(row) == "3.05x [3.05, 3.47, 75%] (n.s.)"
    df = pd.DataFrame([_row([1.0, 1.1, 1.6]) | {"run_id": "r"},
                       _row([1.0, 1.01, 1.02, 1.0, 1.01, 1.02]) | {"run_id": "r"}])
    line = findings.coverage_headline(df)
    assert line.startswith("coverage: 1 of 2 ok records") and "75%" in line
    assert findings.unsteady_headline(df).startswith("unsteady: 1 of 2 ok records")
