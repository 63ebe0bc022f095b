"""The ratio of one metric between two records, with the interval their samples allow.

One definition, used by claims (a ratio claim), comparisons (speedup against a baseline)
and the report (a winner's margin over the runner-up):

* both records timed in the same interleaved rounds (same ``pair_group``, samples aligned):
  the per-round ratios (``stats.paired_ratio_interval``), drift shared by a round cancels;
* otherwise, with samples on both sides: a bootstrap of the ratio of medians
  (``stats.ratio_interval``), and a Mann-Whitney U test decides whether they differ;
* a metric without samples (memory, TFLOP/s): the point value, no interval.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import pandas as pd

from attnbench.stats import intervals

SAMPLED = "time_ms_median"  # the metric whose raw samples records keep (samples_ms)
ALPHA = 0.05
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
    """``a / b`` with its interval, and whether the two differ significantly."""

    interval: intervals.Interval
    significant: bool
    p_value: float | None  # Mann-Whitney, for records not timed in the same rounds

    @property
    def is_paired(self) -> bool:
        return self.interval.method.startswith("paired")

    def describe(self) -> str:
        """'yes (paired)', 'no (p = 0.31)', 'n/a (no samples)'."""
        if self.interval.method == "point":
            return "n/a (no samples)"
        word = "yes" if self.significant else "no"
        if self.is_paired:
            return f"{word} (paired rounds)"
        return f"{word} (Mann-Whitney p = {self.p_value:.2g})"


def difference(a: Mapping, b: Mapping, metric: str = SAMPLED, alpha: float = ALPHA
               ) -> Difference:
    """Paired records differ when the 95% interval of their per-round ratios (6 or more
    rounds) excludes 1; others
    when a Mann-Whitney U test rejects equality (p < alpha)."""
    iv = ratio_interval(a, b, metric)
    if iv.method == "point":
        return Difference(iv, False, None)
    if iv.method.startswith("paired"):
        # an interval short of 95% (fewer than 6 rounds) is never called significant
        return Difference(iv, not intervals.short_of_level(iv.confidence)
                          and not iv.contains(1.0), None)
    p = intervals.mann_whitney(samples(a.get("samples_ms")), samples(b.get("samples_ms")))
    return Difference(iv, p < alpha, p)


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
