"""The model-level report: one section per (model, batch, N) of a model run, as
``index.md`` and ``index.html`` with one SVG chart per section, like a suite run's report.

Per backend: forward and training-step time with 95% intervals, each against sdpa (the
ratio of paired samples: the backends of a step share interleaved rounds), attention's share
of the step, peak memory, and, where weights are real, the output drift from eager. Then,
per model, the best backend's speedup over sdpa at the kernel level (the attention case the
model ran, timed alone) beside the model level, with what Amdahl's law predicts from sdpa's
attention share: ``1 / ((1 - s) + s / k)``. Records are read through
``runs.model_records``, so runs of the first model-run layout read as today's.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from attnbench.reporting import answers, document, plots
from attnbench.reporting.document import Bullets, Details, Figure, Figures, Heading, Para, Table
from attnbench.reporting.interval_text import ratio_text
from attnbench.runs.model_records import read_model_records
from attnbench.runs.record_files import read_meta, write_atomic
from attnbench.stats import significance
from attnbench.stats.intervals import paired_ratio_interval, ratio_interval

BASELINE = "sdpa"
JOB = ["model", "size", "batch", "seq_len", "dtype", "device"]


def _ms(row) -> str:
    if row is None or row.get("status") != "ok":
        return "—"
    return (f"{row['time_ms_median']:.3g} [{row['time_ms_ci_low']:.3g}, "
            f"{row['time_ms_ci_high']:.3g}]")


def speedup(base: dict | None, other: dict | None):
    """base time / other time (> 1: other is faster), paired when the rounds match."""
    if not base or not other or base.get("status") != "ok" or other.get("status") != "ok":
        return None
    a, b = base["samples_ms"], other["samples_ms"]
    if len(a) == len(b):
        return paired_ratio_interval(a, b)
    return ratio_interval(a, b)


def _x(iv) -> str:
    return "—" if iv is None else ratio_text(iv)


def _share(row) -> str:
    if row is None or row.get("status") != "ok":
        return "—"
    if row.get("attn_share") is None or pd.isna(row.get("attn_share")):
        return "n/a"
    return (f"{100 * row['attn_share']:.0f}% [{100 * row['attn_share_lo']:.0f}, "
            f"{100 * row['attn_share_hi']:.0f}]")


def _rows(records, step, level) -> dict[str, dict]:
    return {r["backend"]: r for r in records if r["mode"] == step and r["level"] == level}


def amdahl(share: float, kernel: float) -> float:
    """End-to-end speedup when a fraction ``share`` of the step gets ``kernel`` times faster."""
    return 1.0 / ((1.0 - share) + share / kernel)


def _title(first: dict) -> str:
    real = first.get("weights") == "real"
    kind = "real weights" if real else f"{first['size']} config, random weights"
    return (f"{first['model']} ({kind}), batch {first['batch']}, N = {first['seq_len']}, "
            f"{first['dtype']}")


def job_table(records: list[dict]) -> tuple[pd.DataFrame, list[str]]:
    """Per backend with an ok step: its times, speedups, shares, memory (and drift from
    eager with real weights); and the lines of what was not measured."""
    real = records[0].get("weights") == "real"
    fwd, train = _rows(records, "fwd", "model"), _rows(records, "train", "model")
    rows, notes = [], []
    for backend in dict.fromkeys([*fwd, *train]):
        f, t = fwd.get(backend), train.get(backend)
        for step, r in (("fwd", f), ("train", t)):
            if r is not None and r.get("status") != "ok":
                notes.append(f"{backend} ({step}): {r['status']}: {r.get('reason', '')}")
        if not any(r is not None and r.get("status") == "ok" for r in (f, t)):
            continue
        peak = t.get("peak_mem_bytes") if t and t.get("status") == "ok" else None
        row = {"backend": backend, "forward ms [95% CI]": _ms(f),
               "fwd vs sdpa": _x(speedup(fwd.get(BASELINE), f)),
               "train step ms [95% CI]": _ms(t),
               "train vs sdpa": _x(speedup(train.get(BASELINE), t)),
               "attention share (fwd / train)": f"{_share(f)} / {_share(t)}",
               "peak MiB (train)": "—" if peak is None else f"{peak / 2**20:.0f}"}
        if real:
            cos = f.get("cos_sim_vs_eager") if f else None
            rel = f.get("rel_l2_vs_eager") if f else None
            row["pooled cosine vs eager (mean / min)"] = \
                "—" if cos is None else f"{cos:.6f} / {f['cos_sim_min']:.6f}"
            row["rel. L2 vs eager"] = "—" if rel is None else f"{rel:.2e}"
        rows.append(row)
    return pd.DataFrame(rows), notes


def job_section(records: list[dict], out: Path | None = None) -> list:
    first = records[0]
    blocks: list = [Heading(3, _title(first))]
    case = next((r.get("attn_case") for r in records if r.get("attn_case")), None)
    if case:
        blocks.append(Para([f"Attention case inside the model: {case}."]))
    table, notes = job_table(records)
    blocks.append(Table(table))
    if notes:
        blocks.append(Details(f"Not measured: {len(notes)} backend step(s)", [[n] for n in notes]))
    best = amdahl_table(records)
    if not best.empty:
        blocks.append(Table(best, "The fastest backend per step over sdpa, kernel level "
                                  "beside model level, and what Amdahl's law predicts."))
    if out is not None:
        name = plots.chart_file_name("model--" + document.slug(_title(first)))
        alt = time_chart(records, out / name)
        if alt:
            blocks.append(Figures([Figure(name, alt, "Median time per step with its 95% "
                                                     f"interval, per backend. ({name})")]))
    return blocks


def time_chart(records: list[dict], path: Path) -> str | None:
    """Forward and training-step times per backend as bars with 95% whiskers; the alt text,
    or None when no step is ok."""
    steps = [s for s in ("fwd", "train") if any(r["status"] == "ok" for r in
                                                 _rows(records, s, "model").values())]
    if not steps:
        return None
    fig, axes = plots.plt.subplots(1, len(steps), figsize=(3.4 * len(steps) + 1.2, 2.8),
                                   squeeze=False)
    palette = plots.Palette()
    said = []
    for ax, step in zip(axes[0], steps):
        ok = [r for r in _rows(records, step, "model").values() if r["status"] == "ok"]
        names = [r["backend"] for r in ok]
        y = np.arange(len(ok))
        t = np.array([r["time_ms_median"] for r in ok], dtype=float)
        lo = np.clip(t - np.array([r["time_ms_ci_low"] for r in ok], dtype=float), 0, None)
        hi = np.clip(np.array([r["time_ms_ci_high"] for r in ok], dtype=float) - t, 0, None)
        ax.barh(y, t, xerr=[lo, hi], color=[palette.color(n) for n in names], capsize=3)
        ax.set_yticks(y)
        ax.set_yticklabels(names)
        ax.invert_yaxis()
        ax.set_xlabel("median time (ms), 95% interval")
        ax.set_title("forward" if step == "fwd" else "training step", fontsize=9)
        said.append(f"{step}: " + ", ".join(f"{n} {v:.3g} ms" for n, v in zip(names, t)))
    plots._finish(fig, axes[0], path, _title(records[0]))
    return "Median time per step and backend: " + "; ".join(said) + "."


def amdahl_table(records: list[dict]) -> pd.DataFrame:
    """Per step, the fastest exact backend (and the fastest approximate one) over sdpa,
    kernel level beside model level."""
    rows = []
    for step, label, k, m, pred in best_backends(records):
        rows.append({"step": step, "best backend (by model step)": label,
                     "kernel speedup over sdpa": _x(k), "model speedup over sdpa": _x(m),
                     "Amdahl prediction (sdpa's share)": pred})
    return pd.DataFrame(rows)


def best_backends(records: list[dict]) -> list[tuple]:
    """(step, backend label, kernel speedup, model speedup, Amdahl text) per step, for the
    fastest exact backend and the fastest approximate one."""
    out = []
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
            best = min(candidates, key=lambda b: candidates[b]["time_ms_median"])
            k = speedup(kernel.get(BASELINE), kernel.get(best))
            m = speedup(base, candidates[best])
            share = base.get("attn_share")
            pred = "—" if k is None or share is None else (
                f"{amdahl(share, k.estimate):.2f}x ({100 * share:.0f}%)")
            out.append((step, best if exact else f"{best} (approximate)", k, m, pred))
    return out


def _jobs(records: list[dict]) -> list[list[dict]]:
    jobs: dict[tuple, list[dict]] = {}
    for r in records:
        jobs.setdefault(tuple(r.get(k) for k in JOB), []).append(r)
    return list(jobs.values())


def job_answer(records: list[dict]) -> str | None:
    """'llama3 batch 1, N = 16, train: naive fastest, 1.2x [1.1, 1.3] over sdpa (kernel level
    2.0x, Amdahl predicts 1.3x)'; sdpa itself when no exact backend beats it."""
    found = [b for b in best_backends(records) if "(approximate)" not in b[1]]
    if not found:
        return None
    step, label, k, m, pred = found[-1]  # the training step when there is one
    first = records[0]
    said = significance.decide(m, lower_is_better=False) if m is not None else None
    if said == significance.BETTER:
        verdict = f"{label} fastest, {_x(m)} over sdpa"
    elif said == significance.WORSE:
        verdict = f"sdpa fastest; the next exact backend, {label}, at {_x(m)} of its speed"
    else:
        verdict = f"no exact backend differs from sdpa (the fastest other, {label}, {_x(m)})"
    return (f"{first['model']} batch {first['batch']}, N = {first['seq_len']}, {step}: "
            f"{verdict} (kernel level {_x(k)}, Amdahl predicts {pred})")


