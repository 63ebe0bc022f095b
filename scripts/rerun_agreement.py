"""How well runs of one commit agree: disjoint intervals, compare's answers between each
pair, and whether a planted slowdown of one backend is found
(``attnbench.analysis.rerun_agreement``). Read only.

    python scripts/rerun_agreement.py RUN_DIR RUN_DIR [RUN_DIR ...]
"""

from __future__ import annotations

import argparse
import itertools
import sys

from attnbench.analysis import rerun_agreement, run_diff
from attnbench.core.errors import BadInput
from attnbench.runs import dataset


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", help="run folders of one commit")
    parser.add_argument("--threshold", type=float, default=0.10,
                        help="compare's threshold (default 0.10, as compare's)")
    args = parser.parse_args(argv)
    if len(args.runs) < 2:
        print("rerun_agreement: RUN_DIR: give two or more run folders", file=sys.stderr)
        return 2
    try:
        runs = dataset.load(args.runs)
    except (BadInput, OSError, ValueError) as exc:
        print(f"rerun_agreement: {exc}", file=sys.stderr)
        return 2
    for run in runs:
        if run.records.empty:
            print(f"rerun_agreement: {run.path}: no records", file=sys.stderr)
            return 2
    commits = sorted({r.commit for r in runs})
    if len(commits) > 1:
        print(f"note: the runs are of {len(commits)} commits ({', '.join(commits)}); the "
              f"counts assume one")
    same = all(run_diff.same_setup(a.meta, b.meta) for a, b in itertools.combinations(runs, 2))
    result = rerun_agreement.agreement([(r.run_id, r.records) for r in runs], args.threshold,
                                       same_setup=same)
    device = run_diff.run_device(runs[0].records)
    lines = result.lines(device)
    state = rerun_agreement.one_state_line([(r.run_id, r.meta, r.records) for r in runs],
                                           device)
    machine = rerun_agreement.machine_states([r.meta for r in runs]) + ([state] if state else [])
    for line in lines[:1] + machine + lines[1:]:
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
