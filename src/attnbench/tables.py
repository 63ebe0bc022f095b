"""Pivot tables of records: backend x sequence length, with statuses where no time exists."""

from __future__ import annotations

import pandas as pd

STATUS_SHORT = {"unavailable": "n/a", "unsupported": "unsup", "skipped": "skip"}
LINE_COLUMNS = ["dtype", "mask", "mode", "backend"]


def seq_label(row) -> str:
    return str(row["seq_q"]) if row["seq_q"] == row["seq_k"] else f"{row['seq_q']}/{row['seq_k']}"


def _cell(row, value_col: str, fmt: str) -> str:
    if row["status"] == "ok" and pd.notna(row.get(value_col)):
        return format(row[value_col], fmt)
    if row["status"] == "wrong" and pd.notna(row.get(value_col)):
        return format(row[value_col], fmt) + " WRONG"
    return STATUS_SHORT.get(row["status"], row["status"])


def pivot(df: pd.DataFrame, value_col: str = "time_ms_median", fmt: str = ".3g",
          lines: list[str] | None = None) -> pd.DataFrame:
    """One row per (dtype, mask, mode, backend, ...), one column per sequence length."""
    if df.empty:
        return pd.DataFrame()
    lines = [c for c in (lines or LINE_COLUMNS) if c in df.columns]
    varying = [c for c in ("batch", "heads_q", "heads_kv", "head_dim") if c in df.columns
               and df[c].nunique() > 1]
    lines = varying + lines
    d = df.copy()
    d["N"] = d.apply(seq_label, axis=1)
    d["cell"] = d.apply(lambda r: _cell(r, value_col, fmt), axis=1)
    order = (d.drop_duplicates("N").sort_values(["seq_q", "seq_k"])["N"].tolist())
    table = d.pivot_table(index=lines, columns="N", values="cell", aggfunc="first")
    return table.reindex(columns=order).fillna("")


def to_text(table: pd.DataFrame) -> str:
    if table.empty:
        return "(no records)"
    return table.to_string()


def to_markdown(table: pd.DataFrame) -> str:
    if table.empty:
        return "_no records_\n"
    index_names = list(table.index.names)
    header = "| " + " | ".join(index_names + [str(c) for c in table.columns]) + " |"
    sep = "|" + "---|" * (len(index_names) + len(table.columns))
    rows = []
    for idx, row in table.iterrows():
        idx = idx if isinstance(idx, tuple) else (idx,)
        rows.append("| " + " | ".join([str(i) for i in idx] + [str(v) for v in row]) + " |")
    return "\n".join([header, sep, *rows]) + "\n"


def status_counts(df: pd.DataFrame) -> str:
    counts = df["status"].value_counts()
    return ", ".join(f"{n} {s}" for s, n in counts.items())
