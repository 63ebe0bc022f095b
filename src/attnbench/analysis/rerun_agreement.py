"""How well runs of one commit agree: the counts a rerun must meet.

For a set of runs of the same code, every pair of runs is set side by side:

* record intervals: the same (key, backend) in both runs, its time's interval disjoint
  between them, within-run (the record's own bounds) and across-runs
  (``run_to_run.across_runs``, with what the run is known to have done to the record:
  the machine's departure in its rounds, its unsteadiness if the noise flag flags it);
* paired ratios: every two ok records timed in the same interleaved rounds (one
  ``pair_group``), the ratio's interval disjoint between runs, both ways (across runs:
  with both records' unsteadiness);
* ``compare`` of the two runs (``run_diff``): how many records it calls worse, better,
  unchanged or cannot tell;
* a planted change: one backend's samples in the second run multiplied by ``factor`` and its
  code hash changed, for each backend in turn; the share of its records compare calls worse.

Records timed under an interpreter (``timed_under``) are left out: they are not speeds.
"""

from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import dataclass, field

import pandas as pd

from attnbench.analysis import departures, machine_state, run_diff
from attnbench.core.record import speed_records
from attnbench.stats import ratios, run_to_run
from attnbench.stats.intervals import Interval

METRIC = "time_ms_median"
PLANTED = 1.2  # the slowdown a compare must still find on one backend


def _ok(df: pd.DataFrame) -> pd.DataFrame:
    ok = df[(df["status"] == "ok") & df[METRIC].notna()] if not df.empty else df
    return speed_records(ok)


def record_intervals(df: pd.DataFrame) -> dict[tuple, Interval]:
    """Each ok record's within-run time interval, by (key, backend)."""
    out = {}
    for _, r in _ok(df).iterrows():
        conf = r.get("time_ci_confidence")
        out[(r["key"], r["backend"])] = Interval(
            float(r[METRIC]), float(r["time_ms_ci_low"]), float(r["time_ms_ci_high"]),
            0.95 if conf is None or pd.isna(conf) else float(conf),
            int(r.get("n_samples") or len(ratios.samples(r.get("samples_ms")))),
            "order-statistics")
    return out


def record_departures(df: pd.DataFrame) -> dict[tuple, tuple[float, ...]]:
    """Each ok record's known departures in its run (``departures.known``): the machine's
    in its rounds and its unsteadiness, what its across-runs interval adds."""
    return {k: (d.machine, d.unsteadiness) for k, d in departures.known(df).items()}


def paired_ratios(df: pd.DataFrame) -> dict[tuple, Interval]:
    """The within-run interval of every ratio of two ok records timed in the same rounds
    (one ``pair_group``), by (key_a, backend_a, key_b, backend_b), a before b in order."""
    return {k: iv for k, (iv, _) in _paired(df).items()}


def _paired(df: pd.DataFrame) -> dict[tuple, tuple[Interval, tuple[float, ...]]]:
    """``paired_ratios`` with each ratio's known departures: both records' unsteadiness
    (their shared machine divides out)."""
    ok = _ok(df)
    if ok.empty or "pair_group" not in ok.columns:
        return {}
    known = departures.known(df)
    out = {}
    for _, g in ok[ok["pair_group"].notna()].groupby("pair_group", sort=False):
        rows = sorted((dict(r) for _, r in g.iterrows()), key=lambda r: (r["backend"],
                                                                          r["key"]))
        for a, b in itertools.combinations(rows, 2):
            ka, kb = (a["key"], a["backend"]), (b["key"], b["backend"])
            out[ka + kb] = (ratios.ratio_interval(a, b),
                            (known[ka].unsteadiness, known[kb].unsteadiness))
    return out


def disjoint(a: Interval, b: Interval) -> bool:
    return a.high < b.low or b.high < a.low


@dataclass
class Disjoint:
    """Pairs of one quantity's intervals in two runs, and how many are disjoint."""

    pairs: int = 0
    within: int = 0  # within-run intervals
    across: int = 0  # across-runs intervals

    def text(self, what: str) -> str:
        return (f"{what}: {self.within} of {self.pairs} pairs disjoint within-run "
                f"({_pct(self.within, self.pairs)}), {self.across} across runs "
                f"({_pct(self.across, self.pairs)})")


def _pct(n: int, d: int) -> str:
    return f"{n / d:.1%}" if d else "-"


