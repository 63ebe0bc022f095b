"""The command line, end to end in subprocesses, on a tiny suite."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
TINY = """
name = "tiny"
description = "two backends, two sizes"
backends = ["naive", "sdpa"]
[timing]
warmup_s = 0.001
budget_s = 0.01
[axes]
heads_q = 2
head_dim = 16
seq_len = [32, 64]
mask = ["none", "causal"]
mode = ["fwd", "fwd_bwd"]
"""


def cli(*args, cwd=None, plugins=False):
    env = dict(os.environ)
    env.pop("ATTNBENCH_PLUGINS", None)
    if plugins:
        env["ATTNBENCH_PLUGINS"] = "fake_backends"
        env["PYTHONPATH"] = str(TESTS)
    return subprocess.run([sys.executable, "-m", "attnbench.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def assert_bad_input(proc, *fragments):
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    for fragment in fragments:
        assert fragment in lines[0]


def test_run_writes_results_and_report(tmp_path):
    suite = tmp_path / "tiny.toml"
    suite.write_text(TINY)
    proc = cli("run", "--suite", str(suite), "--out", "res", "--reports", "rep", "--run-id",
               "t1", "--no-progress", "--no-isolate", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    run = tmp_path / "res" / "t1"
    recs = [json.loads(line) for line in (run / "records.jsonl").read_text().splitlines()]
    assert len(recs) == 2 * 2 * 2 * 2
    assert {r["status"] for r in recs} == {"ok"}
    assert all(r["err_impl_out_rel"] < 1e-5 for r in recs)
    assert all(r["err_impl_dq_rel"] < 1e-4 for r in recs if r["mode"] == "fwd_bwd")
    meta = json.loads((run / "meta.json").read_text())
    assert meta["ceilings"]["matmul_tflops"]["float32"] > 0
    assert meta["ceilings"]["copy_gbps"] > 0
    assert all(0 < r["frac_matmul"] for r in recs)
    assert (run / "results.csv").read_text().startswith("run_id,key,backend,status")
    assert "naive" in proc.stdout and "sdpa" in proc.stdout  # the terminal table
    md = (tmp_path / "rep" / "t1" / "index.md").read_text()
    assert "time--tiny-sdpa-vs-naive--float32-fwd.svg" in md
    # sdpa records which kernel PyTorch dispatched to; the appendix shows it per case
    assert {r["kernel"] for r in recs if r["backend"] == "sdpa"} <= {"flash_cpu", "math"}
    appendix = (tmp_path / "rep" / "t1" / "appendix.md").read_text()
    assert "## Kernel that ran" in appendix
    assert "flash_cpu" in appendix.split("## Kernel that ran")[1]
    html = (tmp_path / "rep" / "t1" / "index.html").read_text()
    assert '<img src="time--tiny-sdpa-vs-naive--float32-fwd.svg"' in html

    # the report command on the same run, under another name
    proc = cli("report", str(run), "--name", "again", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "reports" / "again" / "index.html").exists()


@pytest.mark.parametrize("args,fragments", [
    (["run", "--backends", "naive,flashy"], ["--backends", "'flashy'", "allowed:", "naive"]),
    (["run", "--device", "cuda"], ["--device cuda", "no CUDA device"]),
    (["run", "--device", "tpu"], ["--device tpu", "allowed: auto, cpu, cuda"]),
    (["run", "--seq-len", "12,abc"], ["--seq-len", "positive integers"]),
    (["run", "--dtype", "float8"], ["command line: dtype = 'float8'", "allowed: float64"]),
    (["run", "--suite", "nope"], ["unknown suite 'nope'", "quick"]),
    (["run", "--resume", "no-such-run"], ["--resume no-such-run", "no such run"]),
    (["report", "no/such/dir"], ["no/such/dir", "not a run directory"]),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, monkeypatch, capsys, args, fragments):
    from attnbench.cli import main

    monkeypatch.chdir(tmp_path)
    code = main(args)
    err = capsys.readouterr().err
    assert_bad_input(subprocess.CompletedProcess(args, code, "", err), *fragments)
    assert not (tmp_path / "results").exists()


def test_bad_suite_file_touches_nothing(tmp_path):
    (tmp_path / "bad.toml").write_text('backends = ["naive"]\n[axes]\nseq_len = [8, -1]\n')
    results = tmp_path / "results"
    proc = cli("run", "--suite", "bad.toml", cwd=tmp_path)
    assert_bad_input(proc, "bad.toml", "axes.seq_len = -1", "positive integer")
    assert not results.exists()


def test_strict_gate_exits_1_on_wrong_records(tmp_path):
    suite = tmp_path / "s.toml"
    suite.write_text('backends = ["naive", "fake_wrong"]\n[timing]\nbudget_s = 0.001\n'
                     "[axes]\nheads_q = 1\nhead_dim = 8\nseq_len = 16\n")
    proc = cli("run", "--suite", str(suite), "--no-progress", "--no-report", "--no-isolate",
               "--strict", cwd=tmp_path, plugins=True)
    assert proc.returncode == 1, proc.stderr
    assert "wrong" in proc.stdout


def test_list_shows_every_backend_with_reasons(tmp_path):
    proc = cli("list", cwd=tmp_path, plugins=True)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert any(line.startswith("naive") and "available" in line for line in lines)
    i = next(n for n, line in enumerate(lines) if line.startswith("fake_missing"))
    assert "unavailable" in lines[i] and "attnbench_no_such_module" in lines[i + 1]
    as_json = json.loads(cli("list", "--json", cwd=tmp_path).stdout)
    naive = next(b for b in as_json if b["name"] == "naive")
    assert naive["available"] and "causal" in naive["capabilities"]["masks"]


def test_env_prints_the_environment(tmp_path):
    proc = cli("env", cwd=tmp_path)
    assert proc.returncode == 0
    env = json.loads(proc.stdout)
    assert env["device"] == "cpu" and env["torch"] and env["threads"] >= 1
