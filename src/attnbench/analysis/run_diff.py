"""Compare two runs record by record: joined on (key, backend), new / base of a metric.

The metric's declaration says which direction is worse. With raw samples on both sides (the
time metrics), a change is decided from the bootstrap interval of the ratio of medians
(``stats.intervals.change_verdict``) with three answers: ``worse`` / ``better`` (the
interval excludes 1 and the estimate is beyond the threshold), ``unchanged`` (the interval
lies within the threshold) and ``cannot tell`` (neither). Without samples (memory,
TFLOP/s), the threshold alone decides. A record that was ``ok`` and is not ``ok`` now broke.

The machine is separated from the code: when references were measured in both runs --
records of backends whose code did not change (``backend_hash``), else the drift probe --
their median ratio is the machine's move, and every record is judged by its ratio over
that move (a ratio of ratios), so a machine 1.3x slower does not read as a regression of
every backend.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

from attnbench.core import metrics
from attnbench.stats import intervals

SAMPLED = {"time_ms_median"}  # metrics whose raw samples records keep (samples_ms)
MIN_REFERENCES = 6  # reference records the machine's move needs (a 95% interval of it)
CHANGES = ("worse", "better", "unchanged", "cannot tell", "broke", "fixed")


def join_runs(base: pd.DataFrame, new: pd.DataFrame, metric: str) -> pd.DataFrame:
    cols = ["key", "backend", "status", metric, "samples_ms", "backend_hash", "env_id",
            "probe_gflops"]
    b = base[[c for c in cols if c in base.columns]]
    n = new[[c for c in cols if c in new.columns]]
    j = b.merge(n, on=["key", "backend"], how="outer", suffixes=("_base", "_new"))
    for side in ("base", "new"):
        if f"{metric}_{side}" not in j.columns:  # e.g. every record of that run failed
            j[f"{metric}_{side}"] = float("nan")
    j["ratio"] = j[f"{metric}_new"] / j[f"{metric}_base"]
    return j


def _samples(value) -> list[float]:
    return list(value) if isinstance(value, (list, tuple)) else []


def _code_unchanged(r) -> bool:
    hb, hn = r.get("backend_hash_base"), r.get("backend_hash_new")
    return isinstance(hb, str) and isinstance(hn, str) and hb == hn


@dataclass(frozen=True)
class MachineMove:
    """How much slower (> 1) or faster the machine ran the same work in the new run:
    ``interval`` of the median ratio new / base over ``n`` references, from ``source``."""

    interval: intervals.Interval
    source: str  # "unchanged backends" or "drift probe"

    def describe(self) -> str:
        iv = self.interval
        conf = intervals.coverage_note(iv.confidence)
        return (f"the machine moved {iv.estimate:.3g}x [{iv.low:.3g}, {iv.high:.3g}"
                f"{', ' + conf if conf else ''}] (new / base time, from {iv.n} records: "
                f"{self.source})")


def _agreeing_backends(moves: dict[str, float], tolerance: float) -> list[str]:
    """The largest set of backends whose median moves agree within ``tolerance`` of one of
    them, when it is a strict majority; else [] (the references disagree: half the backends
    3x slower and half unchanged could be either a slower machine or a slower backend)."""
    best: list[str] = []
    for m in moves.values():
        near = [b for b, x in moves.items() if abs(math.log(x / m)) <= math.log1p(tolerance)]
        if len(near) > len(best):
            best = near
    return best if len(best) * 2 > len(moves) else []


def machine_move(joined: pd.DataFrame, metric: str, tolerance: float = 0.10
                 ) -> MachineMove | None:
    """The machine's move between the runs, from references measured in both.

    First the backends whose code hash did not change (the same code on the same cases:
    what changed is the machine): each backend's median ratio, and when a strict majority
    of those backends agree (within ``tolerance``), the median ratio over their records.
    Else the drift probe each record carries (a fixed matmul: the machine itself). None
    with fewer than ``MIN_REFERENCES`` records of either, or references that disagree and
    no probe: the runs cannot separate machine from code."""
    if metric not in SAMPLED:
        return None
    both_ok = joined[(joined["status_base"] == "ok") & (joined["status_new"] == "ok")
                     & joined["ratio"].notna() & (joined["ratio"] > 0)]
    refs = both_ok[[_code_unchanged(r) for _, r in both_ok.iterrows()]] \
        if not both_ok.empty else both_ok
    if len(refs) >= MIN_REFERENCES:
        moves = {b: float(g["ratio"].median()) for b, g in refs.groupby("backend")}
        agree = _agreeing_backends(moves, tolerance)
        ratios = refs[refs["backend"].isin(agree)]["ratio"].astype(float).tolist()
        if len(ratios) >= MIN_REFERENCES:
            return MachineMove(intervals.median_interval(ratios),
                               f"{len(agree)} of {len(moves)} unchanged backends that agree")
    if {"probe_gflops_base", "probe_gflops_new"} <= set(both_ok.columns):
        p = both_ok[both_ok["probe_gflops_base"].notna() & both_ok["probe_gflops_new"].notna()]
        slow = (p["probe_gflops_base"] / p["probe_gflops_new"]).tolist()  # time: rate inverted
        if len(slow) >= MIN_REFERENCES:
            return MachineMove(intervals.median_interval(slow), "the drift probe")
    return None


def _relative(iv: intervals.Interval, move: MachineMove) -> intervals.Interval:
    """A record's ratio over the machine's move: the interval divided by the move's median.

    The move's own interval is shown but not propagated: it is the median over many
    records, and its order-statistics interval spans the records that did change (a third
    of them changed 3x: its upper bound is 3), which would hide exactly those changes."""
    m = move.interval.estimate
    return intervals.Interval(iv.estimate / m, iv.low / m, iv.high / m, iv.confidence, iv.n,
                              iv.method + "/machine")


def decide(joined: pd.DataFrame, metric: str, threshold: float,
           move: MachineMove | None = None) -> pd.DataFrame:
    """Adds ``change`` (worse/better/unchanged/cannot tell/broke/fixed/-), ``p_value``, the
    ratio's interval (``ratio_low/high``), ``vs_machine`` (the ratio over the machine's move,
    when ``move`` is given, which then decides) and ``code_changed``."""
    m = metrics.get(metric)
    lower = m.better == metrics.LOWER
    rows = []
    for _, r in joined.iterrows():
        out = {"change": "-", "p_value": None, "ratio_low": None, "ratio_high": None,
               "vs_machine": None}
        sb, sn = r.get("status_base"), r.get("status_new")
        if sb == "ok" and isinstance(sn, str) and sn != "ok":
            out["change"] = "broke"
        elif sn == "ok" and isinstance(sb, str) and sb != "ok":
            out["change"] = "fixed"
        elif sb == "ok" and sn == "ok" and pd.notna(r.get("ratio")):
            a, b = _samples(r.get("samples_ms_base")), _samples(r.get("samples_ms_new"))
            if metric in SAMPLED and a and b:
                iv = intervals.ratio_interval(b, a)
                out.update(p_value=intervals.mann_whitney(a, b), ratio_low=iv.low,
                           ratio_high=iv.high)
                if move is not None:
                    iv = _relative(iv, move)
                    out["vs_machine"] = iv.estimate
                out["change"] = intervals.change_verdict(iv, threshold, lower)
            elif m.worse(r["ratio"], threshold):
                out["change"] = "worse"
            elif m.worse(1 / r["ratio"], threshold) if r["ratio"] else False:
                out["change"] = "better"
            else:
                out["change"] = "unchanged"
        hb, hn = r.get("backend_hash_base"), r.get("backend_hash_new")
        out["code_changed"] = isinstance(hb, str) and isinstance(hn, str) and hb != hn
        rows.append(out)
    return pd.concat([joined.reset_index(drop=True), pd.DataFrame(rows)], axis=1)


def regressions(decided: pd.DataFrame) -> pd.DataFrame:
    """Significant regressions beyond the threshold, and ok records that broke."""
    return decided[decided["change"].isin(["worse", "broke"])]


def change_counts(decided: pd.DataFrame) -> dict[str, int]:
    """How many joined records got each answer (every answer listed, zeros included)."""
    counts = decided["change"].value_counts()
    return {c: int(counts.get(c, 0)) for c in CHANGES}


def ratio_text(r) -> str:
    """'ratio 3.1' or, with no ratio (a side failed), ''."""
    value = r.get("ratio")
    return f", ratio {value:.3g}" if value is not None and math.isfinite(value) else ""


def ceiling_move(base_meta: dict, new_meta: dict) -> list[str]:
    """The matmul ceilings measured at the start of each run, per dtype: 'float32 0.52 ->
    0.41 TFLOP/s (1.27x slower)'; information beside the machine's move."""
    a = (base_meta.get("ceilings") or {}).get("matmul_tflops") or {}
    b = (new_meta.get("ceilings") or {}).get("matmul_tflops") or {}
    out = []
    for dtype in sorted(set(a) & set(b)):
        if a[dtype] and b[dtype]:
            out.append(f"{dtype} {a[dtype]:.3g} -> {b[dtype]:.3g} TFLOP/s "
                       f"({a[dtype] / b[dtype]:.3g}x the time)")
    return out


def probe_move(base_meta: dict, new_meta: dict) -> str | None:
    """The drift probe's median rate in each run, as a time factor."""
    a = (base_meta.get("probe") or {}).get("gflops_median")
    b = (new_meta.get("probe") or {}).get("gflops_median")
    if not a or not b:
        return None
    return f"drift probe {a:.3g} -> {b:.3g} GFLOP/s ({a / b:.3g}x the time)"


