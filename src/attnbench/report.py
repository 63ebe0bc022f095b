"""Reports: ``reports/<name>/index.md`` and a single-file ``index.html`` with the plots.

Every number comes from the records of the runs given; nothing is recomputed or typed in.
The report is built from a list of blocks, rendered once as Markdown and once as HTML.
"""

from __future__ import annotations

import base64
import html
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from . import metrics, records, tables  # noqa: E402
from .claims import claims_table  # noqa: E402

GROUP = ["dtype", "mask", "mode"]


def scaling_exponents(df: pd.DataFrame) -> pd.DataFrame:
    """Fitted slope of log(median time) over log(N) per line with >= 3 ok sizes."""
    ok = df[(df["status"] == "ok") & (df["seq_q"] == df["seq_k"])]
    rows = []
    keys = [c for c in ["backend", *GROUP, "batch", "heads_q", "head_dim"] if c in ok.columns]
    for key, g in ok.groupby(keys):
        g = g.groupby("seq_q")["time_ms_median"].median()
        if len(g) >= 3:
            slope = np.polyfit(np.log(g.index.values.astype(float)), np.log(g.values), 1)[0]
            rows.append(dict(zip(keys, key)) | {"N range": f"{g.index.min()}..{g.index.max()}",
                                                 "exponent": round(float(slope), 3)})
    return pd.DataFrame(rows)


def _line_label(key, names: list[str]) -> str:
    key = key if isinstance(key, tuple) else (key,)
    return " ".join(str(v) if n == "backend" else f"{n}={v}" for n, v in zip(names, key))


def _plot_group(g: pd.DataFrame, title: str, path: Path, lines: list[str]) -> bool:
    """Time (with its 95% interval as error bars) and peak memory over N, one line per
    ``tables.line_columns`` line: a knob sweep draws a line per knob value."""
    ok = g[g["status"].isin(["ok", "wrong"])]
    if ok.empty:
        return False
    names = [c for c in lines if c not in GROUP]
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for key, b in ok.groupby(names, dropna=False):
        b = b.sort_values("seq_q")
        label = _line_label(key, names)
        t = b["time_ms_median"]
        if {"time_ms_ci_low", "time_ms_ci_high"} <= set(b.columns):
            err = [(t - b["time_ms_ci_low"]).clip(lower=0).fillna(0),
                   (b["time_ms_ci_high"] - t).clip(lower=0).fillna(0)]
            axes[0].errorbar(b["seq_q"], t, yerr=err, marker="o", capsize=2, label=label)
        else:
            axes[0].plot(b["seq_q"], t, marker="o", label=label)
        if b["peak_mem_bytes"].notna().any():
            axes[1].plot(b["seq_q"], b["peak_mem_bytes"] / 2**20, marker="o", label=label)
    for ax, ylabel in zip(axes, ["median time (ms), 95% interval", "peak memory above inputs "
                                                                     "(MiB)"]):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length N")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return True


def steadiness(meta: dict) -> str:
    """How steady the machine was during the run, from the drift probe."""
    p = meta.get("probe") or {}
    if not p.get("n"):
        return "Drift probe: not recorded in this run."
    return (f"Drift probe (a fixed matmul timed between rounds): "
            f"{p['gflops_min']:.3g}-{p['gflops_max']:.3g} GFLOP/s over the run "
            f"(spread {p['spread']:.0%} of its median {p['gflops_median']:.3g}); "
            f"{p.get('noisy_records', 0)} record(s) flagged noisy (probe moved more than "
            f"{p.get('noise_threshold', 0):.0%} while they were measured; marked ~ in "
            f"tables).")


def ceiling_check(df: pd.DataFrame) -> str | None:
    """Records above 100% of a measured ceiling mean the ceiling itself was low."""
    over = []
    for col, what in (("frac_matmul", "matmul rate"), ("frac_bandwidth", "copy bandwidth")):
        if col in df.columns:
            bad = df[(df["status"] == "ok") & (df[col] > 1.0)]
            if not bad.empty:
                over.append(f"{len(bad)} record(s) exceed the measured {what} (up to "
                            f"{bad[col].max():.0%})")
    if not over:
        return None
    return ("**Ceiling check failed**: " + "; ".join(over) + ". The ceiling measured at the "
            "start of the run was lower than what backends reached later (the machine was "
            "slower then, or the ceiling's workload is not the device's best); read those "
            "fractions as relative only.")


