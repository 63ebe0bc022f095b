"""What a new user meets first (--backends narrowing, --dry-run checks, ...)."""

from __future__ import annotations

import pytest

from attnbench.core.errors import BadInput
from attnbench.runs.overrides import select


def _pairs(jobs):
    return {(case.mask, backend) for case, backend in jobs}


def test_backends_narrow_each_sweep_instead_of_replacing_it():
    suite, _, jobs = select("family", "sliding_window,sdpa", seq_len="1024,2048",
                            device="cpu")
    backends = {b for _, b in jobs}
    assert backends == {"sliding_window", "sdpa"}
    # sliding_window only where the suite lists it (window cases), sdpa never on them
    assert {m for m, b in _pairs(jobs) if b == "sliding_window"} == {"window(255,0)"}
    assert "window(255,0)" not in {m for m, b in _pairs(jobs) if b == "sdpa"}
    assert not any(m.startswith("block_sparse") for m, _ in _pairs(jobs))
    assert any("left out sweeps" in n and "sparse-layouts" in n for n in suite.notes)


def test_a_backend_no_sweep_lists_runs_only_on_cases_it_supports():
    from attnbench.core.registry import get_backend
    suite, _, jobs = select("family", "sliding_window,naive,additive", seq_len="1024",
                            device="cpu")
    assert not suite.notes or all("listed by no sweep" not in n for n in suite.notes)
    suite, _, jobs = select("quick", "linear,naive", device="cpu")
    assert {b for _, b in jobs} == {"linear", "naive"}
    assert all(not get_backend(b).not_supported_reasons(c) for c, b in jobs)
    assert any("linear is listed by no sweep" in n for n in suite.notes)
    unsupported = [c for c, b in select("quick", "naive", device="cpu")[2]
                   if get_backend("linear").not_supported_reasons(c)]
    assert len([1 for _, b in jobs if b == "linear"]) == \
        len(select("quick", "naive", device="cpu")[2]) - len(unsupported)


def test_backends_that_no_sweep_can_run_are_refused_with_one_line():
    with pytest.raises(BadInput, match="no sweep"):
        select("quick", "sliding_window", device="cpu")


def test_dry_run_refuses_a_bad_run_id_like_the_real_run(tmp_path, capsys):
    from attnbench.cli import main
    assert main(["run", "--dry-run", "--run-id", "../x", "--out", str(tmp_path)]) == 2
    assert "--run-id '../x'" in capsys.readouterr().err


def _records(rows):
    import pandas as pd
    base = {"run_id": "r", "status": "ok", "dtype": "float32", "mode": "fwd", "seq_k": 1024,
            "feature_map": "elu", "block_random": 2, "additive_dim": 0}
    return pd.DataFrame([base | r | {"seq_k": r["seq_q"]} for r in rows])


def test_inferred_comparison_pairs_only_records_of_the_same_case():
    from attnbench.analysis.comparisons import infer
    df = _records([
        {"backend": "sliding_window", "key": "win-1k", "mask": "window(255,0)", "seq_q": 1024},
        {"backend": "sdpa", "key": "win-1k", "mask": "window(255,0)", "seq_q": 1024},
        {"backend": "sdpa", "key": "dense-1k", "mask": "none", "seq_q": 1024},
        {"backend": "sliding_window", "key": "causal-1k", "mask": "causal", "seq_q": 1024,
         "status": "unsupported"},
    ])
    paired, *alone = infer(df)
    assert {paired.baseline, *paired.backends} == {"sdpa", "sliding_window"}
    assert set(paired.records(df)["key"]) == {"win-1k"}
    assert len(paired.pairs(df)) == 1
    assert {c.name for c in alone} == {"sdpa", "sliding_window"}
    assert all(c.baseline is None for c in alone)