def short_headline(run_dir: Path) -> str:
    """At most ``answers.INDEX_WIDTH`` characters for the index."""
    said = []
    for job in _jobs(read_model_records(run_dir)):
        found = [b for b in best_backends(job) if "(approximate)" not in b[1]]
        if found:
            step, label, _, m, _ = found[-1]
            said.append(f"{job[0]['model']} {step}: {label} "
                        f"{'-' if m is None else f'{m.estimate:.2f}x'} vs sdpa")
    return answers.clip("; ".join(said) or "no model step measured")


def blocks(run_dir: Path, out: Path | None = None) -> list:
    records = read_model_records(run_dir)
    meta = read_meta(run_dir)
    env = meta.get("environment") or meta.get("env") or {}  # (env: before records)
    out_blocks: list = [
        Heading(1, f"Model-level run {meta.get('run_id', run_dir.name)}"),
        Para([f"Suite {meta.get('suite')} on {env.get('device_name')} "
              f"(torch {env.get('torch')}, transformers {meta.get('transformers')}, "
              f"{env.get('threads')} threads). Each backend is plugged into the model as a "
              f"transformers attention function (attnbench_<backend>); eager is "
              f"transformers' own attention. Times are medians with 95% intervals; "
              f"'vs sdpa' is sdpa's time over the backend's (paired rounds), > 1 is faster. "
              f"The kernel level times, alone, the attention case the model called."])]
    jobs = _jobs(records)
    heads = [h for h in map(job_answer, jobs) if h]
    if heads:
        out_blocks += [Heading(2, "Answers"), Bullets([[h] for h in heads])]
    out_blocks.append(Heading(2, "Models"))
    for job_records in jobs:
        if all(r["status"] != "ok" for r in job_records):
            first = job_records[0]
            out_blocks += [Heading(3, f"{first['model']} batch {first['batch']}, "
                                      f"N = {first['seq_len']}"),
                           Para([f"{first['status']}: {first.get('reason', '')}"])]
            continue
        out_blocks += job_section(job_records, out)
    return out_blocks


