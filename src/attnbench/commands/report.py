"""``attnbench report``: runs into ``reports/<name>/index.md`` and ``index.html``."""

from __future__ import annotations

from pathlib import Path

from attnbench.core.errors import BadInput


def add_parser(sub) -> None:
    rep = sub.add_parser("report", help="turn runs into reports/<name>/index.md and .html")
    rep.add_argument("runs", nargs="+", help="run directories (results/<run-id>)")
    rep.add_argument("--name", help="report name (default: the first run's id)")
    rep.add_argument("--out", help="output directory (default: reports/<name>)")
    rep.set_defaults(func=run)


def run(args) -> int:
    from attnbench.reporting.report import build_report
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
    build_report(runs, out)
    print(f"report: {out / 'index.md'}  ({out / 'index.html'})")
    return 0