def environment_difference(base_meta: dict, new_meta: dict) -> list[str]:
    """The environment fields that differ between two runs, as 'field: a -> b'."""
    a, b = base_meta.get("environment", {}), new_meta.get("environment", {})
    skip = {"hostname", "device_state"}  # device_state: device_state_difference says it
    return [f"{k}: {a.get(k)} -> {b.get(k)}" for k in sorted(set(a) | set(b))
            if k not in skip and a.get(k) != b.get(k)]


def _clock(meta: dict, df: pd.DataFrame, column: str, at_start: str) -> float | None:
    """A run's clock: the median over its records, else the reading at its start."""
    if column in df.columns and df[column].notna().any():
        return float(df[column].dropna().median())
    value = ((meta.get("environment") or {}).get("device_state") or {}).get(
        "at_start", {}).get(at_start)
    return float(value) if isinstance(value, (int, float)) else None


def device_state_difference(base_meta: dict, new_meta: dict, base: pd.DataFrame,
                            new: pd.DataFrame) -> list[str]:
    """What the device's state says between two runs, before any verdict on the code: a
    clock that differs by more than CLOCK_DROP_REL, and records measured throttled."""
    from attnbench.core.record import is_throttled
    from attnbench.measure.device_state import CLOCK_DROP_REL

    out = []
    for what, column, at_start in (("GPU SM clock", "gpu_sm_mhz", "gpu_sm_mhz"),
                                   ("CPU frequency", "cpu_mhz_begin", "cpu_mhz")):
        a, b = (_clock(m, d, column, at_start) for m, d in ((base_meta, base), (new_meta, new)))
        if a and b and abs(b - a) / max(a, b) > CLOCK_DROP_REL:
            out.append(f"{what} {a:.0f} -> {b:.0f} MHz ({a / b:.3g}x the time at a "
                       f"clock-bound rate): a cause beside the code")
    counts = [int(d["throttled"].map(is_throttled).sum()) if "throttled" in d.columns else 0
              for d in (base, new)]
    if any(counts):
        out.append(f"records measured throttled: {counts[0]} of {len(base)} -> {counts[1]} of "
                   f"{len(new)}")
    return out


__all__ = ["MachineMove", "machine_move", "decide", "regressions", "change_counts",
           "join_runs", "environment_difference", "ceiling_move", "probe_move",
           "device_state_difference"]
