"""``attnbench publish``: the index of the pooled reports, the published runs under results/
(tracked by git or marked PUBLISH) and the model runs, one line each linking its report;
``--all``: every run, in reports/all-runs/."""

from __future__ import annotations

from pathlib import Path

from attnbench.core.errors import BadInput


def add_parser(sub) -> None:
    pub = sub.add_parser("publish", help="write reports/index.md and .html: pooled reports, "
                                         "published runs (tracked by git or marked PUBLISH) "
                                         "and model runs, one headline each, linking reports")
    pub.add_argument("--results", default="results", help="runs folder (default: results)")
    pub.add_argument("--reports", default="reports", help="reports folder (default: reports)")
    pub.add_argument("--rebuild", action="store_true",
                     help="regenerate every listed report before the index")
    pub.add_argument("--all", action="store_true", dest="every",
                     help="index every run, ad-hoc ones too, in reports/all-runs/ instead")
    pub.set_defaults(func=run)


def run(args) -> int:
    from attnbench.reporting.publish import MARKER, build_index, published_runs

    results = Path(args.results)
    if not results.is_dir() or not published_runs(results, every=True):
        raise BadInput(f"--results {args.results}: no run with records there; allowed: a "
                       f"folder of run directories (results/<run-id>/records.jsonl)")
    if not args.every and not published_runs(results):
        raise BadInput(f"--results {args.results}: no published run there (records tracked "
                       f"by git, or a {MARKER} file in the run folder); allowed: --all for "
                       f"an index of every run")
    out = build_index(results, args.reports, rebuild=args.rebuild, every=args.every)
    print(f"index: {out / 'index.md'}  ({out / 'index.html'})")
    return 0
