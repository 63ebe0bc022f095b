"""``attnbench publish``: the index of every run under results/, linking each report."""

from __future__ import annotations

from pathlib import Path

from attnbench.core.errors import BadInput


def add_parser(sub) -> None:
    pub = sub.add_parser("publish", help="write reports/index.md and .html: every run under "
                                         "results/ with its headline, linking its report")
    pub.add_argument("--results", default="results", help="runs folder (default: results)")
    pub.add_argument("--reports", default="reports", help="reports folder (default: reports)")
    pub.add_argument("--rebuild", action="store_true",
                     help="regenerate every run's report before the index")
    pub.set_defaults(func=run)


def run(args) -> int:
    from attnbench.reporting.publish import build_index, published_runs

    results = Path(args.results)
    if not results.is_dir() or not published_runs(results):
        raise BadInput(f"--results {args.results}: no run with records there; allowed: a "
                       f"folder of run directories (results/<run-id>/records.jsonl)")
    out = build_index(results, args.reports, rebuild=args.rebuild)
    print(f"index: {out / 'index.md'}  ({out / 'index.html'})")
    return 0
