"""Selecting records with a ``where`` table, as claims and comparisons declare them.

``where`` maps case fields to a value or a list of values; ``seq_len`` selects both lengths.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # a suite's claims are checked at load, without pandas
    import pandas as pd


def values(v) -> list:
    return v if isinstance(v, list) else [v]


def case_matches(case, where: dict) -> bool:
    """The same selection for one Case (before it has a record): every entry must match."""
    for k, v in where.items():
        lengths = (case.seq_q, case.seq_k) if k == "seq_len" else (case.column(k),)
        if any(x not in values(v) for x in lengths):
            return False
    return True


def where_mask(df: pd.DataFrame, where: dict) -> pd.Series:
    """True for the records that match every entry of ``where``."""
    import pandas as pd

    keep = pd.Series(True, index=df.index)
    for k, v in where.items():
        cols = ("seq_q", "seq_k") if k == "seq_len" else (k,)
        for col in cols:
            keep &= df[col].isin(values(v)) if col in df.columns else False
    return keep
