"""Claims: statements a suite sets out to check, evaluated from the run's records.

A suite may carry ``[[claim]]`` tables (data, like the rest of the suite):

* ``kind = "ratio"``: ``metric`` of ``numerator`` over ``denominator`` on the cases
  selected by ``where`` (one ratio per case, joined on the case key); with
  ``numerator_where`` / ``denominator_where`` the sides select different cases (say a
  window against causal) and are joined on the shape (batch, heads, lengths, dims, dtype,
  mode);
* ``kind = "value"``: ``metric`` of ``backend`` on the selected cases;
* ``kind = "exponent"``: the slope of log(time) over log(N) of ``backend`` on the selected
  cases (seq_q = seq_k).

``expected = [low, high]`` is the range the claim asserts, ``[low]`` means "at least". Each
measurement carries its 95% interval (a ratio of records timed in the same interleaved
rounds: from the per-round ratios; otherwise a bootstrap of the ratio of medians), widened
to the across-runs interval (``stats.run_to_run``) so that a rerun of the same code keeps
the verdict: by the record allowance for one record's time or rate, the ratio allowance for
a ratio of two records or a fraction of a ceiling measured in the same run, and for an
exponent the slope's share of the ratio allowance (``run_to_run.slope_allowance``). The
verdict is ``holds`` (the interval inside the range), ``does not hold`` (outside) or
``inconclusive`` (it straddles a bound, or covers less than 95%). The report prints them
side by side; over several runs of one suite, ``pooled_table`` gives each claim one
random-effects estimate with a Hartung-Knapp interval (``stats.pooling``) beside every run's own:
it pools the within-run intervals, since the runs' own scatter is its between-run component
(the allowance on top would count it twice). A verdict needs the interval to be one the
significance rule accepts (``stats.significance``: at least ``MIN_SAMPLES`` samples,
coverage at the level).

A ratio claim of timed medians may declare ``rounds = [8, 16, 24, 32]``: the looks of its
sequential rule (``stats.sequential``). Its pair is timed in rounds until the ratio's
interval at the rule's per-look confidence (Bonferroni over the looks) excludes a bound or
the last look is done, and its verdict here uses that same confidence (its allowance
scaled to it, ``run_to_run.at_level``).
"""

from __future__ import annotations

import math

import pandas as pd

from attnbench.analysis.claim_checks import (  # noqa: F401
    CLAIM_KEYS,
    KINDS,
    MAX_ROUNDS,
    SHAPE,
    WHERE_FIELDS,
    validate_claims,
)
from attnbench.analysis.comparisons import with_problem
from attnbench.core import metrics

# What a [[claim]] table may say is checked at suite load, in claim_checks (no pandas); these
# names are also this module's.
from attnbench.core.record import speed_records
from attnbench.core.where import case_matches, where_mask
from attnbench.stats import intervals, pooling, ratios, run_to_run, sequential, significance
from attnbench.stats.fits import exponent_across_runs, exponent_interval

# a rate over the run's own measured ceiling: both move with the run's state, as a ratio does
CEILING_FRACTIONS = ("frac_matmul", "frac_bandwidth")


def claim_looks(claim: dict) -> sequential.Looks | None:
    """The looks of a claim decided by sequential rounds, or None."""
    return sequential.Looks(tuple(claim["rounds"])) if "rounds" in claim else None


def side_matches(claim: dict, side: str, case, backend: str) -> bool:
    """Whether job (case, backend) is on a ratio claim's ``side`` (numerator/denominator)."""
    if backend != claim.get(side):
        return False
    return case_matches(case, claim.get("where", {}) | claim.get(f"{side}_where", {}))


def _select(df: pd.DataFrame, where: dict, backend: str) -> pd.DataFrame:
    return df[(df["backend"] == backend) & (df["status"] == "ok") & where_mask(df, where)]


