"""Across-runs intervals, the rerun counts, and records timed under an interpreter, on
injected records."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from attnbench.analysis import rerun_agreement, run_diff
from attnbench.core.record import speed_records, timed_under
from attnbench.reporting import findings
from attnbench.stats import run_to_run
from attnbench.stats.intervals import Interval, median_interval


def _run(rng, offsets, n=12, jitter=0.01, under=None):
    """Three backends on six cases timed in shared rounds; each record's level moved by
    ``offsets`` (a run-level factor its own samples do not carry)."""
    rows = []
    for i in range(6):
        for j, b in enumerate(("a", "b", "c")):
            s = (1 + i) * (1 + j) * offsets[i * 3 + j] * rng.lognormal(0, jitter, n)
            iv = median_interval(s)
            rows.append({"key": f"k{i}", "backend": b, "status": "ok", "device": "cpu",
                         "backend_hash": "h", "pair_group": f"g{i}", "samples_ms": list(s),
                         "time_ms_median": iv.estimate, "time_ms_ci_low": iv.low,
                         "time_ms_ci_high": iv.high, "time_ci_confidence": iv.confidence,
                         "n_samples": n, "timed_under": under if b == "c" else None})
    return pd.DataFrame(rows)


def test_across_runs_intervals_overlap_where_within_run_ones_do_not():
    rng = np.random.default_rng(1)
    a = _run(rng, np.exp(rng.uniform(-0.03, 0.03, 18)))
    b = _run(rng, np.exp(rng.uniform(-0.03, 0.03, 18)))
    got = rerun_agreement.agreement([("r1", a), ("r2", b)])
    assert got.records.pairs == 18 and got.records.within > 3
    assert got.records.across == 0
    assert got.ratios.pairs == 18 and got.ratios.across <= got.ratios.within
    counts = got.compares[0][2]
    assert counts["worse"] + counts["better"] == 0
    # a 1.2x slowdown planted on each backend in turn is called worse on all its records
    assert got.detection == {"a": (6, 6), "b": (6, 6), "c": (6, 6)}
    assert any("disjoint within-run" in line for line in got.lines("cpu"))


def test_the_allowance_estimate_from_replicate_pairs():
    rng = np.random.default_rng(2)
    tight = [(Interval(1.0, 0.999, 1.001, 0.95, 20, "x"),
              Interval(r, r * 0.999, r * 1.001, 0.95, 20, "x"))
             for r in np.exp(rng.normal(0, 0.05 * math.sqrt(2), 2000))]
    # per-run sd 0.05: the 95% half-width of one run's offset is about 1.96 x 0.05
    assert run_to_run.estimate(tight) == pytest.approx(1.96 * 0.05, rel=0.1)
    assert run_to_run.estimate(tight[:2]) is None


def test_across_runs_widens_by_the_declared_allowance_of_the_device_kind():
    iv = Interval(1.0, 1.0, 1.0, 0.95, 20, "order-statistics")
    wide = run_to_run.across_runs(iv, "cpu", "record")
    assert math.log(wide.high) == pytest.approx(math.log1p(run_to_run.CPU.record))
    assert run_to_run.kind("cuda:0") == "cuda" and run_to_run.kind(None) == "cpu"
    assert run_to_run.half_width() == pytest.approx(math.sqrt(2) * math.log1p(
        run_to_run.CPU.record))
    assert "across runs" in run_to_run.legend("cpu")
    with pytest.raises(ValueError):
        run_to_run.allowance("cpu", "speed")


def test_records_timed_under_an_interpreter_are_no_speed():
    rng = np.random.default_rng(3)
    df = _run(rng, np.ones(18), under="triton interpreter")
    assert timed_under(df.iloc[2]) == "triton interpreter" and timed_under(df.iloc[0]) == ""
    assert set(speed_records(df)["backend"]) == {"a", "b"}
    # c is fastest by far once scaled down, yet never wins
    df.loc[df["backend"] == "c", "time_ms_median"] = 1e-3
    win = findings.winners(df.assign(run_id="r", dtype="float32", mode="fwd", mask="none",
                                     seq_q=64, seq_k=64, batch=1), ["backend"])
    assert "c" not in set(win["winner"]) and win["others"].str.contains(
        "c timed under triton interpreter").all()
    # compare calls nothing on it, even when it moved 3x
    new = df.copy()
    new["samples_ms"] = [[x * 3 for x in s] if b == "c" else s
                         for s, b in zip(new["samples_ms"], new["backend"])]
    decided = rerun_agreement.compare_counts(df, new)
    assert (decided[decided["backend"] == "c"]["change"] == "cannot tell").all()
    assert (decided[decided["backend"] == "c"]["why"] == "interpreter").all()
    assert run_diff.why_counts(decided).get("interpreter") == 6


def test_a_record_from_before_the_marker_is_known_by_its_kernel_label():
    rng = np.random.default_rng(4)
    df = _run(rng, np.ones(18)).drop(columns="timed_under")
    df["kernel"] = ["triton_flash[none] fwd=M16N16w1s1 (interpreter)" if b == "c"
                    else "math" for b in df["backend"]]
    assert timed_under(df.iloc[2]) == "triton interpreter" and timed_under(df.iloc[0]) == ""
    assert set(speed_records(df)["backend"]) == {"a", "b"}
    new = df.copy()
    new["samples_ms"] = [[x * 3 for x in s] if b == "c" else s
                         for s, b in zip(new["samples_ms"], new["backend"])]
    decided = rerun_agreement.compare_counts(df, new)
    assert (decided[decided["backend"] == "c"]["change"] == "cannot tell").all()


def test_the_marker_is_set_for_triton_backends_under_the_interpreter():
    from attnbench.measure.execute import timed_under as mark

    class B:
        class caps:
            requires = ("triton",)

    assert mark(B, {"TRITON_INTERPRET": "1"}) == {"timed_under": "triton interpreter"}
    assert mark(B, {"TRITON_INTERPRET": "0"}) == {} and mark(B, {}) == {}
    B.caps.requires = ()
    assert mark(B, {"TRITON_INTERPRET": "1"}) == {}


def test_compare_calls_no_change_on_a_record_unsteady_by_its_own_samples():
    r = {"noisy_by_base": "probe+samples", "noisy_by_new": "probe"}
    assert run_diff.unsteady(r) and not run_diff.unsteady({"noisy_by_new": "probe"})


def test_machine_states_name_each_runs_ceiling_and_probe_and_their_spread():
    metas = [{"ceilings": {"matmul_tflops": {"float32": 0.156}}, "probe": {"gflops_median": 101}},
             {"ceilings": {"matmul_tflops": {"float32": 0.159}}, "probe": {"gflops_median": 111}},
             {"ceilings": {"matmul_tflops": {"float32": 0.197}}, "probe": {"gflops_median": 122}}]
    assert rerun_agreement.machine_states(metas) == [
        "machine per run: matmul ceiling float32 0.156, 0.159, 0.197 TFLOP/s "
        "(largest / smallest 1.26x)",
        "machine per run: drift probe 101, 111, 122 GFLOP/s (largest / smallest 1.21x)"]


def test_machine_states_leave_out_what_a_run_did_not_measure():
    metas = [{"ceilings": {"matmul_tflops": {"float32": 0.2}}},
             {"ceilings": {"matmul_tflops": {"float32": 0.2, "bfloat16": 1.0}},
              "probe": {"gflops_median": 120}}]
    assert rerun_agreement.machine_states(metas) == [
        "machine per run: matmul ceiling float32 0.2, 0.2 TFLOP/s (largest / smallest 1x)"]


def test_each_cannot_tell_says_why_and_the_counts_name_the_reasons():
    """Backend a moved 1.08x between two runs with its code unchanged: its intervals reach
    both within and beyond the 10% threshold ('wide'); its record of k0 is flagged unsteady
    by its own samples ('unsteady'; only the new run has the flag's columns, as when an
    older run is compared with a newer one). The agreement counts name both, for compare
    and for the planted slowdown it did not find."""
    rng = np.random.default_rng(7)
    base = _run(rng, np.ones(18))
    new = _run(rng, np.ones(18))
    new["samples_ms"] = [[x * 1.08 for x in s] if b == "a" else s
                         for s, b in zip(new["samples_ms"], new["backend"])]
    new["noisy"] = [k == "k0" and b == "a" for k, b in zip(new["key"], new["backend"])]
    new["noisy_by"] = ["samples" if x else None for x in new["noisy"]]
    decided = rerun_agreement.compare_counts(base, new)
    a = decided[decided["backend"] == "a"].set_index("key")
    assert a.loc["k0", "change"] == "cannot tell" and a.loc["k0", "why"] == "unsteady"
    assert (a.drop("k0")["change"] == "cannot tell").all()
    assert (a.drop("k0")["why"] == "wide").all()
    assert decided.loc[decided["change"] != "cannot tell", "why"].isna().all()
    assert run_diff.why_counts(decided) == {"wide": 5, "unsteady": 1}
    got = rerun_agreement.agreement([("r1", base), ("r2", new)])
    assert got.unclear == {"wide": 5, "unsteady": 1}
    assert any(x.endswith("(why: 5 wide, 1 unsteady)") for x in got.lines("cpu"))
    assert sum(got.missed.values()) == sum(n - f for f, n in got.detection.values())
