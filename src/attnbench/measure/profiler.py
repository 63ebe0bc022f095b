"""Profiles of measured pairs: where a record's time goes, per operator and per kernel.

After a pair has been timed (and its memory measured), ``profile_pair`` calls its closure
once more to warm up, then runs it under ``torch.profiler`` (CPU activity, and CUDA on a GPU)
for ``profiled_calls`` calls: one, or a few when a call is short (``PROFILE_S`` in all, at
most ``MAX_CALLS``), so that one call disturbed by the machine does not make the table. The
table gives times per call (averaged over them) from a bare session; the same calls are run
again with shapes, memory and FLOP counts recorded for the trace and the FLOP columns.
None of this is timed: the record's timing columns come from the samples taken before, and
profiling only adds the ``profile_*`` columns (record.py).

Files, under the run directory (paths in the record are relative to it):

- ``profiles/<backend>/<case>.trace.json.gz``: the Chrome trace; Perfetto (ui.perfetto.dev)
  and chrome://tracing open it as it is;
- ``profiles/<backend>/<case>.kernels.csv``: the kernel table (see ``kernel_table``);
- ``profiles/<backend>/<case>.memory.json.gz`` (GPU only): the memory timeline.

NVTX: ``nvtx_wrapped`` puts a range named ``<case key>/<backend>`` around each timed call on
a GPU, so ``nsys`` and ``ncu --nvtx`` find the pair; on CPU it returns the closure itself.
"""

from __future__ import annotations

import csv
import gzip
import hashlib
import json
import re
import shlex
import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from attnbench.measure.timing import TimingBudget, measure_interleaved

PROFILES = "profiles"
OUTSIDE_OPERATORS = "(the call itself, outside any operator)"  # the region's own self time
TOP_ROWS = 8  # rows of the kernel table a record carries (the files hold all of them)
# A kernel holding at least this share of the device time is taken to be the attention
# kernel, and the case's work and minimum traffic are attributed to it (FLOP/s, bytes/s).
DOMINANT_SHARE = 0.9
PROFILE_S = 0.5  # profiled calls: enough for about this long ...
MAX_CALLS = 5  # ... but at most this many
# One timed call, no warm-up (the call before it warmed): a plain call beside a profiled one
ONE_CALL = TimingBudget(warmup_s=0.0, budget_s=0.0, min_reps=1, max_reps=1, min_warmup=0)


def profiled_calls(median_ms: float) -> int:
    if not median_ms or median_ms <= 0:
        return 1
    return max(1, min(MAX_CALLS, int(PROFILE_S * 1e3 / median_ms)))


def range_name(case_key: str, backend: str) -> str:
    """The NVTX range (and profiler region) name of a pair."""
    return f"{case_key}/{backend}"


def nvtx_wrapped(fn: Callable[[], object], name: str, device) -> Callable[[], object]:
    """``fn`` inside an NVTX range on CUDA (push/pop cost well under a microsecond of host
    time); on CPU ``fn`` itself, so CPU timings are untouched."""
    if torch.device(device).type != "cuda":
        return fn
    nvtx = torch.cuda.nvtx

    def ranged():
        nvtx.range_push(name)
        try:
            return fn()
        finally:
            nvtx.range_pop()

    return ranged


@dataclass
class KernelRow:
    """One operator (CPU) or kernel (CUDA) of a profile, aggregated over its calls."""

    name: str
    device: str  # cpu or cuda
    calls: float  # per profiled call of the closure
    total_ms: float  # per call; inclusive of children (CPU operators); a kernel's time on GPU
    self_ms: float  # per call; exclusive: what the shares add up
    share: float  # self_ms / the record's median time
    flops: float | None = None  # counted by the profiler, or the case's work (see source)
    tflops: float | None = None
    gbps: float | None = None
    source: str = ""  # where flops / bytes come from


@dataclass
class MergedEvent:
    """One operator's or kernel's profiler averages summed over several sessions (the
    attributes ``kernel_table`` reads of torch's ``FunctionEventAvg``)."""

    key: str
    device_type: object
    count: int = 0
    self_cpu_time_total: float = 0.0
    cpu_time_total: float = 0.0
    self_device_time_total: float = 0.0
    device_time_total: float = 0.0
    flops: float = 0.0


