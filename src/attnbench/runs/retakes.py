"""Retakes: a group that the run's own witnesses read as disturbed is timed again once the
run's first pass is done, and its least disturbed attempt is kept.

On a shared host a neighbour's burst lands on some groups and not others, and a record
timed through one carries a departure a rerun would not repeat (``analysis.departures``:
the drift probe in its rounds stood off the run's level, or its own samples scatter). Its
interval then has to carry that departure across runs, which hides a real change of its
code. Timing the group again later, when the burst has likely passed, and keeping the
attempt whose witnesses read it as less disturbed gives the record an undisturbed time
more often. The choice reads only the witnesses (the probe's readings and the samples'
scatter), never which attempt is faster, and every attempt's disturbance is recorded
(``retake_disturbance``, first attempt first; ``retake_kept``: the index kept).

A group holding a sequential claim is not retaken: its rounds stopped on a rule that a
second attempt would restart.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

import numpy as np
import pandas as pd

from attnbench.analysis import departures
from attnbench.measure.budget import TimingBudget

Rows = list[dict]


def run_level(groups: Iterable[Rows]) -> float | None:
    """The run's probe level (GFLOP/s), read as the analysis reads it from the written run
    (``departures.run_probe_level``); None without any."""
    return departures.run_probe_level(pd.DataFrame([r for rows in groups for r in rows]))


def timed(rows: Rows) -> set[tuple]:
    """The (key, backend) of an attempt's ok records with samples: what it timed."""
    return {(r["key"], r["backend"]) for r in rows
            if r.get("status") == "ok" and r.get("samples_ms")}


def disturbance(rows: Rows, level: float | None, budget: TimingBudget,
                needed: set[tuple] | None = None) -> float:
    """How disturbed one attempt at a group was: the largest known departure of its timed
    records (``departures.of_record``, log scale; 0: none). inf when it did not time every
    record of ``needed`` (the first attempt's ``timed``): it is never preferred."""
    mine = timed(rows)
    if needed is not None and not needed <= mine:
        return math.inf
    return max((departures.of_record(r, level, budget).total for r in rows
                if (r["key"], r["backend"]) in mine), default=0.0)


def retaken(groups: list[tuple[object, Rows]], time_again: Callable[[object], Rows],
            budget: TimingBudget, say: Callable[[str], None] = lambda text: None
            ) -> Iterable[Rows]:
    """For each (jobs, rows) group of the first pass whose attempt was disturbed
    (``disturbance`` > 0, finite), ``budget.retakes`` more attempts (``time_again(jobs)``,
    rows written as the first pass writes them), stopping at an undisturbed one; yields the
    kept attempt's rows, each marked with every attempt's disturbance and the index kept,
    to be appended after the first attempt's (a later line supersedes: ``record_files``)."""
    level = run_level(rows for _, rows in groups)
    todo = [(jobs, rows, d) for jobs, rows in groups
            if timed(rows) and (d := disturbance(rows, level, budget)) > 0]
    if budget.retakes < 1 or not todo:
        return
    say(f"retaking {len(todo)} of {len(groups)} groups the probe or their own samples read "
        f"as disturbed")
    for jobs, rows, first in todo:
        attempts, scores = [rows], [first]
        for _ in range(budget.retakes):
            again = time_again(jobs)
            attempts.append(again)
            scores.append(disturbance(again, level, budget, timed(rows)))
            if scores[-1] == 0:
                break
        kept = int(np.argmin(scores))
        marks = {"retake_disturbance": [round(s, 4) if math.isfinite(s) else None
                                        for s in scores], "retake_kept": kept}
        yield [r | marks for r in attempts[kept]]
