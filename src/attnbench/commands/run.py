"""``attnbench run``: select a suite's pairs, run them, print the table, write the report."""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path

from attnbench.core.errors import BadInput
from attnbench.runs.overrides import csv_list

GATE_STATUSES = ("wrong", "error", "crashed", "timeout")

# The run options a --resume takes from the run itself (meta.json's "invocation").
REPLAYED = ("suite", "backends", "dtype", "seq_len", "device", "threads", "isolate",
            "max_memory", "check_determinism")
SIZE_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def add_parser(sub) -> None:
    r = sub.add_parser("run", help="run a suite and record results")
    r.add_argument("--suite", help="suite name (in suites/) or path to a .toml (default: quick)")
    r.add_argument("--backends", help="comma-separated backends: each sweep keeps those it "
                   "lists; one no sweep lists runs on the cases it supports")
    r.add_argument("--device", help="auto (default), cpu, cuda or cuda:N")
    r.add_argument("--dtype", help="comma-separated dtypes, replacing the suite's")
    r.add_argument("--seq-len", help="comma-separated sequence lengths, replacing the suite's")
    r.add_argument("--out", default="results", help="results root (default: results)")
    r.add_argument("--run-id", help="run directory name (default: time-suite-device)")
    r.add_argument("--resume", metavar="RUN_ID",
                   help="continue this run with its own suite and options, skipping done pairs")
    r.add_argument("--retry", metavar="STATUSES",
                   help="with --resume: run pairs with these statuses again, e.g. "
                        "crashed,timeout (the new record supersedes the old)")
    r.add_argument("--reports", help="reports root (default: reports/ beside the --out folder)")
    r.add_argument("--no-report", action="store_true", help="do not write a report at the end")
    r.add_argument("--no-isolate", action="store_true",
                   help="run jobs in this process (no crash/timeout protection)")
    r.add_argument("--threads", type=int, help="CPU threads (default: torch's default)")
    r.add_argument("--no-progress", action="store_true", help="no progress bar")
    r.add_argument("--max-memory", metavar="SIZE",
                   help="cap the worker's address space (e.g. 8G): beyond it a pair is oom "
                        "and larger cases of its line are skipped")
    r.add_argument("--check-determinism", action="store_true",
                   help="call each pair twice before timing; record whether the outputs "
                        "matched bit for bit (column deterministic)")
    r.add_argument("--dry-run", action="store_true",
                   help="print the plan (pairs, estimated time, largest inputs) and exit")
    r.add_argument("--force", action="store_true",
                   help="run a plan over the limits (100,000 pairs, inputs beyond memory)")
    r.add_argument("--strict", action="store_true",
                   help="exit 1 if any record is wrong, error, crashed or timeout")
    r.add_argument("--profile", action="store_true",
                   help="after measuring each pair, profile one more untimed call: trace, "
                        "kernel table (see attnbench profile)")
    r.set_defaults(func=run)


def _size(option: str, text: str | None) -> int | None:
    """'8G', '512M', '1073741824' -> bytes (at least 1 GiB: the worker itself needs it)."""
    if text is None:
        return None
    t = str(text).strip().upper().removesuffix("IB").removesuffix("B")
    unit = t[-1:] if t[-1:] in SIZE_UNITS and not t[-1:].isdigit() else ""
    try:
        value = float(t[: len(t) - len(unit)]) * SIZE_UNITS[unit]
    except ValueError:
        value = -1
    if not (2**30 <= value < 2**60):
        raise BadInput(f"{option} {text!r}: allowed: a size of at least 1G, e.g. 8G or 512000M")
    return int(value)


def _invocation(args) -> dict:
    """What this command line asks for, as --resume will replay it."""
    return {"suite": args.suite or "quick", "backends": args.backends, "dtype": args.dtype,
            "seq_len": args.seq_len, "device": args.device or "auto", "threads": args.threads,
            "isolate": not args.no_isolate, "max_memory": args.max_memory,
            "check_determinism": args.check_determinism or None}


def _replay(args) -> dict:
    """A resumed run's own options; a flag that contradicts them is bad input."""
    from attnbench.runs import run_folder
    from attnbench.runs.record_files import META, read_meta

    run_dir = Path(args.out) / run_folder.check_name(args.resume, "--resume")
    if not (run_dir / META).exists():
        raise BadInput(f"--resume {args.resume}: no such run under {args.out}")
    saved = read_meta(run_dir).get("invocation")
    if not isinstance(saved, dict):
        raise BadInput(f"{run_dir / META}: records no invocation (a run from before format 2); "
                       f"allowed: --resume of a run this version started")
    given = _invocation(args)
    for key in REPLAYED:
        flag = {"seq_len": "--seq-len", "isolate": "--no-isolate",
                "max_memory": "--max-memory",
                "check_determinism": "--check-determinism"}.get(key, f"--{key}")
        explicit = getattr(args, key, None) if key != "isolate" else (
            False if args.no_isolate else None)
        if key == "device":
            explicit = args.device
        if key == "check_determinism":
            explicit = args.check_determinism or None
        if explicit is not None and given[key] != saved.get(key):
            raise BadInput(f"{flag} {given[key]!r}: contradicts the run being resumed "
                           f"({saved.get(key)!r}); allowed: leave it out, the run's own "
                           f"options are used")
    return saved


