"""The one significance rule, the run-to-run allowance, the two witnesses of compare, and
the noise flag: all on injected samples and intervals (nothing is timed)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from attnbench.analysis import run_diff
from attnbench.stats import intervals, noise, ratios, run_to_run, significance
from attnbench.stats.intervals import Interval


def _iv(est, low, high, n=20, conf=0.95, method="bootstrap"):
    return Interval(est, low, high, conf, n, method)


# ---------------------------------------------------------------- decide


@pytest.mark.parametrize(("iv", "threshold", "lower", "expected"), [
    (_iv(1.5, 1.3, 1.7), 0.1, True, "worse"),
    (_iv(1.5, 1.3, 1.7), 0.1, False, "better"),
    (_iv(0.6, 0.5, 0.7), 0.1, True, "better"),
    (_iv(1.0, 0.97, 1.04), 0.1, True, "unchanged"),
    (_iv(1.2, 0.9, 1.5), 0.1, True, "cannot tell"),      # holds 1
    (_iv(1.05, 1.01, 1.09), 0.1, True, "unchanged"),     # a real change under 10%
    (_iv(1.05, 1.01, 1.15), 0.1, True, "cannot tell"),   # excludes 1, estimate within 10%
    (_iv(1.05, 1.01, 1.09), 0.0, True, "worse"),         # no threshold: any difference
    (_iv(1.5, 1.3, 1.7, n=5), 0.1, True, "cannot tell"),  # fewer than MIN_SAMPLES a side
    (_iv(1.5, 1.3, 1.7, conf=0.9), 0.1, True, "cannot tell"),  # short of 95%
    (_iv(1.5, 1.5, 1.5, n=1, conf=1.0, method="point"), 0.1, True, "cannot tell"),
])
def test_decide(iv, threshold, lower, expected):
    assert significance.decide(iv, threshold, lower) == expected


def test_min_samples_is_the_least_count_whose_median_interval_reaches_95():
    assert intervals.median_ranks(significance.MIN_SAMPLES)[2] >= 0.95
    assert intervals.median_ranks(significance.MIN_SAMPLES - 1)[2] < 0.95


def test_three_samples_a_side_never_decide_even_a_threefold_change():
    """The old rule called worse from 3 samples a side (a bootstrap 95% that is not)."""
    base, new = [19.8, 19.7, 20.7], [28.3, 34.1, 30.2]
    iv = intervals.ratio_interval(new, base)
    assert iv.low > 1  # the bootstrap excludes 1 ...
    assert significance.decide(iv, 0.1) == "cannot tell"  # ... but 3 samples decide nothing
    six_base, six_new = base * 2, new * 2
    assert significance.decide(intervals.ratio_interval(six_new, six_base), 0.1) == "worse"


def test_a_winner_needs_a_margin_whose_interval_excludes_1():
    w = {"samples_ms": [1.0, 1.02, 0.98, 1.01, 0.99, 1.0, 1.03, 0.97], "pair_group": "g"}
    tie = {"samples_ms": [0.9, 1.2, 1.0, 0.85, 1.3, 1.05, 0.95, 1.1], "pair_group": "g"}
    d = ratios.difference(tie, w)
    assert d.interval.contains(1.0) and not d.significant
    assert d.describe() == "no (paired rounds)"
    few = {"samples_ms": [2.0, 2.1, 1.9]}
    d = ratios.difference(few, {"samples_ms": [1.0, 1.05, 0.95]})
    assert not d.significant and d.describe() == "no (fewer than 6 samples a side)"


def test_claims_from_few_bootstrapped_samples_are_inconclusive():
    iv = _iv(2.0, 1.9, 2.1, n=3)
    assert significance.interval_verdict(iv, 1.5, None) == "inconclusive"
    assert significance.interval_verdict(_iv(2.0, 1.9, 2.1, n=6), 1.5, None) == "holds"
    # a pooled interval counts runs, not samples: its quantile allows for how few
    pooled = _iv(2.0, 1.9, 2.1, n=3, method="hartung-knapp")
    assert significance.interval_verdict(pooled, 1.5, None) == "holds"


# ---------------------------------------------------------------- run to run


def test_widen_adds_the_between_run_half_width_in_quadrature():
    iv = _iv(1.0, math.exp(-0.03), math.exp(0.04))
    wide = run_to_run.widen(iv, 0.04)
    assert math.log(1 / wide.low) == pytest.approx(0.05)
    assert math.log(wide.high) == pytest.approx(math.sqrt(0.04 ** 2 + 0.04 ** 2))
    assert run_to_run.half_width() == pytest.approx(run_to_run.two_runs())
    assert run_to_run.half_width(0.2) == 0.2  # replicates wider than the floor win


def test_spread_from_replicates_removes_their_own_share():
    rng = np.random.default_rng(3)
    ratios_ = list(np.exp(rng.normal(0, 0.08, 400)))
    tight = [_iv(1.0, 0.99, 1.01)] * 5
    est = run_to_run.spread_from_replicates(ratios_, tight)
    assert est == pytest.approx(1.96 * 0.08, rel=0.15)
    # replicates that scatter no more than their own intervals add nothing
    assert run_to_run.spread_from_replicates(ratios_, [_iv(1.0, 0.7, 1.4)]) == 0.0
    assert run_to_run.spread_from_replicates([1.0, 1.1], tight) is None


def _record(backend, i, samples, probe=100.0, hash_="h"):
    return {"key": f"k{i}", "backend": backend, "status": "ok", "backend_hash": hash_,
            "time_ms_median": float(np.median(samples)), "samples_ms": list(samples),
            "probe_gflops": probe}


def _run(rng, shifts, n=12, probe=100.0, cases=8, jitter=0.02):
    """Records of three backends on ``cases`` cases; each record's whole run offset by
    ``shifts[backend]`` times a run-level factor drawn per record."""
    rows = []
    for b in ("a", "b", "c"):
        for i in range(cases):
            level = (1 + i) * shifts.get(b, 1.0)
            rows.append(_record(b, i, level * rng.lognormal(0, jitter, n), probe))
    return pd.DataFrame(rows)


def _verdicts(base, new, threshold=0.1):
    j = run_diff.join_runs(base, new, "time_ms_median")
    move = run_diff.machine_move(j, "time_ms_median", threshold)
    return run_diff.decide(j, "time_ms_median", threshold, move), move


def test_two_runs_of_one_code_are_not_called_worse_or_better():
    """Each record of the rerun lands up to 3% away (a run-level offset its own tight
    samples do not carry, inside the declared floor): within-run intervals alone call
    some of them changed."""
    rng = np.random.default_rng(7)
    base = _run(rng, {}, jitter=0.005)
    new = base.copy()
    offsets = np.exp(rng.uniform(-0.03, 0.03, len(new)))
    new["samples_ms"] = [list(np.array(s) * o) for s, o in zip(new["samples_ms"], offsets)]
    new["time_ms_median"] = [float(np.median(s)) for s in new["samples_ms"]]
    decided, _ = _verdicts(base, new, threshold=0.02)
    assert not decided["change"].isin(["worse", "better"]).any()
    # the same data judged on the records' own intervals calls changes
    raw = [significance.decide(intervals.ratio_interval(n, b), 0.02)
           for b, n in zip(base["samples_ms"], new["samples_ms"])]
    assert sum(v in ("worse", "better") for v in raw) > 3


def test_a_change_on_one_backend_is_still_found_beside_the_allowance():
    rng = np.random.default_rng(8)
    base, new = _run(rng, {}), _run(rng, {"a": 1.2})
    decided, move = _verdicts(base, new)
    assert move is not None and move.other is None
    a = decided[decided["backend"] == "a"]
    assert (a["change"] == "worse").all()
    assert not decided[decided["backend"] != "a"]["change"].isin(["worse", "better"]).any()


def test_too_few_samples_a_side_cannot_tell_in_compare():
    rng = np.random.default_rng(9)
    base, new = _run(rng, {}, n=3), _run(rng, {"a": 3.0}, n=3)
    decided, _ = _verdicts(base, new)
    assert (decided["change"] == "cannot tell").all()


def test_witnesses_that_disagree_make_the_affected_records_cannot_tell():
    """The unchanged backends all read 3x slower while the probe says the machine did not
    move: dividing out either witness gives a different answer, so none is given."""
    rng = np.random.default_rng(10)
    base = _run(rng, {}, probe=100.0)
    new = _run(rng, {"a": 3.0, "b": 3.0, "c": 3.0}, probe=100.0)
    decided, move = _verdicts(base, new)
    assert move.other is not None and "WITNESSES DISAGREE" in move.describe()
    assert (decided["change"] == "cannot tell").all()
    # the probe agreeing with the backends (the machine itself 3x slower): nothing changed
    new_slow = new.assign(probe_gflops=100.0 / 3)
    decided, move = _verdicts(base, new_slow)
    assert move.other is None and not decided["change"].isin(["worse", "better"]).any()


def test_witnesses_disagree_needs_a_gap_and_disjoint_intervals():
    assert run_diff.witnesses_disagree(_iv(3.0, 2.9, 3.1), _iv(1.0, 0.95, 1.05))
    assert not run_diff.witnesses_disagree(_iv(1.2, 1.15, 1.25), _iv(1.0, 0.95, 1.05))
    assert not run_diff.witnesses_disagree(_iv(3.0, 0.9, 3.1), _iv(1.0, 0.95, 1.05))


# ---------------------------------------------------------------- noise flag


STEADY_PROBE = [100.0, 97.0, 103.0, 99.0, 101.0, 98.0, 102.0, 100.0]


def test_a_shared_machine_alone_flags_nothing():
    """The probe scatters widely but keeps its level; the record is as steady as it."""
    shared = [100.0, 60.0, 140.0, 90.0, 120.0, 70.0, 130.0, 95.0]
    samples = list(2.0 * np.exp(np.linspace(-0.1, 0.1, 12)))
    assert noise.flags(samples, 0.05, shared, 0.25, 0.05) == []


def test_a_record_less_steady_than_the_probe_is_flagged_by_spread():
    samples = [1.0, 1.3, 0.8, 1.25, 0.85, 1.2, 0.9, 1.1, 1.0, 0.95]
    assert noise.rel_spread(samples) > 2 * noise.rel_spread(STEADY_PROBE)
    assert noise.flags(samples, 0.1, STEADY_PROBE, 0.25, 0.05) == ["spread"]
    # twice the probe's but under the 5% floor: steady enough
    calm = [1.0, 1.01, 0.99, 1.02, 0.98, 1.0]
    assert noise.flags(calm, 0.01, [100.0, 100.2, 100.1, 100.0], 0.25, 0.05) == []


def test_the_probe_moving_within_the_group_flags_it():
    moved = [100.0, 101.0, 99.0, 100.5, 70.0, 71.0, 69.5, 70.5]
    assert noise.probe_moved(moved)
    assert not noise.probe_moved(STEADY_PROBE)
    assert not noise.probe_moved([100.0, 50.0])  # too few readings to know its jitter
    samples = list(2.0 * np.exp(np.linspace(-0.01, 0.01, 12)))
    assert noise.flags(samples, 0.01, moved, 0.25, 0.05) == ["probe"]


def test_a_wide_own_interval_flags_it():
    assert noise.flags([1.0] * 6, 0.3, [], 0.25, 0.05) == ["samples"]
    assert noise.flags([1.0] * 6, 0.2, [], 0.25, 0.05) == []


# ---------------------------------------------------------------- the pytest-benchmark gate


def _gate():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).parents[2] / "benchmarks" / "gate.py"
    spec = importlib.util.spec_from_file_location("attnbench_gate", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.gate


def test_the_gate_calls_nothing_from_three_rounds_and_allows_for_a_rerun():
    gate = _gate()
    base3, new3 = [1.0, 1.01, 0.99], [1.12, 1.11, 1.13]
    lines, failed = gate({"b": base3}, {"b": new3}, 0.1)
    assert not failed and "cannot tell" in lines[0] and "fewer than 6 samples" in lines[0]
    # 6 rounds a side, a 3% shift: inside the run-to-run floor, not a regression
    base = [1.0, 1.001, 0.999, 1.002, 0.998, 1.0]
    lines, failed = gate({"b": base}, {"b": [x * 1.03 for x in base]}, 0.02)
    assert not failed and "0 worse" in lines[-1]
    # a 30% slowdown is a regression
    lines, failed = gate({"b": base}, {"b": [x * 1.3 for x in base]}, 0.1)
    assert failed and lines[0].startswith("worse")


def test_the_record_flag_follows_the_rule_not_the_probe_scatter():
    """Wired where records get their columns: a shared machine's scattered probe alone
    leaves a steady record unflagged (the old flag set it on any probe spread over 10%)."""
    from attnbench.core.case import Case
    from attnbench.measure.budget import TimingBudget
    from attnbench.measure.execute import timing_columns

    case = Case(batch=1, heads_q=1, heads_kv=1, seq_q=8, seq_k=8, head_dim=4, head_dim_v=4)
    shared = [100.0, 60.0, 140.0, 90.0, 120.0, 70.0, 130.0, 95.0]
    steady = list(2.0 * np.exp(np.linspace(-0.03, 0.03, 12)))
    cols = timing_columns(case, 1e6, steady, "budget", shared, TimingBudget())
    assert cols["noisy"] is False and "noisy_by" not in cols
    moved = [100.0, 101.0, 99.0, 100.5, 70.0, 71.0, 69.5, 70.5]
    cols = timing_columns(case, 1e6, steady, "budget", moved, TimingBudget())
    assert cols["noisy"] is True and cols["noisy_by"] == "probe"
