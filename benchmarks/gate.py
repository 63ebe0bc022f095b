"""The regression gate for pytest-benchmark results, decided as ``attnbench compare`` does.

    python benchmarks/gate.py BASE.json NEW.json [--threshold 0.1]

BASE.json and NEW.json are ``--benchmark-json`` files (they hold every round's time). Each
benchmark gets ``compare``'s answer, by the one significance rule
(``attnbench.stats.significance``): the 95% bootstrap interval of new/base medians, widened
by the declared run-to-run floor (two sessions are two runs, ``stats.run_to_run``), gives
``worse`` or ``better`` only when it excludes no change and its estimate is beyond the
threshold, ``unchanged`` when it lies within the threshold, ``cannot tell`` otherwise or
with fewer than ``MIN_SAMPLES`` rounds a side. On a shared machine a fixed ``median:5%``
fails on noise, while this fails on changes the rounds cannot explain. Prints one line per
benchmark that is not ``unchanged`` and a last line with the verdict; exit 0 (no
regression), 1 (a regression, or a benchmark of the base missing from the new file), 2 (an
unreadable file), never a traceback.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path


def _load(path: str) -> dict[str, list[float]]:
    """Benchmark name -> its rounds' seconds, from a --benchmark-json file."""
    try:
        data = json.loads(Path(path).read_text())
        return {b["fullname"]: list(b["stats"]["data"]) for b in data["benchmarks"]}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise SystemExit(f"gate: {path}: not a pytest-benchmark --benchmark-json file with "
                         f"round data ({type(exc).__name__}: {exc}); allowed: the file "
                         f"pytest --benchmark-json=FILE wrote") from None


def gate(base: dict[str, list[float]], new: dict[str, list[float]], threshold: float
         ) -> tuple[list[str], bool]:
    """(lines to print, whether the gate fails)."""
    from attnbench.stats import run_to_run, significance
    from attnbench.stats.intervals import ratio_interval

    between = run_to_run.half_width()
    lines, failed = [], False
    counts = {"worse": 0, "better": 0, "unchanged": 0, "cannot tell": 0}
    for name, rounds in base.items():
        if name not in new:
            lines.append(f"missing  {name}: in the base, not in the new results")
            failed = True
            continue
        iv = run_to_run.widen(ratio_interval(new[name], rounds), between)
        verdict = significance.decide(iv, threshold, True)
        counts[verdict] += 1
        if verdict != "unchanged":
            why = significance.why_not(iv)
            lines.append(f"{verdict:<11} {name}: new/base median {iv.estimate:.3f} "
                         f"[{iv.low:.3f}, {iv.high:.3f}]" + (f" ({why})" if why else ""))
        failed |= verdict == "worse"
    lines.append(f"gate: {'FAIL' if failed else 'pass'}: {counts['worse']} worse, "
                 f"{counts['better']} better, {counts['unchanged']} unchanged, "
                 f"{counts['cannot tell']} cannot tell, of {len(base)} (threshold "
                 f"{threshold:.0%}, 95% intervals with a run-to-run allowance of "
                 f"+-{math.expm1(between):.0%}, at least {significance.MIN_SAMPLES} rounds a side)")
    return lines, failed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("base")
    parser.add_argument("new")
    parser.add_argument("--threshold", type=float, default=0.1)
    args = parser.parse_args(argv)
    try:
        base, new = _load(args.base), _load(args.new)
    except SystemExit as exc:
        print(exc, file=sys.stderr)
        return 2
    lines, failed = gate(base, new, args.threshold)
    print("\n".join(lines))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
