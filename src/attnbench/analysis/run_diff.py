"""Compare two runs record by record: joined on (key, backend), new / base of a metric.

The metric's declaration says which direction is worse. With raw samples on both sides (the
time metrics), a change is decided statistically: ``worse`` / ``better`` only when a
Mann-Whitney U test says the samples differ (p < alpha) *and* the ratio of medians is
beyond the threshold; otherwise ``unchanged``. Without samples (memory, TFLOP/s), the
threshold alone decides. A record that was ``ok`` and is not ``ok`` now is a regression.
Records whose backend code changed between the runs (``backend_hash``) are marked.
"""

from __future__ import annotations

import pandas as pd

from attnbench.core import metrics
from attnbench.stats import intervals

SAMPLED = {"time_ms_median"}  # metrics whose raw samples records keep (samples_ms)


def join_runs(base: pd.DataFrame, new: pd.DataFrame, metric: str) -> pd.DataFrame:
    cols = ["key", "backend", "status", metric, "samples_ms", "backend_hash", "env_id"]
    b = base[[c for c in cols if c in base.columns]]
    n = new[[c for c in cols if c in new.columns]]
    j = b.merge(n, on=["key", "backend"], how="outer", suffixes=("_base", "_new"))
    j["ratio"] = j[f"{metric}_new"] / j[f"{metric}_base"]
    return j


def _samples(value) -> list[float]:
    return list(value) if isinstance(value, (list, tuple)) else []


def decide(joined: pd.DataFrame, metric: str, threshold: float, alpha: float = 0.05
           ) -> pd.DataFrame:
    """Adds ``change`` (worse/better/unchanged/broke/fixed/-), ``p_value`` and the ratio's
    interval, and ``code_changed`` where the backend's code hash differs."""
    m = metrics.get(metric)
    rows = []
    for _, r in joined.iterrows():
        out = {"change": "-", "p_value": None, "ratio_low": None, "ratio_high": None}
        sb, sn = r.get("status_base"), r.get("status_new")
        if sb == "ok" and isinstance(sn, str) and sn != "ok":
            out["change"] = "broke"
        elif sn == "ok" and isinstance(sb, str) and sb != "ok":
            out["change"] = "fixed"
        elif sb == "ok" and sn == "ok" and pd.notna(r.get("ratio")):
            a, b = _samples(r.get("samples_ms_base")), _samples(r.get("samples_ms_new"))
            if metric in SAMPLED and len(a) >= 2 and len(b) >= 2:
                verdict, iv, p = intervals.compare_samples(a, b, threshold,
                                                       m.better == metrics.LOWER, alpha)
                out.update(change=verdict, p_value=p, ratio_low=iv.low, ratio_high=iv.high)
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


def environment_difference(base_meta: dict, new_meta: dict) -> list[str]:
    """The environment fields that differ between two runs, as 'field: a -> b'."""
    a, b = base_meta.get("environment", {}), new_meta.get("environment", {})
    skip = {"hostname"}
    return [f"{k}: {a.get(k)} -> {b.get(k)}" for k in sorted(set(a) | set(b))
            if k not in skip and a.get(k) != b.get(k)]
