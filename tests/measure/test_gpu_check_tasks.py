"""measure/gpu_check.py: the GPU check's task list as the harness's tasks, and the harness
killing its workers when its caller is interrupted (the GPU check's time limit)."""

from __future__ import annotations

import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from attnbench.measure import gpu_check

ALL_PARTS = {"flex", "shapes", "configs", "backends"}  # the script's default --parts


def test_the_smoke_task_list_is_the_rehearsals_eleven_tasks_in_order():
    tasks = gpu_check.task_list(ALL_PARTS, [], smoke=True)
    labels = [t.label for t in tasks]
    assert labels[:4] == [
        "shape bfloat16 (1, 2, 1, 33, 47, 40, 24, 'window(5,3)')",
        "shape bfloat16 (1, 2, 2, 1, 20, 16, 16, 'causal')",
        "shape float16 (1, 2, 2, 1, 20, 16, 16, 'causal')",
        "shape float32 (1, 2, 1, 33, 47, 40, 24, 'window(5,3)')"]
    assert labels[4:7] == [f"config {k} #0 bfloat16 d64 causal" for k in ("fwd", "dkdv", "dq")]
    assert [lab.split()[1] for lab in labels[7:]] == ["sdpa_flash", "sdpa_cudnn"] * 2
    assert all(t.args[0].device == "cpu" for t in tasks[7:])  # backend tasks: their case
    assert tasks[0].args[-1] == "cpu" and tasks[4].args[-1] is gpu_check.SMOKE


def test_the_gpu_task_list_covers_every_shape_candidate_and_backend():
    from attnbench.implementations import triton_flash

    K = triton_flash.kernels()
    tasks = gpu_check.task_list(ALL_PARTS, [], smoke=False)
    kinds = [t.label.split()[0] for t in tasks]
    n_configs = sum(len(K.candidate_configs(k, d, d)) for k in ("fwd", "dkdv", "dq")
                    for _, d, _ in gpu_check.GPU.combos)
    assert kinds.count("shape") == 10 + 3 + 2 and kinds.count("config") == n_configs
    assert kinds.count("backend") == 2 + 10 * 4
    assert kinds[:2] == ["backend", "backend"] and "flex" in tasks[0].label  # longest first
    assert all(getattr(a, "device", "cuda") == "cuda" for t in tasks for a in t.args[:1])
    assert gpu_check.task_list({"none"}, [], smoke=False) == []


def test_an_unknown_task_kind_is_refused():
    with pytest.raises(ValueError, match="task kind 'x'"):
        gpu_check.as_task("x", ())


_CALLER = """
import signal, sys, time
# as gpu_correctness.py: its own SIGINT handler, since a background start may ignore SIGINT
signal.signal(signal.SIGINT, signal.default_int_handler)
sys.path.insert(0, sys.argv[1])
import hang_task
from attnbench.measure import correctness
task = correctness.Task(hang_task.hang, (sys.argv[2],), "hang")
try:
    correctness.run_tasks([task], 1, lambda rows: None, timeout_s=300)
except KeyboardInterrupt:
    print("interrupted", flush=True)
    time.sleep(60)  # still alive: no exit handler can have stopped the worker, only run_tasks
"""

_HANG_TASK = """
import os, time
from pathlib import Path
def hang(pid_file):
    Path(pid_file).write_text(str(os.getpid()))
    time.sleep(120)
    return []
"""


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return True
    return "\nState:\tZ" in state  # killed, not yet reaped


def test_an_interrupted_caller_leaves_no_worker_running(tmp_path):
    """The time limit's SIGINT reaches the caller of run_tasks: every worker is killed
    before the interruption goes on (none may hold the GPU in the next step). The caller is
    its own process, as gpu_correctness.py is: its main thread holds nothing but the wait."""
    (tmp_path / "hang_task.py").write_text(_HANG_TASK)
    pid_file = tmp_path / "pid"
    caller = subprocess.Popen([sys.executable, "-c", _CALLER, str(tmp_path), str(pid_file)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not pid_file.exists() and time.monotonic() < deadline:
            assert caller.poll() is None, caller.communicate()[1]
            time.sleep(0.05)
        assert pid_file.exists(), "the task never started"
        time.sleep(0.1)  # the pid is written before the file is closed
        pid = int(pid_file.read_text())
        caller.send_signal(signal.SIGINT)
        ready, _, _ = select.select([caller.stdout], [], [], 60)
        assert ready and caller.stdout.readline() == "interrupted\n"
        deadline = time.monotonic() + 10
        while not _gone(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _gone(pid) and caller.poll() is None
    finally:
        caller.kill()
        caller.communicate()


def test_progress_lines_name_each_failed_and_skipped_check():
    rows = [{"check": "shape x", "tensor": "dq", "ok": False, "maxabs": 0.5, "rel": 0.1,
             "bound": "rel<=0.01"},
            {"check": "shape x", "tensor": "-", "ok": None, "error": "no GQA"}]
    lines = gpu_check.progress_lines(rows, 3.0)
    assert lines == ["  [   3.0s] FAIL shape x (2 checks, 1 failed, 1 not runnable)",
                     "      FAIL shape x dq: maxabs 0.5 rel 0.1 (rel<=0.01)",
                     "      not runnable shape x: no GQA"]


def test_the_summary_line_counts_checks_and_lost_processes():
    rows = [{"ok": True}, {"ok": True}, {"ok": False}, {"ok": None}]
    assert gpu_check.summary_line(rows, {"crashed": 1, "retired": 2}, 14.6) == (
        "gpu_correctness: 2 checks passed, 1 failed, 1 not runnable, 1 tasks crashed their "
        "process, 2 processes retired after a CUDA fault, 15 s")
