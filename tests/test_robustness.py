"""Hostile input and interrupted runs: one line and exit 2 for bad input, nothing written
outside --out, resume replays the run's own options, retries supersede, compare notices
what is missing."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attnbench.cli import main
from attnbench.core.errors import BadInput
from attnbench.runs.record_files import RECORDS, read_meta, read_records
from attnbench.runs.run_folder import RunLock, new_run_dir, slug
from attnbench.runs.suite import AXIS_KEYS, TIMING_KEYS, TOP_KEYS, parse_suite

TINY = """
name = "tiny"
backends = ["naive", "sdpa"]
[timing]
warmup_s = 0.0
budget_s = 0.002
min_reps = 2
max_reps = 3
[axes]
heads_q = 1
head_dim = 8
seq_len = [16, 32]
"""


@pytest.fixture
def tiny(tmp_path):
    path = tmp_path / "tiny.toml"
    path.write_text(TINY)
    return path


def run(*argv) -> int:
    return main(["run", "--no-isolate", "--no-progress", "--no-report", *argv])


def one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert err.startswith("attnbench: error: ") and "\n" not in err, err
    assert "Traceback" not in err
    return err


def files_under(path: Path) -> set[Path]:
    return {p for p in path.rglob("*")} if path.exists() else set()


@pytest.mark.slow
def test_bare_resume_replays_the_runs_own_suite_and_flags(tiny, tmp_path, capsys):
    out = tmp_path / "results"
    assert run("--suite", str(tiny), "--seq-len", "16,32", "--backends", "naive",
               "--out", str(out), "--run-id", "F") == 0
    full = read_records(out / "F")
    assert len(full) == 2
    lines = (out / "F" / RECORDS).read_text().splitlines()
    (out / "F" / RECORDS).write_text(lines[0] + "\n" + lines[1][:20])  # killed mid-write
    capsys.readouterr()
    assert run("--resume", "F", "--out", str(out)) == 0  # no --suite: the run's own
    assert "the last line was cut off" in capsys.readouterr().err
    again = read_records(out / "F")
    assert sorted((r["key"], r["backend"]) for r in again) == \
        sorted((r["key"], r["backend"]) for r in full)
    assert read_meta(out / "F")["suite"] == "tiny"
    assert run("--resume", "F", "--out", str(out), "--suite", "quick") == 2
    assert "contradicts the run being resumed" in one_line_error(capsys)


def test_retry_supersedes_the_crashed_record(tiny, tmp_path):
    out = tmp_path / "results"
    assert run("--suite", str(tiny), "--out", str(out), "--run-id", "R") == 0
    path = out / "R" / RECORDS
    recs = [json.loads(x) for x in path.read_text().splitlines()]
    recs[0] |= {"status": "crashed", "reason": "worker process killed by signal SIGSEGV"}
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    assert run("--resume", "R", "--out", str(out), "--retry", "crashed,timeout") == 0
    after = read_records(out / "R")
    assert len(after) == len(recs) and all(r["status"] == "ok" for r in after)
    assert len(path.read_text().splitlines()) == len(recs) + 1  # history kept in the file


@pytest.mark.parametrize("run_id", ["../escape", "a/b", "x" * 230, "nul\x00byte", ".hidden"])
def test_unsafe_run_ids_are_refused(tiny, tmp_path, capsys, run_id):
    out = tmp_path / "results"
    assert run("--suite", str(tiny), "--out", str(out), "--run-id", run_id) == 2
    assert "--run-id" in one_line_error(capsys)
    assert files_under(tmp_path) <= {tiny} | files_under(out)
    assert not (tmp_path / "escape").exists()


def test_suite_names_become_slugs_inside_out(tmp_path):
    path = tmp_path / "evil.toml"
    path.write_text(TINY.replace('name = "tiny"', 'name = "../../../../tmp/X/' + "y" * 300
                                 + '"'))
    out = tmp_path / "results"
    assert run("--suite", str(path), "--out", str(out), "--backends", "naive") == 0
    (run_dir,) = list(out.iterdir())
    assert run_dir.parent == out and len(run_dir.name) < 100
    assert slug("../../x y/z") == "x-y-z"


def test_two_runs_in_the_same_second_get_two_folders(tmp_path):
    a = new_run_dir(tmp_path, "20261130-120000-quick-cpu", explicit=False)
    b = new_run_dir(tmp_path, "20261130-120000-quick-cpu", explicit=False)
    assert a != b and b.name.endswith("-2")


def test_a_locked_run_refuses_a_second_writer(tiny, tmp_path, capsys):
    out = tmp_path / "results"
    assert run("--suite", str(tiny), "--out", str(out), "--run-id", "L") == 0
    with RunLock(out / "L"):
        assert run("--resume", "L", "--out", str(out)) == 2
    assert "a run is writing to it" in one_line_error(capsys)


def test_dry_run_plans_and_writes_nothing(tiny, tmp_path, capsys):
    out = tmp_path / "results"
    assert run("--suite", str(tiny), "--out", str(out), "--dry-run") == 0
    assert "4 (case, backend) pairs over 2 cases" in capsys.readouterr().out
    assert not out.exists()
    assert run("--suite", str(tiny), "--out", str(out), "--seq-len", "1000000000") == 2
    assert "plan refused" in one_line_error(capsys) and not out.exists()


def test_compare_counts_what_is_missing(tiny, tmp_path, capsys):
    out = tmp_path / "results"
    assert run("--suite", str(tiny), "--out", str(out), "--run-id", "A") == 0
    assert run("--suite", str(tiny), "--out", str(out), "--run-id", "B",
               "--backends", "naive") == 0
    assert run("--suite", str(tiny), "--out", str(out), "--run-id", "C", "--backends",
               "sdpa", "--seq-len", "64") == 0
    capsys.readouterr()
    a, b, c = (str(out / x) for x in "ABC")
    assert main(["compare", a, c, "--fail-on-regression"]) == 1
    assert "nothing was compared" in capsys.readouterr().out
    # two runs timed minutes apart on a loaded machine can really differ by more than 10%
    # (compare has the power to see it at n = 3): this test is about missing pairs, so a
    # threshold no timing noise reaches
    loose = ["--threshold", "100"]
    assert main(["compare", a, b, "--fail-on-regression", *loose]) == 1
    assert "missing: 2 pair(s) of the base run" in capsys.readouterr().out
    assert main(["compare", a, b, "--fail-on-regression", "--allow-missing", *loose]) == 0


def _bad_suite(tmp_path, text):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize("argv", [
    ["--backends", ""], ["--dtype", ""], ["--threads", "-1"], ["--seq-len", "0"],
    ["--retry", "crashed"], ["--device", "tpu"],
])
def test_bad_command_lines(tiny, tmp_path, capsys, argv):
    out = tmp_path / "results"
    assert run("--suite", str(tiny), "--out", str(out), *argv) == 2
    one_line_error(capsys)
    assert not out.exists() or not any(out.iterdir())


@pytest.mark.parametrize("patch", [
    ('budget_s = 0.002', 'budget_s = "fast"'),
    ('budget_s = 0.002', 'timeout_s = [1]'),
    ('budget_s = 0.002', 'timeout_s = inf'),
    ('budget_s = 0.002', 'timeout_s = 1e308'),
    ('seq_len = [16, 32]', 'seq_len = ' + '[' * 500 + '1' + ']' * 500),
    ('[axes]\nheads_q = 1\nhead_dim = 8\nseq_len = [16, 32]', '[axes]'),
    ('[timing]', '[[claim]]\ntext = "t"\nkind = "value"\nbackend = "naive"\n'
                 'metric = "reason"\n[timing]'),
])
def test_bad_suites(tmp_path, capsys, patch):
    text = TINY.replace(*patch)
    assert text != TINY
    out = tmp_path / "results"
    assert run("--suite", _bad_suite(tmp_path, text), "--out", str(out)) == 2
    one_line_error(capsys)
    assert not out.exists()


def test_bad_files_and_outputs(tiny, tmp_path, capsys):
    a_file = tmp_path / "file"
    a_file.write_text("x")
    assert run("--suite", str(tiny), "--out", str(a_file)) == 2
    assert "is a file" in one_line_error(capsys)
    out = tmp_path / "results"
    assert run("--suite", str(tiny), "--out", str(out), "--run-id", "M") == 0
    (out / "M" / "meta.json").write_text("{not json")
    capsys.readouterr()
    assert run("--resume", "M", "--out", str(out)) == 2
    assert "corrupt" in one_line_error(capsys)
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / RECORDS).write_text("")
    assert main(["report", str(empty)]) == 2
    assert "holds no record" in one_line_error(capsys)
    assert main(["compare", str(out / "M"), str(out / "M"), "--metric", "reason"]) == 2
    one_line_error(capsys)
    assert main(["compare", str(out / "M"), str(out / "M"), "--threshold", "-5"]) == 2
    one_line_error(capsys)
    if os.geteuid() != 0:  # root writes anywhere
        ro = tmp_path / "ro"
        ro.mkdir(mode=0o500)
        assert run("--suite", str(tiny), "--out", str(ro / "x")) == 2
        one_line_error(capsys)


# ---- fuzzing: any suite either loads or fails with one BadInput line --------------------

scalars = st.one_of(st.integers(-10**6, 10**6), st.floats(allow_nan=True),
                    st.text(max_size=12), st.booleans(), st.just(math.inf))
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4), max_leaves=8)
keys = st.sampled_from(list(AXIS_KEYS) + list(TIMING_KEYS) + ["junk", "backends", "name"])
tables = st.dictionaries(keys, values, max_size=6)
suites = st.fixed_dictionaries(
    {}, optional={"name": st.one_of(st.text(max_size=30), scalars),
                  "backends": st.one_of(st.lists(st.sampled_from(["naive", "sdpa", "nope"]),
                                                 max_size=3), scalars),
                  "axes": st.one_of(tables, scalars), "timing": st.one_of(tables, scalars),
                  "defaults": tables, "sweep": st.one_of(st.lists(tables, max_size=3), scalars),
                  "exclude": st.one_of(st.lists(tables, max_size=2), scalars),
                  "claim": st.one_of(st.lists(tables, max_size=2), scalars),
                  "colour": scalars})


@settings(max_examples=1000, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=suites)
def test_fuzzed_suites_load_or_fail_with_one_line(data):
    assert set(data) <= set(TOP_KEYS) | {"colour"}
    try:
        suite = parse_suite(data, Path("fuzz.toml"), ["naive", "sdpa"])
    except BadInput as exc:
        assert "\n" not in str(exc) and str(exc).startswith("fuzz.toml")
        return
    suite.jobs()  # a suite that loads expands into jobs without an exception


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(argv=st.lists(st.sampled_from(["--seq-len", "--dtype", "--backends", "--threads",
                                      "--device", "--retry", "0", "-1", "", "x", "16",
                                      "float32", "naive", "1e9", "cuda", ","]), max_size=6))
def test_fuzzed_command_lines_dry_run(tmp_path_factory, argv):
    out = tmp_path_factory.mktemp("fuzz") / "results"
    try:
        code = main(["run", "--dry-run", "--out", str(out), "--suite", "quick", *argv])
    except SystemExit as exc:  # argparse: usage error, exit 2
        code = exc.code
    assert code in (0, 2)
    assert not out.exists()


# ---- fault backends in the isolated worker ---------------------------------------------

FAULTS = """
name = "faults"
[timing]
warmup_s = 0.0
budget_s = 0.005
min_reps = 2
max_reps = 3
timeout_s = 60
[defaults]
heads_q = 1
head_dim = 8
[[sweep]]
backends = ["fake_state", "fake_abort", "fake_shape", "fake_chatty", "fake_state_check",
            "naive"]
