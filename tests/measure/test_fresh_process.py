"""measure/worker.run_in_fresh_process: the one place besides the worker pool that starts a
process (``attnbench model``'s run, under OMP_WAIT_POLICY set before torch loads)."""

from __future__ import annotations

import os
import sys

from attnbench.measure.worker import run_in_fresh_process


def _report(path: str, code: int) -> None:
    with open(path, "w") as fh:
        fh.write(os.environ.get("ATTNBENCH_TEST_MARK", "-"))
    sys.exit(code)


def _grandchild(path: str) -> None:  # a daemonic worker could not start this one
    sys.exit(run_in_fresh_process(_report, (path, 4)))


def test_the_child_sees_the_environment_and_its_exit_code_comes_back(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNBENCH_TEST_MARK", "passive")
    out = tmp_path / "said"
    assert run_in_fresh_process(_report, (str(out), 3)) == 3
    assert out.read_text() == "passive"


def test_the_child_may_start_processes_of_its_own(tmp_path):
    out = tmp_path / "said"
    assert run_in_fresh_process(_grandchild, (str(out),)) == 4
    assert out.exists()
