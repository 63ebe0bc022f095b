"""``attnbench profile`` (and ``run --profile``): what the command line adds to a run.

The run itself (selection, measuring, files) is ``attnbench run``'s; profiling is switched
on in the runner (``RunOptions.profile``). Here: the limit on how many pairs one profile run
may take, and what is printed afterwards: each pair's files, its largest kernels, and the
``nsys``/``ncu`` command lines that capture the same pair on a GPU.
"""

from __future__ import annotations

from pathlib import Path

from attnbench.core.errors import BadInput
from attnbench.core.record import Record
from attnbench.measure.profiler import tool_commands

MAX_PROFILED_PAIRS = 64  # each writes a trace; more is a run, not a look at some pairs
SHOWN_ROWS = 5


def check_pairs(n_pairs: int, force: bool) -> None:
    if n_pairs == 0:
        raise BadInput("profile: the selection holds no (case, backend) pair; allowed: a "
                       "--suite/--backends/--dtype/--seq-len selection with at least one")
    if n_pairs > MAX_PROFILED_PAIRS and not force:
        raise BadInput(f"profile: the selection holds {n_pairs} (case, backend) pairs; "
                       f"allowed: at most {MAX_PROFILED_PAIRS} (narrow it with --backends, "
                       f"--dtype, --seq-len, or --force)")


def rerun_command(inv: dict, case, backend: str) -> list[str]:
    """``attnbench run`` for the pair's suite, backend, dtype and length on a GPU."""
    cmd = ["attnbench", "run", "--suite", str(inv.get("suite") or "quick"),
           "--backends", backend, "--dtype", case.dtype, "--seq-len", str(case.seq_q),
           "--device", "cuda", "--no-report", "--no-progress", "--out", "nsys-results"]
    return cmd


def _plain(row: dict) -> str:
    """The plain calls beside the profiled ones: what the profiler itself adds."""
    plain = row.get("profile_plain_ms")
    if not plain:
        return ""
    return (f"; plain calls between the profiled ones {plain:.4g} ms, so the profiler adds "
            f"{row['profile_total_ms'] / plain - 1:+.0%} and the machine moved "
            f"{plain / row['time_ms_median'] - 1:+.0%} since the timing")


def summary_lines(rows: list[dict], run_dir: Path, inv: dict) -> list[str]:
    """What ``profile`` prints per profiled record."""
    out = []
    for row in rows:
        if not row.get("profile_trace"):
            if row.get("profile_error"):
                out.append(f"{row['backend']} {row['key']}: no profile ({row['profile_error']})")
            continue
        rec = Record.from_row(row)
        median = row.get("time_ms_median")
        samples = row.get("samples_ms") or [median]
        out.append(f"\n{row['backend']} {row['key']}: median {median:.4g} ms (samples "
                   f"{min(samples):.4g}..{max(samples):.4g}), kernel table total "
                   f"{row['profile_total_ms']:.4g} ms ({row['profile_total_ms'] / median:.0%} "
                   f"of the median){_plain(row)}")
        for top in (row.get("profile_top") or [])[:SHOWN_ROWS]:
            out.append(f"  {top['share']:7.1%}  {top['self_ms']:9.4g} ms  x{top['calls']:<4g} "
                       f"{top['name'][:90]}")
        out.append(f"  trace:   {run_dir / row['profile_trace']}  (ui.perfetto.dev)")
        out.append(f"  kernels: {run_dir / row['profile_kernels']}")
        if row.get("profile_memory"):
            out.append(f"  memory:  {run_dir / row['profile_memory']}")
        stem = row["profile_kernels"].removesuffix(".kernels.csv")
        on_gpu = rec.case.replace(device="cuda")  # the key the GPU run's NVTX ranges carry
        out.append("  on a CUDA machine:")
        for line in tool_commands(on_gpu, rec.backend, rerun_command(inv, on_gpu, rec.backend),
                                  stem):
            out.append(f"  {line}")
    return out