def model_report(run_dir: Path) -> str:
    """The report's Markdown, without charts."""
    return document.to_markdown(blocks(run_dir))


def summary(run_dir: Path) -> str:
    """A text table for the terminal: per job and backend, both steps and their speedups."""
    rows = []
    for job in _jobs(read_model_records(run_dir)):
        table, _ = job_table(job)
        first = job[0]
        for _, r in table.iterrows():
            rows.append({"model": f"{first['model']} b{first['batch']} N={first['seq_len']}",
                         "backend": r["backend"], "fwd ms": r["forward ms [95% CI]"],
                         "fwd vs sdpa": r["fwd vs sdpa"],
                         "train ms": r["train step ms [95% CI]"],
                         "train vs sdpa": r["train vs sdpa"]})
    if not rows:
        return "(no ok model step)"
    return pd.DataFrame(rows).to_string(index=False)


def write_model_report(run_dir: Path, out: Path) -> Path:
    """``index.md`` and ``index.html`` with their charts in ``out``; the Markdown's path."""
    out.mkdir(parents=True, exist_ok=True)
    made = blocks(run_dir, out)
    document.write(made, out, f"attnbench model run: {run_dir.name}")
    files = [f.file for b in made if isinstance(b, Figures) for f in b.figures]
    write_atomic(out / ".attnbench-report.json",
                 json.dumps({"files": ["index.md", "index.html", *files],
                             "runs": [run_dir.name]}, indent=1) + "\n")
    return out / "index.md"