def count_disjoint(per_run: list[dict[tuple, Interval]], devices: list, what: str,
                   departures: list[dict[tuple, tuple[float, ...]]] | None = None
                   ) -> tuple[Disjoint, list[tuple[Interval, Interval, bool]]]:
    """Over every pair of runs: the quantities both hold, disjoint within-run and across
    runs (each widened by its known departures in its run, where given:
    ``record_departures``, ``_paired``); and the pairs themselves (for
    ``run_to_run.estimate``), each with whether neither side has a known departure."""
    out, pairs = Disjoint(), []
    departures = departures or [{} for _ in per_run]
    runs = list(zip(per_run, devices, departures))
    for (x, dx, mx), (y, dy, my) in itertools.combinations(runs, 2):
        for k in sorted(set(x) & set(y)):
            a, b = x[k], y[k]
            pairs.append((a, b, not any(mx.get(k, ())) and not any(my.get(k, ()))))
            out.pairs += 1
            out.within += disjoint(a, b)
            out.across += disjoint(run_to_run.across_runs(a, dx, what, *mx.get(k, ())),
                                   run_to_run.across_runs(b, dy, what, *my.get(k, ())))
    return out, pairs


def compare_counts(base: pd.DataFrame, new: pd.DataFrame, threshold: float = 0.10,
                   same_setup: bool = False) -> pd.DataFrame:
    """``compare``'s decided table of two runs, as the command makes it (each record over its
    unchanged partners in the same rounds where they are the tighter reference, else over
    the machine's move)."""
    return run_diff.judge(base, new, METRIC, threshold, same_setup).decided


def planted(new: pd.DataFrame, backend: str, factor: float = PLANTED) -> pd.DataFrame:
    """``new`` with ``backend``'s times multiplied by ``factor`` and its code hash changed:
    what a real change of that backend's code by that much would record."""
    out = new.copy()
    mask = out["backend"] == backend
    for col in (METRIC, "time_ms_ci_low", "time_ms_ci_high"):
        if col in out.columns:
            out.loc[mask, col] = out.loc[mask, col] * factor
    out["samples_ms"] = [[s * factor for s in ratios.samples(v)] if m else v
                         for v, m in zip(out["samples_ms"], mask)]
    out["backend_hash"] = [f"planted-{h}" if m else h
                           for h, m in zip(out.get("backend_hash", [None] * len(out)), mask)]
    return out


@dataclass
class Agreement:
    runs: list[str]
    records: Disjoint
    ratios: Disjoint
    estimate_record: float | None  # per-run between-run half-width these runs show (log)
    estimate_ratio: float | None
    undisturbed_record: float | None = None  # the same, of pairs without known departures
    undisturbed_ratio: float | None = None
    compares: list[tuple[str, str, dict[str, int]]] = field(default_factory=list)
    detection: dict[str, tuple[int, int]] = field(default_factory=dict)  # backend: found, of
    unclear: Counter = field(default_factory=Counter)  # compares' 'cannot tell', by why
    missed: Counter = field(default_factory=Counter)  # planted records not found, by answer

    def lines(self, device=None) -> list[str]:
        """The counts, one line each."""
        import math

        def est(x):
            return "-" if x is None else f"+-{math.expm1(x):.1%}"

        out = [f"runs: {', '.join(self.runs)}",
               self.records.text("record intervals"),
               self.ratios.text("paired-ratio intervals"),
               f"between-run allowance these runs show (per run, 95%): record "
               f"{est(self.estimate_record)}, ratio {est(self.estimate_ratio)}; without "
               f"known departures (departures.py) record {est(self.undisturbed_record)}, "
               f"ratio {est(self.undisturbed_ratio)}; declared "
               f"{run_to_run.allowance_text(device)}"]
        total: Counter = Counter()
        for a, b, counts in self.compares:
            total.update(counts)
            out.append(f"compare {a} -> {b}: " + ", ".join(
                f"{counts.get(c, 0)} {c}" for c in ("worse", "better", "unchanged",
                                                     "cannot tell")))
        out.append("compare, all pairs: " + ", ".join(
            f"{total.get(c, 0)} {c}" for c in ("worse", "better", "unchanged", "cannot tell"))
            + _reasons(" (why: ", self.unclear, ")"))
        found = sum(f for f, _ in self.detection.values())
        of = sum(n for _, n in self.detection.values())
        out.append(f"planted {PLANTED:g}x slowdown found (called worse): {found} of {of} "
                   f"({_pct(found, of)}); by backend: " + ", ".join(
                       f"{b} {f}/{n}" for b, (f, n) in sorted(self.detection.items())))
        if self.missed:
            out.append(_reasons("planted slowdown not found: ", self.missed, ""))
        return out


def _reasons(before: str, counts: Counter, after: str) -> str:
    """'before 52 wide, 4 scattered after' (most first), '' without any."""
    if not counts:
        return ""
    return before + ", ".join(f"{n} {k}" for k, n in counts.most_common()) + after


