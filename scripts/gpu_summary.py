#!/usr/bin/env python3
"""Summarise a suites/h200.toml run against the goals of triton_flash (docs/gpu.md).

Reads a run directory (records.jsonl) and prints, as Markdown: record statuses per backend;
bf16 head-dim-128 TFLOP/s of triton_flash next to SDPA's flash kernel (``sdpa_flash``, else
``sdpa``) for N >= 4096 with the ratio and the fraction of the run's measured matmul ceiling;
and the speed-up of a causal window of 4096 over full causal at N = 16K. Every goal line says
met / not met from the numbers in the run; nothing is measured here.

Usage: python scripts/gpu_summary.py RUN_DIR [--out summary.md]
"""

from __future__ import annotations

import argparse
import sys

GOALS = [  # (mode, mask, minimum ratio triton_flash / sdpa flash in TFLOP/s)
    ("fwd", "none", 1.2),
    ("fwd", "causal", 1.1),
    ("bwd", "none", 1.0),
    ("bwd", "causal", 1.0),
]
WINDOW_GOAL = 1.8


def _fmt(x, spec=".1f"):
    return "-" if x is None or x != x else format(x, spec)


def summarise(df) -> list[str]:
    out = []
    w = out.append
    w("# triton_flash on the GPU: summary of one suites/h200.toml run\n")
    counts = df.groupby(["backend", "status"]).size().unstack(fill_value=0)
    w("## Records by status\n")
    w("| backend | " + " | ".join(counts.columns) + " |")
    w("|---" * (len(counts.columns) + 1) + "|")
    for b, row in counts.iterrows():
        w(f"| {b} | " + " | ".join(str(int(v)) for v in row) + " |")
    bad = df[(df.backend == "triton_flash") & (df.status != "ok")]
    for _, r in bad.iterrows():
        w(f"- triton_flash {r.status}: {r.key}: {r.get('reason', '')}")
    w("")

    ok = df[df.status == "ok"]
    base_name = "sdpa_flash" if (ok.backend == "sdpa_flash").any() else "sdpa"
    sel = ok[(ok.dtype == "bfloat16") & (ok.head_dim == 128) & (ok.seq_q >= 4096)
             & ok["mask"].isin(["none", "causal"])]
    w(f"## bf16, head dim 128, N >= 4096: triton_flash vs {base_name} (TFLOP/s)\n")
    w("| mode | mask | N | triton_flash | frac of matmul ceiling | "
      f"{base_name} | ratio |")
    w("|---|---|---|---|---|---|---|")
    ratios: dict[tuple[str, str], list[float]] = {}
    for (mode, mask, n), g in sel.groupby(["mode", "mask", "seq_q"]):
        ours = g[g.backend == "triton_flash"]
        base = g[g.backend == base_name]
        t = float(ours.tflops.iloc[0]) if len(ours) else None
        frac = float(ours.frac_matmul.iloc[0]) if len(ours) and "frac_matmul" in ours else None
        b = float(base.tflops.iloc[0]) if len(base) else None
        ratio = t / b if t and b else None
        if ratio:
            ratios.setdefault((mode, mask), []).append(ratio)
        w(f"| {mode} | {mask} | {n} | {_fmt(t)} | {_fmt(frac, '.2f')} | {_fmt(b)} | "
          f"{_fmt(ratio, '.2f')} |")
    w("")
    w("## Goals\n")
    for mode, mask, goal in GOALS:
        rs = ratios.get((mode, mask))
        if not rs:
            w(f"- {mode} {mask}: >= {goal}x {base_name}: no data")
            continue
        worst = min(rs)
        verdict = "met" if worst >= goal else "NOT met"
        w(f"- {mode} {mask}: >= {goal}x {base_name} at every N >= 4096: {verdict} "
          f"(ratios {', '.join(f'{r:.2f}' for r in rs)})")
    win = ok[(ok.backend == "triton_flash") & (ok.seq_q == 16384) & (ok.head_dim == 128)]
    for dtype in ("bfloat16", "float16"):
        for mode in ("fwd", "bwd", "fwd_bwd"):
            g = win[(win.dtype == dtype) & (win["mode"] == mode)]
            causal = g[g["mask"] == "causal"].time_ms_median
            window = g[g["mask"] == "window(4095,0)"].time_ms_median
            if len(causal) and len(window):
                speedup = float(causal.iloc[0]) / float(window.iloc[0])
                verdict = "met" if speedup >= WINDOW_GOAL else "NOT met"
                w(f"- window(4095,0) vs causal, N=16384, {dtype} {mode}: {speedup:.2f}x faster "
                  f"(goal >= {WINDOW_GOAL}x: {verdict}; {float(causal.iloc[0]):.2f} ms vs "
                  f"{float(window.iloc[0]):.2f} ms)")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir")
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    from attnbench.records import load_results

    df = load_results(args.run_dir)
    text = "\n".join(summarise(df)) + "\n"
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
