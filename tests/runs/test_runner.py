"""Every record status is reachable, records stream to JSONL, and runs resume."""

import json

import pytest
from run_command import TINY

from attnbench import load_results
from attnbench.core.registry import all_backends
from attnbench.runs.record_files import RECORDS, STATUSES, read_records
from attnbench.runs.runner import RunOptions, run_suite
from attnbench.runs.suite import load_suite
from attnbench.stats import intervals

SUITE = """
name = "statuses"
[timing]
warmup_s = 0.001
budget_s = 0.005
min_reps = 2
timeout_s = 20
[defaults]
heads_q = 2
head_dim = 8
[[sweep]]
backends = ["naive", "fake_oom", "fake_error", "fake_nan", "fake_wrong", "fake_missing",
            "fake_refuses", "fake_crash", "fake_hang"]
[sweep.axes]
seq_len = [16, 64, 128]
[[sweep.exclude]]
backend = ["fake_crash", "fake_hang", "fake_error", "fake_nan", "fake_wrong", "fake_missing",
           "fake_refuses"]
seq_len = [64, 128]
[[sweep]]
backends = ["fake_oom"]
[sweep.axes]
seq_len = 16
mask = "causal"
"""


@pytest.fixture(scope="module")
def plugins():
    """Fake backends for the whole module (one slow isolated run serves several tests)."""
    import os

    from conftest import TESTS

    from attnbench.core.registry import all_backends

    old = {k: os.environ.get(k) for k in ("ATTNBENCH_PLUGINS", "PYTHONPATH")}
    os.environ["ATTNBENCH_PLUGINS"] = "fake_backends"
    os.environ["PYTHONPATH"] = str(TESTS)
    all_backends(refresh=True)
    yield
    for k, v in old.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    all_backends(refresh=True)


@pytest.fixture(scope="module")
def suite_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("suite") / "statuses.toml"
    path.write_text(SUITE)
    return path


@pytest.fixture(scope="module")
def status_run(plugins, suite_path, tmp_path_factory):
    from attnbench.core.registry import all_backends

    suite = load_suite(str(suite_path), sorted(all_backends()))
    return run_suite(suite, "cpu", RunOptions(out=tmp_path_factory.mktemp("results"),
                                              run_id="r1", progress=False,
                                              measure_ceilings=False))


def test_every_status_is_reachable(status_run):
    recs = read_records(status_run)
    by = {(r["backend"], r["seq_q"], r["mask"]): r for r in recs}
    expect = {
        ("naive", 16, "none"): "ok",
        ("fake_oom", 16, "none"): "ok",
        ("fake_oom", 64, "none"): "oom",
        ("fake_oom", 128, "none"): "skipped",
        ("fake_oom", 16, "causal"): "unsupported",
        ("fake_error", 16, "none"): "error",
        ("fake_nan", 16, "none"): "wrong",
        ("fake_wrong", 16, "none"): "wrong",
        ("fake_missing", 16, "none"): "unavailable",
        ("fake_refuses", 16, "none"): "unsupported",
        ("fake_crash", 16, "none"): "crashed",
        ("fake_hang", 16, "none"): "timeout",
    }
    got = {k: by[k]["status"] for k in expect}
    assert got == expect
    assert {r["status"] for r in recs} == set(STATUSES)
    for r in recs:
        if r["status"] != "ok":
            assert r["reason"] and "\n" not in r["reason"], r
    assert "MemoryError" in by[("fake_oom", 64, "none")]["reason"]
    assert "oom at the smaller case" in by[("fake_oom", 128, "none")]["reason"]
    assert by[("fake_error", 16, "none")]["reason"] == (
        "RuntimeError: kernel launch failed: invalid configuration")
    assert "NaN" in by[("fake_nan", 16, "none")]["reason"]
    assert "above the float32 tolerance" in by[("fake_wrong", 16, "none")]["reason"]
    assert "attnbench_no_such_module" in by[("fake_missing", 16, "none")]["reason"]
    assert "mask causal not supported" in by[("fake_oom", 16, "causal")]["reason"]
    assert "library refused" in by[("fake_refuses", 16, "none")]["reason"]
    assert "SIGSEGV" in by[("fake_crash", 16, "none")]["reason"]
    assert "20 s limit (timeout_s)" in by[("fake_hang", 16, "none")]["reason"]
    # the sweep went on after the crash and the hang: later cases still ran
    assert by[("naive", 128, "none")]["status"] == "ok"