def machine_states(metas: list[dict]) -> list[str]:
    """What each run measured of the machine at its start (matmul ceiling per dtype) and
    throughout (the drift probe's median), with the largest over the smallest: runs whose
    machine read differently are not replicates of one state, and their counts say how
    far the method carries that, not how steady the code is."""
    out = []
    ceilings = [run_diff.matmul_ceilings(m) for m in metas]
    for dtype in sorted(set().union(*ceilings)):
        out.append(_spread_line(f"matmul ceiling {dtype}", "TFLOP/s",
                                [c.get(dtype) for c in ceilings]))
    out.append(_spread_line("drift probe", "GFLOP/s",
                            [run_diff.probe_rate(m) for m in metas]))
    return [line for line in out if line]


def one_state_line(runs: list[tuple[str, dict, pd.DataFrame]], device=None) -> str | None:
    """Whether the runs (label, meta, records) were measured on one machine state, by the
    drift probe: between the runs (``machine_state.between_runs``) and during each
    (``machine_state.within_run``); None when a run has no probe."""
    if any(machine_state.run_level(m, r) is None for _, m, r in runs):
        return None
    limit = machine_state.limit(device)
    why = []
    moved = machine_state.between_runs([(m, r) for _, m, r in runs], device)
    if moved is not None:
        why.append(machine_state.between_runs_text(
            moved, [run_diff.matmul_ceilings(m) for _, m, _ in runs], device).removeprefix(
            "machine differed between the runs: "))
    during = [(label, w) for label, _, r in runs
              if (w := machine_state.within_run(r, device)) is not None]
    if during:
        why.append("moved during " + ", ".join(
            f"{label} (quarters {w.levels_text()} GFLOP/s, {w.factor:.3g}x)"
            for label, w in during) + f", beyond {limit:.3g}x")
    if why:
        return "machine: NOT one state: " + "; ".join(why)
    return (f"machine: one state (drift probe within the {limit:.3g}x two runs of unchanged "
            f"code may differ by, between the runs and over each run's quarters)")


def _spread_line(what: str, unit: str, values: list) -> str | None:
    """'what a, b, c unit (largest / smallest 1.26x)'; None unless every run has a value."""
    if not values or any(not v or v <= 0 for v in values):
        return None
    return (f"machine per run: {what} {', '.join(f'{v:.3g}' for v in values)} {unit} "
            f"(largest / smallest {max(values) / min(values):.3g}x)")


def _estimates(*pair_lists) -> list[float | None]:
    """``run_to_run.estimate`` of each list of pairs, all of them, then of each, those
    without known departures: record, ratio, undisturbed record, undisturbed ratio."""
    every = [run_to_run.estimate([(a, b) for a, b, _ in p]) for p in pair_lists]
    steady = [run_to_run.estimate([(a, b) for a, b, clean in p if clean]) for p in pair_lists]
    return every + steady


def agreement(runs: list[tuple[str, pd.DataFrame]], threshold: float = 0.10,
              factor: float = PLANTED, same_setup: bool = False) -> Agreement:
    """The counts over every pair of ``runs`` (label, records), in the order given;
    ``same_setup``: the runs share one setup (``run_diff.same_setup`` of every pair)."""
    devices = [run_diff.run_device(df) for _, df in runs]
    rec, rec_pairs = count_disjoint([record_intervals(df) for _, df in runs], devices,
                                    "record", [record_departures(df) for _, df in runs])
    paired = [_paired(df) for _, df in runs]
    rat, rat_pairs = count_disjoint([{k: iv for k, (iv, _) in p.items()} for p in paired],
                                    devices, "ratio",
                                    [{k: d for k, (_, d) in p.items()} for p in paired])
    out = Agreement([label for label, _ in runs], rec, rat, *_estimates(rec_pairs, rat_pairs))
    found: Counter = Counter()
    of: Counter = Counter()
    for (la, a), (lb, b) in itertools.combinations(runs, 2):
        decided = compare_counts(a, b, threshold, same_setup)
        out.compares.append((la, lb, run_diff.change_counts(decided)))
        out.unclear.update(run_diff.why_counts(decided))
        both = set(_ok(a)["backend"]) & set(_ok(b)["backend"])
        for backend in sorted(both):
            decided = compare_counts(a, planted(b, backend, factor), threshold, same_setup)
            mine = decided[(decided["backend"] == backend) & (decided["status_base"] == "ok")
                           & (decided["status_new"] == "ok")]
            mine = mine[[run_diff.speed_ok(r) for _, r in mine.iterrows()]] \
                if not mine.empty else mine
            found[backend] += int((mine["change"] == "worse").sum())
            out.missed.update(f"cannot tell: {r['why']}" if r["change"] == "cannot tell"
                              else str(r["change"]) for _, r in mine.iterrows()
                              if r["change"] != "worse")
            of[backend] += len(mine)
    out.detection = {b: (found[b], of[b]) for b in of}
    return out
