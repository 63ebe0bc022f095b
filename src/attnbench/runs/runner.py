"""Orchestrates a run: metadata and ceilings, the job loop, OOM skipping, files, summary."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from attnbench.core.case import Case
from attnbench.core.errors import BadInput
from attnbench.core.record import FORMAT_VERSION, Record
from attnbench.measure import probe
from attnbench.measure.ceilings import copy_roof, matmul_roof
from attnbench.measure.execute import one_line
from attnbench.measure.worker import InProcessExecutor, IsolatedExecutor, WorkerConfig
from attnbench.runs import (
    environment,
    rank_folders,
    record_files,
    retakes,
    run_folder,
    sharding,
)
from attnbench.runs.overrides import resolve_device
from attnbench.runs.pairing import claim_rounds, job_groups
from attnbench.runs.suite import Suite

WORKER_LOG = record_files.WORKER_LOG


@dataclass
class RunOptions:
    out: Path = Path("results")
    run_id: str | None = None
    resume: bool = False
    isolate: bool = True
    threads: int | None = None
    progress: bool = True
    measure_ceilings: bool = True
    retry: tuple[str, ...] = ()  # with resume: statuses whose pairs run again
    max_memory_bytes: int | None = None  # address-space cap of the worker (RLIMIT_AS)
    explicit_dtypes: bool = False  # the user chose the dtypes: never left out as too slow
    profile: bool = False  # profile each ok pair after measuring it (profiling.py)
    invocation: dict = dataclasses.field(default_factory=dict)  # what --resume replays


def default_run_id(suite: Suite, device: str) -> str:
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    return f"{stamp}-{run_folder.slug(suite.name)}-{torch.device(device).type}"


def _group(case: Case) -> str:
    """A case's sweep line with its size axes blanked: the cases an OOM speaks for."""
    return case.replace(seq_q=1, seq_k=1, batch=1).key


class OomTracker:
    """After an OOM, larger cases of the same backend and sweep line are skipped."""

    def __init__(self):
        self.smallest: dict[tuple[str, str], Case] = {}

    def note(self, case: Case, backend: str) -> None:
        self.smallest.setdefault((backend, _group(case)), case)

    def skip_reason(self, case: Case, backend: str) -> str | None:
        failed = self.smallest.get((backend, _group(case)))
        if failed is None:
            return None
        if (case.seq_q >= failed.seq_q and case.seq_k >= failed.seq_k
                and case.batch >= failed.batch):
            return f"skipped after an oom at the smaller case {failed.key}"
        return None


def run_suite(suite: Suite, device: str, options: RunOptions) -> Path:
    shard = sharding.Shard.from_env()  # None without torchrun: one rank, as always
    device = resolve_device(device)
    if shard is not None:
        device = shard.bind(device)
    jobs = suite.jobs_on(device)
    if options.run_id:  # a name is checked before anything is created
        run_folder.check_name(options.run_id, "--resume" if options.resume else "--run-id")
    root = run_folder.out_root(options.out)
    with contextlib.ExitStack() as stack:
        def open_run() -> Path:  # the lead's part: the only part without torchrun
            if options.resume:
                run_dir = root / options.run_id
                if not (run_dir / record_files.META).exists():
                    raise BadInput(f"--resume {options.run_id}: no such run under "
                                   f"{options.out}")
            else:
                run_id = options.run_id or default_run_id(suite, device)
                run_dir = run_folder.new_run_dir(root, run_id, explicit=bool(options.run_id))
            stack.enter_context(run_folder.RunLock(run_dir))
            rank_folders.fold(run_dir)  # what the ranks of a killed sharded attempt left
            return run_dir

        if shard is None:
            return _run_locked(suite, device, options, jobs, open_run())
        try:
            run_dir = shard.agree(open_run, root)
            return _run_locked(suite, device, options, jobs, run_dir, shard)
        finally:
            shard.close()


