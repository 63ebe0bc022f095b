"""``attnbench run``: select a suite's pairs, run them, print the table, write the report."""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path

from attnbench.core.errors import BadInput

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


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask, e.g. under taskset or a container's
    cpuset), which bounds --threads."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def _check_threads(threads: int | None) -> None:
    if threads is None:
        return
    cpus = usable_cpus()
    if not 1 <= threads <= cpus:
        raise BadInput(f"--threads {threads}: allowed: 1 to {cpus} (the CPUs this process "
                       f"may use)")


def _recorded_suite(args, name: str) -> tuple[str, str | None]:
    """(its path, the suite TOML) the run being resumed recorded; (name, None) for a run from
    before that: its file is read, and refused if it changed since (two suites never mix in
    one run)."""
    from attnbench.runs.record_files import META, read_meta
    from attnbench.runs.suite import find_suite

    meta = read_meta(Path(args.out) / args.resume)
    if isinstance(meta.get("suite_toml"), str):
        return str(meta.get("suite_path") or name), meta["suite_toml"]
    import hashlib

    source = meta.get("suite_path") or (meta.get("invocation") or {}).get("suite") or ""
    try:
        now = hashlib.sha256(find_suite(source).read_bytes()).hexdigest()[:16]
    except (BadInput, OSError):
        now = None
    if meta.get("suite_hash") and now != meta["suite_hash"]:
        raise BadInput(f"--resume {args.resume}: its suite {source!r} "
                       f"{'changed' if now else 'cannot be read'} since the run started and "
                       f"the run ({META}) records no copy of it; allowed: a new run")
    return name, None


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
    # Up to the plan's size check nothing imports torch, pandas or scipy.stats (about 3 s
    # here): a suite of millions of pairs is refused in a fraction of a second.
    from attnbench.runs.overrides import finish_selection, read_selection, retry_statuses
    from attnbench.runs.plan import check_plan, expand, make_plan, size_problem

    _check_threads(args.threads)
    retry = retry_statuses(args.retry, args.resume)
    if args.resume and args.run_id and args.run_id != args.resume:
        raise BadInput(f"--run-id {args.run_id!r} with --resume {args.resume!r}: allowed: "
                       f"one of them (--resume names the run)")
    if args.run_id or args.resume:  # refused before any work, --dry-run as the real run
        from attnbench.runs.run_folder import check_name
        check_name(args.run_id or args.resume, "--run-id" if args.run_id else "--resume")
    inv = _replay(args) if args.resume else _invocation(args)
    _check_threads(inv["threads"])
    max_memory = _size("--max-memory", inv.get("max_memory"))
    if max_memory and not inv["isolate"]:
        raise BadInput("--max-memory: needs the worker process; allowed: without --no-isolate")
    source, text = _recorded_suite(args, inv["suite"]) if args.resume else (inv["suite"], None)
    suite, settled = read_selection(source, inv["backends"], inv["dtype"], inv["seq_len"],
                                    inv["device"], suite_text=text)
    # The size from the axes, before anything is expanded; a plan too large on every device
    # the run may use is refused before its backends and its device are resolved (these
    # import every implementation, and torch).
    too_large = size_problem(suite, inv["device"]) if settled else None
    if not too_large or args.force:
        suite, device, _ = finish_selection(suite, inv["backends"], inv["device"], expand=False)
        too_large = size_problem(suite, device)
    if inv.get("check_determinism"):
        suite.timing = dataclasses.replace(suite.timing, check_determinism=True)
    for note in suite.notes:
        print(f"note: {note}")
    if too_large and args.dry_run and not args.force:
        print(f"plan: would be refused without --force: {too_large}")
        return 0
    if too_large and not args.force:
        raise BadInput(f"plan refused: {too_large}; allowed: a smaller sweep, or --force to "
                       f"run it anyway")
    jobs = expand(suite, device, args.force)
    if not jobs:
        raise BadInput(f"{suite.path}: no (case, backend) pair on {device} is left after its "
                       f"excludes and the command line; allowed: a suite with at least one")
    plan = make_plan(suite, jobs, device, history=Path(args.out) if args.dry_run else None,
                     measure=args.dry_run)  # the estimate only where it is printed
    if args.dry_run:
        print(f"plan: {plan.summary()}")
        for problem in plan.problems():
            print(f"plan: would be refused without --force: {problem}")
        return 0
    check_plan(plan, args.force)
    from attnbench.runs import record_files
    from attnbench.runs.runner import RunOptions, run_suite
    from attnbench.runs.sharding import is_lead

    if args.profile:
        from attnbench.measure.profile_summary import check_pairs
        check_pairs(plan.pairs, args.force)
    options = RunOptions(out=Path(args.out), run_id=args.run_id or args.resume,
                         resume=bool(args.resume), isolate=inv["isolate"],
                         threads=inv["threads"], progress=not args.no_progress, retry=retry,
                         invocation=inv, max_memory_bytes=max_memory,
                         explicit_dtypes=inv["dtype"] is not None, profile=args.profile)
    from attnbench.core import metrics
    from attnbench.reporting import tables
    from attnbench.reporting.report import build_report

    run_dir = run_suite(suite, device, options)
    if not is_lead():  # a torchrun rank other than 0: rank 0 merged its records
        print(f"rank {os.environ.get('RANK')}: its records are in {run_dir}")
        return 0
    df = record_files.load_results(run_dir)
    median = metrics.get("time_ms_median")
    print(f"{median.section} ({median.shown_unit}) ±half-width of its 95% interval (its "
          f"coverage in brackets when fewer samples reached less); ~ = noisy, WRONG = above "
          f"tolerance; columns: N")
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
