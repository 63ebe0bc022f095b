"""Compare two runs record by record: joined on (key, backend), ratio of a metric.

A regression is a slower time (or larger memory) beyond the threshold, or a record that
was ``ok`` in the base run and is not ``ok`` now.
"""

from __future__ import annotations

import pandas as pd

LOWER_IS_BETTER = {"time_ms_median", "time_ms_min", "peak_mem_bytes"}


def join_runs(base: pd.DataFrame, new: pd.DataFrame, metric: str) -> pd.DataFrame:
    cols = ["key", "backend", "status", metric]
    b = base[[c for c in cols if c in base.columns]]
    n = new[[c for c in cols if c in new.columns]]
    j = b.merge(n, on=["key", "backend"], how="outer", suffixes=("_base", "_new"))
    j["ratio"] = j[f"{metric}_new"] / j[f"{metric}_base"]
    return j


def regressions(joined: pd.DataFrame, metric: str, threshold: float) -> pd.DataFrame:
    both_ok = (joined["status_base"] == "ok") & (joined["status_new"] == "ok")
    if metric in LOWER_IS_BETTER:
        worse = joined["ratio"] > 1 + threshold
    else:
        worse = joined["ratio"] < 1 - threshold
    broke = (joined["status_base"] == "ok") & joined["status_new"].notna() & (
        joined["status_new"] != "ok")
    return joined[(both_ok & worse) | broke]
