"""Records grouped into lines, as ``tables.line_columns`` defines them, and the lines' names.

A line's name shows the backend and every other line column whose value varies among the
records shown (``feature_map=elu linear``); the run appears as its label (device or commit).
"""

from __future__ import annotations

import pandas as pd

PLAIN = ("backend", "run_id")  # shown as their value, the rest as column=value


def groups(df: pd.DataFrame, names: list[str]) -> list[tuple[dict, pd.DataFrame]]:
    """(line, its records sorted by N) in order of first appearance; missing values (a
    scale of None) form a line of their own instead of being dropped."""
    names = [c for c in names if c in df.columns]
    if df.empty or not names:
        return []
    d = df.copy()
    for c in names:
        d[c] = d[c].astype(object).where(d[c].notna(), "-")
    out = []
    for key, g in d.groupby(names, sort=False, dropna=False):
        key = key if isinstance(key, tuple) else (key,)
        out.append((dict(zip(names, key)), df.loc[g.index].sort_values(["seq_q", "seq_k"])))
    return out


def shown(df: pd.DataFrame, names: list[str]) -> list[str]:
    """The line columns a name needs here: the backend, and those that vary."""
    return [c for c in names if c in df.columns
            and (c == "backend" or df[c].astype(str).nunique() > 1)]


def label(line: dict, columns: list[str]) -> str:
    return " ".join(str(line[c]) if c in PLAIN else f"{c}={line[c]}" for c in columns)
