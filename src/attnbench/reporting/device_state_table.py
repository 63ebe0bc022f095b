"""The device's state in the report's environment table: one row for the clocks, power and
temperature the records were measured at, one for what could not be read, and the count
of records measured throttled (measure/device_state.py)."""

from __future__ import annotations

import pandas as pd

from attnbench.core.record import is_throttled
from attnbench.runs.dataset import Run

DASH = "-"


def _median(df: pd.DataFrame, column: str) -> float | None:
    if column not in df.columns or not df[column].notna().any():
        return None
    return float(pd.to_numeric(df[column], errors="coerce").dropna().median())


def _range(df: pd.DataFrame, low: str, high: str) -> str:
    a, b = _median(df, low), _median(df, high)
    if a is None or b is None:
        return ""
    lo = float(pd.to_numeric(df[low], errors="coerce").min())
    hi = float(pd.to_numeric(df[high], errors="coerce").max())
    return f" ({lo:.0f}-{hi:.0f})" if hi > lo else ""


def state(run: Run) -> str:
    """What the records say about the device while they were measured (medians over the
    records), else the state at the run's start."""
    df = run.records
    parts = []
    sm = _median(df, "gpu_sm_mhz")
    if sm is not None:
        parts.append(f"SM {sm:.0f} MHz{_range(df, 'gpu_sm_mhz_min', 'gpu_sm_mhz_max')}")
    for column, fmt in (("gpu_mem_mhz", "memory {:.0f} MHz"), ("gpu_temp_c", "{:.0f} C"),
                        ("cpu_mhz_begin", "CPU {:.0f} MHz"), ("power_w", "{:.3g} W")):
        value = _median(df, column)
        if value is not None:
            parts.append(fmt.format(value))
    limit = _median(df, "gpu_power_limit_w")
    if limit is not None:
        parts.append(f"limit {limit:.0f} W")
    if parts:
        return ", ".join(parts) + " (medians over records)"
    start = ((run.env.get("device_state") or {}).get("at_start") or {})
    if start.get("cpu_mhz"):
        return f"CPU {start['cpu_mhz']:.0f} MHz at the start ({start.get('cpu_mhz_source')})"
    if start.get("gpu_sm_mhz"):
        return f"SM {start['gpu_sm_mhz']:.0f} MHz at the start"
    return DASH


def not_readable(run: Run) -> str:
    why = (run.env.get("device_state") or {}).get("not_readable") or {}
    return "; ".join(f"{k}: {v}" for k, v in sorted(why.items())) or DASH


def throttled(run: Run) -> str:
    df = run.records
    if "throttled" not in df.columns or not df["throttled"].notna().any():
        return DASH
    known = df["throttled"].notna()
    return f"{int(df['throttled'].map(is_throttled).sum())} of {int(known.sum())} records"


def extend(table: pd.DataFrame, runs: list[Run]) -> pd.DataFrame:
    """The environment table with the device-state rows added (only where a run has any)."""
    rows = {"device state": state, "not readable": not_readable, "measured throttled": throttled}
    added = pd.DataFrame({r.label: {k: f(r) for k, f in rows.items()} for r in runs})
    added = added.loc[~(added == DASH).all(axis=1)]
    added.index.name = table.index.name
    return pd.concat([table, added[table.columns]]) if not added.empty else table
