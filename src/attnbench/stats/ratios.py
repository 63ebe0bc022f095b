"""The ratio of one metric between two records, with the interval their samples allow.

One definition, used by claims (a ratio claim), comparisons (speedup against a baseline)
and the report (a winner's margin over the runner-up):

* both records timed in the same interleaved rounds (same ``pair_group``, samples aligned):
  the per-round ratios (``stats.paired_ratio_interval``), drift shared by a round cancels;
* otherwise, with samples on both sides: a bootstrap of the ratio of medians
  (``stats.ratio_interval``);
* a metric without samples (memory, TFLOP/s): the point value, no interval.

Whether the two differ is ``significance.differs`` of that interval, the one rule.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import pandas as pd

from attnbench.stats import intervals, significance

SAMPLED = "time_ms_median"  # the metric whose raw samples records keep (samples_ms)
JOIN_COLUMNS = ("samples_ms", "pair_group")  # what a join must keep for the interval


def samples(value) -> list[float]:
    """A record's samples as a list ([] when it has none)."""
    return list(value) if isinstance(value, (list, tuple)) else []


def paired(a: Mapping, b: Mapping) -> bool:
    """Whether two records were timed in the same interleaved rounds, sample i of each from
    round i."""
    group_a, group_b = a.get("pair_group"), b.get("pair_group")
    sa, sb = samples(a.get("samples_ms")), samples(b.get("samples_ms"))
    return isinstance(group_a, str) and group_a == group_b and len(sa) == len(sb) > 0


def ratio_interval(a: Mapping, b: Mapping, metric: str = SAMPLED,
                   confidence: float = intervals.LEVEL) -> intervals.Interval:
    """``metric`` of record ``a`` over record ``b`` with its interval (95% unless told)."""
    sa, sb = samples(a.get("samples_ms")), samples(b.get("samples_ms"))
    if metric == SAMPLED and sa and sb:
        return intervals.paired_ratio_interval(sa, sb, confidence) if paired(a, b) else \
            intervals.ratio_interval(sa, sb, confidence)
    value = float(a[metric]) / float(b[metric])
    return intervals.Interval(value, value, value, 1.0, 1, "point")


@dataclass(frozen=True)
class Difference:
    """``a / b`` with its interval, and whether the two differ (``significance.differs``)."""

    interval: intervals.Interval
    significant: bool

    @property
    def is_paired(self) -> bool:
        return self.interval.method.startswith("paired")

    def describe(self) -> str:
        """'yes (paired rounds)', 'no (bootstrap)', 'no (fewer than 6 samples a side)',
        'n/a (no samples)'."""
        if self.interval.method == "point":
            return "n/a (no samples)"
        word = "yes" if self.significant else "no"
        why = significance.why_not(self.interval)
        return f"{word} ({why or ('paired rounds' if self.is_paired else 'bootstrap')})"


def difference(a: Mapping, b: Mapping, metric: str = SAMPLED) -> Difference:
    """Whether records ``a`` and ``b`` differ in ``metric``: the one rule on their ratio's
    interval (it excludes 1, from at least ``significance.MIN_SAMPLES`` samples a side)."""
    iv = ratio_interval(a, b, metric)
    return Difference(iv, significance.differs(iv))


def join(a: pd.DataFrame, b: pd.DataFrame, on: list[str], columns: list[str]) -> pd.DataFrame:
    """Rows of ``a`` beside the rows of ``b`` they pair with (equal ``on``), every other
    column suffixed ``_a`` / ``_b``; keeps what ``ratio_interval`` needs."""
    keep = list(dict.fromkeys([*on, *columns, *JOIN_COLUMNS]))
    left = a[[c for c in keep if c in a.columns]]
    right = b[[c for c in keep if c in b.columns]]
    return left.merge(right, on=on, suffixes=("_a", "_b"))


def side(row: Mapping, suffix: str) -> dict:
    """One side of a joined row as a record-like mapping (suffix removed)."""
    return {k[: -len(suffix)]: v for k, v in row.items() if k.endswith(suffix)}


def joined_ratio_interval(row: Mapping, metric: str = SAMPLED,
                          confidence: float = intervals.LEVEL) -> intervals.Interval:
    """``ratio_interval`` of a row of ``join``: side ``_a`` over side ``_b``."""
    return ratio_interval(side(row, "_a"), side(row, "_b"), metric, confidence)


def format_ratio(iv: intervals.Interval, unit: str = "x") -> str:
    """'8.31x [7.92, 8.80]', '3.05x [3.05, 3.47, 75%]' (the interval only when there is
    one, its coverage when it is below 95%)."""
    if iv.low == iv.high or not all(map(math.isfinite, (iv.low, iv.high))):
        return f"{iv.estimate:.3g}{unit}"
    note = intervals.coverage_note(iv.confidence)
    conf = f", {note}" if note else ""
    return f"{iv.estimate:.3g}{unit} [{iv.low:.3g}, {iv.high:.3g}{conf}]"
