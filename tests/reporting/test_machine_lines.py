"""The report's headline names a machine that moved during a run, or between the runs it
reads together (injected probe rates)."""

from __future__ import annotations

import json

import numpy as np
from test_report import write_run

from attnbench.reporting.report import Report
from attnbench.runs import dataset


def _with_probe(run_dir, rates):
    """The run's records given probe rates in recorded order, and its meta their median."""
    path = run_dir / "records.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    for i, (row, rate) in enumerate(zip(rows, rates)):
        row |= {"probe_gflops": rate, "recorded_at": f"2026-12-01T10:{i:02d}:00+00:00"}
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    meta = json.loads((run_dir / "meta.json").read_text())
    meta["probe"] = {"gflops_median": float(np.median(rates))}
    (run_dir / "meta.json").write_text(json.dumps(meta))
    return len(rows)


def test_the_report_headline_names_a_machine_that_moved(tmp_path):
    a = write_run(tmp_path / "a", "a")
    n = sum(1 for _ in (a / "records.jsonl").open())
    _with_probe(a, [120.0] * (n - n // 4) + [100.0] * (n // 4))
    b = write_run(tmp_path / "b", "b")
    _with_probe(b, [150.0] * n)
    heads = Report(dataset.load([a, b]), tmp_path / "rep").headlines()
    during = [h for h in heads if h.startswith("machine moved during run")]
    assert len(during) == 1 and "run a:" in during[0]
    assert any(h.startswith("machine differed between the runs: drift probe 120, 150")
               for h in heads)
    steady = Report(dataset.load([b]), tmp_path / "rep1").headlines()
    assert not any(h.startswith("machine") for h in steady)
