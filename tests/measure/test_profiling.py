"""Profiles: trace, kernel table and record columns; profiling after (never inside) timing;
the profile command's output and bad input."""

import csv
from types import SimpleNamespace

import pytest
import torch
from test_cli import assert_bad_input

from attnbench.core.case import Case
from attnbench.core.record import OPTIONAL_COLUMNS
from attnbench.measure import profiler
from attnbench.measure.execute import CaseCache, execute_group, timing_columns
from attnbench.measure.timing import TimingBudget
from attnbench.reporting.report import build_report

BUDGET = TimingBudget(warmup_s=0.001, budget_s=0.02, min_reps=3, max_reps=8)
CASE = Case(batch=1, heads_q=2, heads_kv=2, seq_q=128, seq_k=128, head_dim=16, head_dim_v=16,
            mask="causal")
TINY = """
name = "tiny"
backends = ["naive", "sdpa"]
[timing]
warmup_s = 0.001
budget_s = 0.01
[axes]
heads_q = 2
head_dim = 16
seq_len = [32, 64]
"""


@pytest.fixture(scope="module")
def naive_profiled(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("run")
    rec = execute_group([(CASE, "naive")], BUDGET, CaseCache(), profile_dir=str(run_dir))[0]
    return rec, run_dir


def test_trace_loads_and_holds_the_backends_ops(naive_profiled):
    rec, run_dir = naive_profiled
    assert rec.status == "ok", rec.reason
    trace = profiler.load_trace(run_dir / rec.info["profile_trace"])
    names = {e.get("name") for e in trace["traceEvents"]}
    # naive is matmul, mask, softmax, matmul: its ATen operators are in the trace, inside
    # the region named by the pair
    assert {"aten::bmm", "aten::_softmax"} <= names
    assert profiler.range_name(CASE.key, "naive") in names


def test_kernel_table_adds_up(naive_profiled):
    rec, run_dir = naive_profiled
    rows = profiler.read_table(run_dir / rec.info["profile_kernels"])
    assert rows and [r["self_ms"] for r in rows] == sorted((r["self_ms"] for r in rows),
                                                           reverse=True)
    total = sum(r["self_ms"] for r in rows)
    assert total == pytest.approx(rec.info["profile_total_ms"])
    median = rec.metrics["time_ms_median"]
    assert sum(r["share"] for r in rows) == pytest.approx(total / median)
    for r in rows:
        assert 0 < r["self_ms"] <= r["total_ms"] + 1e-9
    # self times of the operators inside the profiled region add up to its wall time
    assert total == pytest.approx(rec.info["profile_wall_ms"], rel=0.02)
    assert [t["name"] for t in rec.info["profile_top"]] == [
        r["name"] for r in rows[:profiler.TOP_ROWS]]


def test_record_points_to_its_files(naive_profiled):
    rec, run_dir = naive_profiled
    for col in ("profile_trace", "profile_kernels"):
        assert col in OPTIONAL_COLUMNS
        path = run_dir / rec.info[col]
        assert path.is_file() and path.stat().st_size > 0
        assert not rec.info[col].startswith("/")  # relative: the run directory can move
    assert "profile_memory" not in rec.info  # the memory timeline is a GPU feature


def test_profiling_comes_after_timing_and_changes_no_number(fake_backends, tmp_path):
    from fake_backends import Logged

    Logged.CALLS.clear()
    rec = execute_group([(CASE.replace(mask="none"), "fake_logged")], BUDGET, CaseCache(),
                        profile_dir=str(tmp_path))[0]
    assert rec.status == "ok", rec.reason
    n = rec.info["profile_calls"]
    calls = Logged.CALLS
    # after measuring: a warm-up call, n bare sessions of one call (the table) each after a
    # plain call (profile_plain_ms), then a full session of n calls (the trace)
    tail = [False] + [False, True] * n + [True] * n
    assert n >= 1 and calls[-len(tail):] == tail
    assert not any(calls[:-len(tail)])  # no timed (or checked, or memory) call was profiled
    assert len(calls) - len(tail) >= rec.metrics["n_samples"]
    assert rec.info["profile_plain_ms"] > 0
    recomputed = timing_columns(rec.case, rec.metrics["work_flops"], rec.info["samples_ms"],
                                rec.info["sampling_stop"], [], BUDGET)
    assert rec.metrics["time_ms_median"] == recomputed["time_ms_median"]


def test_cuda_kernel_table_attributes_the_work_to_a_dominant_kernel():
    cuda, cpu = torch.autograd.DeviceType.CUDA, torch.autograd.DeviceType.CPU

    def evt(key, device_type, self_us, count=1):
        return SimpleNamespace(key=key, device_type=device_type, count=count,
                               self_device_time_total=self_us, device_time_total=self_us,
                               self_cpu_time_total=5.0, cpu_time_total=5.0, flops=0)

    events = [evt("flash_fwd_kernel", cuda, 950.0), evt("fill", cuda, 50.0, 2),
              evt("aten::sdpa", cpu, 0.0)]
    rows = profiler.kernel_table(events, "cuda", median_ms=1.0, work_flops=2e12,
                                  min_bytes=4e9)
    assert [r.name for r in rows] == ["flash_fwd_kernel", "fill"]
    assert rows[0].tflops == pytest.approx(2e12 / 0.95e-3 / 1e12)
    assert rows[0].gbps == pytest.approx(4e9 / 0.95e-3 / 1e9)
    assert rows[1].tflops is None and rows[1].share == pytest.approx(0.05)
    # no kernel dominates: nothing is attributed
    split = profiler.kernel_table([evt("a", cuda, 500.0), evt("b", cuda, 500.0)], "cuda",
                                   1.0, 2e12, 4e9)
    assert all(r.tflops is None and r.gbps is None for r in split)


def test_nvtx_is_a_no_op_on_cpu():
    def f():
        return 1

    assert profiler.nvtx_wrapped(f, "x", "cpu") is f


def test_profile_command_writes_files_and_tool_lines(tmp_path, capsys, monkeypatch):
    from attnbench.cli import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "tiny.toml").write_text(TINY)
    code = main(["profile", "--suite", "tiny.toml", "--backends", "sdpa", "--seq-len", "64",
                 "--out", "res", "--run-id", "p1", "--no-progress", "--no-isolate",
                 "--no-report"])
    out = capsys.readouterr().out
    assert code == 0
    assert "aten::_scaled_dot_product" in out
    assert "nsys profile" in out and "ncu --nvtx --nvtx-include" in out
    assert "-cuda-none-fwd-s0/sdpa" in out  # the range the GPU run will open
    rows = list(csv.DictReader(open(next((tmp_path / "res" / "p1").rglob("*.kernels.csv")))))
    assert rows and rows[0]["device"] == "cpu"
    assert profiler.OUTSIDE_OPERATORS in {r["name"] for r in rows}

    report = build_report([tmp_path / "res" / "p1"], tmp_path / "rep")
    md = (report / "index.md").read_text()
    section = md[md.index("## Where the time goes"):]
    assert "scaled_dot_product_flash_attention_for_cpu" in section.split("\n## ")[0]
    assert (report / "roofline.svg").is_file() and "roof float32" in section


