"""``attnbench model``: whole models run with each attention backend (model-level run), then
their report; ``--resume RUN_ID`` measures what a model run has not recorded yet (its own
suite, on its own device); ``--report RUN`` only rebuilds a run's report."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from attnbench.core.errors import BadInput

DEFAULT_SUITE = "model_steps_cpu"


def add_parser(sub) -> None:
    m = sub.add_parser("model", help="time whole transformers models with each backend "
                                     "(needs the [models] extra)")
    m.add_argument("suite", nargs="?",
                   help=f"a suite with a [models] section (default: {DEFAULT_SUITE}; with "
                        f"--resume: the run's own)")
    m.add_argument("--device", default="auto")
    m.add_argument("--out", default="results", help="results root (runs go to <out>/models/)")
    m.add_argument("--run-id")
    m.add_argument("--resume", metavar="RUN_ID",
                   help="measure the pairs the model run <out>/models/RUN_ID has not recorded "
                        "(its recorded suite, on its device); recorded pairs are skipped")
    m.add_argument("--retry", metavar="STATUSES",
                   help="with --resume: measure pairs with these statuses again, e.g. "
                        "unavailable,error (the new record supersedes the old)")
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
        retry = _retry(args)
        if args.resume:
            suite, device = _resumed(args, sorted(all_backends()))
        else:
            device = resolve_device(args.device)
            suite = load_model_suite(args.suite or DEFAULT_SUITE, sorted(all_backends()),
                                     device)
        reason = transformers_reason()
        if reason:  # still recorded: every job unavailable with the install command
            print(f"attnbench model: {reason}")
        if "OMP_WAIT_POLICY" not in os.environ:
            return _in_fresh_process(suite, device, args, retry)
        run_dir = run_models(suite, args.out, device, args.run_id or args.resume,
                             resume=bool(args.resume), retry=retry)
        print(f"run: {run_dir}")
    path = write_model_report(run_dir, Path(args.report_dir) / run_dir.name)
    print(summary(run_dir))
    print(f"report: {path}  ({path.with_suffix('.html')})")
    return 0


def _retry(args) -> tuple[str, ...]:
    from attnbench.runs.overrides import retry_statuses

    return retry_statuses(args.retry, args.resume)


def _resumed(args, known: list[str]):
    """(suite, device) of the run ``--resume`` names; a flag that contradicts it is bad
    input."""
    from attnbench.runs.model_runner import recorded_suite

    if args.suite is not None:
        raise BadInput(f"--resume {args.resume} with the suite {args.suite!r}: allowed: "
                       f"--resume alone (the run's recorded suite is measured)")
    if args.run_id and args.run_id != args.resume:
        raise BadInput(f"--run-id {args.run_id!r} with --resume {args.resume!r}: allowed: "
                       f"one of them (--resume names the run)")
    suite, device = recorded_suite(args.out, args.resume, known)
    if args.device not in ("auto", device):
        raise BadInput(f"--device {args.device}: contradicts the run being resumed "
                       f"({device}); allowed: {device}, or leave it out")
    return suite, device


def _in_fresh_process(suite, device, args, retry) -> int:
    """The run in a spawned process whose OpenMP pool waits passively: spinning idle threads
    (the default, fixed when torch loads) made a 0.1 ms linear layer take 17 ms on the
    loaded 2-core machine (a minute per tiny model step instead of a second)."""
    from attnbench.measure.worker import run_in_fresh_process

    os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
    # Not a worker's call: the whole command, unbounded in time, whose steps may start
    # processes (inductor's compile workers), which a daemonic worker may not.
    return run_in_fresh_process(_child, (suite, device, args.out, args.run_id or args.resume,
                                         bool(args.resume), retry, args.report_dir))


def _child(suite, device, out, run_id, resume, retry, report_dir) -> None:
    from attnbench.reporting.model_report import summary, write_model_report
    from attnbench.runs.model_runner import run_models

    try:
        run_dir = run_models(suite, out, device, run_id, resume=resume, retry=retry)
    except BadInput as exc:
        print(f"attnbench: error: {exc}", file=sys.stderr)
        sys.exit(2)
    print(f"run: {run_dir}")
    path = write_model_report(run_dir, Path(report_dir) / run_dir.name)
    print(summary(run_dir))
    print(f"report: {path}  ({path.with_suffix('.html')})")