def _run_locked(suite: Suite, device: str, options: RunOptions, jobs, run_dir: Path,
                shard: sharding.Shard | None = None) -> Path:
    threads = options.threads or (torch.get_num_threads() if device == "cpu" else None)
    run_id = run_dir.name
    done: set[tuple[str, str]] = set()
    if options.resume:
        done = {(r["key"], r["backend"]) for r in record_files.read_records(run_dir)
                if r.get("status") not in options.retry}
    # where this process writes records and its worker's log: a rank its own folder
    where = run_dir if shard is None else rank_folders.folder(run_dir, shard.rank)

    if threads:
        torch.set_num_threads(threads)
    if options.isolate:
        # The worker imports torch afresh, so its OpenMP pool honours this. Spinning idle
        # threads (the default) stall short CPU calls by whole scheduler quanta on shared
        # or virtualized cores: 0.3 ms calls measured 8-32 ms on the 2-vCPU CI machine.
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    env = environment.collect(device)
    env["threads"] = threads if device == "cpu" else env["threads"]
    meta = record_files.read_meta(run_dir) if options.resume else {}
    if shard is not None:  # each rank measures its own device's ceilings
        meta.pop("ceilings", None)
        meta.pop("slow_dtypes", None)
    meta.update({
        "format_version": FORMAT_VERSION,
        "run_id": run_id,
        "suite": suite.name,
        "suite_description": suite.description,
        "suite_path": suite.path,
        "suite_hash": suite.content_hash,
        "suite_toml": suite.text,  # what --resume replays, whatever the file holds later
        "claims": suite.claims,
        "comparisons": [dataclasses.asdict(c) for c in suite.comparisons],
        "environment": env,
        "environment_id": environment.env_id(env),
        "timing": dataclasses.asdict(suite.timing) | {"timeout_s": suite.timeout_s}
        | environment.timing_note(suite.timing.method, device),
        "isolated": options.isolate,
        "invocation": options.invocation or meta.get("invocation", {}),
        "started": meta.get("started") or dt.datetime.now().astimezone().isoformat(),
        "ended": None,
    })
    profile_dir = str(run_dir) if options.profile else None
    if options.isolate:
        executor = IsolatedExecutor(config=WorkerConfig(
            threads, options.max_memory_bytes, str(where / WORKER_LOG), profile_dir))
    else:
        executor = InProcessExecutor(threads, WorkerConfig(threads, profile_dir=profile_dir))
    todo = [(c, b) for c, b in jobs if (c.key, b) not in done]
    if shard is not None:
        todo = shard.share(todo, suite)

    def save_meta():
        if shard is None or shard.lead:
            record_files.write_meta(run_dir, meta)
        if shard is not None:
            rank_folders.save_rank(where, shard.describe(), meta)

    bar = tqdm(todo, desc=f"attnbench {suite.name}", unit="job", disable=not options.progress
               or (shard is not None and not shard.lead), dynamic_ncols=True)
    try:  # (bar iterated by group in run_jobs, updated per record)
        save_meta()  # first: a run killed from here on can resume
        build_native_kernels(todo, lambda text: bar.write(text, file=sys.stderr))
        if options.measure_ceilings and "matmul_tflops" not in (meta.get("ceilings") or {}):
            # (again on resume when an earlier attempt lost its worker)
            dtypes = sorted({c.dtype for c, _ in jobs})
            bar.set_description_str(f"attnbench {suite.name}: measuring the device's ceilings")
            meta["ceilings"] = executor.ceilings(dtypes, device)  # in the measuring process
            bar.set_description_str(f"attnbench {suite.name}")
        save_meta()
        slow = {} if options.explicit_dtypes else slow_dtypes(
            meta.get("ceilings") or {}, suite.timing.slow_dtype_factor,
            environment.cpu_capability() if device.startswith("cpu") else None)
        if slow:
            meta["slow_dtypes"] = slow
            save_meta()
        run_jobs(bar, executor, suite, where, run_id, env, meta.get("ceilings") or {}, slow)
    finally:
        executor.close()
        bar.close()
        meta["ended"] = dt.datetime.now().astimezone().isoformat()
        if shard is not None:
            save_meta()
            if sys.exc_info()[0] is None:  # every rank done: the lead folds their files in
                shard.barrier(run_dir)  # (a failed rank leaves them to the next start)
                if shard.lead:
                    rank_folders.fold(run_dir, meta)
        if shard is None or shard.lead:
            rows = record_files.read_records(run_dir)
            meta["probe"] = probe_summary(rows, suite.timing.noise_threshold)
            record_files.write_meta(run_dir, meta)
            if rows:
                record_files.write_csv(run_dir)
    return run_dir


