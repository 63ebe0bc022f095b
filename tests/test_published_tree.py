"""What the repository publishes under results/ and reports/: the records and reports of
reference runs, never a run's lock file or its workers' log."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def unpublishable(paths: list[str]) -> list[str]:
    """The tracked paths that are a run's lock or worker log."""
    return [p for p in paths if p.endswith(".lock") or Path(p).name == "worker.log"]


def tracked(*folders: str) -> list[str]:
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    proc = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z", "--", *folders],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip("not a git checkout")
    return [p for p in proc.stdout.split("\0") if p]


def test_the_check_names_locks_and_worker_logs():
    paths = ["results/r/records.jsonl", "results/r/.lock", "results/r/run.lock",
             "results/r/worker.log", "reports/r/index.md", "results/r/worker.log.txt"]
    assert unpublishable(paths) == ["results/r/.lock", "results/r/run.lock",
                                    "results/r/worker.log"]


def test_no_lock_or_worker_log_is_tracked():
    bad = unpublishable(tracked("results", "reports"))
    assert not bad, f"{len(bad)} tracked (git rm --cached them): {bad[:5]}"

