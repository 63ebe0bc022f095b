"""The model-level report: one section per (model, batch, N) of a model run.

Per backend: forward and training-step time with 95% intervals, each against sdpa (the
ratio of paired samples: the backends of a step share interleaved rounds), attention's share
of the step, peak memory, and, where weights are real, the output drift from eager. Then,
per model, the best backend's speedup over sdpa at the kernel level (the attention case the
model ran, timed alone) beside the model level, with what Amdahl's law predicts from sdpa's
attention share: ``1 / ((1 - s) + s / k)``.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from attnbench.runs.record_files import read_meta, read_records
from attnbench.stats.intervals import paired_ratio_interval, ratio_interval

BASELINE = "sdpa"
JOB = ["model", "scale", "batch", "seq_len", "dtype"]


def _ms(row) -> str:
    if row is None or row.get("status") != "ok":
        return "—"
    return f"{row['time_ms']:.3g} [{row['time_ms_lo']:.3g}, {row['time_ms_hi']:.3g}]"


def speedup(base: dict | None, other: dict | None):
    """base time / other time (> 1: other is faster), paired when the rounds match."""
    if not base or not other or base.get("status") != "ok" or other.get("status") != "ok":
        return None
    a, b = base["samples_ms"], other["samples_ms"]
    if len(a) == len(b):
        return paired_ratio_interval(a, b)
    return ratio_interval(a, b)


def _x(iv) -> str:
    return "—" if iv is None else f"{iv.estimate:.2f}x [{iv.low:.2f}, {iv.high:.2f}]"


def _share(row) -> str:
    if row is None or row.get("status") != "ok":
        return "—"
    if row.get("attn_share") is None or pd.isna(row.get("attn_share")):
        return "n/a"
    return (f"{100 * row['attn_share']:.0f}% [{100 * row['attn_share_lo']:.0f}, "
            f"{100 * row['attn_share_hi']:.0f}]")


def _rows(records, step, level) -> dict[str, dict]:
    return {r["backend"]: r for r in records if r["step"] == step and r["level"] == level}


def amdahl(share: float, kernel: float) -> float:
    """End-to-end speedup when a fraction ``share`` of the step gets ``kernel`` times faster."""
    return 1.0 / ((1.0 - share) + share / kernel)


def job_section(records: list[dict]) -> list[str]:
    first = records[0]
    real = first.get("weights") == "real"
    kind = "real weights" if real else f"{first['scale']} config, random weights"
    title = (f"### {first['model']} ({kind}), batch {first['batch']}, "
             f"N = {first['seq_len']}, {first['dtype']}")
    case = next((r.get("attn_case") for r in records if r.get("attn_case")), None)
    lines = [title, ""]
    if case:
        lines += [f"Attention case inside the model: `{case}`.", ""]
    fwd, train = _rows(records, "fwd", "model"), _rows(records, "train", "model")
    head = ["backend", "forward ms [95% CI]", "vs sdpa", "train step ms [95% CI]", "vs sdpa",
            "attention share (fwd / train)", "peak MiB (train)"]
    if real:
        head += ["pooled cosine vs eager (mean / min)", "rel. L2 vs eager"]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    notes = []
    for backend in dict.fromkeys([*fwd, *train]):
        f, t = fwd.get(backend), train.get(backend)
        for step, r in (("fwd", f), ("train", t)):
            if r is not None and r.get("status") != "ok":
                notes.append(f"- {backend} ({step}): {r['status']}: {r.get('reason', '')}")
        if not any(r is not None and r.get("status") == "ok" for r in (f, t)):
            continue
        peak = t.get("peak_mem_mb") if t and t.get("status") == "ok" else None
        cells = [backend, _ms(f), _x(speedup(fwd.get(BASELINE), f)), _ms(t),
                 _x(speedup(train.get(BASELINE), t)), f"{_share(f)} / {_share(t)}",
                 "—" if peak is None else f"{peak:.0f}"]
        if real:
            cos = f.get("cos_sim_vs_eager") if f else None
            rel = f.get("rel_l2_vs_eager") if f else None
            cells += ["—" if cos is None else f"{cos:.6f} / {f['cos_sim_min']:.6f}",
                      "—" if rel is None else f"{rel:.2e}"]
        lines.append("| " + " | ".join(cells) + " |")
    lines += [""] + (["Not measured:", ""] + notes + [""] if notes else [])
    lines += amdahl_lines(records)
    return lines


def amdahl_lines(records: list[dict]) -> list[str]:
    """Per step, the fastest exact backend (and the fastest approximate one) over sdpa,
    kernel level beside model level."""
    out = ["| step | best backend (by model step) | kernel speedup over sdpa | "
           "model speedup over sdpa | Amdahl prediction (sdpa's share) |",
           "|---|---|---|---|---|"]
    any_row = False
    for step in ("fwd", "train"):
        model, kernel = _rows(records, step, "model"), _rows(records, step, "kernel")
        base = model.get(BASELINE)
        if not base or base.get("status") != "ok":
            continue
        for exact in (True, False):
            candidates = {b: r for b, r in model.items() if b not in (BASELINE, "eager")
                          and r.get("status") == "ok" and b in kernel
                          and (r.get("semantics", "exact") == "exact") == exact}
            if not candidates:
                continue
            best = min(candidates, key=lambda b: candidates[b]["time_ms"])
            k = speedup(kernel.get(BASELINE), kernel.get(best))
            m = speedup(base, candidates[best])
            share = base.get("attn_share")
            pred = "—" if k is None or share is None else (
                f"{amdahl(share, k.estimate):.2f}x ({100 * share:.0f}%)")
            label = best if exact else f"{best} (approximate)"
            out.append(f"| {step} | {label} | {_x(k)} | {_x(m)} | {pred} |")
            any_row = True
    return (out + [""]) if any_row else []


def model_report(run_dir: Path) -> str:
    records = [r for r in read_records(run_dir)]
    meta = read_meta(run_dir)
    env = meta.get("env", {})
    lines = [f"# Model-level run {meta.get('run_id', run_dir.name)}", "",
             f"Suite `{meta.get('suite')}` on {env.get('device_name')} "
             f"(torch {env.get('torch')}, transformers {meta.get('transformers')}, "
             f"{env.get('threads')} threads). Each backend is plugged into the model as a "
             f"transformers attention function (`attnbench_<backend>`); `eager` is "
             f"transformers' own attention. Times are medians with 95% intervals; "
             f"'vs sdpa' is sdpa's time over the backend's (paired rounds), > 1 is faster. "
             f"The kernel level times, alone, the attention case the model called.", ""]
    jobs: dict[tuple, list[dict]] = {}
    for r in records:
        jobs.setdefault(tuple(r.get(k) for k in JOB), []).append(r)
    for job_records in jobs.values():
        if all(r["status"] != "ok" for r in job_records):
            first = job_records[0]
            lines += [f"### {first['model']} batch {first['batch']}, N = {first['seq_len']}",
                      "", f"{first['status']}: {first.get('reason', '')}", ""]
            continue
        lines += job_section(job_records)
    return "\n".join(lines) + "\n"


def write_model_report(run_dir: Path, out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    path = out / "index.md"
    path.write_text(model_report(run_dir), encoding="utf-8")
    return path
