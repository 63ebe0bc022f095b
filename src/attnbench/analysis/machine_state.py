"""Whether the machine held still: during one run, and between runs that are read together.

The drift probe (``measure/probe.py``) times one fixed matmul between measuring rounds;
each record keeps the median of its readings (``probe_gflops``). A record's absolute time
moves with the machine, so when the probe's level moved by more than two runs of unchanged
code are allowed to differ (``run_to_run.two_runs``), absolute times from different parts
of the run, or from different runs, differ by more than their across-runs intervals carry.
Ratios of records timed in the same interleaved rounds divide most of it out.

* within a run: the run's records in the order they were recorded, cut into ``PARTS``
  consecutive parts; the largest part's median probe rate over the smallest's. A single
  record's probe is not used alone: what a record runs (a large memory-bound kernel) can
  slow the probe read right after it, a scatter that parts' medians average away;
* between runs: each run's probe median (meta.json, else its records'), the largest over
  the smallest; the matmul ceilings measured at each run's start are named beside it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from attnbench.analysis import departures, run_diff
from attnbench.stats import run_to_run

PARTS = 4  # consecutive parts of a run whose probe levels are compared
MIN_PER_PART = 3  # records with a probe reading a part needs


@dataclass(frozen=True)
class Moved:
    """The probe's levels (GFLOP/s) over parts of a run, or over runs, that moved by
    ``factor`` (largest / smallest) beyond ``limit``."""

    levels: tuple[float, ...]
    factor: float
    limit: float

    def levels_text(self) -> str:
        return ", ".join(f"{x:.3g}" for x in self.levels)


def limit(device=None) -> float:
    """The largest / smallest probe level that still counts as one machine state: what two
    runs of unchanged code may differ by (the declared allowance of the device kind)."""
    return math.exp(run_to_run.two_runs(device))


def levels_in_time(records: pd.DataFrame, parts: int = PARTS) -> list[float]:
    """The median probe rate of each of ``parts`` consecutive parts of a run's records, in
    the order they were recorded; [] when a part would hold fewer than ``MIN_PER_PART``."""
    if not {"probe_gflops", "recorded_at"} <= set(records.columns):
        return []
    timed = records[records["probe_gflops"].notna()].sort_values("recorded_at", kind="stable")
    rates = timed["probe_gflops"].astype(float).to_numpy()
    if rates.size < parts * MIN_PER_PART:
        return []
    return [float(np.median(p)) for p in np.array_split(rates, parts)]


def _moved(levels: list[float], device) -> Moved | None:
    if len(levels) < 2 or min(levels) <= 0:
        return None
    factor = max(levels) / min(levels)
    bound = limit(device)
    return Moved(tuple(levels), factor, bound) if factor > bound else None


def within_run(records: pd.DataFrame, device=None) -> Moved | None:
    """The probe's move during one run, when it is beyond ``limit``; else None."""
    return _moved(levels_in_time(records), device)


def run_level(meta: dict, records: pd.DataFrame) -> float | None:
    """A run's probe median: meta.json's, else the median of its records' (None: no probe)."""
    rate = run_diff.probe_rate(meta)
    return float(rate) if rate else departures.run_probe_level(records)


def between_runs(runs: list[tuple[dict, pd.DataFrame]], device=None) -> Moved | None:
    """The probe's move between runs (meta, records) read together, when beyond ``limit``."""
    levels = [run_level(meta, recs) for meta, recs in runs]
    if any(x is None for x in levels):
        return None
    return _moved(levels, device)


def within_run_text(label: str, moved: Moved, device=None) -> str:
    return (f"machine moved during run {label}: the drift probe's level over the run's four "
            f"quarters was {moved.levels_text()} GFLOP/s ({moved.factor:.3g}x apart, beyond "
            f"the {moved.limit:.3g}x two runs of unchanged code may differ by, "
            f"{run_to_run.kind(device)}); its absolute times carry more variation than their "
            f"intervals say, ratios timed in the same rounds less")


def between_runs_text(moved: Moved, ceilings: list[dict], device=None) -> str:
    ceiling = ""
    dtypes = sorted(set.intersection(*(set(c) for c in ceilings))) if ceilings else []
    if dtypes:
        d = dtypes[0]
        values = [c[d] for c in ceilings]
        ceiling = (f"; matmul ceiling {d} at each run's start "
                   f"{', '.join(f'{v:.3g}' for v in values)} TFLOP/s")
    return (f"machine differed between the runs: drift probe {moved.levels_text()} GFLOP/s "
            f"({moved.factor:.3g}x apart, beyond the {moved.limit:.3g}x two runs of unchanged "
            f"code may differ by, {run_to_run.kind(device)}){ceiling}; the runs are not "
            f"replicates of one machine state, so pooled figures carry that spread")
