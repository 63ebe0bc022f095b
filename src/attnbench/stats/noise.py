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
"""

from __future__ import annotations

import numpy as np

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


def probe_moved(readings) -> bool:
    """Whether the probe's level moved within a group: the medians of its first and second
    half of readings (in time order) differ by more than either half's own range."""
    x = np.asarray(readings, dtype=float).ravel()
    if x.size < MIN_PROBE_READINGS:
        return False
    first, second = x[: x.size // 2], x[x.size // 2:]
    jitter = max(np.ptp(first), np.ptp(second))
    return bool(abs(np.median(second) - np.median(first)) > jitter)


def flags(samples, interval_reach: float | None, probe_readings, unsteady_rel: float,
          min_spread: float) -> list[str]:
    """The reasons (of ``REASONS``, in that order) a record is flagged noisy; [] when it is
    steady. ``interval_reach`` is its interval's larger distance from the median, relative
    (None: no interval)."""
    out = []
    if probe_moved(probe_readings):
        out.append("probe")
    own = rel_spread(samples)
    machine = rel_spread(probe_readings)
    if own is not None and machine is not None and own > max(min_spread,
                                                              SPREAD_FACTOR * machine):
        out.append("spread")
    if interval_reach is not None and interval_reach > unsteady_rel:
        out.append("samples")
    return out