def run(args) -> int:
    from attnbench.core import metrics
    from attnbench.reporting import tables
    from attnbench.reporting.report import build_report
    from attnbench.runs import record_files
    from attnbench.runs.overrides import select
    from attnbench.runs.plan import check_plan, make_plan
    from attnbench.runs.runner import RunOptions, run_suite
    from attnbench.runs.sharding import is_lead

    if args.threads is not None and args.threads <= 0:
        raise BadInput(f"--threads {args.threads}: allowed: a positive integer")
    retry = tuple(csv_list(args.retry) or ())
    if retry and not args.resume:
        raise BadInput("--retry: only with --resume RUN_ID")
    for status in retry:
        if status not in record_files.STATUSES or status == "ok":
            raise BadInput(f"--retry {status!r}: allowed: "
                           f"{', '.join(s for s in record_files.STATUSES if s != 'ok')}")
    if args.resume and args.run_id and args.run_id != args.resume:
        raise BadInput(f"--run-id {args.run_id!r} with --resume {args.resume!r}: allowed: "
                       f"one of them (--resume names the run)")
    if args.run_id or args.resume:  # refused before any work, --dry-run as the real run
        from attnbench.runs.run_folder import check_name
        check_name(args.run_id or args.resume, "--run-id" if args.run_id else "--resume")
    inv = _replay(args) if args.resume else _invocation(args)
    suite, device, jobs = select(inv["suite"], inv["backends"], inv["dtype"], inv["seq_len"],
                                 inv["device"])
    if inv.get("check_determinism"):
        suite.timing = dataclasses.replace(suite.timing, check_determinism=True)
    for note in suite.notes:
        print(f"note: {note}")
    plan = make_plan(suite, jobs, device, history=Path(args.out) if args.dry_run else None,
                     measure=args.dry_run)  # the estimate only where it is printed
    if args.dry_run:
        print(f"plan: {plan.summary()}")
        for problem in plan.problems():
            print(f"plan: would be refused without --force: {problem}")
        return 0
    check_plan(plan, args.force)
    if args.profile:
        from attnbench.measure.profile_summary import check_pairs
        check_pairs(plan.pairs, args.force)
    options = RunOptions(out=Path(args.out), run_id=args.run_id or args.resume,
                         resume=bool(args.resume), isolate=inv["isolate"],
                         threads=inv["threads"], progress=not args.no_progress, retry=retry,
                         invocation=inv, max_memory_bytes=_size("--max-memory", inv.get(
                             "max_memory")), explicit_dtypes=inv["dtype"] is not None,
                         profile=args.profile)
    if options.max_memory_bytes and not options.isolate:
        raise BadInput("--max-memory: needs the worker process; allowed: without --no-isolate")
    run_dir = run_suite(suite, device, options)
    if not is_lead():  # a torchrun rank other than 0: rank 0 merged its records
        print(f"rank {os.environ.get('RANK')}: its records are in {run_dir}")
        return 0
    df = record_files.load_results(run_dir)
    median = metrics.get("time_ms_median")
    print(f"{median.section} ({median.shown_unit}) ±half-width of its 95% interval; "
          f"~ = noisy, WRONG = above tolerance; columns: N")
    print(tables.to_text(tables.pivot(df)))
    print(f"\n{tables.status_counts(df)}")
    print(f"results: {run_dir}")
    if args.profile:
        from attnbench.measure.profile_summary import summary_lines
        print("\n".join(summary_lines(record_files.read_records(run_dir), run_dir, inv)))
    if not args.no_report:
        reports = Path(args.reports) if args.reports else run_dir.parent.parent / "reports"
        report_dir = build_report([run_dir], reports / run_dir.name)
        print(f"report:  {report_dir / 'index.md'}  ({report_dir / 'index.html'})")
    if args.strict:
        bad = df[df["status"].isin(GATE_STATUSES)]
        if not bad.empty:
            print(f"--strict: {len(bad)} record(s) with status in {', '.join(GATE_STATUSES)}",
                  file=sys.stderr)
            return 1
    return 0