def test_ok_records_carry_metrics_and_environment(status_run):
    ok = [r for r in read_records(status_run) if r["backend"] == "naive"]
    for r in ok:
        assert r["status"] == "ok"
        assert r["err_impl_out_rel"] < 1e-5
        assert r["err_vs_softmax_out_rel"] == r["err_impl_out_rel"]
        assert len(r["samples_ms"]) == r["n_samples"] >= 2
        assert r["time_ms_min"] <= r["time_ms_median"]
        assert r["tflops"] == pytest.approx(r["flops"] / (r["time_ms_median"] * 1e-3) / 1e12)
        assert r["env_torch"] and r["env_threads"] >= 1
        assert r["run_id"] == "r1"
    meta = json.loads((status_run / "meta.json").read_text())
    assert meta["suite"] == "statuses" and meta["ended"]
    assert meta["environment"]["device"] == "cpu"


def test_jsonl_round_trip_and_load_results(status_run):
    lines = (status_run / RECORDS).read_text().splitlines()
    recs = [json.loads(line) for line in lines]
    assert recs == read_records(status_run)
    df = load_results(status_run)
    assert len(df) == len(recs)
    assert list(df.columns[:4]) == ["run_id", "key", "backend", "status"]
    csv = load_results(status_run / "results.csv")
    assert list(csv["key"]) == list(df["key"])
    assert "samples_ms" not in csv.columns  # raw samples stay in the JSONL


def test_resume_skips_recorded_jobs_and_tolerates_a_torn_line(status_run, suite_path):
    from attnbench.core.registry import all_backends

    path = status_run / RECORDS
    lines = path.read_text().splitlines()
    kept = [line for line in lines if json.loads(line)["backend"] != "naive"]
    path.write_text("\n".join(kept) + "\n" + '{"key": "torn')  # killed mid-write
    suite = load_suite(str(suite_path), sorted(all_backends()))
    run_suite(suite, "cpu", RunOptions(out=status_run.parent, run_id="r1", resume=True,
                                       progress=False, measure_ceilings=False))
    recs = read_records(status_run)
    assert sorted(r["seq_q"] for r in recs if r["backend"] == "naive") == [16, 64, 128]
    assert sum(r["backend"] == "fake_crash" for r in recs) == 1  # not run again


def test_existing_run_is_not_overwritten(status_run, suite_path):
    from attnbench.core.errors import BadInput
    from attnbench.core.registry import all_backends

    before = (status_run / RECORDS).read_text()
    suite = load_suite(str(suite_path), sorted(all_backends()))
    with pytest.raises(BadInput, match="already exists"):
        run_suite(suite, "cpu", RunOptions(out=status_run.parent, run_id="r1", progress=False))
    assert (status_run / RECORDS).read_text() == before


