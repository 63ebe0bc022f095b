"""benchmarks/ (the suites as pytest-benchmark benchmarks), run as a user runs it: in a
subprocess, on a tiny suite with test backends (tests/fake_backends.py)."""

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"
SUITE = """
name = "tiny_bench"
backends = ["naive", "fake_sleep", "fake_missing", "fake_wrong"]
[timing]
warmup_s = 0.001
budget_s = 0.1
min_reps = 3
max_reps = 3
[axes]
heads_q = 2
head_dim = 16
seq_len = 32
mask = ["none", "causal"]
"""
BASE_SLEEP_MS, SLOW_SLEEP_MS = "100", "200"  # 5% of 100 ms: well above sleep jitter


def bench(tmp_path, *args, sleep_ms):
    # as a user runs it: not as an xdist worker (pytest-benchmark turns itself off there)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")}
    env |= dict(ATTNBENCH_PLUGINS="fake_backends", PYTHONPATH=str(TESTS),
                FAKE_SLEEP_MS=sleep_ms)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rfs", "-p", "no:cacheprovider",
         "--benchmark-only", str(ROOT / "benchmarks"),
         "--attnbench-suite", str(tmp_path / "tiny_bench.toml"),
         f"--benchmark-storage=file://{tmp_path / 'store'}", *args],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """One run of the whole tiny suite, saved as the baseline."""
    tmp = tmp_path_factory.mktemp("bench")
    (tmp / "tiny_bench.toml").write_text(SUITE)
    proc = bench(tmp, "--benchmark-json", str(tmp / "out.json"), "--benchmark-save=base",
                 f"--junitxml={tmp / 'junit.xml'}", sleep_ms=BASE_SLEEP_MS)
    return tmp, proc


def test_one_benchmark_per_supported_pair(saved):
    tmp, proc = saved
    data = json.loads((tmp / "out.json").read_text())
    key = "b1-hq2-hkv2-q32-k32-d16-dv16-float32-cpu-{}-fwd-s0"
    # fake_sleep supports no causal mask, fake_missing is unavailable, fake_wrong fails
    assert sorted(b["param"] for b in data["benchmarks"]) == sorted([
        f"{key.format('causal')}/naive", f"{key.format('none')}/fake_sleep",
        f"{key.format('none')}/naive"])
    for b in data["benchmarks"]:
        assert b["stats"]["rounds"] == 3 and b["extra_info"]["err_impl_out_rel"] < 1e-5
    sleeper = next(b for b in data["benchmarks"] if b["param"].endswith("/fake_sleep"))
    assert sleeper["stats"]["min"] >= float(BASE_SLEEP_MS) * 1e-3  # the sleep is timed
    info = data["machine_info"]["attnbench"]
    assert info["device"] == "cpu" and info["torch"] and "cpu_capability" in info
    assert "SKIPPED" in proc.stdout and "unsupported: mask causal" in proc.stdout
    assert "unavailable: module 'attnbench_no_such_module' is not installed" in proc.stdout


def test_a_wrong_backend_fails_its_benchmark(saved):
    tmp, proc = saved
    assert proc.returncode == 1, proc.stdout[-2000:]
    # the test ids come from the JUnit report: the console's summary lines are cut to the
    # terminal's width, which depends on the host and on how deep the checkout sits
    cases = ET.parse(tmp / "junit.xml").getroot().iter("testcase")
    failed = [case.get("name") for case in cases if case.find("failure") is not None]
    assert failed == ["test_attention[b1-hq2-hkv2-q32-k32-d16-dv16-float32-cpu-none-fwd-s0"
                      "/fake_wrong]"], failed
    assert "fake_wrong b1-hq2-hkv2-q32-k32-d16-dv16-float32-cpu-none-fwd-s0: wrong:" in proc.stdout


def test_compare_fail_trips_on_a_planted_slowdown_and_not_against_itself(saved):
    tmp, _ = saved
    gate = ["--attnbench-backends", "fake_sleep", "--benchmark-compare=0001",
            "--benchmark-compare-fail=median:5%"]
    slow = bench(tmp, *gate, sleep_ms=SLOW_SLEEP_MS)
    assert slow.returncode != 0
    assert "Performance has regressed" in slow.stdout + slow.stderr
    same = bench(tmp, *gate, sleep_ms=BASE_SLEEP_MS)
    assert same.returncode == 0, same.stdout[-2000:] + same.stderr[-2000:]
    assert "Performance has regressed" not in same.stdout + same.stderr


def test_benchmark_samples_come_from_the_timing_loop(monkeypatch):
    """The benchmarks' samples are the run's timing loop's (its warm-up, stopping rule and
    clock): a cold first call (500x the warm ones) is warm-up, never a sample, and sampling
    stops by the loop's precision rule."""
    import importlib.util
    from types import SimpleNamespace

    from attnbench.measure import timing
    from attnbench.measure.timing import TimingBudget

    spec = importlib.util.spec_from_file_location("_bench_attention",
                                                  ROOT / "benchmarks" / "test_attention.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    now = [0.0]
    costs = iter([0.5] + [0.001] * 1000)
    monkeypatch.setattr(timing, "clock", lambda: now[0])

    def fn():
        now[0] += next(costs)

    opened = SimpleNamespace(prepared=SimpleNamespace(fn=fn), inputs=SimpleNamespace(nbytes=0),
                             record=SimpleNamespace(case=SimpleNamespace(device="cpu")))
    budget = TimingBudget(warmup_s=0.01, budget_s=0.03, min_reps=3, max_reps=100)
    samples, stop = module.samples_ms(opened, budget)
    assert stop == "precision" and len(samples) == 6
    assert samples == pytest.approx([1.0] * 6)


def _benchmarks_module(name):
    import importlib.util
    path = ROOT / "benchmarks" / f"{name}.py"
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