def test_a_declared_comparison_missing_its_baseline_or_every_other_backend_is_left_out():
    """--backends sliding_window,sdpa on the family suite: 'window-vs-flex' would draw
    sliding_window against a flex that never ran (only 'no baseline' marks)."""
    from attnbench.analysis.comparisons import Comparison, plan
    df = _records([
        {"backend": "sliding_window", "key": "w", "mask": "window(255,0)", "seq_q": 1024},
        {"backend": "sdpa", "key": "c", "mask": "causal", "seq_q": 1024},
    ])
    declared = [Comparison("window-vs-flex", "flex", ("sliding_window",)),
                Comparison("dense", "sdpa", ("linear", "linformer")),
                Comparison("window-vs-causal", "sdpa", ("sliding_window",), pair="shape")]
    kept, notes = plan(df, declared)
    assert [c.name for c, _ in kept if c.declared] == ["window-vs-causal"]
    assert any("'window-vs-flex' has no record of flex" in n for n in notes)
    assert any("'dense' has no record of linear, linformer" in n for n in notes)


def test_lines_are_named_only_by_knobs_their_backends_read():
    from attnbench.reporting import lines
    df = _records([
        {"backend": "sdpa", "key": "a", "mask": "none", "seq_q": 1024, "block_random": 6},
        {"backend": "linear", "key": "b", "mask": "none", "seq_q": 1024,
         "feature_map": "favor"},
        {"backend": "linear", "key": "c", "mask": "none", "seq_q": 1024},
    ])
    names = ["backend", "feature_map", "block_random", "additive_dim"]
    assert lines.shown(df, names) == ["backend", "feature_map"]
    # a knob nobody reads still names lines that could not be told apart without it
    two_sdpa = _records([
        {"backend": "sdpa", "key": "a", "mask": "none", "seq_q": 1024, "block_random": 6},
        {"backend": "sdpa", "key": "b", "mask": "none", "seq_q": 1024},
    ])
    assert lines.shown(two_sdpa, names) == ["backend", "block_random"]


@pytest.mark.parametrize("chart", ["time", "speedup"])
def test_charts_of_status_marks_only_never_read_negative(tmp_path, chart):
    import matplotlib.pyplot as plt

    from attnbench.reporting import plots
    df = _records([{"backend": "sliding_window", "key": f"k{n}", "mask": "causal",
                    "seq_q": n, "status": "unsupported"} for n in (1024, 2048)])
    seen = []
    original = plots._finish

    def keep_limits(fig, ax, path, title):
        seen.append(np.ravel(ax)[0].get_ylim())
        original(fig, ax, path, title)

    import numpy as np
    plots._finish = keep_limits
    try:
        if chart == "time":
            plots.time_chart(df, "t", tmp_path / "t.png", ["backend", "mask"])
        else:
            sp = df.assign(speedup=None, speedup_low=None, speedup_high=None,
                           significant=False, baseline_status="ok")
            plots.speedup_chart(sp, "s", tmp_path / "s.png", ["backend", "mask"], "sdpa")
    finally:
        plots._finish = original
        plt.close("all")
    assert seen and seen[0][0] >= 0, seen


def test_two_masks_of_one_backend_get_two_colours():
    from attnbench.reporting.plots import Palette
    p = Palette()
    window = p.of({"backend": "naive", "mask": "window(255,0)"})["color"]
    causal = p.of({"backend": "naive", "mask": "causal"})["color"]
    assert window != causal
    assert p.color("naive") == window


@pytest.mark.slow
def test_publish_lists_only_tracked_or_marked_runs_and_leaves_git_clean(tmp_path):
    import shutil
    import subprocess

    from test_report import write_run

    from attnbench.reporting.publish import build_index
    if shutil.which("git") is None:
        pytest.skip("git is not installed")

    def git(*args):
        return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
                              cwd=tmp_path, check=True, capture_output=True, text=True).stdout

    git("init", "-q")
    (tmp_path / ".gitignore").write_text("/results/*/\n/reports/*/\n")
    write_run(tmp_path, "2026-12-01-synth-cpu", "AMD EPYC")
    build_index(tmp_path / "results", tmp_path / "reports", rebuild=True, every=True)
    git("add", "-A")
    git("add", "-f", "results/2026-12-01-synth-cpu", "reports/2026-12-01-synth-cpu")
    git("commit", "-qm", "published run")
    write_run(tmp_path, "2026-12-02-adhoc-cpu", "AMD EPYC")      # a local run
    write_run(tmp_path, "2026-12-03-marked-cpu", "NVIDIA H200")  # marked for publication
    (tmp_path / "results" / "2026-12-03-marked-cpu" / "PUBLISH").touch()
    build_index(tmp_path / "results", tmp_path / "reports")
    md = (tmp_path / "reports" / "index.md").read_text()
    assert "2026-12-01-synth-cpu](2026-12-01-synth-cpu/index.md)" in md
    assert "adhoc" not in md
    assert "2026-12-03-marked-cpu (no report" in md  # its report folder is ignored: no link
    git("add", "-f", "results/2026-12-03-marked-cpu")
    git("add", "-A")
    git("commit", "-qm", "index with the marked run")
    build_index(tmp_path / "results", tmp_path / "reports")
    assert git("status", "--porcelain") == ""
    everything = build_index(tmp_path / "results", tmp_path / "reports", every=True)
    assert "adhoc" in (everything / "index.md").read_text()
    assert git("status", "--porcelain") == ""


