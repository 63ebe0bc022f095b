"""Run-to-run variation: what a ratio between two runs must allow for beyond its samples.

A record's interval describes the samples of one process in one run; a second run of the
same code (another process, memory layout, machine state) lands elsewhere by more than
that interval says. So a ratio of two runs' records carries a between-run component, added
to its own interval's half-width in quadrature on the log scale:

* estimated, when replicate measurements exist: the records of unchanged code that agree
  on the machine's move are replicates of one another, and how far 95% of their
  log-ratios reach from their median, beyond their own intervals, is the between-run
  half-width of one record;
* never below the declared allowance of the device kind (``ALLOWANCES``): the 95%
  half-width (a relative change) a rerun of the same code moves one record, or one ratio of
  two records timed in the same rounds, beyond its own interval (docs/design.md,
  Statistics);
* and what this run is known to have done to this quantity: the machine's departure in a
  record's rounds (the drift probe read there stood farther from the run's level than it
  ordinarily scatters, ``probe_shift.excess``; ratios of records timed in the same rounds
  divide it out), and the unsteadiness of a record the noise flag flags
  (``noise.unsteadiness``; a ratio carries both records').

Two intervals, named wherever a number is shown: the *within-run* interval (a record's
``time_ms_ci_low/high``, the samples of one run) and the *across-runs* interval
(``across_runs``: the within-run one widened by the allowance), the one a rerun respects.
Records keep the within-run bounds; the across-runs interval is derived where it is used.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from attnbench.stats.intervals import LEVEL, Interval, quantile_ratio


@dataclass(frozen=True)
class Allowance:
    """How far (95% half-width, relative) a rerun of unchanged code moves a quantity beyond
    its own within-run interval, per run."""

    record: float  # one record's median time
    ratio: float  # the ratio of two records timed in the same interleaved rounds
    probe: float  # the drift probe's median over one group's rounds (stats/probe_shift.py)


# Set from repeated CPU runs of one commit (estimate(): scripts/rerun_agreement.py prints it).
CPU = Allowance(record=0.05, ratio=0.03, probe=0.10)
# No repeated GPU runs of one commit yet: the CPU figures stand until they are measured.
ALLOWANCES = {"cpu": CPU, "cuda": CPU}
WHAT = ("record", "ratio", "probe")
WITHIN = "within run (this run's samples only)"
ACROSS = ("across runs (within-run widened by the between-run allowance, and by what the "
          "noise flag measured on a flagged record)")


def kind(device) -> str:
    """The device kind an allowance is declared for: 'cuda' for 'cuda', 'cuda:0'; else
    'cpu' (a record without a device was measured where only CPUs ran)."""
    return "cuda" if isinstance(device, str) and device.startswith("cuda") else "cpu"


def allowance(device=None, what: str = "record") -> float:
    """The declared between-run 95% half-width of ``what`` (record or ratio) on ``device``'s
    kind, on the log scale."""
    if what not in WHAT:
        raise ValueError(f"what: {what!r}; allowed: {', '.join(WHAT)}")
    return math.log1p(getattr(ALLOWANCES[kind(device)], what))


def allowance_text(device=None) -> str:
    """'+-5% a record, +-3% a ratio (cpu)': the allowance in words."""
    a = ALLOWANCES[kind(device)]
    return f"+-{a.record:.0%} a record, +-{a.ratio:.0%} a ratio ({kind(device)})"


def legend(device=None) -> str:
    """The line a report or compare prints to say which interval its numbers carry."""
    return f"intervals: {ACROSS}, {allowance_text(device)}"


def across_runs(iv: Interval, device=None, what: str = "record", *known: float) -> Interval:
    """The across-runs interval: ``iv`` (within-run) widened by the declared allowance and
    by each ``known`` departure (log scale) of this quantity in this run, in quadrature:
    the machine's in a record's rounds (``probe_shift.excess``; a ratio of records timed
    in the same rounds shares their machine and takes none) and a flagged record's
    unsteadiness (``noise.unsteadiness``)."""
    return widen(iv, math.hypot(allowance(device, what), *known))


def two_runs(device=None, what: str = "record") -> float:
    """The between-run half-width (log scale) of one record's ratio between two runs (or,
    ``what`` 'ratio', of a ratio of two records timed in the same rounds): each run's
    allowance, in quadrature."""
    return math.sqrt(2) * allowance(device, what)


def estimate(pairs: list[tuple[Interval, Interval]], level: float = LEVEL) -> float | None:
    """The per-run between-run half-width (log scale) that replicate pairs of one quantity
    show (the same record, or ratio, in two runs of one commit): the ``level`` quantile of
    their log-ratios' distance from 1, their own intervals (in quadrature, typical over the
    pairs) removed, over the square root of 2 (a pair holds two runs' variation); None with
    fewer than 3 pairs."""
    logs, own = [], []
    for a, b in pairs:
        if a.estimate > 0 and b.estimate > 0:
            logs.append(abs(math.log(b.estimate / a.estimate)))
            own.append(math.hypot(log_half_width(a), log_half_width(b)))
    if len(logs) < 3:
        return None
    reach = float(np.quantile(logs, level))
    return math.sqrt(max(0.0, reach ** 2 - float(np.median(own)) ** 2)) / math.sqrt(2)


def log_half_width(iv: Interval) -> float:
    """The larger distance of the bounds from the estimate, on the log scale (0: none)."""
    if not (iv.low > 0 and iv.high > 0 and iv.estimate > 0):
        return 0.0
    return max(math.log(iv.estimate / iv.low), math.log(iv.high / iv.estimate))


def spread_from_replicates(ratios: list[float], intervals: list[Interval],
                           level: float = LEVEL) -> float | None:
    """The between-run half-width at ``level`` (log scale) that replicate ratios show: the
    ``level`` quantile of their distances from their median (reruns have heavy tails, so
    no normal model), with their own intervals' typical half-width removed in quadrature;
    None with fewer than 3 replicates."""
    logs = np.log([r for r in ratios if r > 0])
    if logs.size < 3:
        return None
    reach = float(np.quantile(np.abs(logs - np.median(logs)), level))
    own = float(np.median([log_half_width(iv) for iv in intervals])) if intervals else 0.0
    return math.sqrt(max(0.0, reach ** 2 - own ** 2))


def half_width(replicates: float | None = None, device=None, what: str = "record") -> float:
    """The between-run 95% half-width (log scale) a comparison of two runs allows: the
    replicates' estimate when there is one, never less than ``two_runs`` of the device."""
    floor = two_runs(device, what)
    return floor if replicates is None else max(floor, replicates)


def widen(iv: Interval, between: float) -> Interval:
    """``iv`` with a between-run half-width ``between`` (log scale) added to each side's own
    in quadrature: the interval a rerun respects."""
    if not (iv.low > 0 and iv.high > 0 and iv.estimate > 0) or between <= 0:
        return iv
    lo = math.sqrt(math.log(iv.estimate / iv.low) ** 2 + between ** 2)
    hi = math.sqrt(math.log(iv.high / iv.estimate) ** 2 + between ** 2)
    return Interval(iv.estimate, iv.estimate * math.exp(-lo), iv.estimate * math.exp(hi),
                    iv.confidence, iv.n, iv.method + "/runs")


def at_level(between: float, level: float = LEVEL) -> float:
    """A 95% between-run half-width rescaled to ``level`` by normal quantiles: an interval
    at a wider level (a sequential rule's per-look one) carries a wider allowance too."""
    if level == LEVEL or between <= 0:
        return between
    return between * quantile_ratio(level)


def slope_allowance(xs, device=None) -> float:
    """The between-run 95% half-width of a least-squares slope over ``xs`` (log N) of one
    run's log times, one record per x. The slope is a contrast of the run's log times (its
    weights sum to 0), so a shift of the whole run cancels as it does in a ratio of two of
    its records; each size is given the independent share ``ratio / sqrt(2)`` that makes
    any two sizes' ratio move by the ratio allowance, so the slope moves by
    ``ratio / sqrt(2 * sum((x - mean x)^2))``."""
    x = np.asarray(xs, dtype=float)
    sxx = float(np.sum((x - x.mean()) ** 2)) if x.size else 0.0
    return allowance(device, "ratio") / math.sqrt(2 * sxx) if sxx > 0 else 0.0


def widen_linear(iv: Interval, between: float) -> Interval:
    """``iv`` with a between-run half-width ``between`` (on its own scale: a slope, not a
    ratio) added to each side's own in quadrature."""
    if between <= 0 or not all(map(math.isfinite, (iv.estimate, iv.low, iv.high))):
        return iv
    lo = math.hypot(iv.estimate - iv.low, between)
    hi = math.hypot(iv.high - iv.estimate, between)
    return Interval(iv.estimate, iv.estimate - lo, iv.estimate + hi, iv.confidence, iv.n,
                    iv.method + "/runs")
