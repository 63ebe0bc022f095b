"""``attnbench merge``: runs from several machines or commits as one dataset."""

from __future__ import annotations


def add_parser(sub) -> None:
    m = sub.add_parser("merge", help="runs from several machines or commits as one dataset "
                                     "(report and compare read it)")
    m.add_argument("runs", nargs="+", help="run directories or datasets")
    m.add_argument("--out", required=True, help="the dataset's folder (new)")
    m.set_defaults(func=run)


def run(args) -> int:
    from attnbench.runs.merge import describe, merge_runs

    out = merge_runs(args.runs, args.out)
    print(f"merged: {out} ({describe(out)})")
    return 0