def build_blocks(run_dirs: list[Path], out_dir: Path) -> list[tuple]:
    blocks: list[tuple] = [("h1", "attnbench report")]
    frames = []
    for run_dir in run_dirs:
        meta = records.read_meta(run_dir)
        df = records.load_results(run_dir)
        frames.append(df)
        env = meta.get("environment", {})
        ceil = meta.get("ceilings", {})
        mm = ", ".join(f"{k} {v:.3g}" for k, v in ceil.get("matmul_tflops", {}).items())
        blocks.append(("h2", f"Run {meta.get('run_id', run_dir.name)}"))
        blocks.append(("p", f"Suite **{meta.get('suite')}** ({meta.get('suite_description', '')})"
                            f" on **{env.get('device_name')}** ({env.get('device')}), "
                            f"torch {env.get('torch')}, triton {env.get('triton')}, "
                            f"{env.get('threads')} threads, commit "
                            f"{(env.get('git_commit') or '?')[:10]}"
                            f"{' (dirty)' if env.get('git_dirty') else ''}; "
                            f"{meta.get('started')} to {meta.get('ended')}."))
        if ceil:
            blocks.append(("p", f"Measured ceilings: matmul TFLOP/s {mm}; copy bandwidth "
                                f"{ceil.get('copy_gbps', 0):.3g} GB/s."))
        blocks.append(("p", f"Records: {tables.status_counts(df)}."))
        blocks.append(("p", steadiness(meta)))
    df = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    if df.empty:
        return blocks + [("p", "No records.")]
    claims = [c for d in run_dirs for c in records.read_meta(d).get("claims", [])]
    if claims:
        blocks.append(("h2", "Claims and measurements"))
        blocks.append(("p", "Each claim is data in the suite; the measurement is computed from "
                            "this run's ok records (ratios per case, exponents fitted over N), "
                            "with its 95% interval: 'paired' when both sides were timed in the "
                            "same interleaved rounds, else a bootstrap. The verdict is "
                            "'inconclusive' when the interval straddles the expected bound."))
        blocks.append(("table", claims_table(df, claims).set_index("claim")))
    lines = tables.line_columns(df)
    over = ceiling_check(df)
    if over:
        blocks.append(("p", over))
    for m in metrics.tabulated():
        if m.name not in df.columns or df[m.name].isna().all():
            continue
        d = df
        if m.name.startswith("err_vs_softmax") and "semantics" in df.columns:
            d = df[df["semantics"] == "approximate"]
            if d.empty:
                continue
        blocks.append(("h2", f"{m.section} ({m.shown_unit})"))
        blocks.append(("p", f"{m.how}. Rows: {', '.join(lines)}; columns: sequence length "
                            f"(seq_q/seq_k when they differ). Non-ok cells show the status."))
        blocks.append(("table", tables.pivot(d, m.name, lines)))
    if "kernel" in df.columns and df["kernel"].notna().any():
        blocks.append(("h2", "Kernel that ran"))
        blocks.append(("p", "As recorded by the backend, once per case outside the timed region "
                            "(for sdpa: the ATen kernel PyTorch dispatched to)."))
        blocks.append(("table", tables.pivot(df[df["kernel"].notna()], "kernel", lines)))
    exps = scaling_exponents(df)
    if not exps.empty:
        blocks.append(("h2", "Scaling: fitted exponent of time over N"))
        blocks.append(("table", exps.set_index(list(exps.columns[:-2]))))

    blocks.append(("h2", "Plots"))
    for n, (key, g) in enumerate(df.groupby(GROUP)):
        title = " / ".join(str(k) for k in key)
        path = out_dir / f"plot_{n:02d}.png"
        if _plot_group(g, title, path, lines):
            blocks.append(("img", path.name, title))

    bad = df[~df["status"].isin(["ok"])]
    if not bad.empty:
        blocks.append(("h2", "Records that are not ok"))
        cols = [c for c in ["backend", "key", "status", "reason"] if c in bad.columns]
        blocks.append(("table", bad[cols].head(200).set_index(["backend", "key"])))
    return blocks


def _md(blocks) -> str:
    out = []
    for kind, *rest in blocks:
        if kind in ("h1", "h2"):
            out.append(("#" if kind == "h1" else "##") + " " + rest[0] + "\n")
        elif kind == "p":
            out.append(rest[0] + "\n")
        elif kind == "table":
            out.append(tables.to_markdown(rest[0]))
        elif kind == "img":
            out.append(f"![{rest[1]}]({rest[0]})\n")
    return "\n".join(out)


def _html_inline(text: str) -> str:
    parts = html.escape(text).split("**")
    return "".join(f"<b>{p}</b>" if i % 2 else p for i, p in enumerate(parts))


def _html(blocks, out_dir: Path) -> str:
    body = []
    for kind, *rest in blocks:
        if kind in ("h1", "h2"):
            body.append(f"<{kind}>{html.escape(rest[0])}</{kind}>")
        elif kind == "p":
            body.append(f"<p>{_html_inline(rest[0])}</p>")
        elif kind == "table":
            t = rest[0]
            body.append(t.to_html(border=0, classes="t") if not t.empty else "<p>(none)</p>")
        elif kind == "img":
            data = base64.b64encode((out_dir / rest[0]).read_bytes()).decode()
            body.append(f'<figure><img alt="{html.escape(rest[1])}" '
                        f'src="data:image/png;base64,{data}"></figure>')
    style = ("body{font-family:sans-serif;max-width:1200px;margin:2em auto;}"
             "table.t{border-collapse:collapse;font-size:12px;margin:0.5em 0}"
             "table.t td,table.t th{border:1px solid #ccc;padding:2px 6px;text-align:right}"
             "img{max-width:100%}")
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>attnbench report</title>"
            f"<style>{style}</style></head><body>{''.join(body)}</body></html>\n")


def build_report(run_dirs: list[str | Path], out_dir: str | Path) -> Path:
    runs = [Path(r) for r in run_dirs]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    blocks = build_blocks(runs, out)
    (out / "index.md").write_text(_md(blocks), encoding="utf-8")
    (out / "index.html").write_text(_html(blocks, out), encoding="utf-8")
    return out