def native_kernels_for(jobs) -> list[str]:
    """The native CPU kernels ``jobs`` may call: their backends' ``native_kernels``, for
    the fp32 CPU cases the kernels run."""
    from attnbench.core.registry import get_backend

    kernels: dict[str, None] = {}
    for backend in sorted({b for c, b in jobs if torch.device(c.device).type == "cpu"
                           and c.dtype == "float32"}):
        try:
            names = getattr(get_backend(backend), "native_kernels", ())
        except KeyError:  # an unknown name gets its own record
            continue
        kernels.update(dict.fromkeys(names))
    return list(kernels)


def build_native_kernels(jobs, say) -> None:
    """Compile the kernels ``jobs`` need now, before the first pair: a build is never
    inside a pair's bounds, and one that fails leaves its backends on their eager path."""
    kernels = native_kernels_for(jobs)
    if not kernels:
        return
    from attnbench.implementations import _native

    for name, reason in _native.prepare(kernels, say=say).items():
        if not _native.disabled():
            say(f"native kernel {name} not used: {reason}; its backends run their eager path")


# CPU capabilities (torch.backends.cpu.get_cpu_capability) whose ATen kernels have no
# native bf16: on an AVX-512 host lowered by ATEN_CPU_CAPABILITY=avx2, oneDNN's matmul still
# runs AVX-512 bf16 (the ceiling looks fast) while sdpa's bf16 kernels fail ("pack_vnni2 is
# only supported when avx512 is supported", docs/upstream-faults.md)
NO_NATIVE_BF16 = {"default", "avx2", "no avx", "zvector", "vsx"}


def slow_dtypes(ceilings: dict, factor: float, cpu_capability: str | None = None
                ) -> dict[str, str]:
    """Dtypes whose measured matmul rate is below 1/factor of float32's (of the fastest
    dtype's when float32 was not measured), with the reason their cases are left out (a CPU
    without native bf16: minutes per bf16 case); bfloat16 also where ATen's kernels run at a
    capability without native bf16 (``NO_NATIVE_BF16``). float32 itself is never left out:
    it is the precision every other is judged against, even where AMX makes bf16 15x faster."""
    rates = ceilings.get("matmul_tflops") or {}
    if factor and "bfloat16" in rates and cpu_capability in NO_NATIVE_BF16:
        return {"bfloat16": f"bfloat16 left out: torch's CPU kernels run at capability "
                            f"{cpu_capability} (ATEN_CPU_CAPABILITY or the CPU), without "
                            f"native bf16, where sdpa's bf16 fails (pack_vnni2) and the rest "
                            f"is 10-70x slower; pass --dtype bfloat16 to run it anyway"}
    if not factor or len(rates) < 2:
        return {}
    base = "float32" if "float32" in rates else max(rates, key=rates.get)
    return {d: (f"{d} matmul measured {r:.3g} TFLOP/s on this device, under 1/{factor:g} of "
                f"{base}'s {rates[base]:.3g}: left out of this suite's run (its "
                f"slow_dtype_factor); pass --dtype {d} to run it anyway")
            for d, r in rates.items() if d != "float32" and r * factor < rates[base]}


