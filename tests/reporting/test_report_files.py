"""A report folder: only what a build wrote is ever removed; long suite names make bounded
file names; matplotlib writes nothing under HOME."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from attnbench.cli import main

LONG = "s" * 230  # the trial's crash began at 226 characters
SUITE = f"""
name = "{LONG}"
backends = ["naive", "sdpa"]
[timing]
warmup_s = 0.0
budget_s = 0.002
min_reps = 1
max_reps = 2
[axes]
heads_q = 1
head_dim = 8
seq_len = [16, 32]
"""


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    from attnbench.runs.runner import RunOptions, run_suite
    from attnbench.runs.suite import load_suite

    tmp = tmp_path_factory.mktemp("long")
    (tmp / "long.toml").write_text(SUITE)
    return run_suite(load_suite(str(tmp / "long.toml")), "cpu", RunOptions(
        out=tmp / "results", run_id="long", isolate=False, progress=False,
        measure_ceilings=False))


def test_long_suite_names_give_bounded_chart_names(run_dir, tmp_path, capsys):
    out = tmp_path / "report"
    assert main(["report", str(run_dir), "--out", str(out)]) == 0
    charts = sorted(p.name for p in out.glob("*.svg"))
    assert charts and all(len(name.encode()) <= 150 for name in charts)
    assert len(set(charts)) == len(charts)
    html = (out / "index.html").read_text()
    assert all(name in html for name in charts)  # the document links what was written


def test_report_removes_only_what_it_wrote(run_dir, tmp_path, capsys):
    out = tmp_path / "report"
    out.mkdir()
    mine = [out / "holiday.png", out / "figure-1.png"]
    for path in mine:
        path.write_bytes(b"\x89PNG user's own")
    assert main(["report", str(run_dir), "--out", str(out)]) == 0
    manifest = json.loads((out / ".attnbench-report.json").read_text())
    drawn = [n for n in manifest["files"] if n.endswith(".svg")]
    assert drawn and all((out / n).is_file() for n in drawn)
    # a chart an earlier build wrote and this one does not draw goes; the user's stay
    stale = "time--gone.svg"
    (out / stale).write_bytes(b"old chart")
    manifest["files"].append(stale)
    (out / ".attnbench-report.json").write_text(json.dumps(manifest))
    assert main(["report", str(run_dir), "--out", str(out)]) == 0
    assert not (out / stale).exists()
    assert all(path.read_bytes() == b"\x89PNG user's own" for path in mine)


def test_matplotlib_writes_nothing_under_home(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "MPLCONFIGDIR"} | {"HOME": str(home)}
    proc = subprocess.run([sys.executable, "-c", "import attnbench.reporting.plots"],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert list(home.iterdir()) == []
