"""``attnbench model``: whole models run with each attention backend (model-level run), then
their report; ``--report RUN`` only rebuilds a run's report."""

from __future__ import annotations

import multiprocessing
import os
import sys
from pathlib import Path

from attnbench.core.errors import BadInput


def add_parser(sub) -> None:
    m = sub.add_parser("model", help="time whole transformers models with each backend "
                                     "(needs the [models] extra)")
    m.add_argument("suite", nargs="?", default="model_steps_cpu",
                   help="a suite with a [models] section (default: model_steps_cpu)")
    m.add_argument("--device", default="auto")
    m.add_argument("--out", default="results", help="results root (runs go to <out>/models/)")
    m.add_argument("--run-id")
    m.add_argument("--report-dir", default="reports",
                   help="reports root (the report goes to <report-dir>/<run-id>/)")
    m.add_argument("--report", metavar="RUN", help="only rebuild the report of this run")
    m.set_defaults(func=run)


def run(args) -> int:
    from attnbench.core.registry import all_backends
    from attnbench.measure.hf_adapter import transformers_reason
    from attnbench.reporting.model_report import summary, write_model_report
    from attnbench.runs.model_runner import run_models
    from attnbench.runs.model_suite import load_model_suite
    from attnbench.runs.overrides import resolve_device
    from attnbench.runs.record_files import RECORDS

    if args.report:
        run_dir = Path(args.report)
        if not (run_dir / RECORDS).is_file():
            raise BadInput(f"--report {args.report}: not a run directory (no {RECORDS})")
    else:
        device = resolve_device(args.device)
        suite = load_model_suite(args.suite, sorted(all_backends()), device)
        reason = transformers_reason()
        if reason:  # still recorded: every job unavailable with the install command
            print(f"attnbench model: {reason}")
        if "OMP_WAIT_POLICY" not in os.environ:
            return _in_fresh_process(suite, device, args)
        run_dir = run_models(suite, args.out, device, args.run_id)
        print(f"run: {run_dir}")
    path = write_model_report(run_dir, Path(args.report_dir) / run_dir.name)
    print(summary(run_dir))
    print(f"report: {path}  ({path.with_suffix('.html')})")
    return 0


def _in_fresh_process(suite, device, args) -> int:
    """The run in a spawned process whose OpenMP pool waits passively: spinning idle threads
    (the default, fixed when torch loads) made a 0.1 ms linear layer take 17 ms on the
    loaded 2-core machine (a minute per tiny model step instead of a second)."""
    os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
    child = multiprocessing.get_context("spawn").Process(
        target=_child, args=(suite, device, args.out, args.run_id, args.report_dir))
    child.start()
    child.join()
    return child.exitcode


def _child(suite, device, out, run_id, report_dir) -> None:
    from attnbench.reporting.model_report import summary, write_model_report
    from attnbench.runs.model_runner import run_models

    try:
        run_dir = run_models(suite, out, device, run_id)
    except BadInput as exc:
        print(f"attnbench: error: {exc}", file=sys.stderr)
        sys.exit(2)
    print(f"run: {run_dir}")
    path = write_model_report(run_dir, Path(report_dir) / run_dir.name)
    print(summary(run_dir))
    print(f"report: {path}  ({path.with_suffix('.html')})")
