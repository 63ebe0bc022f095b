"""Whether the machine held still during a run and between runs, from the drift probe's
level each record carries: injected probe rates, never the machine's own."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from attnbench.analysis import machine_state, rerun_agreement
from attnbench.stats import run_to_run


def _records(rates) -> pd.DataFrame:
    """One record per probe rate, recorded a minute apart, handed over shuffled."""
    rows = [{"key": f"k{i}", "backend": "b", "status": "ok", "probe_gflops": float(r),
             "recorded_at": f"2026-12-06T20:{i:02d}:00+00:00"} for i, r in enumerate(rates)]
    return pd.DataFrame(rows).sample(frac=1.0, random_state=0)


def test_the_limit_is_what_two_runs_of_unchanged_code_may_differ_by():
    assert machine_state.limit("cpu") == pytest.approx(math.exp(run_to_run.two_runs("cpu")))
    assert 1.05 < machine_state.limit("cpu") < 1.1


def test_levels_are_medians_of_consecutive_parts_in_recorded_order():
    rates = [100.0] * 6 + [110.0] * 6 + [120.0] * 6 + [130.0] * 6
    assert machine_state.levels_in_time(_records(rates)) == [100.0, 110.0, 120.0, 130.0]
    assert machine_state.levels_in_time(_records(rates[:11])) == []  # under 3 a part
    assert machine_state.levels_in_time(pd.DataFrame({"probe_gflops": rates})) == []


def test_a_step_in_the_probes_level_during_a_run_is_named():
    rates = [120.0] * 18 + [100.0] * 6  # the last quarter 1.2x slower
    moved = machine_state.within_run(_records(rates), "cpu")
    assert moved is not None and moved.factor == pytest.approx(1.2)
    text = machine_state.within_run_text("r1", moved, "cpu")
    assert text.startswith("machine moved during run r1: the drift probe's level over the "
                           "run's four quarters was 120, 120, 120, 100 GFLOP/s (1.2x apart")


def test_a_probe_that_scatters_record_to_record_without_moving_is_not_named():
    """Every other record's probe read 25% low (what a memory-bound record does to the
    read after it): each quarter's median is the same, the machine did not move."""
    rng = np.random.default_rng(3)
    rates = [120.0 * (0.75 if i % 2 else 1.0) * rng.uniform(0.99, 1.01) for i in range(40)]
    assert machine_state.within_run(_records(rates), "cpu") is None


def test_between_runs_reads_each_runs_probe_median_and_names_the_ceilings():
    metas = [{"probe": {"gflops_median": g}, "ceilings": {"matmul_tflops": {"float32": c}}}
             for g, c in ((101, 0.156), (111, 0.159), (122, 0.197))]
    runs = [(m, pd.DataFrame()) for m in metas]
    moved = machine_state.between_runs(runs, "cpu")
    assert moved.levels == (101, 111, 122) and moved.factor == pytest.approx(122 / 101)
    text = machine_state.between_runs_text(moved, [m["ceilings"]["matmul_tflops"]
                                                   for m in metas], "cpu")
    assert "drift probe 101, 111, 122 GFLOP/s (1.21x apart" in text
    assert "matmul ceiling float32 at each run's start 0.156, 0.159, 0.197 TFLOP/s" in text
    steady = [({"probe": {"gflops_median": g}}, pd.DataFrame()) for g in (122, 123, 124)]
    assert machine_state.between_runs(steady, "cpu") is None


def test_a_run_without_the_probe_in_its_meta_reads_its_records():
    runs = [({}, _records([100.0] * 12)), ({"probe": {"gflops_median": 130.0}}, pd.DataFrame())]
    assert machine_state.between_runs(runs, "cpu").levels == (100.0, 130.0)
    assert machine_state.between_runs([({}, pd.DataFrame()), runs[1]], "cpu") is None


def test_rerun_agreement_says_whether_the_runs_were_one_machine_state():
    steady = _records([120.0] * 12)
    one = [(f"r{i}", {"probe": {"gflops_median": g}}, steady) for i, g in enumerate((122, 123))]
    assert rerun_agreement.one_state_line(one, "cpu").startswith("machine: one state")
    two = [(f"r{i}", {"probe": {"gflops_median": g}}, steady) for i, g in enumerate((101, 122))]
    assert rerun_agreement.one_state_line(two, "cpu").startswith(
        "machine: NOT one state: drift probe 101, 122 GFLOP/s")
    moving = _records([120.0] * 9 + [100.0] * 3)
    during = [("r0", {"probe": {"gflops_median": 120}}, moving), one[1]]
    line = rerun_agreement.one_state_line(during, "cpu")
    assert line.startswith("machine: NOT one state: moved during r0 (quarters 120, 120, 120, "
                           "100 GFLOP/s, 1.2x)")
    assert rerun_agreement.one_state_line([("r", {}, pd.DataFrame())] * 2, "cpu") is None