[sweep.axes]
seq_len = [16, 32]
[[sweep]]
backends = ["fake_hog"]
[sweep.axes]
seq_len = [16, 256, 512]
"""


@pytest.mark.slow
def test_fault_backends_cost_one_record_each(fake_backends, tmp_path, capfd, monkeypatch):
    import torch

    from attnbench.core.registry import all_backends
    from attnbench.runs.runner import RunOptions, run_suite
    from attnbench.runs.suite import load_suite

    monkeypatch.setenv("FAKE_EXPECT_THREADS", str(torch.get_num_threads()))
    path = tmp_path / "faults.toml"
    path.write_text(FAULTS)
    suite = load_suite(str(path), sorted(all_backends()))
    run_dir = run_suite(suite, "cpu", RunOptions(out=tmp_path / "results", run_id="f",
                                                 progress=False, measure_ceilings=False,
                                                 max_memory_bytes=4 * 2**30))
    by = {(r["backend"], r["seq_q"]): r for r in read_records(run_dir)}
    for n in (16, 32):
        abort = by[("fake_abort", n)]
        assert abort["status"] == "crashed" and "SIGABRT" in abort["reason"]
        assert "fake_abort: giving up on purpose" in abort["reason"]
        assert by[("fake_shape", n)]["status"] in ("error", "wrong")
        for ok in ("fake_state", "fake_chatty", "naive"):
            assert by[(ok, n)]["status"] == "ok", by[(ok, n)]
        # settings fake_state left behind were restored before the next backend's setup
        assert by[("fake_state_check", n)]["status"] == "ok", by[("fake_state_check", n)]
    assert by[("fake_hog", 16)]["status"] == "ok"
    assert by[("fake_hog", 256)]["status"] == "oom"  # 8 GiB under a 4 GiB cap
    assert by[("fake_hog", 512)]["status"] == "skipped"
    assert "fake_chatty: stdout noise" not in capfd.readouterr().out
    assert "fake_chatty: stdout noise" in (run_dir / "worker.log").read_text()


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


def test_check_determinism_records_bit_identity(fake_backends, tiny, tmp_path):
    out = tmp_path / "results"
    assert run("--suite", str(tiny), "--out", str(out), "--run-id", "D", "--backends",
               "naive,fake_jitter", "--seq-len", "16", "--check-determinism") == 0
    by = {r["backend"]: r for r in read_records(out / "D")}
    assert by["naive"]["status"] == by["fake_jitter"]["status"] == "ok"
    assert by["naive"]["deterministic"] is True
    assert by["fake_jitter"]["deterministic"] is False
    assert run("--resume", "D", "--out", str(out)) == 0  # the flag is the run's own


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


@pytest.mark.slow
def test_ctrl_c_exits_130_without_a_traceback(tiny, tmp_path):
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "results"
    # a warm-up of 0.3 s per group: the run outlasts a busy machine's delay before the kill
    tiny.write_text(TINY.replace("warmup_s = 0.0", "warmup_s = 0.3"))
    env = {k: v for k, v in os.environ.items() if k != "ATTNBENCH_PLUGINS"}
    argv = [sys.executable, "-m", "attnbench.cli", "run", "--suite", str(tiny), "--out",
            str(out), "--run-id", "I", "--no-progress", "--no-report", "--seq-len",
            "16,32,64,128,256,512,1024"]
    # SIGINT back to its default in the child: a shell that starts the tests in the
    # background (`.ci/run &`) hands its children SIGINT ignored, and Python keeps it so
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        path = out / "I" / RECORDS
        if path.exists() and path.read_text().count("\n") >= 1:
            break
        time.sleep(0.01)
    if proc.poll() is not None:
        pytest.skip("the run ended before it could be interrupted")
    os.killpg(proc.pid, signal.SIGINT)  # as a terminal's Ctrl-C: the whole process group
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "attnbench: interrupted" in err
    assert all(json.loads(line) for line in (out / "I" / RECORDS).read_text().splitlines())
