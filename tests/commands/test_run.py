"""`attnbench run`: a dry run plans and writes nothing, --check-determinism, Ctrl-C."""

from __future__ import annotations

import json
import os

import pytest
from run_command import TINY, one_line_error, run

from attnbench.runs.record_files import RECORDS, read_records


def test_dry_run_plans_and_writes_nothing(tiny, tmp_path, capsys):
    out = tmp_path / "results"
    assert run("--suite", str(tiny), "--out", str(out), "--dry-run") == 0
    assert "4 (case, backend) pairs over 2 cases" in capsys.readouterr().out
    assert not out.exists()
    assert run("--suite", str(tiny), "--out", str(out), "--seq-len", "1000000000") == 2
    assert "plan refused" in one_line_error(capsys) and not out.exists()


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
