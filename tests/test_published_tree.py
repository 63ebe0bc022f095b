"""What the repository publishes under results/ and reports/: the records and reports of
reference runs, never a run's lock file or its workers' log."""

from __future__ import annotations

import json
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


def orphans(paths: list[str], manifests: dict[str, list[str]]) -> list[str]:
    """Tracked report files that their folder's manifest (``.attnbench-report.json``, what
    ``attnbench report`` wrote last) does not list: left over from an older report."""
    out = []
    for p in paths:
        parts = Path(p).parts
        if len(parts) != 3 or parts[0] != "reports" or parts[2] == ".attnbench-report.json":
            continue
        listed = manifests.get(parts[1])
        if listed is not None and parts[2] not in listed:
            out.append(p)
    return out


def test_the_orphan_check_names_files_no_manifest_lists():
    paths = ["reports/r/index.md", "reports/r/a.svg", "reports/r/a.png",
             "reports/r/.attnbench-report.json", "reports/index.md", "reports/s/x.png"]
    assert orphans(paths, {"r": ["index.md", "a.svg"]}) == ["reports/r/a.png"]


def test_every_tracked_report_file_is_in_its_report_manifest():
    paths = tracked("reports")
    manifests = {}
    for p in paths:
        if Path(p).name == ".attnbench-report.json" and len(Path(p).parts) == 3:
            data = json.loads((ROOT / p).read_text(encoding="utf-8"))
            manifests[Path(p).parts[1]] = data.get("files", [])
    bad = orphans(paths, manifests)
    assert not bad, f"{len(bad)} tracked report files no report wrote (git rm them): {bad[:5]}"