def test_list_shows_capabilities_and_survives_a_closed_pipe():
    import subprocess
    import sys
    text = subprocess.run([sys.executable, "-m", "attnbench", "list"], capture_output=True,
                          text=True, check=True).stdout
    assert "supports: devices" in text and "knobs feature_map, num_features" in text
    piped = subprocess.run(f"{sys.executable} -m attnbench list --json | head -1",
                           shell=True, capture_output=True, text=True)
    assert piped.stdout == "[\n" and "Traceback" not in piped.stderr, piped.stderr


def _earlier_run(results, suite, jobs, seconds, ms=1.0, environment=None):
    import dataclasses
    import json

    from attnbench.core.record import Record
    run = results / "2026-01-01-earlier"
    run.mkdir(parents=True)
    meta = {"suite": suite.name, "started": "2026-01-01T00:00:00+00:00",
            "ended": f"2026-01-01T00:{seconds // 60:02d}:{seconds % 60:02d}+00:00",
            "timing": dataclasses.asdict(suite.timing), "invocation": {"device": "cpu"},
            "ceilings": {"matmul_tflops": {"float32": 0.25}}}
    if environment:
        meta["environment"] = environment
    (run / "meta.json").write_text(json.dumps(meta))
    with open(run / "records.jsonl", "w") as fh:
        for case, backend in jobs:
            row = Record.new(case, backend, "ok", time_ms_median=ms, flops=case.flops).to_row()
            fh.write(json.dumps(row | {"run_id": run.name, "suite": suite.name}) + "\n")
    return run


def test_dry_run_estimate_comes_from_an_earlier_run_of_the_suite(tmp_path):
    from attnbench.runs.plan import make_plan
    suite, device, jobs = select("quick", device="cpu")
    _earlier_run(tmp_path, suite, jobs, seconds=100)
    plan = make_plan(suite, jobs, device, history=tmp_path)
    assert plan.estimate_s == pytest.approx(100, rel=0.01)  # the same pairs: its own time
    assert "from run 2026-01-01-earlier: 1.7 min measured" in plan.summary()
    half = [j for j in jobs if j[1] == "naive"]
    assert make_plan(suite, half, device, history=tmp_path).estimate_s == \
        pytest.approx(50, rel=0.05)


def test_dry_run_estimate_from_another_machine_scales_by_the_matmul_rates(tmp_path,
                                                                         monkeypatch):
    """An earlier run on another machine: its times scaled by its fp32 matmul rate over this
    machine's (injected here, never measured in a test)."""
    from attnbench.runs import plan as plan_module
    suite, device, jobs = select("quick", device="cpu")
    _earlier_run(tmp_path, suite, jobs, seconds=100,
                 environment={"device_name": "a faster CPU", "cpu_capability": "avx512",
                              "threads": 2})
    monkeypatch.setattr(plan_module, "_matmul_rate", lambda device: 0.125e12)  # half of 0.25
    plan = plan_module.make_plan(suite, jobs, device, history=tmp_path)
    assert plan.estimate_s == pytest.approx(200, rel=0.01)
    assert "measured on a faster CPU: its times scaled x2.00" in plan.summary()


