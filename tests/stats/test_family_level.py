"""Verdicts drawn at once are drawn at the family level: the level at which the whole set
expects at most ``FALSE_CALLS`` false calls. Intervals and samples are injected."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from attnbench.analysis import run_diff
from attnbench.stats import run_to_run, significance
from attnbench.stats.intervals import LEVEL, Interval, rescaled


def test_the_family_level_keeps_the_expected_false_calls_at_one():
    assert significance.family_level(71) == pytest.approx(1 - 1 / 71)
    assert (1 - significance.family_level(71)) * 71 == pytest.approx(significance.FALSE_CALLS)
    # a few verdicts stay at 95%: at most one false call in 20 is what 95% already means
    assert significance.family_level(20) == LEVEL
    assert significance.family_level(3) == LEVEL and significance.family_level(0) == LEVEL
    assert significance.family_text(5, LEVEL) == "at 95%"
    assert "71 verdicts expect at most 1 false call" in significance.family_text(
        71, significance.family_level(71))


def test_rescaling_widens_each_side_by_the_ratio_of_normal_quantiles():
    iv = Interval(1.2, 1.2 / math.exp(0.1), 1.2 * math.exp(0.2), 0.95, 12, "bootstrap")
    wide = rescaled(iv, 0.99)
    k = 2.5758 / 1.9600
    assert math.log(wide.estimate / wide.low) == pytest.approx(0.1 * k, rel=1e-3)
    assert math.log(wide.high / wide.estimate) == pytest.approx(0.2 * k, rel=1e-3)
    assert wide.confidence == 0.99 and wide.estimate == iv.estimate and wide.n == iv.n
    assert rescaled(iv, 0.95) is iv and rescaled(iv, 0.90) is iv
    assert rescaled(Interval(1.0, -1.0, 2.0, 0.95, 12, "x"), 0.99).low == -1.0


def test_an_interval_that_barely_excludes_one_is_a_call_alone_but_not_among_many():
    iv = Interval(1.15, 1.03, 1.28, 0.95, 12, "bootstrap")
    assert run_diff._sampled_verdict(iv, None, 0.10, True, "cpu")[0] == "worse"
    verdict, wide = run_diff._sampled_verdict(iv, None, 0.10, True, "cpu",
                                              level=significance.family_level(71))
    assert verdict == "cannot tell" and wide.low < 1 < wide.estimate


def _runs(records: int, slow: float) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``records`` unchanged records timed alike in two runs, every sample the same so
    that only the declared between-run allowance widens a ratio, except record 0 of the
    new run, ``slow`` times slower (its code hash unchanged: a stray of the machine)."""
    sides = []
    for side in (0, 1):
        rows = []
        for i in range(records):
            s = (1 + i) * np.ones(12) * (slow if side and i == 0 else 1.0)
            rows.append({"key": f"k{i}", "backend": f"b{i % 4}", "status": "ok",
                         "device": "cpu", "backend_hash": f"h{i % 4}", "samples_ms": s.tolist(),
                         "time_ms_median": float(np.median(s))})
        sides.append(pd.DataFrame(rows))
    return sides[0], sides[1]


@pytest.mark.parametrize("records, called", [(8, True), (80, False)])
def test_compare_judges_at_the_level_of_its_number_of_verdicts(records, called):
    """One record slower by a little more than two runs' declared allowance, with nothing
    else moving: among 8 verdicts the 95% interval calls it; among 80 the family level's
    wider interval does not, and every judged record counts towards that level."""
    slow = math.exp(run_to_run.two_runs("cpu") * 1.12)
    judged = run_diff.judge(*_runs(records, slow), "time_ms_median", 0.05)
    assert judged.judged == records
    assert judged.level == significance.family_level(records)
    first = judged.decided[judged.decided["key"] == "k0"]["change"].iloc[0]
    assert (first == "worse") is called
    assert not judged.decided[judged.decided["key"] != "k0"]["change"].isin(
        ["worse", "better"]).any()
