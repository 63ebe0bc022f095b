"""Recompute the noise flag (``attnbench.stats.noise``) on published runs, read only, and
count it against the flag the records carry.

    python scripts/noise_flags.py RUN_DIR [RUN_DIR ...]

Each record's flag is recomputed from its samples, its interval and the drift probe's
readings over its group; the run's ``unsteady_rel`` comes from its meta.json, the least
spread that can flag a record from today's default. Prints one line per run and a total.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

from attnbench.measure.budget import TimingBudget
from attnbench.stats import noise
from attnbench.stats.intervals import median_interval


def _records(run: Path) -> list[dict]:
    path = run / "records.jsonl"
    out = []
    for i, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except ValueError:
            raise SystemExit(f"{path}:{i}: not JSON; allowed: one JSON object per line"
                             ) from None
        if not isinstance(rec, dict):
            raise SystemExit(f"{path}:{i}: not a record; allowed: one JSON object per line")
        out.append(rec)
    return out


def recompute(rec: dict, unsteady_rel: float, min_spread: float) -> list[str]:
    """The reasons the new rule flags a record ([] when steady)."""
    samples = rec.get("samples_ms") or []
    reach = median_interval(samples).half_width_rel if len(samples) >= 2 else None
    return noise.flags(samples, reach, rec.get("probe_readings") or [], unsteady_rel,
                       min_spread)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path)
    args = parser.parse_args(argv)
    total_old = total_new = total_ok = 0
    reasons: Counter = Counter()
    for run in args.runs:
        try:
            meta = json.loads((run / "meta.json").read_text())
            records = _records(run)
        except (OSError, ValueError) as exc:
            print(f"noise_flags: {run}: not a run folder with meta.json and records.jsonl "
                  f"({type(exc).__name__})", file=sys.stderr)
            return 2
        except SystemExit as exc:
            print(f"noise_flags: {exc}", file=sys.stderr)
            return 2
        unsteady = float((meta.get("timing") or {}).get("unsteady_rel",
                                                        TimingBudget.unsteady_rel))
        ok = [r for r in records if r.get("status") == "ok"]
        old = sum(1 for r in ok if r.get("noisy") is True)
        flagged = {id(r): recompute(r, unsteady, TimingBudget.noise_threshold) for r in ok}
        new = sum(1 for f in flagged.values() if f)
        for f in flagged.values():
            reasons.update(f)
        print(f"{run.name}: {len(ok)} ok records, flagged noisy: {old} before, {new} now")
        total_old, total_new, total_ok = total_old + old, total_new + new, total_ok + len(ok)
    print(f"all: {total_ok} ok records, flagged noisy: {total_old} before, {total_new} now "
          f"(by reason, a record may have several: "
          + ", ".join(f"{reasons[k]} {k}" for k in noise.REASONS) + ")")
    return 0


if __name__ == "__main__":
    sys.exit(main())
