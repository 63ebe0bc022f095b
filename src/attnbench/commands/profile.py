"""``attnbench profile``: measure the selected pairs as ``run`` does, then profile each."""

from __future__ import annotations

from attnbench.commands import run


def add_parser(sub) -> None:
    pr = sub.add_parser("profile", help="run and profile pairs selected as run selects them: "
                                        "Perfetto trace, kernel table, nsys/ncu lines")
    for flag in ("--suite", "--backends", "--device", "--dtype", "--seq-len", "--run-id",
                 "--reports", "--threads"):
        pr.add_argument(flag, type=int if flag == "--threads" else None,
                        help=f"as in attnbench run {flag}")
    pr.add_argument("--out", default="results", help="results root (default: results)")
    for flag in ("--no-report", "--no-isolate", "--no-progress", "--force"):
        pr.add_argument(flag, action="store_true", help=f"as in attnbench run {flag}")
    pr.set_defaults(func=run.run, profile=True, resume=None, retry=None, max_memory=None,
                    check_determinism=False, dry_run=False, strict=False)
