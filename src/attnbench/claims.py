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

``expected = [low, high]`` is the range the claim asserts, ``[low]`` means "at least".
The report prints claim, expectation, measurement and verdict side by side.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from .errors import BadInput

CLAIM_KEYS = ("text", "source", "kind", "metric", "backend", "numerator", "denominator",
              "where", "numerator_where", "denominator_where", "expected", "scale", "unit")
# A ratio whose two sides select different cases (e.g. a window against causal) joins on shape.
SHAPE = ["batch", "heads_q", "heads_kv", "seq_q", "seq_k", "head_dim", "head_dim_v", "dtype",
         "mode"]
KINDS = ("ratio", "value", "exponent")


def validate_claims(raw, path) -> list[dict]:
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise BadInput(f"{path}: claim = {raw!r}: must be a list of [[claim]] tables")
    out = []
    for i, c in enumerate(raw):
        where = f"claim[{i}]"
        if not isinstance(c, dict):
            raise BadInput(f"{path}: {where} = {c!r}: must be a table")
        for k in c:
            if k not in CLAIM_KEYS:
                raise BadInput(f"{path}: {where}.{k} = {c[k]!r}: unknown key; allowed: "
                               f"{', '.join(CLAIM_KEYS)}")
        kind = c.get("kind")
        if kind not in KINDS:
            raise BadInput(f"{path}: {where}.kind = {kind!r}: allowed: {', '.join(KINDS)}")
        need = {"ratio": ("numerator", "denominator"), "value": ("backend",),
                "exponent": ("backend",)}[kind]
        for k in ("text",) + need:
            if not isinstance(c.get(k), str):
                raise BadInput(f"{path}: {where}.{k} = {c.get(k)!r}: must be a string")
        exp = c.get("expected")
        if exp is not None and not (isinstance(exp, list) and 1 <= len(exp) <= 2 and all(
                isinstance(x, (int, float)) for x in exp)):
            raise BadInput(f"{path}: {where}.expected = {exp!r}: give [low, high] or [low]")
        for k in ("where", "numerator_where", "denominator_where"):
            if not isinstance(c.get(k, {}), dict):
                raise BadInput(f"{path}: {where}.{k} = {c[k]!r}: must be a table")
        out.append(dict(c))
    return out


def _select(df: pd.DataFrame, where: dict, backend: str) -> pd.DataFrame:
    d = df[(df["backend"] == backend) & (df["status"] == "ok")]
    for k, v in where.items():
        col = "seq_q" if k == "seq_len" else k
        values = v if isinstance(v, list) else [v]
        d = d[d[col].isin(values)]
        if k == "seq_len":
            d = d[d["seq_k"].isin(values)]
    return d


def measure_claim(df: pd.DataFrame, claim: dict) -> tuple[list[float], str]:
    """The measured values of a claim (one per matching case, or one exponent) and a note."""
    metric = claim.get("metric", "time_ms_median")
    where = claim.get("where", {})
    kind = claim["kind"]
    if kind == "ratio":
        sided = "numerator_where" in claim or "denominator_where" in claim
        on = SHAPE if sided else ["key"]
        a = _select(df, where | claim.get("numerator_where", {}), claim["numerator"])
        b = _select(df, where | claim.get("denominator_where", {}), claim["denominator"])
        j = a[on + [metric]].merge(b[on + [metric]], on=on, suffixes=("_a", "_b"))
        return [float(x) for x in j[f"{metric}_a"] / j[f"{metric}_b"]], f"{len(j)} case(s)"
    d = _select(df, where, claim["backend"])
    if kind == "value":
        return [float(x) * float(claim.get("scale", 1.0)) for x in d[metric]], \
            f"{len(d)} case(s)"
    d = d[d["seq_q"] == d["seq_k"]].groupby("seq_q")["time_ms_median"].median()
    if len(d) < 3:
        return [], f"needs >= 3 sizes, found {len(d)}"
    slope = float(np.polyfit(np.log(d.index.values.astype(float)), np.log(d.values), 1)[0])
    return [slope], f"N = {d.index.min()}..{d.index.max()}"


def verdict(values: list[float], expected) -> str:
    if not values:
        return "not measured"
    if not expected:
        return "recorded"
    low = expected[0]
    high = expected[1] if len(expected) > 1 else math.inf
    inside = [low <= v <= high for v in values]
    if all(inside):
        return "holds"
    return "does not hold" if not any(inside) else "holds for some cases"


def claims_table(df: pd.DataFrame, claims: list[dict]) -> pd.DataFrame:
    rows = []
    for c in claims:
        values, note = measure_claim(df, c)
        exp = c.get("expected")
        exp_text = "" if not exp else (f"{exp[0]:g}..{exp[1]:g}" if len(exp) > 1
                                       else f">= {exp[0]:g}")
        unit = c.get("unit", "")
        measured = ", ".join(f"{v:.3g}" for v in values) if values else "-"
        rows.append({"claim": c["text"], "source": c.get("source", ""),
                     "expected": f"{exp_text} {unit}".strip(),
                     "measured": f"{measured} {unit}".strip() + f" ({note})",
                     "verdict": verdict(values, exp)})
    return pd.DataFrame(rows)
