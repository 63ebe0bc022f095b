#!/usr/bin/env python3
"""Summarise a suites/h200.toml run: statuses, triton_flash against SDPA, and the goals.

Reads a run directory (records.jsonl, meta.json) and prints Markdown: record statuses per
backend (with the reason of every triton_flash record that is not ok); bf16 head-dim-128
TFLOP/s of triton_flash, SDPA's flash kernel and cuDNN for N >= 4096 with the fraction of
the run's measured matmul ceiling; and the suite's claims (its goals, declared as data in
suites/h200.toml) with their 95% intervals and verdicts, as the report computes them.
Nothing is measured here.

Usage: python scripts/gpu_summary.py RUN_DIR [--out summary.md]
"""

from __future__ import annotations

import argparse
import sys

SIDE_BY_SIDE = ("triton_flash", "sdpa_flash", "sdpa_cudnn")


def _fmt(x, spec=".1f"):
    return "-" if x is None or x != x else format(x, spec)


def _statuses(df) -> list[str]:
    counts = df.groupby(["backend", "status"]).size().unstack(fill_value=0)
    out = ["## Records by status\n", "| backend | " + " | ".join(counts.columns) + " |",
           "|---" * (len(counts.columns) + 1) + "|"]
    out += [f"| {b} | " + " | ".join(str(int(v)) for v in row) + " |"
            for b, row in counts.iterrows()]
    for _, r in df[(df.backend == "triton_flash") & (df.status != "ok")].iterrows():
        out.append(f"- triton_flash {r.status}: {r.key}: {r.get('reason', '')}")
    return out + [""]


def _throughput(df) -> list[str]:
    ok = df[(df.status == "ok") & (df.dtype == "bfloat16") & (df.head_dim == 128)
            & (df.seq_q >= 4096) & df["mask"].isin(["none", "causal"])]
    present = [b for b in SIDE_BY_SIDE if (ok.backend == b).any()]
    title = "## bf16, head dim 128, N >= 4096: TFLOP/s (fraction of the measured matmul ceiling)\n"
    if not present:
        return [title, "No ok record of " + ", ".join(SIDE_BY_SIDE) + " here.", ""]
    out = [title, "| mode | mask | N | " + " | ".join(present) + " |",
           "|---" * (3 + len(present)) + "|"]
    for (mode, mask, n), g in ok.groupby(["mode", "mask", "seq_q"]):
        cells = []
        for b in present:
            r = g[g.backend == b]
            frac = r.frac_matmul.iloc[0] if len(r) and "frac_matmul" in r else None
            cells.append(f"{_fmt(r.tflops.iloc[0])} ({_fmt(frac, '.2f')})" if len(r) else "-")
        out.append(f"| {mode} | {mask} | {n} | " + " | ".join(cells) + " |")
    return out + [""]


def summarise(df, claims: list[dict]) -> list[str]:
    from attnbench.analysis.claims import claims_table

    out = ["# triton_flash on the GPU: summary of one suites/h200.toml run\n"]
    out += _statuses(df) + _throughput(df)
    out.append("## Goals (the suite's claims)\n")
    if not claims:
        out.append("The run's meta.json holds no claims.")
        return out
    table = claims_table(df, claims)
    cols = ["claim", "expected", "measured (95% interval)", "verdict"]
    out += ["| " + " | ".join(cols) + " |", "|---" * len(cols) + "|"]
    out += ["| " + " | ".join(str(r[c]) for c in cols) + " |" for _, r in table.iterrows()]
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir")
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    from attnbench.core.errors import BadInput
    from attnbench.runs.record_files import load_results, read_meta

    try:
        df = load_results(args.run_dir)
    except BadInput:  # e.g. a run cut before its first record
        df = None
    if df is None or df.empty or "backend" not in df:
        text = f"gpu_summary: {args.run_dir} holds no records; nothing to summarise\n"
        rc = 1
    else:
        text = "\n".join(summarise(df, read_meta(args.run_dir).get("claims") or [])) + "\n"
        rc = 0
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    return rc


if __name__ == "__main__":
    sys.exit(main())
