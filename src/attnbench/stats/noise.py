"""The noise flag: which records were measured unsteadily, told apart from a machine that
is merely shared.

A shared machine makes the drift probe's readings scatter all the time; flagging every
record whose group saw the probe scatter flags nearly all of them and teaches readers to
ignore the flag. A record is flagged for what sets it apart instead, by any of:

* ``samples``: its own interval reaches farther than ``unsteady_rel`` from its median
  (the samples show the unsteadiness directly);
* ``spread``: its samples scatter more than ``SPREAD_FACTOR`` times the probe's readings
  over the same group, and more than ``min_spread`` (the record was less steady than the
  machine was);
* ``probe``: the probe's level moved within the group by more than its own jitter: the
  medians of the group's first and second half of readings differ by more than either
  half's range (the machine changed speed while the record was timed).

Spreads are interquartile ranges over the median, so they compare across sample counts.
Each check that flags a record says by how much (``Flag``: what it measured, the limit it
passed), so the report can show the reason beside every flagged record.

A flagged record's median is not pinned down by its samples: a rerun lands it about as far
off as the flag measured. So what the flag measured (``unsteadiness``) is carried into every
interval of that record compared across runs (``run_to_run.across_runs``), and a flag is
more than a mark: it is how much wider a rerun's interval has to be.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from attnbench.stats import intervals, ratios

SPREAD_FACTOR = 2.0  # a record's spread over the probe's that sets it apart
MIN_PROBE_READINGS = 4  # two a half: fewer cannot show a half's own jitter
REASONS = ("probe", "spread", "samples")


def rel_spread(values) -> float | None:
    """Interquartile range over the median; None with fewer than 2 values or median 0."""
    x = np.asarray(values, dtype=float).ravel()
    if x.size < 2:
        return None
    med = float(np.median(x))
    if med == 0:
        return None
    q1, q3 = np.percentile(x, [25, 75])
    return float(q3 - q1) / abs(med)


@dataclass(frozen=True)
class Flag:
    """One check that flagged a record: ``measured`` passed ``limit`` (both relative to the
    median they are read against)."""

    check: str  # one of REASONS
    measured: float
    limit: float

    def text(self) -> str:
        """'spread: samples' IQR 31% of their median, over 12% (...)': the reason in words."""
        what = {"probe": "the drift probe's level moved {m} of its median within the group, "
                         "over its halves' own range {l}",
                "spread": "samples' IQR {m} of their median, over {l} (the larger of the "
                          "run's floor and twice the probe's IQR)",
                "samples": "its interval reaches {m} from its median, over {l}"}[self.check]
        return f"{self.check}: " + what.format(m=f"{self.measured:.0%}", l=f"{self.limit:.0%}")


def probe_move(readings) -> Flag | None:
    """The probe's move within a group when it is beyond its own jitter: the medians of its
    first and second half of readings (in time order) differ by more than either half's own
    range (both over the readings' median); None when it did not move, or with fewer than
    ``MIN_PROBE_READINGS`` readings."""
    x = np.asarray(readings, dtype=float).ravel()
    if x.size < MIN_PROBE_READINGS:
        return None
    first, second = x[: x.size // 2], x[x.size // 2:]
    jitter = max(np.ptp(first), np.ptp(second))
    move = abs(np.median(second) - np.median(first))
    if not move > jitter:
        return None
    scale = abs(float(np.median(x))) or 1.0
    return Flag("probe", float(move) / scale, float(jitter) / scale)


def probe_moved(readings) -> bool:
    """Whether the probe's level moved within a group (``probe_move``)."""
    return probe_move(readings) is not None


def flag_reasons(samples, interval_reach: float | None, probe_readings, unsteady_rel: float,
                 min_spread: float) -> list[Flag]:
    """Each check (of ``REASONS``, in that order) that flags a record noisy, with what it
    measured and the limit it passed; [] when it is steady. ``interval_reach`` is its
    interval's larger distance from the median, relative (None: no interval)."""
    out = []
    moved = probe_move(probe_readings)
    if moved is not None:
        out.append(moved)
    own = rel_spread(samples)
    machine = rel_spread(probe_readings)
    if own is not None and machine is not None:
        limit = max(min_spread, SPREAD_FACTOR * machine)
        if own > limit:
            out.append(Flag("spread", own, limit))
    if interval_reach is not None and interval_reach > unsteady_rel:
        out.append(Flag("samples", interval_reach, unsteady_rel))
    return out


def flags(samples, interval_reach: float | None, probe_readings, unsteady_rel: float,
          min_spread: float) -> list[str]:
    """The reasons (of ``REASONS``, in that order) a record is flagged noisy; [] when it is
    steady (``flag_reasons`` without the figures)."""
    return [f.check for f in flag_reasons(samples, interval_reach, probe_readings,
                                          unsteady_rel, min_spread)]


def record_flags(record: dict, unsteady_rel: float, min_spread: float) -> list[Flag]:
    """``flag_reasons`` of one record (its ``samples_ms`` and ``probe_readings``), its
    interval's reach read from its samples; [] without samples."""
    samples = ratios.samples(record.get("samples_ms"))
    if not samples:
        return []
    reach = intervals.median_interval(samples).half_width_rel if len(samples) >= 2 else None
    probe = record.get("probe_readings")
    return flag_reasons(samples, reach, probe if isinstance(probe, list) else [],
                        unsteady_rel, min_spread)


def unsteadiness(found: list[Flag]) -> float:
    """How far (log scale) a flagged record's median may land in a rerun: the largest
    figure its flags measured; 0 for a steady record."""
    return max((math.log1p(f.measured) for f in found if f.measured > 0), default=0.0)