def run_jobs(bar: tqdm, executor, suite: Suite, run_dir: Path, run_id: str, env: dict,
             ceilings: dict, slow: dict[str, str] | None = None) -> None:
    """The job loop: groups of jobs timed together (pairing.job_groups), minus what an OOM
    speaks for and dtypes too slow here; each record appended as it comes."""
    env_cols = environment.record_fields(env)
    env_id = environment.env_id(env)
    oom = OomTracker()
    first_pass: list[tuple[list, list[dict]]] = []  # (jobs, rows written) of retakable groups

    def finished(rec: Record) -> dict:
        return finish_record(rec, run_id, suite.name, env_cols, env_id, ceilings)

    with record_files.RecordWriter(run_dir) as writer:
        for group in job_groups(list(bar.iterable), suite.claims, suite.comparisons):
            case0 = group[0][0]
            bar.set_postfix_str(f"{'+'.join(b for _, b in group)} {case0.mask} {case0.mode} "
                                f"N={case0.seq_q}", refresh=False)
            skipped, todo = [], []
            for case, backend in group:
                reason = (slow or {}).get(case.dtype) or oom.skip_reason(case, backend)
                if reason:
                    skipped.append(Record.new(case, backend, "skipped", reason))
                else:
                    todo.append((case, backend))
            claim = claim_rounds(todo, suite.claims)
            done = executor.run_group(todo, suite.timing, suite.timeout_s, claim) \
                if todo else []
            rows = []
            for rec in skipped + done:
                if rec.status == "oom":
                    oom.note(rec.case, rec.backend)
                rows.append(write_row(writer, rec, finished))
                bar.update(1)
            if todo and claim is None:
                first_pass.append((todo, rows[len(skipped):]))
        for rows in retakes.retaken(
                first_pass, lambda jobs: [finished(r) for r in executor.run_group(
                    jobs, suite.timing, suite.timeout_s)], suite.timing, bar.write):
            for row in rows:
                writer.write(row)


def write_row(writer, rec: Record, finished) -> dict:
    """Write ``rec``'s row (``finished``: the run's columns added); the row written. A row
    that cannot be made JSON is written as an error record of its pair instead (e.g. a set
    in prepare()'s extras: that pair fails, the sweep goes on)."""
    row = finished(rec)
    try:  # (nothing is written when the line cannot be made)
        writer.write(row)
        return row
    except (TypeError, ValueError, RecursionError) as exc:
        failed = finished(Record.new(rec.case, rec.backend, "error", one_line(
            exc, prefix="its record cannot be written as JSON: ")))
        writer.write(failed)
        return failed


def finish_record(rec: Record, run_id: str, suite: str, env_cols: dict, env_id: str,
                  ceilings: dict) -> dict:
    """Run-level columns, ceiling fractions and the environment: the row written to disk."""
    peak = matmul_roof(ceilings, rec.case.dtype)
    if rec.metrics.get("tflops") is not None and peak:
        rec.update(frac_matmul=rec.metrics["tflops"] / peak)
    bw = copy_roof(ceilings, rec.case.bytes)
    if rec.metrics.get("gbps") is not None and bw:
        rec.update(frac_bandwidth=rec.metrics["gbps"] / bw)
    row = {"run_id": run_id, "suite": suite, "format_version": FORMAT_VERSION,
           **rec.to_row()}
    row.setdefault("noisy", False)
    row["recorded_at"] = dt.datetime.now().astimezone().isoformat()
    return row | env_cols | {"env_id": env_id}


def probe_summary(rows: list[dict], threshold: float) -> dict:
    """The drift probe over the run (from its records) and how many records were noisy."""
    readings = {}  # a group's records share its readings: count each group once
    for r in rows:
        if r.get("probe_readings"):
            readings[r.get("pair_group") or id(r)] = r["probe_readings"]
    rates = [x for group in readings.values() for x in group]
    return probe.summary(rates) | {
        "noise_threshold": threshold,
        "noisy_records": sum(1 for r in rows if r.get("noisy")),
        "records_with_probe": sum(1 for r in rows if r.get("probe_readings"))}
