#!/usr/bin/env python3
"""What the GPU check's step 3 costs on a run the size of suites/h200.toml, without a GPU.

Writes a synthetic run with one record per (case, backend) job of the suite on ``cuda``
(every job ``ok``, times from a roofline-like model with per-round jitter, paired as the
runner pairs them), then times ``gpu_summary.py`` and ``attnbench report`` on it in
separate processes and prints wall and CPU seconds of each (children included). The
numbers set ``REPORT_LIMIT_S`` in scripts/gpu_check.sh (docs/gpu.md, "Budget").

Usage: python scripts/gpu_report_cost.py [--suite h200] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def synthetic_rows(suite, run_id: str) -> list[dict]:
    from attnbench.core.record import Record
    from attnbench.runs.pairing import job_groups
    from attnbench.stats import intervals

    rng = random.Random(0)
    jobs = suite.jobs_on("cuda")
    rows = []
    for g, group in enumerate(job_groups(jobs, suite.claims, suite.comparisons)):
        for case, backend in group:
            ms = case.flops / 300e12 * 1e3 * (1 + 0.3 * rng.random())  # ~300 TFLOP/s
            samples = [ms * (1 + 0.01 * rng.uniform(-1, 1)) for _ in range(20)]
            iv = intervals.median_interval(samples)
            rows.append(Record.new(
                case, backend, "ok", semantics="exact", time_ms_median=sorted(samples)[10],
                time_ms_ci_low=iv.low, time_ms_ci_high=iv.high, samples_ms=samples,
                tflops=case.flops / (ms * 1e-3) / 1e12, peak_mem_bytes=4.0 * case.flops ** 0.5,
                err_impl_out_rel=3e-3, err_vs_softmax_out_rel=3e-3, pair_group=f"g{g}",
            ).to_row() | {"run_id": run_id, "suite": suite.name})
    return rows


def write_run(root: Path, suite_name: str) -> Path:
    from attnbench.runs.suite import load_suite

    suite = load_suite(suite_name)
    run_id = f"synthetic-{suite.name}"
    run = root / "results" / run_id
    run.mkdir(parents=True)
    with open(run / "records.jsonl", "w") as fh:
        for r in synthetic_rows(suite, run_id):
            fh.write(json.dumps(r) + "\n")
    meta = {"run_id": run_id, "suite": suite.name, "suite_path": str(suite.path),
            "started": "2026-12-01T10:00:00+00:00", "ended": "2026-12-01T10:02:00+00:00",
            "environment": {"device": "cuda", "device_name": "Synthetic H200",
                            "git_commit": "0" * 40, "torch": "2.11.0+cu130"},
            "ceilings": {"matmul_tflops": {"bfloat16": 700.0, "float16": 700.0,
                                           "float32": 50.0}, "copy_gbps": 4000.0},
            "claims": suite.claims}
    (run / "meta.json").write_text(json.dumps(meta))
    return run


def timed(cmd: list[str]) -> tuple[int, float, float]:
    """(exit code, wall s, CPU s of the child and its children)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    rc = subprocess.run(cmd, cwd=REPO, stdout=subprocess.DEVNULL).returncode
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return rc, wall, cpu


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--suite", default="h200")
    ap.add_argument("--keep", help="write the run and report here (default: a temporary folder)")
    args = ap.parse_args(argv)
    root = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="report-cost-"))
    run = write_run(root, args.suite)
    n = sum(1 for _ in open(run / "records.jsonl"))
    py = sys.executable
    steps = {
        "summary": [py, "scripts/gpu_summary.py", str(run), "--out", str(root / "summary.md")],
        "report": [py, "-m", "attnbench.cli", "report", str(run), "--name", run.name,
                   "--out", str(root / "report")],
    }
    print(f"{n} synthetic records of suite {args.suite} in {run} ({os.cpu_count()} CPUs)")
    for name, cmd in steps.items():
        rc, wall, cpu = timed(cmd)
        print(f"{name}: exit {rc}, {wall:.1f} s wall, {cpu:.1f} CPU-s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