def test_compare_flags_slower_and_broken_records(status_run, tmp_path, capsys):
    import shutil

    from attnbench.cli import main

    base, new, noise = tmp_path / "r1", tmp_path / "r2", tmp_path / "r3"
    for run, factor in ((base, 1.0), (new, 2.0), (noise, 1.03)):
        shutil.copytree(status_run, run)
        recs = read_records(run)
        for r in recs:
            if r["backend"] == "naive" and r["seq_q"] == 64:  # 12 samples, scaled
                r["samples_ms"] = [factor * (1.0 + 0.01 * i) for i in range(12)]
                r["time_ms_median"] = factor * 1.055
            if run == new and r["backend"] == "naive" and r["seq_q"] == 128:
                r["status"], r["reason"] = "error", "RuntimeError: boom"
        (run / RECORDS).write_text("".join(json.dumps(r) + "\n" for r in recs))
    assert main(["compare", str(base), str(base), "--fail-on-regression"]) == 0
    assert main(["compare", str(base), str(new), "--fail-on-regression"]) == 1
    out = capsys.readouterr().out
    assert "2 regression(s)" in out
    assert "ok -> error" in out
    # 3% slower and significant, but within the 10% threshold: no regression
    assert main(["compare", str(base), str(noise), "--fail-on-regression"]) == 0
    assert "0 regression(s)" in capsys.readouterr().out


def test_dtypes_far_slower_than_float32_are_left_out_saying_why():
    from attnbench.runs.runner import slow_dtypes

    ceilings = {"matmul_tflops": {"float32": 0.2, "bfloat16": 0.0024}}  # an AVX2 host
    slow = slow_dtypes(ceilings, 8)
    assert list(slow) == ["bfloat16"]
    assert "0.0024 TFLOP/s" in slow["bfloat16"] and "--dtype bfloat16" in slow["bfloat16"]
    assert slow_dtypes({"matmul_tflops": {"float32": 0.2, "bfloat16": 0.44}}, 8) == {}
    assert slow_dtypes(ceilings, 0) == {}  # a suite without the option runs every dtype
    # an AMX host: bf16 15x faster than float32, which is still run (the reference precision)
    assert slow_dtypes({"matmul_tflops": {"float32": 0.07, "bfloat16": 1.1}}, 8) == {}
    assert list(slow_dtypes({"matmul_tflops": {"float32": 0.07, "bfloat16": 1.1,
                                                "float16": 0.001}}, 8)) == ["float16"]


@pytest.mark.slow
def test_a_lost_cuda_context_gets_a_fresh_worker(fake_backends, tmp_path):
    from attnbench.core.registry import all_backends
    from attnbench.runs.runner import RunOptions, run_suite
    from attnbench.runs.suite import load_suite

    path = tmp_path / "ctx.toml"
    path.write_text(TINY.replace('backends = ["naive", "sdpa"]',
                                 'backends = ["naive", "fake_context_lost"]'))
    suite = load_suite(str(path), sorted(all_backends()))
    run_dir = run_suite(suite, "cpu", RunOptions(out=tmp_path / "r", run_id="c",
                                                 progress=False, measure_ceilings=False))
    recs = read_records(run_dir)
    lost = [r for r in recs if r["backend"] == "fake_context_lost"]
    assert all(r["status"] == "error" and r["context_lost"] for r in lost)
    pids = [r["worker_pid"] for r in recs if r["backend"] == "naive"]
    assert len(set(pids)) == len(pids) == 2  # each group after a lost context: a new worker


def test_bf16_left_out_where_aten_runs_without_native_bf16():
    from attnbench.runs.runner import slow_dtypes
    fast = {"matmul_tflops": {"float32": 0.25, "bfloat16": 0.5}}  # oneDNN's AVX-512 bf16
    assert slow_dtypes(fast, 4.0, "avx512") == {}
    left = slow_dtypes(fast, 4.0, "avx2")  # ATEN_CPU_CAPABILITY=avx2 on an AVX-512 host
    assert list(left) == ["bfloat16"] and "pack_vnni2" in left["bfloat16"]
    assert slow_dtypes(fast, 0.0, "avx2") == {}  # a suite that opts out keeps it


