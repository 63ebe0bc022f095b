"""A record's change between two runs judged against its partners timed in the same rounds.

Backends of one problem are timed in interleaved rounds (one ``pair_group``): round i of
each was measured within moments of the others'. Between two runs, whatever the machine
did in a round hit a record and its partners alike, so the record's time over its partners'
in each round, compared between the runs, carries the code's change without the machine's,
including a move the rest of the run did not share (a host whose memory bandwidth slowed
for an hour). Only partners whose code did not change (``backend_hash``) are a reference.

For a record x with unchanged partners p1..pk in both runs (k >= ``MIN_PARTNERS``, each
holding x's rounds on each side): each round's reference is the geometric mean of the
partners' samples, x's relative time is its sample over that reference, and the change is
the ratio of the medians of the relative times new / base, with its bootstrap interval
(``intervals.ratio_interval``). A record without such partners is left to the machine's
move (``run_diff``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from attnbench.analysis import departures
from attnbench.stats import intervals, ratios, run_to_run

# With one partner, x over p is p over x inverted: a move of either reads as a change of
# the other, so which one moved takes a second partner to tell.
MIN_PARTNERS = 2


@dataclass(frozen=True)
class Relative:
    """A record's change new / base over its unchanged partners in the same rounds."""

    interval: intervals.Interval
    partners: tuple[str, ...]  # the partners' backends
    reach: tuple[float, float]  # each side's relative-time interval reach from its median


def _groups(df: pd.DataFrame) -> dict[str, list[dict]]:
    """Each pair group's ok records with samples, as dicts."""
    if df.empty or "pair_group" not in df.columns:
        return {}
    ok = df[(df["status"] == "ok") & df["pair_group"].notna()]
    out: dict[str, list[dict]] = {}
    for _, r in ok.iterrows():
        if ratios.samples(r.get("samples_ms")):
            out.setdefault(str(r["pair_group"]), []).append(dict(r))
    return out


def _by_record(groups: dict[str, list[dict]]) -> dict[tuple, tuple[dict, list[dict]]]:
    """(key, backend) -> (its record, the other records of its group)."""
    out = {}
    for members in groups.values():
        for r in members:
            out[(r["key"], r["backend"])] = (r, [m for m in members if m is not r])
    return out


def _relative_times(x: dict, partners: list[dict]) -> np.ndarray | None:
    """x's samples over the per-round geometric mean of its partners' (None unless every
    sample list has x's length: the rounds are aligned)."""
    xs = np.asarray(ratios.samples(x.get("samples_ms")), dtype=float)
    ps = [np.asarray(ratios.samples(p.get("samples_ms")), dtype=float) for p in partners]
    if not ps or any(p.shape != xs.shape for p in ps) or np.any(xs <= 0) or \
            any(np.any(p <= 0) for p in ps):
        return None
    reference = np.exp(np.mean(np.log(np.vstack(ps)), axis=0))  # (rounds,)
    return xs / reference


def _aligned(x: dict, p: dict) -> bool:
    """Whether two records of one group hold the same rounds (as many samples)."""
    return len(ratios.samples(x.get("samples_ms"))) == len(ratios.samples(p.get("samples_ms")))


def _hash(r: dict):
    h = r.get("backend_hash")
    return h if isinstance(h, str) else None


def relative_changes(base: pd.DataFrame, new: pd.DataFrame) -> dict[tuple, Relative]:
    """Every record that has unchanged partners in the same rounds in both runs, by (key,
    backend): its change over them (``Relative``). A partner the noise flag flags on
    either side (``departures``: it carries unsteadiness) is left out of the reference
    while ``MIN_PARTNERS`` steady ones remain: its own scatter would read as a change of
    every record it is a partner of."""
    old, now = _by_record(_groups(base)), _by_record(_groups(new))
    unsteady = {k for run in (base, new) for k, d in departures.known(run).items()
                if d.unsteadiness > 0}
    out = {}
    for ident in sorted(set(old) & set(now)):
        (xb, pb), (xn, pn) = old[ident], now[ident]
        base_partners = {(p["key"], p["backend"]): p for p in pb}
        partners = []
        for p in pn:
            q = base_partners.get((p["key"], p["backend"]))
            if q is not None and p["backend"] != ident[1] and _hash(p) is not None \
                    and _hash(p) == _hash(q) and _aligned(xb, q) and _aligned(xn, p):
                partners.append((q, p))
        steady = [(q, p) for q, p in partners if (p["key"], p["backend"]) not in unsteady]
        partners = steady if len(steady) >= MIN_PARTNERS else partners
        if len(partners) < MIN_PARTNERS:
            continue
        rel_b = _relative_times(xb, [q for q, _ in partners])
        rel_n = _relative_times(xn, [p for _, p in partners])
        if rel_b is None or rel_n is None:
            continue
        iv = intervals.ratio_interval(rel_n.tolist(), rel_b.tolist())
        reach = tuple(intervals.median_interval(s.tolist()).half_width_rel
                      for s in (rel_b, rel_n))
        out[ident] = Relative(iv, tuple(sorted({p["backend"] for _, p in partners})), reach)
    return out


def unchanged_spread(changes: dict[tuple, Relative], unchanged: set[tuple]) -> float | None:
    """The between-run half-width (log scale) the relative changes of unchanged records show
    (``run_to_run.spread_from_replicates``), None with fewer than 3."""
    mine = [c for ident, c in changes.items() if ident in unchanged and
            c.interval.estimate > 0 and math.isfinite(c.interval.estimate)]
    return run_to_run.spread_from_replicates([c.interval.estimate for c in mine],
                                             [c.interval for c in mine])
