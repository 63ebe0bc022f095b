"""The report's "Where the time goes": profiled kernels per backend, and a roofline.

- Kernel shares: for each run and backend with profiled records (``attnbench profile``,
  ``run --profile``), its largest profiled case (most dense FLOPs) and the top rows of its
  kernel table (``profile_top``), each with its share of the record's median time; the
  table's total beside the median says how much of the time the profile accounts for.
- Roofline: every ok record at its arithmetic intensity (the work it performs over its
  minimum traffic: inputs read once, outputs written once, so an upper bound on the real
  intensity) against its achieved TFLOP/s, under the roofs the run measured at its start:
  the matmul rate of each dtype and the streaming copy bandwidth, and, lighter, the fastest
  copy of the run's ladder (one that fits a cache), which bounds records small enough to
  stay in that cache.
"""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from attnbench.measure.ceilings import copy_ladder  # noqa: E402
from attnbench.reporting import plots  # noqa: E402
from attnbench.reporting.document import Figure, Figures, Heading, Para, Table  # noqa: E402

TOP = 5


def kernel_shares(df: pd.DataFrame) -> pd.DataFrame:
    """Per (run, backend): the top kernels of its largest profiled case."""
    if "profile_top" not in df.columns:
        return pd.DataFrame()
    prof = df[df["profile_top"].apply(lambda v: isinstance(v, list) and len(v) > 0)]
    rows = []
    for (run, backend), g in prof.groupby(["run_id", "backend"], sort=False):
        rec = g.loc[g["flops_dense"].idxmax()]
        median = rec["time_ms_median"]
        total = rec.get("profile_total_ms")
        for rank, top in enumerate(rec["profile_top"][:TOP], 1):
            rows.append({"run": run, "backend": backend, "case": rec["key"],
                         "median ms": median, "table total / median": total / median,
                         "plain calls / median": (rec.get("profile_plain_ms") or math.nan)
                         / median,
                         "#": rank, "kernel": top["name"], "calls": top["calls"],
                         "self ms": top["self_ms"], "share": top["share"],
                         "TFLOP/s": top.get("tflops"), "GB/s": top.get("gbps")})
    out = pd.DataFrame(rows)
    if not out.empty and out["run"].nunique() == 1:
        out = out.drop(columns=["run"])
    return out.dropna(axis=1, how="all")


def _formatted(table: pd.DataFrame) -> pd.DataFrame:
    t = table.copy()
    for col in ("median ms", "self ms", "TFLOP/s", "GB/s"):
        if col in t:
            t[col] = t[col].map(lambda v: "" if pd.isna(v) else f"{v:.4g}")
    for col in ("share", "table total / median"):
        if col in t:
            t[col] = t[col].map(lambda v: "" if pd.isna(v) else f"{v:.1%}")
    if "calls" in t:
        t["calls"] = t["calls"].map(lambda v: f"{v:g}")
    return t.set_index([c for c in ("run", "backend", "case") if c in t])


