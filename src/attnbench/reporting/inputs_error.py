"""The report's section on inputs: each approximate backend's error on captured activations
beside its error on random ones (and on each synthetic distribution), the exact backends'
low-precision error per inputs, and the inputs' measured properties that explain both.

Captured values are summarised over layers and text windows (seeds) as a median with the
range [min, max] of what was measured; randn and the synthetic inputs by their median over
seeds. Shown only when a run has inputs other than randn.
"""

from __future__ import annotations

import pandas as pd

from attnbench.reporting.document import Heading, Para, Table

ERR = "err_vs_softmax_out_rel"
IMPL = "err_impl_out_rel"
PROPS = ("in_entropy", "in_top8_mass", "in_sink_mass", "in_eff_rank_k", "in_kurtosis_qk")
CAPTURED = "captured"


def _ok(df: pd.DataFrame) -> pd.DataFrame:
    if "inputs" not in df.columns or (df["inputs"].fillna("randn") == "randn").all():
        return df.iloc[0:0]
    ok = df[df["status"] == "ok"].copy()
    ok["inputs"] = ok["inputs"].fillna("randn")
    ok["inputs_kind"] = ok["inputs"].where(~ok["inputs"].str.startswith("minilm"), CAPTURED)
    return ok


def _label(row) -> str:
    """A backend line: the backend with the knob that makes it a different approximation."""
    if row["backend"] == "linear":
        return f"linear ({row.get('feature_map', 'elu')})"
    if row["backend"] == "block_sparse":
        return f"block_sparse ({row.get('block_layout_name', 'bigbird')})"
    if row["backend"] == "linformer":
        return f"linformer (k={row.get('linformer_k', '')})"
    return row["backend"]


def _approximate(df: pd.DataFrame) -> pd.DataFrame:
    ok = _ok(df)
    if ok.empty or ERR not in ok or "semantics" not in ok:
        return ok.iloc[0:0]
    ok = ok[(ok["semantics"] == "approximate") & ok[ERR].notna() & (ok["dtype"] == "float32")]
    return ok.assign(line=ok.apply(_label, axis=1)) if not ok.empty else ok


def _summary(values: pd.Series) -> str:
    lo, med, hi = values.min(), values.median(), values.max()
    return f"{med:.3g}" if lo == hi else f"{med:.3g} [{lo:.3g}, {hi:.3g}]"


def error_table(df: pd.DataFrame) -> pd.DataFrame:
    """Rows (backend line, N); columns: randn, captured (median [min, max] over layers and
    windows), captured / randn, then each synthetic distribution."""
    ap = _approximate(df)
    if ap.empty:
        return pd.DataFrame()
    kinds = ["randn", CAPTURED] + sorted(k for k in ap["inputs_kind"].unique()
                                         if k not in ("randn", CAPTURED))
    rows = []
    for (line, n), g in ap.groupby(["line", "seq_k"]):
        row = {"backend": line, "N": int(n)}
        for kind in kinds:
            vals = g.loc[g["inputs_kind"] == kind, ERR]
            row[kind] = _summary(vals) if len(vals) else ""
            if kind == CAPTURED:
                base = g.loc[g["inputs_kind"] == "randn", ERR]
                row["captured / randn"] = (f"{vals.median() / base.median():.2g}x"
                                           if len(vals) and len(base) else "")
        rows.append(row)
    return pd.DataFrame(rows).set_index(["backend", "N"])


def headlines(df: pd.DataFrame) -> list[str]:
    """One sentence per approximate backend line, at the longest N measured on both."""
    ap = _approximate(df)
    out = []
    if ap.empty:
        return out
    for line, g in ap.groupby("line"):
        both = set(g.loc[g["inputs_kind"] == CAPTURED, "seq_k"]) & set(
            g.loc[g["inputs_kind"] == "randn", "seq_k"])
        if not both:
            continue
        n = max(both)
        real = g.loc[(g["inputs_kind"] == CAPTURED) & (g["seq_k"] == n), ERR]
        rand = g.loc[(g["inputs_kind"] == "randn") & (g["seq_k"] == n), ERR].median()
        ratio = real.median() / rand
        how = ("about the same as" if 0.9 <= ratio <= 1.1 else
               f"{ratio:.2g}x higher than" if ratio > 1 else f"{1 / ratio:.2g}x lower than")
        out.append(f"{line}: relative L2 error against exact softmax on all-MiniLM-L6-v2's "
                   f"activations is {_summary(real)} (median [range] over layers and windows) "
                   f"at N = {n}, {how} on random inputs ({rand:.3g}).")
    return out


def low_precision_table(df: pd.DataFrame) -> pd.DataFrame:
    """Exact backends' err_impl (median over N and seeds) per inputs, bf16 and fp16."""
    ok = _ok(df)
    if ok.empty or IMPL not in ok or "semantics" not in ok:
        return pd.DataFrame()
    ok = ok[(ok["semantics"] == "exact") & ok["dtype"].isin(["bfloat16", "float16"])
            & ok[IMPL].notna()]
    if ok.empty:
        return pd.DataFrame()
    table = ok.groupby(["backend", "dtype", "inputs"])[IMPL].median().unstack("inputs")
    return table.map(lambda v: "" if pd.isna(v) else f"{v:.2g}")


def properties_table(df: pd.DataFrame) -> pd.DataFrame:
    ok = _ok(df)
    have = [p for p in PROPS if p in ok.columns]
    if ok.empty or not have:
        return pd.DataFrame()
    table = ok.groupby("inputs")[have].median()
    return table.map(lambda v: "" if pd.isna(v) else f"{v:.3g}")


def blocks(df: pd.DataFrame) -> list:
    err, low, props = error_table(df), low_precision_table(df), properties_table(df)
    if err.empty and low.empty and props.empty:
        return []
    out = [Heading(2, "Error on real and random inputs"),
           Para(["Relative L2 error against exact softmax (fp32) of each approximate backend "
                 "on Q/K/V captured from all-MiniLM-L6-v2 (median [min, max] over layers and "
                 "text windows), on randn, and on the synthetic distributions; then the "
                 "exact backends' error against float64 in bf16 and fp16 per inputs; then "
                 "the inputs' measured properties (medians over the records)."])]
    if not err.empty:
        out.append(Table(err, "Approximation error (err_vs_softmax_out_rel) by inputs"))
    if not low.empty:
        out.append(Table(low, "Exact backends' error against float64 (err_impl_out_rel) "
                              "in low precision, by inputs"))
    if not props.empty:
        out.append(Table(props, "Measured properties of the inputs"))
    return out