def test_groups_are_timed_in_fresh_processes_and_pooled(fake_clock, write_suite, tmp_path):
    """processes = 2: each group is timed in a second, fresh worker too; the records pool
    both processes' samples (still round-aligned) and say so."""
    from attnbench.runs.record_files import read_records
    from attnbench.runs.runner import RunOptions, run_suite
    from attnbench.runs.suite import load_suite

    path = write_suite('name = "p"\nbackends = ["fake_drift_slow", "fake_drift_fast"]\n'
                       "[timing]\nwarmup_s = 0.0\nrewarm_s = 0.0\nbudget_s = 0.02\nmin_reps = 6\n"
                       "max_reps = 6\nprocesses = 2\ntimeout_s = 60\n"
                       "[axes]\nheads_q = 1\nhead_dim = 4\nseq_len = 8\n")
    suite = load_suite(str(path), sorted(all_backends()))
    run = run_suite(suite, "cpu", RunOptions(out=tmp_path, run_id="r", progress=False,
                                             measure_ceilings=False))
    slow, fast = read_records(run)
    assert slow["status"] == fast["status"] == "ok", (slow["reason"], fast["reason"])
    assert slow["processes"] == fast["processes"] == 2
    assert slow["n_samples"] == fast["n_samples"] == 6  # 3 rounds in each process
    assert slow["pair_group"] == fast["pair_group"]
    ratio = intervals.paired_ratio_interval(slow["samples_ms"], fast["samples_ms"])
    assert ratio.contains(2.0), ratio


SEQUENTIAL_SUITE = """name = "seq"
backends = ["fake_drift_slow", "fake_drift_fast"]
[timing]
warmup_s = 0.0
rewarm_s = 0.0  # one untimed call per timed one: the fakes' wobble counts on it
budget_s = 0.02
min_reps = 6
max_reps = 6
processes = {processes}
timeout_s = 60
[axes]
heads_q = 1
head_dim = 4
seq_len = 8
[[claim]]
text = "the fast one is at least {bound}x faster"
kind = "ratio"
numerator = "fake_drift_slow"
denominator = "fake_drift_fast"
expected = [{bound}]
rounds = [8, 16, 24, 32]
"""


@pytest.mark.parametrize("bound,processes,rounds,stop,used,verdict,isolate", [
    # true ratio 2 (per-round 1.9 / 2.1): far from 1.5, the first look decides
    (1.5, 1, 8, "decided", 1, "holds", True),
    (1.5, 3, 8, "decided", 1, "holds", True),  # decided in the first process: no other runs
    # on the bound: every look straddles 2, rounds go on to the budget (past max_reps)
    (2.0, 1, 32, "claim_budget", 1, "inconclusive", True),
    (2.0, 3, 32, "claim_budget", 3, "inconclusive", True),  # looks over 3 processes
    (1.5, 3, 8, "decided", 1, "holds", False),  # the same without isolation
    (2.0, 3, 32, "claim_budget", 3, "inconclusive", False),
])
def test_a_sequential_claim_stops_when_decided_or_at_its_budget(
        fake_clock, write_suite, tmp_path, bound, processes, rounds, stop, used, verdict,
        isolate):
    import pandas as pd

    from attnbench.analysis.claims import claims_table
    from attnbench.runs.record_files import read_records
    from attnbench.runs.runner import RunOptions, run_suite
    from attnbench.runs.suite import load_suite

    path = write_suite(SEQUENTIAL_SUITE.format(bound=bound, processes=processes))
    suite = load_suite(str(path), sorted(all_backends()))
    run = run_suite(suite, "cpu", RunOptions(out=tmp_path, run_id="r", progress=False,
                                             measure_ceilings=False, isolate=isolate))
    slow, fast = read_records(run)
    assert slow["status"] == fast["status"] == "ok", (slow["reason"], fast["reason"])
    for rec in (slow, fast):
        assert (rec["claim_rounds"], rec["claim_stop"]) == (rounds, stop)
        assert rec["n_samples"] == rounds and rec.get("processes", 1) == used
    table = claims_table(pd.DataFrame([slow, fast]), suite.claims)
    assert table["verdict"][0] == verdict
    assert f"98.75% intervals (4 looks), {rounds} rounds ({stop})" in \
        table["measured (95% interval)"][0]
