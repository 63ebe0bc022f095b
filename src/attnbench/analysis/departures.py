"""What a run is known to have done to each of its records, beyond a rerun's ordinary
variation: the part of the run-to-run spread a record's own data can name.

Two departures, each on the log scale (0: none known):

* ``machine``: the drift probe read in the record's rounds stood farther from the run's
  level than it ordinarily scatters (``probe_shift.excess``): the record was timed on a
  slower or faster machine than the rest of its run, which a rerun would not repeat. Records
  timed in the same rounds share it, so a ratio of them, or a record over its partners,
  carries none;
* ``unsteadiness``: the noise flag flagged the record (``noise.unsteadiness``): its median
  is not pinned down by its samples.

An interval compared across runs adds a record's departures to the declared (or estimated)
between-run allowance in quadrature (``run_to_run.across_runs``), and that allowance is
estimated from records with none, so a few disturbed records neither hide the changes of
steady ones nor pass their own disturbance off as a change.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

from attnbench.measure.budget import TimingBudget
from attnbench.stats import noise, probe_shift


@dataclass(frozen=True)
class Departure:
    machine: float = 0.0  # the probe's departure in its rounds from the run's level
    unsteadiness: float = 0.0  # what its noise flags measured

    @property
    def total(self) -> float:
        """Both, in quadrature: what a record's own time carries across runs."""
        return math.hypot(self.machine, self.unsteadiness)

    @property
    def none(self) -> bool:
        return self.machine == 0 and self.unsteadiness == 0


def run_probe_level(records: pd.DataFrame) -> float | None:
    """The median of a run's records' probe rates (GFLOP/s); None without any."""
    if "probe_gflops" not in records.columns or not records["probe_gflops"].notna().any():
        return None
    return float(records["probe_gflops"].dropna().astype(float).median())


def of_record(record: dict, level: float | None, budget: TimingBudget | None = None
              ) -> Departure:
    """One ok record's ``Departure`` in a run whose probe level is ``level`` (GFLOP/s,
    ``run_probe_level``), its noise flags decided under ``budget``'s thresholds (the
    defaults when not given)."""
    budget = budget or TimingBudget()
    device = record.get("device")
    flags = noise.record_flags(record, budget.unsteady_rel, budget.noise_threshold)
    return Departure(probe_shift.excess(record.get("probe_readings"), level,
                                        device if isinstance(device, str) else None),
                     noise.unsteadiness(flags))


def known(records: pd.DataFrame, budget: TimingBudget | None = None
          ) -> dict[tuple, Departure]:
    """Each ok record's ``Departure`` by (key, backend), its noise flags decided under
    ``budget``'s thresholds (the defaults when not given)."""
    if records.empty or "status" not in records.columns:
        return {}
    level = run_probe_level(records)
    return {(r["key"], r["backend"]): of_record(dict(r), level, budget)
            for _, r in records[records["status"] == "ok"].iterrows()}
