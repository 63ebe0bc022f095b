"""What a reader asks first, one line per comparison: which backend is fastest and by how
much, where it crosses over the baseline, and how accurate it is; and the one short line the
index shows for a run."""

from __future__ import annotations

import pandas as pd

from attnbench.analysis.comparisons import Comparison
from attnbench.core import accuracy
from attnbench.reporting import findings, tables
from attnbench.reporting.plots import n_label

INDEX_WIDTH = 120  # characters of a headline in the index


CROSSOVER_FIELDS = ("backend", "crossover N", "between", "what happens",
                    "both sides significant")


def crossover_text(sp: pd.DataFrame, lines: list[str], baseline: str) -> str:
    """'fast overtakes base near N = 1448 (between 1K and 2K; float32 fwd)', joined by '; ',
    or '': only crossings significant on both sides, each named by its line."""
    cross = findings.crossovers(sp, lines, baseline)
    if cross.empty:
        return ""
    found = cross[(cross["crossover N"] != findings.DASH)
                  & (cross["both sides significant"] == "yes")]
    said = []
    for _, r in found.iterrows():
        line = " ".join(str(r[c]) for c in cross.columns
                        if c not in CROSSOVER_FIELDS and pd.notna(r[c]))
        where = f"between {r['between']}" + (f"; {line}" if line else "")
        said.append(f"{r['backend']} {r['what happens']} near N = "
                    f"{r['crossover N'].lstrip('~')} ({where})")
    return "; ".join(dict.fromkeys(said))


def accuracy_text(recs: pd.DataFrame) -> str:
    """The largest error of the exact backends against their tolerance, and each approximate
    backend's error against exact softmax (median over its ok records)."""
    ok = recs[recs["status"] == "ok"] if "status" in recs else recs.iloc[0:0]
    said = []
    col = "err_impl_out_rel"
    if col in ok and ok[col].notna().any():
        exact = ok[ok.get("semantics", pd.Series("exact", index=ok.index)) != "approximate"]
        exact = exact[exact[col].notna()]
        if not exact.empty:
            worst = exact.loc[exact[col].astype(float).idxmax()]
            tol = accuracy.tolerance(str(worst["dtype"]), "out")
            said.append(f"exact backends within {float(worst[col]):.1e} of float64 "
                        f"(tolerance {tol:.0e})")
    wrong = int((recs["status"] == "wrong").sum()) if "status" in recs else 0
    if wrong:
        said.append(f"{wrong} record(s) above the tolerance")
    col = "err_vs_softmax_out_rel"
    if col in ok and "semantics" in ok:
        approx = ok[(ok["semantics"] == "approximate") & ok[col].notna()]
        for backend, g in approx.groupby("backend", sort=True):
            said.append(f"{backend} {float(g[col].median()):.2g} from exact softmax")
    return "accuracy: " + ", ".join(said) if said else ""


def dense_layout_text(df: pd.DataFrame) -> str:
    """Block layouts that cover every tile compute dense attention: say where, since their
    records then read as exact, not as an approximation."""
    if "layout_density" not in df.columns:
        return ""
    dense = df[pd.to_numeric(df["layout_density"], errors="coerce") >= 1.0]
    if dense.empty:
        return ""
    said = []
    for backend, g in dense.groupby("backend", sort=True):
        sizes = ", ".join(n_label(int(n)) for n in sorted(set(g["seq_q"].astype(int))))
        said.append(f"{backend} at N = {sizes}")
    return ("dense here (exact): " + "; ".join(said)
            + ": the block layout covers every tile at these sizes")


def comparison_answer(c: Comparison, recs: pd.DataFrame, sp: pd.DataFrame) -> str | None:
    """The comparison's answer line: the fastest at the largest size, the crossovers, the
    accuracy."""
    head = findings.comparison_headline(c, sp)
    if not head:
        return None
    parts = [head]
    if c.baseline and not sp.empty:
        cross = crossover_text(sp, tables.line_columns(recs), c.baseline)
        if cross:
            parts.append("crosses over: " + cross)
    acc = accuracy_text(recs)
    if acc:
        parts.append(acc)
    return "; ".join(parts)


def short_headline(planned: list, verdicts: str | None) -> str:
    """At most INDEX_WIDTH characters: the first comparison's fastest backend and factor at
    its largest size, and the goals' verdicts."""
    parts = []
    for c, _, sp in planned:
        pick = findings.headline_pick(sp)
        if pick is None:
            continue
        backend, x, significant, best = pick
        n = n_label(int(best["seq_q"]))
        if not significant:
            parts.append(f"{backend} and {c.baseline} not told apart at N={n} ({x:.3g}x)")
        elif x >= 1:
            parts.append(f"{backend} {x:.3g}x faster than {c.baseline} at N={n}")
        else:
            parts.append(f"{c.baseline} fastest at N={n} ({backend} {x:.3g}x)")
        break
    if verdicts:
        parts.append(verdicts)
    return clip("; ".join(parts) or "-")


def clip(text: str, width: int = INDEX_WIDTH) -> str:
    return text if len(text) <= width else text[:width - 1].rstrip(" ;,") + "…"
