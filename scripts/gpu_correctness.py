#!/usr/bin/env python3
"""Every GPU backend of suites/h200.toml against the float64 reference, first of all.

A CLI over the correctness harness: the tasks and criteria are ``attnbench.measure.gpu_check``'s,
run in ``attnbench.measure.correctness``'s workers (a task that crashes or hangs its process
fails alone; a process a CUDA fault poisoned is retired). ``GPU_CHECK_FAULTS=segv@I,cuda@J``
injects those faults into tasks I and J, to rehearse on a CPU. ``--out`` is rewritten after
every task, so a run cut by its time limit keeps what finished. Exit code 1 if a check failed
or the run was interrupted, 2 without a GPU.

Usage: python scripts/gpu_correctness.py [--out FILE.json] [--jobs N] [--suite SUITE]
       [--parts flex,shapes,configs,backends] [--smoke]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path


def suite_flex_jobs(suite_name: str | None, device: str) -> list:
    """Every case the suite runs on flex on ``device``: each shape and mode is a compile."""
    if not suite_name:
        return []
    from attnbench.core.errors import BadInput
    from attnbench.runs.suite import load_suite

    try:
        jobs = load_suite(suite_name).jobs_on(device)
    except BadInput as exc:  # step 2 will say the same; step 1 checks the rest
        print(f"gpu_correctness: no flex warm-up: {exc}", flush=True)
        return []
    return [case for case, backend in jobs if backend == "flex"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="write every check as JSON here")
    ap.add_argument("--jobs", type=int, help="processes (default: the CPUs of the affinity "
                    "mask; ptxas and inductor compile on one core each)")
    ap.add_argument("--parts", default="flex,shapes,configs,backends")
    ap.add_argument("--suite", help="warm up every flex job of this suite (name or .toml)")
    ap.add_argument("--smoke", action="store_true",
                    help="CPU dry run of this script through the Triton interpreter, tiny shapes")
    args = ap.parse_args(argv)
    signal.signal(signal.SIGINT, _interrupt_once)
    write = (lambda doc: _write(args.out, doc)) if args.out else (lambda doc: None)
    write({"tasks": None, "finished": 0, "results": [],  # a step cut before any task says so
           "state": "starting (importing torch and triton)"})
    if args.smoke:  # before torch/triton: the kernels must be defined interpreted
        os.environ["TRITON_INTERPRET"] = "1"
    elif os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        print("gpu_correctness: TRITON_INTERPRET is set; unset it to check the compiled kernels")
        return 2
    import torch

    if not args.smoke and not torch.cuda.is_available():
        print("gpu_correctness: no CUDA GPU visible to torch; nothing to check here")
        return 2
    from attnbench.measure import correctness, gpu_check

    parts, flex = set(args.parts.split(",")), []
    if "flex" in parts:
        flex = suite_flex_jobs(args.suite, "cpu" if args.smoke else "cuda")
        print(f"gpu_correctness: flex warm-up, {len(flex)} compiles (every flex shape and mode "
              f"of {args.suite or 'no suite'}): " + (", ".join(c.key for c in flex) or "none"),
              flush=True)
    tasks = gpu_check.task_list(parts, flex, args.smoke)
    faults = gpu_check.parse_faults(os.environ.get("GPU_CHECK_FAULTS", ""), len(tasks))
    jobs = correctness.default_jobs(args.jobs)
    device = "cpu (interpreter)" if args.smoke else torch.cuda.get_device_name()
    print(f"gpu_correctness: {len(tasks)} tasks on {device} with {jobs} processes"
          + (f"; injected faults {faults}" if faults else ""), flush=True)
    header = {"device": device, "torch": torch.__version__,
              "triton": __import__("triton").__version__, "tasks": len(tasks),
              "triton_cache_dir": os.environ.get("TRITON_CACHE_DIR", "(Triton's default)")}
    t0, results, finished = time.perf_counter(), [], set()

    def on_result(rows):  # as results come: a run cut short still says what it checked
        results.extend(rows)
        finished.update(r["task"] for r in rows)
        print("\n".join(gpu_check.progress_lines(rows, time.perf_counter() - t0)), flush=True)
        write(header | {"finished": len(finished), "state": "running", "results": results})

    write(header | {"finished": 0, "state": "running", "results": []})
    try:
        stats = correctness.run_tasks(tasks, jobs, on_result, faults)
    except KeyboardInterrupt:  # the time limit (timeout -s INT); the workers are killed
        print(f"gpu_correctness: interrupted after {len(finished)} of {len(tasks)} tasks",
              flush=True)
        write(header | {"finished": len(finished), "results": results,
                        "state": "interrupted (time limit)"})
        os._exit(1)  # now: waiting for the workers could outlast timeout's grace period
    write(header | {"finished": len(finished), "results": results, "state": "done"} | stats)
    print(gpu_check.summary_line(results, stats, time.perf_counter() - t0), flush=True)
    return 1 if any(r["ok"] is False for r in results) else 0


def _interrupt_once(signum, frame):
    """`timeout` sends SIGINT here and then to the whole group: the second must not cut
    the saving of what finished."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    raise KeyboardInterrupt


def _write(path: str, doc: dict) -> None:
    Path(f"{path}.tmp").write_text(json.dumps(doc, indent=1))
    os.replace(f"{path}.tmp", path)


if __name__ == "__main__":
    sys.exit(main())