def _value_interval(row, metric: str, scale: float) -> intervals.Interval:
    """The record's value with its interval: the median time's, or for a rate (a fixed
    amount over the median time, e.g. frac_matmul) the time's interval carried through the
    inverse; any other metric is a point."""
    samples = ratios.samples(row.get("samples_ms"))
    if metric == "time_ms_median" and samples:
        iv = intervals.median_interval(samples)
        return intervals.Interval(iv.estimate * scale, iv.low * scale, iv.high * scale,
                              iv.confidence, iv.n, iv.method)
    if metrics.get(metric).per_time and samples and pd.notna(row.get(metric)):
        iv = intervals.median_interval(samples)
        value = float(row[metric]) * scale
        return intervals.Interval(value, value * iv.estimate / iv.high,
                                  value * iv.estimate / iv.low, iv.confidence, iv.n, iv.method)
    value = float(row[metric]) * scale
    return intervals.Interval(value, value, value, 1.0, 1, "point")


def measure_claim(df: pd.DataFrame, claim: dict, across: bool = True
                  ) -> tuple[list[intervals.Interval], str]:
    """The measured values of a claim with their intervals (one per matching case, or one
    exponent) and a note: across-runs intervals (the within-run ones widened by the
    between-run allowance), or with ``across`` False the within-run ones (what pooling over
    runs combines)."""
    metric = claim.get("metric", "time_ms_median")
    where = claim.get("where", {})
    if metric == "time_ms_median" or metrics.get(metric).per_time:
        df = speed_records(df)  # a time under an interpreter is not a speed
    kind = claim["kind"]
    level = claim_level(claim)
    if kind == "ratio":
        sided = "numerator_where" in claim or "denominator_where" in claim
        on = SHAPE if sided else ["problem"]
        a = with_problem(_select(df, where | claim.get("numerator_where", {}),
                                 claim["numerator"]))
        b = with_problem(_select(df, where | claim.get("denominator_where", {}),
                                 claim["denominator"]))
        j = ratios.join(a, b, on, [metric] + (["claim_rounds", "claim_stop"]
                                              if "rounds" in claim else []))
        looks = claim_looks(claim)
        measured = [ratios.joined_ratio_interval(r, metric, level) for _, r in j.iterrows()]
        if across and _timed(metric):
            measured = [_across(iv, _device(a), "ratio", level) for iv in measured]
        return measured, f"{len(j)} case(s)" + (_rounds_note(j, looks) if looks else "")
    d = _select(df, where, claim["backend"])
    if kind == "value":
        scale = float(claim.get("scale", 1.0))
        measured = [_value_interval(r, metric, scale) for _, r in d.iterrows()]
        if across and _timed(metric):
            what = "ratio" if metric in CEILING_FRACTIONS else "record"
            measured = [_across(iv, _device(d), what, level) for iv in measured]
        return measured, f"{len(d)} case(s)"
    d = d[d["seq_q"] == d["seq_k"]]
    iv = exponent_interval(d)
    if iv is None:
        return [], f"needs >= 3 sizes, found {d['seq_q'].nunique()}"
    if across:
        iv = exponent_across_runs(iv, d["seq_q"], _device(d))
    return [iv], f"N = {d['seq_q'].min()}..{d['seq_q'].max()}"


def _timed(metric: str) -> bool:
    """Whether a metric is a time or a rate over one: what a rerun moves."""
    return metric == "time_ms_median" or metrics.get(metric).per_time


def _device(d: pd.DataFrame):
    """The device the selected records ran on (None: not recorded, a CPU run)."""
    if "device" not in d.columns or not d["device"].notna().any():
        return None
    return d["device"].dropna().iloc[0]


def _across(iv: intervals.Interval, device, what: str, level: float) -> intervals.Interval:
    """A claim's within-run interval widened by ``what``'s allowance at the claim's level;
    a point (no samples) stays one: it has no interval to carry the allowance."""
    if iv.method == "point":
        return iv
    return run_to_run.widen(iv, run_to_run.at_level(run_to_run.allowance(device, what), level))


def _rounds_note(j: pd.DataFrame, looks: sequential.Looks) -> str:
    """'; sequential: 98.75% intervals (4 looks), 8 rounds (decided)'."""
    said = []
    for _, r in j.iterrows():
        n, stop = r.get("claim_rounds_a"), r.get("claim_stop_a")
        said.append(f"{int(n)} rounds ({stop})" if isinstance(stop, str) and pd.notna(n)
                    else "rounds not sequential")
    return (f"; sequential: {looks.per_look_confidence * 100:.4g}% intervals "
            f"({len(looks.rounds)} looks), {', '.join(said)}")