@pytest.mark.parametrize("args,fragments", [
    (("--backends", "nope"), ("unknown backend 'nope'", "allowed")),
    (("--seq-len", "0"), ("--seq-len", "positive")),
    (("--suite", "quick"), ("profile: the selection holds", "at most 64")),
    (("--suite", "no_such_suite"), ("no_such_suite",)),
])
def test_profile_bad_input_is_one_line(tmp_path, capsys, monkeypatch, args, fragments):
    from attnbench.cli import main

    monkeypatch.chdir(tmp_path)
    code = main(["profile", *args, "--out", "res", "--no-progress"])
    err = capsys.readouterr().err
    assert_bad_input(SimpleNamespace(returncode=code, stderr=err), *fragments)
    assert not (tmp_path / "res").exists() or not any((tmp_path / "res").rglob("*.jsonl"))


def test_sessions_are_merged_per_operator_and_device():
    cpu, cuda = torch.autograd.DeviceType.CPU, torch.autograd.DeviceType.CUDA

    def evt(key, device_type, self_us, count=1):
        return SimpleNamespace(key=key, device_type=device_type, count=count,
                               self_cpu_time_total=self_us, cpu_time_total=2 * self_us,
                               self_device_time_total=0.0, device_time_total=0.0, flops=0)

    merged = profiler.merged_events([[evt("aten::bmm", cpu, 10.0, 4), evt("k", cuda, 1.0)],
                                      [evt("aten::bmm", cpu, 30.0, 4)]])
    bmm = next(m for m in merged if m.key == "aten::bmm")
    assert (bmm.count, bmm.self_cpu_time_total, bmm.cpu_time_total) == (8, 40.0, 80.0)
    assert len(merged) == 2  # the CUDA event stays its own row
    rows = profiler.kernel_table(merged, "cpu", median_ms=0.02, n_calls=2)
    assert rows[0].calls == 4 and rows[0].self_ms == pytest.approx(0.02)


@pytest.mark.parametrize("ladder,in_cache", [
    ({"1048576": 70.0, "134217728": 23.0}, "roof float32 in cache: 70 GB/s (the 1 MiB copy)"),
    ({"1048576": 23.5, "134217728": 23.0}, None),  # no faster rung: one roof
    ({}, None),  # a run recorded before the ladder
])
def test_roofline_draws_the_in_cache_roof_beside_the_streaming_one(tmp_path, ladder, in_cache):
    import pandas as pd

    from attnbench.reporting.plots import Palette
    from attnbench.reporting.time_breakdown import roofline_chart

    df = pd.DataFrame([dict(status="ok", backend="sdpa", dtype="float32", tflops=0.5,
                            gbps=40.0)])
    ceilings = {"r1": {"matmul_tflops": {"float32": 2.0}, "copy_gbps": 23.0,
                       "copy_gbps_by_bytes": ladder}}
    alt = roofline_chart(df, ceilings, tmp_path / "roof.png", Palette()).alt
    assert "roof float32: 2 TFLOP/s, 23 GB/s" in alt and (tmp_path / "roof.png").is_file()
    assert (in_cache in alt) if in_cache else ("in cache" not in alt)
