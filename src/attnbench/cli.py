"""Command line: ``attnbench run | profile | list | env | report | publish | recommend |
compare | merge``.

Exit codes: 0 done; 1 the run finished but a requested gate failed (``--strict``, ``compare
--fail-on-regression``);
2 bad input, reported as one line without a traceback.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path

from .choose import csv_list as _csv
from .errors import BadInput, PeerLost

GATE_STATUSES = ("wrong", "error", "crashed", "timeout")


# The run options a --resume takes from the run itself (meta.json's "invocation").
REPLAYED = ("suite", "backends", "dtype", "seq_len", "device", "threads", "isolate",
            "max_memory", "check_determinism")
SIZE_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


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
    from . import rundir
    from .records import META, read_meta

    run_dir = Path(args.out) / rundir.check_name(args.resume, "--resume")
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


def cmd_run(args) -> int:
    from . import metrics, records, tables
    from .choose import select
    from .plan import check_plan, make_plan
    from .report import build_report
    from .runner import RunOptions, run_suite
    from .sharding import is_lead

    if args.threads is not None and args.threads <= 0:
        raise BadInput(f"--threads {args.threads}: allowed: a positive integer")
    retry = tuple(_csv(args.retry) or ())
    if retry and not args.resume:
        raise BadInput("--retry: only with --resume RUN_ID")
    for status in retry:
        if status not in records.STATUSES or status == "ok":
            raise BadInput(f"--retry {status!r}: allowed: "
                           f"{', '.join(s for s in records.STATUSES if s != 'ok')}")
    if args.resume and args.run_id and args.run_id != args.resume:
        raise BadInput(f"--run-id {args.run_id!r} with --resume {args.resume!r}: allowed: "
                       f"one of them (--resume names the run)")
    inv = _replay(args) if args.resume else _invocation(args)
    suite, device, jobs = select(inv["suite"], inv["backends"], inv["dtype"], inv["seq_len"],
                                 inv["device"])
    if inv.get("check_determinism"):
        suite.timing = dataclasses.replace(suite.timing, check_determinism=True)
    plan = make_plan(suite, jobs, device)
    if args.dry_run:
        print(f"plan: {plan.summary()}")
        for problem in plan.problems():
            print(f"plan: would be refused without --force: {problem}")
        return 0
    check_plan(plan, args.force)
    if args.profile:
        from .profile_cmd import check_pairs
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
    df = records.load_results(run_dir)
    median = metrics.get("time_ms_median")
    print(f"{median.section} ({median.shown_unit}) ±half-width of its 95% interval; "
          f"~ = noisy, WRONG = above tolerance; columns: N")
    print(tables.to_text(tables.pivot(df)))
    print(f"\n{tables.status_counts(df)}")
    print(f"results: {run_dir}")
    if args.profile:
        from .profile_cmd import summary_lines
        print("\n".join(summary_lines(records.read_records(run_dir), run_dir, inv)))
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


def cmd_list(args) -> int:
    from .api import list_backends
    from .registry import all_backends

    rows = list_backends()
    if args.json:
        for row in rows:
            row["capabilities"] = dataclasses.asdict(all_backends()[row["name"]].caps)
        print(json.dumps(rows, indent=2))
        return 0
    width = max(len(r["name"]) for r in rows) if rows else 10
    for r in rows:
        state = "available" if r["available"] else "unavailable"
        line = f"{r['name']:<{width}}  {state:<11}  {r['semantics']:<11}  {r['description']}"
        print(line)
        if not r["available"]:
            print(f"{'':<{width}}  reason: {r['reason']}")
    return 0


def cmd_env(args) -> int:
    from .environment import collect
    from .runner import resolve_device

    print(json.dumps(collect(resolve_device(args.device)), indent=2))
    return 0


def cmd_report(args) -> int:
    from . import rundir
    from .records import RECORDS, read_records
    from .report import build_report

    runs = []
    for r in args.runs:
        p = Path(r)
        if not (p / RECORDS).is_file():
            raise BadInput(f"{r}: not a run directory (no {RECORDS} inside)")
        if not read_records(p):
            raise BadInput(f"{p / RECORDS}: holds no record; allowed: a run with records")
        runs.append(p)
    name = rundir.check_name(args.name, "--name") if args.name else runs[0].name
    out = Path(args.out) if args.out else Path("reports") / name
    if out.exists() and not out.is_dir():
        raise BadInput(f"--out {out}: is a file; allowed: a directory (made if missing)")
    build_report(runs, out)
    print(f"report: {out / 'index.md'}  ({out / 'index.html'})")
    return 0


def cmd_publish(args) -> int:
    from .publish import build_index, published_runs

    results = Path(args.results)
    if not results.is_dir() or not published_runs(results):
        raise BadInput(f"--results {args.results}: no run with records there; allowed: a "
                       f"folder of run directories (results/<run-id>/records.jsonl)")
    out = build_index(results, args.reports, rebuild=args.rebuild)
    print(f"index: {out / 'index.md'}  ({out / 'index.html'})")
    return 0


def cmd_compare(args) -> int:
    import pandas as pd

    from . import metrics
    from .compare import decide, environment_difference, join_runs, regressions
    from .merge import compare_sides

    try:
        metric = metrics.get(args.metric)
    except KeyError:
        raise BadInput(f"--metric {args.metric}: not a declared metric; allowed: "
                       f"{', '.join(metrics.NAMES)}") from None
    if metric.better == metrics.NEUTRAL:
        raise BadInput(f"--metric {args.metric}: a count with no better direction; allowed: "
                       f"{', '.join(m.name for m in metrics.METRICS if m.better != 'neutral')}")
    if not args.threshold >= 0:
        raise BadInput(f"--threshold {args.threshold}: allowed: a relative change >= 0, "
                       f"e.g. 0.1")
    (base_meta, base), (new_meta, new) = compare_sides(args.base, args.new, args.runs)
    for name, df in (("base", base), ("new", new)):
        if args.metric not in df.columns:
            raise BadInput(f"--metric {args.metric}: no record of the {name} run has it")
    diff = environment_difference(base_meta, new_meta)
    if diff:
        print("environment differs: " + "; ".join(diff) + "\n")
    decided = decide(join_runs(base, new, args.metric), args.metric, args.threshold)
    shown = decided.dropna(subset=["ratio"]).sort_values("ratio", ascending=False)
    cols = ["backend", "key", f"{args.metric}_base", f"{args.metric}_new", "ratio",
            "ratio_low", "ratio_high", "p_value", "change", "code_changed"]
    print(shown[cols].to_string(index=False, float_format=lambda x: f"{x:.4g}"))
    bad = regressions(decided)
    only_base = decided[decided["status_new"].isna()]
    only_new = decided[decided["status_base"].isna()]
    print(f"\n{len(decided)} joined records, {len(shown)} with the metric in both runs, "
          f"{len(bad)} regression(s) ({metric.better} is better; significant at p < 0.05 "
          f"and beyond {args.threshold:.0%})")
    if len(only_base) or len(only_new):
        print(f"missing: {len(only_base)} pair(s) of the base run not in the new one, "
              f"{len(only_new)} of the new run not in the base"
              + ("" if args.allow_missing else " (they fail --fail-on-regression; "
                 "--allow-missing to accept)"))
        for _, r in only_base.head(20).iterrows():
            print(f"  MISSING {r['backend']} {r['key']}")
    if len(decided) - len(only_base) - len(only_new) == 0:
        print("nothing was compared: the runs share no (key, backend) pair")
        return 1 if args.fail_on_regression else 0
    if not args.allow_missing and len(only_base):
        bad = pd.concat([bad, only_base])
    for _, r in bad.iterrows():
        code = " (backend code changed)" if r["code_changed"] else ""
        print(f"  REGRESSION {r['backend']} {r['key']}: {r['status_base']} -> "
              f"{r['status_new']}, ratio {r['ratio']:.3g}{code}")
    return 1 if (args.fail_on_regression and not bad.empty) else 0


def cmd_merge(args) -> int:
    from .merge import describe, merge_runs

    out = merge_runs(args.runs, args.out)
    print(f"merged: {out} ({describe(out)})")
    return 0


def cmd_recommend(args) -> int:
    import pandas as pd

    from .recommend import parse_shape, recommend, render
    from .records import load_results

    shape = parse_shape(args.shape)
    runs = args.runs or ["results"]
    frames = [load_results(r) for r in runs]
    print(render(recommend(shape, pd.concat(frames, ignore_index=True)), ", ".join(runs)),
          end="")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="attnbench", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)

    r = sub.add_parser("run", help="run a suite and record results")
    r.add_argument("--suite", help="suite name (in suites/) or path to a .toml (default: quick)")
    r.add_argument("--backends", help="comma-separated backends, replacing the suite's")
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
    r.set_defaults(func=cmd_run)

    pr = sub.add_parser("profile", help="run and profile pairs selected as run selects them: "
                                        "Perfetto trace, kernel table, nsys/ncu lines")
    for flag in ("--suite", "--backends", "--device", "--dtype", "--seq-len", "--run-id",
                 "--reports", "--threads"):
        pr.add_argument(flag, type=int if flag == "--threads" else None,
                        help=f"as in attnbench run {flag}")
    pr.add_argument("--out", default="results", help="results root (default: results)")
    for flag in ("--no-report", "--no-isolate", "--no-progress", "--force"):
        pr.add_argument(flag, action="store_true", help=f"as in attnbench run {flag}")
    pr.set_defaults(func=cmd_run, profile=True, resume=None, retry=None, max_memory=None,
                    check_determinism=False, dry_run=False, strict=False)

    ls = sub.add_parser("list", help="list backends with availability and reasons")
    ls.add_argument("--json", action="store_true")
    ls.set_defaults(func=cmd_list)

    e = sub.add_parser("env", help="print the environment a run would record")
    e.add_argument("--device", default="auto")
    e.set_defaults(func=cmd_env)

    rep = sub.add_parser("report", help="turn runs into reports/<name>/index.md and .html")
    rep.add_argument("runs", nargs="+", help="run directories (results/<run-id>)")
    rep.add_argument("--name", help="report name (default: the first run's id)")
    rep.add_argument("--out", help="output directory (default: reports/<name>)")
    rep.set_defaults(func=cmd_report)
    pub = sub.add_parser("publish", help="write reports/index.md and .html: every run under "
                                         "results/ with its headline, linking its report")
    pub.add_argument("--results", default="results", help="runs folder (default: results)")
    pub.add_argument("--reports", default="reports", help="reports folder (default: reports)")
    pub.add_argument("--rebuild", action="store_true",
                     help="regenerate every run's report before the index")
    pub.set_defaults(func=cmd_publish)
    rec = sub.add_parser("recommend", help="the fastest exact backend within tolerance on "
                                           "the measured problem nearest to a shape")
    rec.add_argument("--shape", required=True,
                     help='e.g. "b=1,hq=32,hkv=8,n=8192,d=128,dtype=bfloat16,mask=causal" '
                          "(keys: b hq hkv n nq nk d dv dtype mask mode device)")
    rec.add_argument("runs", nargs="*", help="run directories or folders of runs "
                                             "(default: results)")
    rec.set_defaults(func=cmd_recommend)
    c = sub.add_parser("compare", help="join two runs on (key, backend) and flag regressions")
    c.add_argument("base", help="base run directory (or a merged dataset)")
    c.add_argument("new", nargs="?",
                   help="new run directory (left out: BASE is a dataset of two runs)")
    c.add_argument("--runs", metavar="BASE_ID,NEW_ID",
                   help="the two runs to compare, by id, when a folder is a merged dataset")
    c.add_argument("--metric", default="time_ms_median")
    c.add_argument("--threshold", type=float, default=0.10,
                   help="relative change that counts as a regression (default 0.10)")
    c.add_argument("--fail-on-regression", action="store_true",
                   help="exit 1 on a regression or a base pair missing from the new run")
    c.add_argument("--allow-missing", action="store_true",
                   help="pairs missing from the new run do not fail the gate")
    c.set_defaults(func=cmd_compare)
    m = sub.add_parser("merge", help="runs from several machines or commits as one dataset "
                                     "(report and compare read it)")
    m.add_argument("runs", nargs="+", help="run directories or datasets")
    m.add_argument("--out", required=True, help="the dataset's folder (new)")
    m.set_defaults(func=cmd_merge)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except BadInput as exc:
        print(f"attnbench: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("attnbench: interrupted", file=sys.stderr)
        return 130
    except PeerLost as exc:  # under torchrun: a rank died, the run can be resumed
        print(f"attnbench: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