def verdict(measured: list[intervals.Interval], expected,
            level: float = intervals.LEVEL) -> str:
    """holds / does not hold / inconclusive (an interval straddles a bound, or covers less
    than ``level``), over cases."""
    if not measured:
        return "not measured"
    if not expected:
        return "recorded"
    low = expected[0]
    high = expected[1] if len(expected) > 1 else None
    each = {significance.interval_verdict(iv, low, high, level) for iv in measured}
    if len(each) == 1:
        return each.pop()
    if each == {"holds", "does not hold"}:
        return "holds for some cases"
    return "inconclusive"


def _fmt(iv: intervals.Interval) -> str:
    if iv.low == iv.high:
        return f"{iv.estimate:.3g}"
    note = intervals.coverage_note(iv.confidence)
    conf = f", {note}" if note else ""
    paired = " paired" if iv.method.startswith("paired") else ""
    return f"{iv.estimate:.3g} [{iv.low:.3g}, {iv.high:.3g}{conf}{paired}]"


# the column of the measured values (across-runs intervals: the report's legend says so)
MEASURED = "measured (95% interval)"


def claims_table(df: pd.DataFrame, claims: list[dict], across: bool = True) -> pd.DataFrame:
    """One row per claim of one run: its across-runs intervals (``across`` False: the
    within-run ones) and the verdict on them."""
    rows = []
    for c in claims:
        intervals, note = measure_claim(df, c, across)
        exp = c.get("expected")
        exp_text = "" if not exp else (f"{exp[0]:g}..{exp[1]:g}" if len(exp) > 1
                                       else f">= {exp[0]:g}")
        unit = c.get("unit", "")
        measured = ", ".join(_fmt(iv) for iv in intervals) if intervals else "-"
        rows.append({"claim": c["text"], "source": c.get("source", ""),
                     "expected": f"{exp_text} {unit}".strip(),
                     MEASURED: f"{measured} {unit}".strip() + f" ({note})",
                     "verdict": verdict(intervals, exp, claim_level(c))})
    return pd.DataFrame(rows)


def claim_level(claim: dict) -> float:
    """The confidence a claim's verdict needs: its sequential rule's per-look level."""
    looks = claim_looks(claim)
    return looks.per_look_confidence if looks else intervals.LEVEL


def pooled_table(runs: list[tuple[str, pd.DataFrame, list[dict]]]) -> pd.DataFrame:
    """Claims measured in two or more of ``runs`` (label, records, claims), one row each:
    every run's own interval, the random-effects pooled one (``stats.pooling``: the spread
    between runs included, a t quantile on runs - 1 df) and the verdict on the pooled
    interval. A claim is matched across runs by its text; its cases by their order (runs
    of one suite select the same cases)."""
    by_text: dict[str, list[tuple[str, list[intervals.Interval]]]] = {}
    claim_of: dict[str, dict] = {}
    for label, df, claims in runs:
        for c in claims:
            measured, _ = measure_claim(df.assign(run_id=label), c, across=False)
            if measured:
                by_text.setdefault(c["text"], []).append((label, measured))
                claim_of.setdefault(c["text"], c)
    rows = []
    for text, per_run in by_text.items():
        if len(per_run) < 2:
            continue
        c = claim_of[text]
        unit = c.get("unit", "")
        row = {"claim": text}
        for label, measured in per_run:
            row[label] = ", ".join(_fmt(iv) for iv in measured)
        counts = {len(m) for _, m in per_run}
        if len(counts) != 1:
            rows.append(row | {"pooled (95% interval)": "cases differ between runs",
                               "between-run sd": "-", "verdict": "not pooled"})
            continue
        pooled = [pooling.random_effects([m[i] for _, m in per_run])
                  for i in range(counts.pop())]
        if any(p is None for p in pooled):
            rows.append(row | {"pooled (95% interval)": "a run has no interval",
                               "between-run sd": "-", "verdict": "not pooled"})
            continue
        row["pooled (95% interval)"] = (", ".join(_fmt(p.interval) for p in pooled) + f" {unit}"
                                        ).strip() + f" ({pooling.describe(len(per_run))})"
        row["between-run sd"] = ", ".join(f"{math.expm1(p.tau):.0%}" for p in pooled)
        row["verdict"] = verdict([p.interval for p in pooled], c.get("expected"))
        rows.append(row)
    return pd.DataFrame(rows)