def test_dry_run_of_sequential_claims_says_the_longest_the_run_may_take(tmp_path):
    """family_goals' claims take 12, 24 or 36 rounds as the data decide: one earlier run
    (decided at 12) read 2.0 min, the next three 3.0-3.7. The estimate names the bound."""
    from attnbench.runs.plan import claim_round_budget, make_plan
    suite, device, jobs = select("family_goals", device="cpu")
    rounds = claim_round_budget(suite, jobs)
    sides = {(c.mask, b) for c, b in jobs if (c.key, b) in rounds}
    assert {("window(255,0)", "sliding_window"), ("causal", "sdpa"), ("none", "linear"),
            ("none", "block_sparse"), ("none", "sdpa")} <= sides
    assert set(rounds.values()) == {36}
    _earlier_run(tmp_path, suite, jobs, seconds=120, ms=50.0)
    plan = make_plan(suite, jobs, device, history=tmp_path)
    assert plan.most_s > 1.05 * plan.estimate_s
    assert f"up to {plan.most_s / 60:.1f} min if every sequential claim takes all its " \
           f"rounds" in plan.summary()
    # a suite without sequential claims gives one figure
    quick, _, quick_jobs = select("quick", device="cpu")
    assert claim_round_budget(quick, quick_jobs) == {}
    _earlier_run(tmp_path / "q", quick, quick_jobs, seconds=60)
    plain = make_plan(quick, quick_jobs, device, history=tmp_path / "q")
    assert plain.most_s == plain.estimate_s and "up to" not in plain.summary()


def _benchmarks_module(name):
    import importlib.util
    from pathlib import Path
    path = Path(__file__).resolve().parent.parent / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"_bench_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_benchmark_gate_decides_on_noise_as_compare_does(tmp_path):
    import json
    import random
    gate_mod = _benchmarks_module("gate")
    rng = random.Random(0)

    def write(name, scale, noise):
        rounds = [scale * 1e-3 * (1 + noise * rng.random()) for _ in range(20)]
        (tmp_path / name).write_text(json.dumps({"benchmarks": [
            {"fullname": "bench[a]", "stats": {"data": rounds}}]}))
        return str(tmp_path / name)

    base = write("base.json", 1.0, 0.4)
    # an unchanged tree on a shared machine: medians a few % apart, the same spread
    assert gate_mod.main([base, write("same.json", 1.04, 0.4)]) == 0
    assert gate_mod.main([base, write("slow.json", 1.6, 0.4)]) == 1  # a real regression
    (tmp_path / "bad.json").write_text("{}")
    assert gate_mod.main([base, str(tmp_path / "bad.json")]) == 2


def test_bf16_left_out_where_aten_runs_without_native_bf16():
    from attnbench.runs.runner import slow_dtypes
    fast = {"matmul_tflops": {"float32": 0.25, "bfloat16": 0.5}}  # oneDNN's AVX-512 bf16
    assert slow_dtypes(fast, 4.0, "avx512") == {}
    left = slow_dtypes(fast, 4.0, "avx2")  # ATEN_CPU_CAPABILITY=avx2 on an AVX-512 host
    assert list(left) == ["bfloat16"] and "pack_vnni2" in left["bfloat16"]
    assert slow_dtypes(fast, 0.0, "avx2") == {}  # a suite that opts out keeps it


def test_headings_state_their_unit_once():
    from attnbench.core import metrics
    assert metrics.get("tflops").heading == \
        "Throughput (TFLOP/s of the work each backend performs)"
    assert metrics.get("time_ms_median").heading == "Median time (ms)"


def test_a_multi_run_headline_quotes_the_pooled_figure_not_the_best_run():
    import pandas as pd

    from attnbench.analysis.comparisons import Comparison
    from attnbench.reporting.findings import comparison_headline
    sp = pd.DataFrame([{"run_id": run, "backend": "fast", "seq_q": 1024, "seq_k": 1024,
                        "dtype": "float32", "mode": "fwd", "speedup": s, "speedup_low": s - .1,
                        "speedup_high": s + .1, "significant": True, "significance": ""}
                       for run, s in (("run-a", 2.0), ("run-b", 3.0))])
    line = comparison_headline(Comparison("c", "base", ("fast",)), sp)
    assert "run run-b" not in line and "3x [" not in line, line
    assert "pooled over 2 runs, Hartung-Knapp t quantile with 1 df" in line, line
    assert "per run 2-3x" in line, line
