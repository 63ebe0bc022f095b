"""``attnbench report``: runs into ``reports/<name>/index.md`` and ``index.html``."""

from __future__ import annotations

from pathlib import Path

from attnbench.core.errors import BadInput


def add_parser(sub) -> None:
    rep = sub.add_parser("report", help="turn runs into reports/<name>/index.md and .html")
    rep.add_argument("runs", nargs="+", help="run directories (results/<run-id>)")
    rep.add_argument("--name", help="report name (default: the first run's id)")
    rep.add_argument("--out", help="output directory (default: reports/<name>)")
    rep.add_argument("--force", action="store_true",
                     help="replace the first run's own report with one of several runs")
    rep.set_defaults(func=run)


def run(args) -> int:
    from attnbench.reporting.report import build_report, runs_of
    from attnbench.runs import run_folder
    from attnbench.runs.record_files import (
        META,
        RECORDS,
        no_records_yet,
        read_meta,
        read_records,
    )

    runs = []
    for r in args.runs:
        p = Path(r)
        if not (p / RECORDS).is_file() and not (p / META).is_file():
            raise BadInput(f"{r}: not a run directory (no {RECORDS} inside)")
        if not read_records(p):
            raise BadInput(no_records_yet(r, read_meta(p)))
        runs.append(p)
    name = run_folder.check_name(args.name, "--name") if args.name else runs[0].name
    out = Path(args.out) if args.out else Path("reports") / name
    if out.exists() and not out.is_dir():
        raise BadInput(f"--out {out}: is a file; allowed: a directory (made if missing)")
    if not (args.name or args.out or args.force) and _another_report(out, runs):
        raise BadInput(f"{out}: holds the report of {runs_of(out) or [runs[0].name]}; "
                       f"allowed: --name NAME for this report of {len(runs)} runs, or "
                       f"--force to replace it")
    build_report(runs, out)
    print(f"report: {out / 'index.md'}  ({out / 'index.html'})")
    return 0


def _another_report(out: Path, runs: list[Path]) -> bool:
    """``out`` holds a report built from other runs than these (a run's own report, which a
    report of several runs would replace under the first run's name)."""
    from attnbench.reporting.report import runs_of

    if not (out / "index.md").is_file():
        return False
    return runs_of(out) != [p.name for p in runs] and len(runs) > 1
