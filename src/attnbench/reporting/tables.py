"""Pivot tables of records: one row per line, one column per sequence length.

"The same line" has one definition, ``line_columns``: dtype, mask, mode and backend, plus
every other case field (and the run, when several are shown) that varies among the
records. Two records never share a cell silently: knob sweeps (linear's feature_map elu vs
favor, a scale sweep) get a row each; a backend parameter's cell is blank on the rows of
backends that do not read it. Values are formatted by their metric's declaration;
a time shows its 95% interval's half-width, or "too noisy to say".
"""

from __future__ import annotations

import pandas as pd

from attnbench.core import knobs, metrics
from attnbench.core.record import CASE_COLUMNS
from attnbench.reporting.interval_text import half_width_text
from attnbench.stats.intervals import coverage_note

STATUS_SHORT = {"unavailable": "n/a", "unsupported": "unsup", "skipped": "skip"}
ALWAYS = ["dtype", "mask", "mode", "backend"]
SIZE_COLUMNS = ("seq_q", "seq_k")  # the table's columns, never part of a line
NOT_LINES = ("device", "block_pairs")  # device: one per run; block_pairs: lists
CLOCKS = ("gpu_sm_mhz", "cpu_mhz_begin")  # a record's device clock: GPU SM first, else CPU


def line_columns(df: pd.DataFrame) -> list[str]:
    """The columns that identify a table row (a line over N) in these records.

    A column that the lengths determine (a suite's ``batch = "16384 // seq_len"``: one value
    per N) moves along the line with N rather than starting a line per value
    (``moving_with_n`` lists them, for the captions)."""
    varying = [c for c in _case_columns(df) if df[c].astype(str).nunique(dropna=False) > 1]
    moving = set(moving_with_n(df))
    return [c for c in varying if c not in moving] + [c for c in ALWAYS if c in df.columns]


def moving_with_n(df: pd.DataFrame) -> dict[str, dict[str, str]]:
    """Case columns that vary but hold one value per sequence length: column -> {N label:
    value}. They are not lines; a table says them in its caption, since its rows cannot."""
    sizes = [c for c in SIZE_COLUMNS if c in df.columns]
    if not sizes or df.empty:
        return {}
    out = {}
    for c in _case_columns(df):
        if c == "run_id":  # two runs at different lengths are two lines, never one
            continue
        values = df[c].astype(str)
        if values.nunique(dropna=False) > 1 and \
                values.groupby([df[s] for s in sizes]).nunique().max() == 1:
            firsts = df.assign(_v=values).drop_duplicates(sizes).sort_values(sizes)
            out[c] = {seq_label(r): r["_v"] for _, r in firsts.iterrows()}
    return out


def moving_caption(df: pd.DataFrame) -> str:
    """'Moving with N, not a row of its own: batch (1024: 16, 2048: 8).', or ''."""
    moving = moving_with_n(df)
    if not moving:
        return ""
    return "Moving with N, not a row of its own: " + "; ".join(
        f"{c} (" + ", ".join(f"{n}: {v}" for n, v in by_n.items()) + ")"
        for c, by_n in moving.items()) + "."


def _case_columns(df: pd.DataFrame) -> list[str]:
    return [c for c in ["run_id", *CASE_COLUMNS] if c in df.columns and c not in ALWAYS
            and c not in SIZE_COLUMNS and c not in NOT_LINES]


def seq_label(row) -> str:
    return str(row["seq_q"]) if row["seq_q"] == row["seq_k"] else f"{row['seq_q']}/{row['seq_k']}"


def _format(row, value_col: str) -> str:
    value = row.get(value_col)
    try:
        text = metrics.get(value_col).format(value)
    except KeyError:  # a derived or informational column (e.g. kernel)
        text = "" if value is None or (isinstance(value, float) and pd.isna(value)) \
            else (f"{value:.3g}" if isinstance(value, float) else str(value))
    if value_col == "time_ms_median" and text and pd.notna(row.get("time_ms_ci_high")):
        text += half_width_text(value, row["time_ms_ci_low"], row["time_ms_ci_high"])
        conf = row.get("time_ci_confidence")
        note = coverage_note(float(conf)) if conf is not None and pd.notna(conf) else ""
        text += f" ({note})" if note else ""
    return text


