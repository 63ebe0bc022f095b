"""Records grouped into lines, as ``tables.line_columns`` defines them, and the lines' names.

A line's name shows the backend and every other line column whose value varies among the
records shown (``feature_map=elu linear``) and, for a case knob, that some record's backend
reads (``Backend.reads_knob``: sdpa's line is not named by linear's ``feature_map``) unless
the lines could not be told apart without it; the run appears as its label (device or
commit).
"""

from __future__ import annotations

import pandas as pd

from attnbench.core.case import Case

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
    """The line columns a name needs here: the backend, and those that vary (a knob: only
    where a backend of these records reads it, unless needed to tell lines apart)."""
    varying = [c for c in names if c in df.columns
               and (c == "backend" or df[c].astype(str).nunique() > 1)]
    knobs = set(Case.knob_fields())
    read = [c for c in varying if c not in knobs or _read_here(df, c)]
    lines = [line for line, _ in groups(df, names)]
    return read if len({label(line, read) for line in lines}) == len(lines) else varying


def _read_here(df: pd.DataFrame, knob: str) -> bool:
    """Whether a backend of these records reads ``knob`` on its cases (unknown backends:
    assumed to, so nothing is hidden that might matter)."""
    from attnbench.core.registry import all_backends
    known = all_backends()
    if "backend" not in df.columns:
        return True
    masks = df["mask"] if "mask" in df.columns else pd.Series("", index=df.index)
    return any(reads(known, backend, knob, mask)
               for backend, mask in set(zip(df["backend"].astype(str), masks.astype(str))))


def reads(known: dict, backend: str, knob: str, mask: str) -> bool:
    """Whether ``backend`` (one of ``known``, the registry) reads ``knob`` on a case with
    ``mask``; an unknown backend is assumed to, so nothing is hidden that might matter."""
    b = known.get(backend)
    return b is None or b.reads_knob(knob, mask)


def label(line: dict, columns: list[str]) -> str:
    return " ".join(str(line[c]) if c in PLAIN else f"{c}={line[c]}" for c in columns)