def merged_events(sessions) -> list[MergedEvent]:
    """The key averages of several profiler sessions as one list, summed per (key, device)."""
    out: dict[tuple, MergedEvent] = {}
    for events in sessions:
        for e in events:
            m = out.setdefault((e.key, e.device_type), MergedEvent(e.key, e.device_type))
            m.count += e.count
            m.self_cpu_time_total += e.self_cpu_time_total
            m.cpu_time_total += e.cpu_time_total
            m.self_device_time_total += getattr(e, "self_device_time_total", 0) or 0
            m.device_time_total += getattr(e, "device_time_total", 0) or 0
            m.flops += getattr(e, "flops", 0) or 0
    return list(out.values())


def _file_stem(case_key: str) -> str:
    """A file name for a case key: readable, safe, and unique (hash of the full key)."""
    safe = re.sub(r"[^A-Za-z0-9_.=-]+", "_", case_key)[:120]
    return f"{safe}-{hashlib.sha1(case_key.encode()).hexdigest()[:8]}"


def kernel_table(events, device: str, median_ms: float, work_flops: float | None = None,
                 min_bytes: float | None = None, n_calls: int = 1,
                 region: str | None = None,
                 flops: dict[str, float] | None = None) -> list[KernelRow]:
    """Rows of a profile's key averages over ``n_calls`` calls, per call, largest self time
    first.

    CPU: every ATen operator with self time (the profiled region's own self time included),
    so the self times add up to the profiled call. CUDA: every kernel with device time, so
    they add up to the busy time of the GPU. The profiled region's (``region``) own self time
    is listed as ``OUTSIDE_OPERATORS`` (Python, allocation, waiting). FLOP/s comes from the
    profiler's FLOP counts (matmuls) where it has them (``flops``: per operator, over the
    ``n_calls`` calls of another session; else the events' own counts); a kernel holding
    ``DOMINANT_SHARE`` of the device time gets the case's work and minimum traffic (FLOP/s
    and bytes/s of the attention kernel)."""
    rows = []
    for evt in events:
        if device == "cuda":
            if evt.device_type != torch.autograd.DeviceType.CUDA:
                continue
            self_us = evt.self_device_time_total
            total_us = evt.device_time_total
        else:
            if evt.device_type != torch.autograd.DeviceType.CPU:
                continue
            self_us = evt.self_cpu_time_total
            total_us = evt.cpu_time_total
        if self_us <= 0:
            continue
        self_ms = self_us / 1e3 / n_calls
        name = OUTSIDE_OPERATORS if evt.key == region else evt.key
        row = KernelRow(name, device, round(evt.count / n_calls, 3), total_us / 1e3 / n_calls,
                        self_ms, self_ms / median_ms if median_ms else float("nan"))
        counted = (flops or {}).get(evt.key) or getattr(evt, "flops", 0) or 0
        if counted > 0:
            row.flops, row.source = float(counted) / n_calls, "profiler FLOP count"
            row.tflops = counted / (self_us * 1e-6) / 1e12
        rows.append(row)
    rows.sort(key=lambda r: r.self_ms, reverse=True)
    busy = sum(r.self_ms for r in rows)
    if device == "cuda" and rows and busy > 0 and rows[0].self_ms >= DOMINANT_SHARE * busy:
        top = rows[0]
        sec = top.self_ms * 1e-3
        if work_flops:
            top.flops, top.tflops = work_flops, work_flops / sec / 1e12
        if min_bytes:
            top.gbps = min_bytes / sec / 1e9
        top.source = (f"the case's work and minimum traffic (this kernel holds "
                      f"{top.self_ms / busy:.0%} of the device time)")
    return rows