def roofline_chart(df: pd.DataFrame, ceilings: dict[str, dict], path: Path,
                   palette: plots.Palette) -> plots.Chart | None:
    """Achieved TFLOP/s against arithmetic intensity, one roof per (run, dtype)."""
    need = {"tflops", "gbps", "status"}
    if not need <= set(df.columns):
        return None
    ok = df[(df["status"] == "ok") & (df["tflops"] > 0) & (df["gbps"] > 0)]
    if ok.empty:
        return None
    intensity = ok["tflops"] * 1e12 / (ok["gbps"] * 1e9)  # FLOP per byte of minimum traffic
    fig, ax = plt.subplots(figsize=plots.SIZE)
    pairs = [(run, dtype, peak, ceil.get("copy_gbps")) for run, ceil in ceilings.items()
             for dtype, peak in (ceil.get("matmul_tflops") or {}).items()
             if peak and ceil.get("copy_gbps") and dtype in set(ok["dtype"])]
    ridges = [peak * 1e12 / (bw * 1e9) for _, _, peak, bw in pairs]  # FLOP/byte
    xs = np.geomspace(max(min([intensity.min(), *ridges]) / 4, 1e-3),
                      max([intensity.max(), *ridges]) * 4, 200)
    roofs = []
    for run, dtype, peak, bw in pairs:
        style = palette.STYLES[len(roofs) % 4]
        roof = np.minimum(peak, bw * 1e9 * xs / 1e12)
        label = f"roof {dtype}" + (f" ({run})" if len(ceilings) > 1 else "")
        ax.plot(xs, roof, color="0.3", linestyle=style, linewidth=1, label=label)
        roofs.append(f"{label}: {peak:.3g} TFLOP/s, {bw:.3g} GB/s, ridge at "
                     f"{peak * 1e3 / bw:.3g} FLOP/byte")
        cached = _fastest_copy(ceilings[run])
        if cached and cached[1] > 1.05 * bw:  # records small enough for a cache sit up to it
            nbytes, cached_bw = cached
            ax.plot(xs, np.minimum(peak, cached_bw * 1e9 * xs / 1e12), color="0.65",
                    linestyle=style, linewidth=1,
                    label=f"{label}, in cache ({_mib(nbytes)} copy)")
            roofs.append(f"{label} in cache: {cached_bw:.3g} GB/s (the {_mib(nbytes)} copy)")
    for backend, g in ok.assign(intensity=intensity).groupby("backend", sort=False):
        ax.scatter(g["intensity"], g["tflops"], s=18, color=palette.color(str(backend)),
                   label=str(backend), alpha=0.8)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP per byte of minimum traffic)")
    ax.set_ylabel("achieved TFLOP/s (work performed / median time)")
    plots._finish(fig, ax, path, "Roofline: every ok record under the run's measured roofs")
    alt = (f"Roofline, {len(ok)} ok records of backends {', '.join(ok['backend'].unique())}; "
           + ("; ".join(roofs) if roofs else "no ceilings measured") + ".")
    return plots.Chart(path, alt)


def _fastest_copy(ceilings: dict) -> tuple[int, float] | None:
    """The run's fastest measured copy, (source bytes, GB/s): the roof of a record whose
    traffic fits a cache, which the streaming copy alone would put above its roof."""
    ladder = copy_ladder(ceilings)
    return max(ladder, key=lambda rung: rung[1]) if ladder else None


def _mib(nbytes: int) -> str:
    return f"{nbytes / 2**20:g} MiB"


def blocks(report) -> list:
    """The section, for ``report.Report`` (its runs, records, folder, palette, files)."""
    df = report.df
    out = []
    shares = kernel_shares(df)
    roof_name = "roofline.svg"
    ceilings = {r.label: r.meta.get("ceilings") or {} for r in report.runs}
    chart = roofline_chart(df, ceilings, report.out / roof_name, report.palette)
    if shares.empty and chart is None:
        return out
    out.append(Heading(2, "Where the time goes"))
    if not shares.empty:
        out += [Para(["Per backend, its largest profiled case: the operators (CPU) or kernels "
                      "(GPU) with the largest self time in untimed profiled calls after "
                      "measuring, each as a share of the record's median time; 'table total "
                      "/ median' is how much of the measured time the profile accounts for; "
                      "'plain calls / median' times unprofiled calls made between the "
                      "profiled ones, so the gap between the two is the profiler's own cost "
                      "and the plain calls' distance from 1 is the machine's drift. Traces "
                      "(Perfetto) and full tables are under the run's profiles/ folder."]),
                Table(_formatted(shares))]
    if chart is not None:
        report.files.append(roof_name)
        out.append(Figures([Figure(roof_name, chart.alt,
                                   "Roofline: each ok record's work over its minimum traffic "
                                   "(an upper bound on its intensity) against its achieved "
                                   "TFLOP/s, under the matmul rate and streaming copy bandwidth "
                                   "the run measured at its start; the lighter roof is its "
                                   "fastest copy, one that fits a cache, which bounds records "
                                   f"small enough to stay there. ({roof_name})")]))
    return out