def _cell(row, value_col: str) -> str:
    text = _format(row, value_col) if pd.notna(row.get(value_col)) else ""
    if row["status"] == "ok" and text:
        return text + (" ~" if row.get("noisy") is True else "")
    if row["status"] == "wrong" and text:
        return text + " WRONG"
    return STATUS_SHORT.get(row["status"], row["status"])


def clock_column(df: pd.DataFrame) -> str | None:
    """The clock these records carry (GPU SM clock first, else CPU frequency), or None."""
    return next((c for c in CLOCKS if c in df.columns
                 and pd.to_numeric(df[c], errors="coerce").notna().any()), None)


def _clock(row, column: str | None) -> str:
    value = pd.to_numeric(row.get(column), errors="coerce") if column else None
    if value is None or pd.isna(value) or row["status"] not in ("ok", "wrong"):
        return ""
    return f" at {value:.0f} MHz"


def pivot(df: pd.DataFrame, value_col: str = "time_ms_median",
          lines: list[str] | None = None, clock: str | None = None) -> pd.DataFrame:
    """One row per line (``line_columns``), one column per sequence length; with ``clock``
    (a column of ``CLOCKS``), each measured cell says the clock it was measured at."""
    if df.empty:
        return pd.DataFrame()
    lines = [c for c in (lines or line_columns(df)) if c in df.columns]
    d = df.copy()
    for c in lines:  # NaN (e.g. scale=None) would drop the row from a pivot
        d[c] = d[c].astype(object).where(d[c].notna(), "-")
    d["N"] = d.apply(seq_label, axis=1)
    _blank_unread_params(d, lines)
    d["cell"] = d.apply(lambda r: _cell(r, value_col) + _clock(r, clock), axis=1)
    order = (d.drop_duplicates("N").sort_values(["seq_q", "seq_k"])["N"].tolist())
    table = d.pivot_table(index=lines, columns="N", values="cell",
                          aggfunc=lambda cells: " | ".join(cells))  # never drop a record
    return table.reindex(columns=order).fillna("")


def _blank_unread_params(d: pd.DataFrame, lines: list[str]) -> None:
    """Blank, in place, a backend parameter's cell on the rows of backends that do not read
    it (sdpa's row shows no ``block_band``), except where that would put two records with
    different values in one cell."""
    if "backend" not in d.columns:
        return
    from attnbench.core.registry import all_backends
    from attnbench.reporting.lines import reads
    known = all_backends()
    masks = d["mask"].astype(str) if "mask" in d.columns else pd.Series("", index=d.index)
    for c in [c for c in lines if c in knobs.BUILT_IN]:
        unread = pd.Series([not reads(known, b, c, m)
                            for b, m in zip(d["backend"].astype(str), masks)], index=d.index)
        if not unread.any():
            continue
        blanked = d[c].where(~unread, "")
        rest = [x for x in lines if x != c] + ["N"]
        clash = d.assign(_blank=blanked).groupby([*rest, "_blank"])[c].transform(
            lambda values: values.astype(str).nunique() > 1)
        d[c] = d[c].where(~(unread & ~clash), "")


def folded(rates: pd.DataFrame, shares: pd.DataFrame) -> pd.DataFrame:
    """Each cell of ``rates`` with the same cell of ``shares`` in brackets, where both hold
    a value (a status or an empty cell stays as it was)."""
    shares = shares.reindex(index=rates.index, columns=rates.columns).fillna("")

    def one(rate: str, share: str) -> str:
        share = share.removesuffix(" ~")  # the rate already says noisy
        return f"{rate} ({share})" if rate and share and rate != share else rate

    return pd.DataFrame([[one(a, b) for a, b in zip(ra, sh)]
                         for ra, sh in zip(rates.itertuples(index=False),
                                           shares.itertuples(index=False))],
                        index=rates.index, columns=rates.columns)


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