def write_table(rows: list[KernelRow], path: Path) -> None:
    fields = list(KernelRow.__dataclass_fields__)
    with open(path, "w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=fields)
        writer.writeheader()
        for row in rows:
            writer.writerow(asdict(row))


def read_table(path: str | Path) -> list[dict]:
    """A kernel table file back as dicts (numbers as floats, empty cells as None)."""
    out = []
    with open(path, newline="", encoding="utf-8") as fh:
        for row in csv.DictReader(fh):
            for k, v in row.items():
                if k in ("name", "device", "source"):
                    continue
                row[k] = None if v == "" else float(v)
            out.append(row)
    return out


def load_trace(path: str | Path) -> dict:
    """A trace file (``.json`` or ``.json.gz``) as the JSON object Perfetto reads."""
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as fh:
        return json.load(fh)


def profile_pair(fn: Callable[[], object], case, backend: str, median_ms: float,
                 work_flops: float | None, run_dir: str | Path) -> dict:
    """Untimed calls of ``fn`` under the profiler (after one warm-up call); files under
    ``run_dir``; returns the record's ``profile_*`` columns."""
    dev = torch.device(case.device)
    cuda = dev.type == "cuda"
    run_dir = Path(run_dir)
    folder = run_dir / PROFILES / re.sub(r"[^A-Za-z0-9_.-]+", "_", backend)
    folder.mkdir(parents=True, exist_ok=True)
    stem = folder / _file_stem(case.key)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    sync = (lambda: torch.cuda.synchronize(dev)) if cuda else (lambda: None)
    n_calls = profiled_calls(median_ms)
    region = range_name(case.key, backend)

    def profiled(calls: int, **detail):
        with profile(activities=activities, **detail) as prof:
            for _ in range(calls):
                with record_function(region):
                    fn()
                    sync()
        return prof

    def plain() -> float:
        """One call timed as the record's samples were (the timing loop: CUDA events after
        an L2 flush on a GPU, the timer's clock on a CPU)."""
        return measure_interleaved([fn], dev, ONE_CALL, warm=True, samplers=[])[0].samples_ms[0]

    fn()  # warm: the memory measurement before may have handed pages back to the system
    sync()
    # The kernel table's times come from bare sessions, one call each, alternating with plain
    # calls timed by the wall clock: recording shapes, memory and FLOPs costs microseconds
    # per operator on CPU (a backend of many small operators, sliding_window's chunks, read
    # 131% of its median under such a session), and the plain calls beside the profiled ones
    # tell the profiler's own cost (``profile_plain_ms``) from the machine's drift since the
    # record was timed. The trace, FLOP counts and memory timeline come from a full session.
    bare, plain_ms = [], []
    for _ in range(n_calls):
        plain_ms.append(plain())
        bare.append(profiled(1).key_averages())
    full = profiled(n_calls, record_shapes=True, profile_memory=True, with_flops=True,
                    with_stack=cuda)  # the memory timeline needs stacks
    trace = stem.with_name(stem.name + ".trace.json.gz")
    full.export_chrome_trace(str(trace))  # torch gzips a path ending in .gz
    device = "cuda" if cuda else "cpu"
    events = merged_events(bare)
    flops = {e.key: e.flops for e in full.key_averages() if getattr(e, "flops", 0)}
    rows = kernel_table(events, device, median_ms, work_flops, case.bytes, n_calls,
                        region=region, flops=flops)
    table = stem.with_name(stem.name + ".kernels.csv")
    write_table(rows, table)
    root = [e for e in events if e.key == region]
    cols = {
        "profile_trace": str(trace.relative_to(run_dir)),
        "profile_kernels": str(table.relative_to(run_dir)),
        "profile_device": device,
        "profile_calls": n_calls,
        "profile_total_ms": sum(r.self_ms for r in rows),
        "profile_wall_ms": root[0].cpu_time_total / 1e3 / n_calls if root else None,
        "profile_plain_ms": statistics.median(plain_ms),
        "profile_top": [{"name": r.name, "calls": r.calls, "self_ms": r.self_ms,
                         "share": r.share, "tflops": r.tflops, "gbps": r.gbps}
                        for r in rows[:TOP_ROWS]],
    }
    if cuda:
        memory = stem.with_name(stem.name + ".memory.json.gz")
        try:
            index = dev.index if dev.index is not None else torch.cuda.current_device()
            full.export_memory_timeline(str(memory), device=f"cuda:{index}")
            cols["profile_memory"] = str(memory.relative_to(run_dir))
        except Exception as exc:  # the timeline is a bonus: its failure costs only itself
            cols["profile_memory_error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
    return cols


def tool_commands(case, backend: str, rerun: list[str], out_stem: str) -> list[str]:
    """Ready-to-run ``nsys`` and ``ncu`` command lines that capture this pair's timed calls
    (its NVTX range) while ``rerun`` runs the pair again on a GPU."""
    name = range_name(case.key, backend)
    cmd = shlex.join(rerun)
    return [
        f"nsys profile --trace=cuda,nvtx,osrt --capture-range=nvtx "
        f"--env-var=NSYS_NVTX_PROFILER_REGISTER_ONLY=0 "
        f"--nvtx-capture={shlex.quote(name)} --capture-range-end=repeat "
        f"-o {shlex.quote(out_stem + '.nsys')} {cmd}",
        f"ncu --nvtx --nvtx-include {shlex.quote(name + '/')} --target-processes all "
        f"--set full --launch-count 5 -o {shlex.quote(out_stem + '.ncu')} {cmd}",
    ]
