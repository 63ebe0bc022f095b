"""Run (case, backend) jobs and turn what happens into records.

A job group (the backends of one problem, or the two sides of a claim) runs together:
for each job availability, support, inputs, setup (``prepare``) and one checked call
against the float64 evaluation; then the jobs that got that far are timed together in
interleaved rounds (``timing.measure_interleaved``), so a ratio between them comes from
paired samples; then each gets a separate call for peak memory. Every exception is
classified into a status; none escapes.
"""

from __future__ import annotations

import hashlib
import os
import statistics
import time
from dataclasses import dataclass

import torch

from attnbench.core import accuracy, inputs_captured
from attnbench.core.backend import DIFFERENT, EXACT, Backend, Prepared
from attnbench.core.case import Case, Inputs
from attnbench.core.errors import NotSupported
from attnbench.core.record import OPTIONAL_COLUMNS, Record
from attnbench.core.registry import get_backend
from attnbench.measure import device_state, probe, profiler
from attnbench.measure.case_cache import CaseCache
from attnbench.measure.claim_rounds import FINAL_STOPS, ClaimRounds
from attnbench.measure.memory import peak_memory_bytes
from attnbench.measure.timing import Timing, TimingBudget, measure_interleaved
from attnbench.measure.timing_methods import Copies, input_copy
from attnbench.stats import noise

SETUP, TIMED = "setup", "timed"  # the phases a worker's heartbeat announces


def one_line(exc: BaseException, limit: int = 300, prefix: str = "") -> str:
    text = str(exc).strip().splitlines()
    msg = prefix + (f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__)
    return msg if len(msg) <= limit else msg[: limit - 3] + "..."


def is_oom(exc: BaseException) -> bool:
    if isinstance(exc, (MemoryError, torch.cuda.OutOfMemoryError)):
        return True
    text = str(exc)
    return isinstance(exc, RuntimeError) and ("out of memory" in text.lower()
                                              or "can't allocate memory" in text)


# CUDA errors after which the process's context is unusable: every later call fails too.
CONTEXT_LOST = ("illegal memory access", "unspecified launch failure", "device-side assert",
                "misaligned address", "illegal instruction")


def failure(record: Record, exc: BaseException) -> Record:
    if isinstance(exc, NotSupported):
        return record.update(status="unsupported", reason="; ".join(exc.reasons))
    if any(text in str(exc) for text in CONTEXT_LOST):
        record.update(context_lost=True)  # the worker is replaced before the next job
    return record.update(status="oom" if is_oom(exc) else "error", reason=one_line(exc))


@dataclass
class Candidate:
    """A job that passed its checked call and waits to be timed."""

    record: Record
    backend: Backend
    prepared: Prepared
    inputs: Inputs


def same_twice(prepared: Prepared) -> bool:
    """Whether two calls give bit-identical outputs (NaN matching NaN)."""
    first = {k: v.detach().clone() for k, v in prepared.outputs(prepared.fn()).items()}
    second = prepared.outputs(prepared.fn())
    return all(first[k].shape == v.shape and bool(((first[k] == v)
                                                   | (first[k].isnan() & v.isnan())).all())
               for k, v in second.items())


def _open(case: Case, backend_name: str | Backend, cache: CaseCache, check: bool = True,
          determinism: bool = False) -> Record | Candidate:
    """Everything before timing: a final (non-ok) record, or a candidate. ``check=False``
    (a repeat in a fresh process) skips the float64 check: the first process judged it.
    ``backend_name`` may be a Backend itself (a test's stand-in for a registered one)."""
    record = Record.new(case, getattr(backend_name, "name", backend_name), "ok")
    try:
        backend = get_backend(backend_name) if isinstance(backend_name, str) else backend_name
    except KeyError as exc:
        return record.update(status="unavailable", reason=str(exc).strip("'\""))
    record.update(semantics=backend.semantics, backend_hash=backend.code_hash())
    ok, why = backend.is_available()
    if not ok:
        return record.update(status="unavailable", reason=why)
    reasons = backend.not_supported_reasons(case)
    if reasons:
        return record.update(status="unsupported", reason="; ".join(reasons))
    if case.inputs_problem():
        return record.update(status="unsupported", reason=case.inputs_problem())
    if case.inputs_spec.captured and inputs_captured.unavailable_reason():
        return record.update(status="unavailable", reason=inputs_captured.unavailable_reason())
    try:
        inputs = cache.inputs_for(case)
        record.update(**inputs.info)
        t0 = time.perf_counter()
        prepared = backend.prepare(case, inputs)
        record.update(setup_s=time.perf_counter() - t0)
        if check:
            _check(record, backend, prepared, inputs, cache)
            record.update(**cache.properties_for(case))
            if determinism:
                record.update(deterministic=same_twice(prepared))
        else:
            prepared.fn()  # the first call (lazy initialisation) stays out of timing
    except Exception as exc:  # classify, record, and let the sweep go on
        return failure(record, exc)
    for key in ("kernel", "compile_s", *OPTIONAL_COLUMNS):
        if key in prepared.extras:
            record.update(**{key: prepared.extras[key]})
    if "columns_after_check" in prepared.extras:  # what a backend can say once it has run
        try:
            record.update(**prepared.extras["columns_after_check"]())
        except Exception as exc:  # information only: its failure costs only itself
            record.update(columns_error=one_line(exc))
    return Candidate(record, backend, prepared, inputs)


def open_job(case: Case, backend_name: str | Backend, cache: CaseCache) -> Record | Candidate:
    """Availability, support, setup and the checked call of one pair, as a run does them:
    a final record (not ok, with its reason) or a candidate ready to time (whose record may
    say ``wrong``). The pytest-benchmark plugin (benchmarks/) times candidates its own way."""
    return _open(case, backend_name, cache)


def output_problem(case: Case, inputs: Inputs, outputs: dict) -> str | None:
    """Why the outputs cannot be the case's (a shape or dtype other than its inputs imply),
    or None. Checked before any error is computed."""
    b, hq, nq, dv = case.batch, case.heads_q, case.seq_q, case.head_dim_v
    expected = {"out": ((b, hq, nq, dv), inputs.q.dtype),  # (B, Hq, Nq, Dv)
                "dq": (tuple(inputs.q.shape), inputs.q.dtype),  # (B, Hq, Nq, D)
                "dk": (tuple(inputs.k.shape), inputs.k.dtype),  # (B, Hkv, Nk, D)
                "dv": (tuple(inputs.v.shape), inputs.v.dtype)}  # (B, Hkv, Nk, Dv)
    for name, tensor in outputs.items():
        if name not in expected:
            continue
        shape, dtype = expected[name]
        if not isinstance(tensor, torch.Tensor):
            return f"{name} is a {type(tensor).__name__}, not a tensor of shape {shape}"
        if tuple(tensor.shape) != shape:
            return f"{name} has shape {tuple(tensor.shape)}, the case needs {shape}"
        if tensor.dtype != dtype:
            return (f"{name} has dtype {str(tensor.dtype).removeprefix('torch.')}, the case "
                    f"needs {str(dtype).removeprefix('torch.')}")
    return None


def _check(record: Record, backend: Backend, prepared: Prepared, inputs: Inputs,
           cache: CaseCache) -> None:
    """One call against the float64 evaluation: error columns and the ok/wrong verdict."""
    case = record.case
    outputs = prepared.outputs(prepared.fn())
    problem = output_problem(case, inputs, outputs)
    if problem:  # never compared by broadcasting: a wrong shape is wrong, not a small error
        record.update(status="wrong", reason=problem)
        return
    impl_ref = backend.impl_reference(case, inputs)
    exact_ref = cache.reference_for(case) if (impl_ref is None
                                              or backend.semantics != DIFFERENT) else None
    floor = accuracy.floors(case, inputs)
    impl_cols = accuracy.error_columns("err_impl", outputs, (impl_ref or exact_ref).as_dict(),
                                       floor)
    if backend.semantics == DIFFERENT:
        soft_cols = {}
    elif backend.semantics == EXACT and impl_ref is None:
        soft_cols = {k.replace("err_impl", "err_vs_softmax"): v for k, v in impl_cols.items()}
    else:
        soft_cols = accuracy.error_columns("err_vs_softmax", outputs, exact_ref.as_dict(),
                                           floor)
    doc_cols = accuracy.document_columns(case, inputs, outputs,
                                         (impl_ref or exact_ref).as_dict())
    wrong = accuracy.verdict(outputs, impl_cols | doc_cols, case.dtype)
    record.update(**impl_cols, **soft_cols, **doc_cols)
    if wrong:
        record.update(status="wrong", reason=wrong)


def timing_columns(case: Case, work: float, samples: list[float], stop: str,
                   probe_readings: list[float], budget: TimingBudget) -> dict:
    """Every timing-derived column, from the raw samples (and the probe readings taken
    during them): one definition, used after one process and after merging several."""
    sec = statistics.median(samples) * 1e-3
    return sample_columns(samples, stop, probe_readings, budget) | {
        "tflops": work / sec / 1e12,
        "tflops_dense": case.flops_dense / sec / 1e12,
        "gbps": case.bytes / sec / 1e9,
        "work_flops": work,
        "flops": case.flops,
        "flops_dense": case.flops_dense,
        "density": case.density,
    }


def sample_columns(samples: list[float], stop: str, probe_readings: list[float],
                   budget: TimingBudget) -> dict:
    """The columns of the samples alone (median, interval, spread, probe, noise flag): a
    kernel record's and a model step's alike."""
    timing = Timing(list(samples), stop, list(probe_readings))
    interval = timing.interval
    cols = {
        "time_ms_median": timing.median_ms,
        "time_ms_ci_low": interval.low,
        "time_ms_ci_high": interval.high,
        "time_ci_confidence": interval.confidence,
        "time_ms_iqr": timing.iqr_ms,
        "time_ms_min": timing.min_ms,
        "time_cv": timing.cv,
        "n_samples": len(timing.samples_ms),
        "samples_ms": timing.samples_ms,
        "sampling_stop": stop,
    }
    if probe_readings:
        cols["probe_readings"] = list(probe_readings)
        cols["probe_gflops"] = statistics.median(probe_readings)
        spread = probe.spread(probe_readings)
        if spread is not None:
            cols["probe_spread"] = spread
    reach = interval.half_width_rel if len(timing.samples_ms) >= 2 else None
    flagged_by = noise.flags(timing.samples_ms, reach, probe_readings, budget.unsteady_rel,
                             budget.noise_threshold)
    cols["noisy"] = bool(flagged_by)
    if flagged_by:
        cols["noisy_by"] = "+".join(flagged_by)
    return cols


def timed_under(backend: Backend, environ=os.environ) -> dict:
    """``{"timed_under": "triton interpreter"}`` for a Triton backend while
    ``TRITON_INTERPRET`` is on (its calls then run in Python, not on the device), else {}."""
    interpret = environ.get("TRITON_INTERPRET", "0").strip().lower()
    if "triton" in backend.caps.requires and interpret not in ("", "0", "false", "no"):
        return {"timed_under": "triton interpreter"}
    return {}


def _timing_columns(cand: Candidate, timing: Timing, budget: TimingBudget) -> dict:
    work = cand.backend.work_flops(cand.record.case)
    cols = timing_columns(cand.record.case, work, timing.samples_ms, timing.stop,
                          timing.probe_readings, budget) | {"input_bytes": cand.inputs.nbytes}
    cols |= timed_under(cand.backend)
    return cols | timing.fields | device_state.tflops_per_j(timing.fields, work)


def _copies(cand: Candidate) -> Copies:
    """cudagraph: the pair set up again over k fresh copies of its inputs."""
    def make(k: int) -> list:
        return [cand.backend.prepare(cand.record.case, inputs).fn
                for inputs in (input_copy(cand.inputs) for _ in range(k))]
    return Copies(cand.inputs.nbytes, make)


def merge_repeats(first: list[Record], repeats: list[list[Record]], budget: TimingBudget
                  ) -> list[Record]:
    """Pool the samples of the same group timed again in fresh processes (``processes``
    in a suite's timing): process-level effects (memory placement, which cores) then show
    in the interval instead of shifting whole runs. Sample order stays round-aligned
    across the group's records when every repeat timed the same records."""
    for i, rec in enumerate(first):
        if "samples_ms" not in rec.info:
            continue
        samples, readings = list(rec.info["samples_ms"]), list(rec.info.get("probe_readings", []))
        stops = [rec.info.get("sampling_stop", "")]
        for repeat in repeats:
            other = repeat[i] if i < len(repeat) else None
            if other is None or "samples_ms" not in other.info:
                rec.info.pop("pair_group", None)  # rounds no longer aligned
                continue
            samples += other.info["samples_ms"]
            readings += other.info.get("probe_readings", [])
            stops.append(other.info.get("sampling_stop", ""))
        for stale in ("noisy_by", "probe_spread"):  # set only when they apply: recomputed
            rec.info.pop(stale, None)
        rec.update(**timing_columns(rec.case, rec.metrics["work_flops"], samples,
                                    "+".join(sorted(set(stops))), readings, budget),
                   processes=1 + len(repeats))
        if stops[-1] in (*FINAL_STOPS, "claim_share"):  # a sequential claim's pair
            rec.update(claim_stop=stops[-1], claim_rounds=len(samples))
    return first


def claim_settled(records: list[Record]) -> bool:
    """Whether a process's rounds ended a sequential claim (decided, or its budget spent):
    no further process is needed for it."""
    return any(r.info.get("sampling_stop") in FINAL_STOPS for r in records)


def group_id(jobs: list[tuple[Case, str]]) -> str:
    text = "|".join(f"{c.key}/{b}" for c, b in jobs)
    return hashlib.sha1(text.encode()).hexdigest()[:12]


def _timed_fn(cand: Candidate):
    """The closure the timer calls: inside an NVTX range named by the pair on a GPU."""
    rec = cand.record
    return profiler.nvtx_wrapped(cand.prepared.fn, profiler.range_name(rec.key, rec.backend),
                                  rec.case.device)


def _profile(cand: Candidate, run_dir: str) -> None:
    """After measuring: one more, untimed, call under the profiler (profiling.py)."""
    rec = cand.record
    try:
        if "columns_when_profiled" in cand.prepared.extras:  # worth their cost only here
            rec.update(**cand.prepared.extras["columns_when_profiled"]())
        rec.update(**profiler.profile_pair(cand.prepared.fn, rec.case, rec.backend,
                                            rec.metrics["time_ms_median"],
                                            rec.metrics.get("work_flops"), run_dir))
    except Exception as exc:  # a failed profile costs the profile, never the measurement
        rec.update(profile_error=one_line(exc))


def execute_group(jobs: list[tuple[Case, str]], budget: TimingBudget, cache: CaseCache,
                  drift: probe.DriftProbe | None = None, progress=lambda phase: None,
                  repeat: bool = False, profile_dir: str | None = None,
                  claim: ClaimRounds | None = None, prior: list[list[float]] | None = None,
                  until: int | None = None) -> list[Record]:
    """Records for jobs timed together; sample i of every ok record comes from round i.
    ``progress(phase)`` is called after each job's setup and after timing, with the phase
    that follows ("setup" while jobs are still being set up, then "timed"): a heartbeat, on
    which the isolated worker's parent restarts that phase's bound. ``repeat``: timing only
    (no float64 check, no memory), for pooling with the first process's records.
    ``profile_dir`` (the run directory): each ok record is profiled after all measuring.
    ``claim``: the group holds a sequential claim's sides; its rounds go on until the claim
    is decided, its budget spent or this process's share (``until``) done, counting the
    earlier processes' rounds (``prior``: their samples, one list per job)."""
    cache.keep_only([c for c, _ in jobs])
    opened = []
    for i, (case, backend) in enumerate(jobs):
        opened.append(_open(case, backend, cache, check=not repeat,
                            determinism=budget.check_determinism))
        progress(SETUP if i + 1 < len(jobs) else TIMED)
    timed = [c for c in opened if isinstance(c, Candidate)]
    if timed:
        device = timed[0].record.case.device
        rule = None if claim is None else claim.rule(
            [i for i, c in enumerate(opened) if isinstance(c, Candidate)], prior,
            until or claim.looks[-1])
        try:
            timings = measure_interleaved([_timed_fn(c) for c in timed], device, budget,
                                          probe=drift, warm=True, sequential=rule,
                                          copies=[_copies(c) for c in timed])
        except Exception as exc:  # a closure failed mid-rounds: time each on its own
            if len(timed) == 1:
                failure(timed[0].record, exc)
                timed, timings = [], []
            else:
                timings = None
        progress(TIMED)
        if timings is None:
            for cand in timed:
                cand.record.update(**_time_alone(cand, budget, drift))
                progress(TIMED)
        else:
            pair = group_id(jobs) if len(timed) > 1 else None
            for cand, timing in zip(timed, timings):
                cand.record.update(**_timing_columns(cand, timing, budget))
                if pair:
                    cand.record.update(pair_group=pair, paired_with=len(timed) - 1)
        for cand in [] if repeat else timed:
            if cand.record.status in ("ok", "wrong") and "time_ms_median" in cand.record.metrics:
                try:
                    cand.record.update(peak_mem_bytes=peak_memory_bytes(cand.prepared.fn,
                                                                        device))
                except Exception as exc:
                    failure(cand.record, exc)
        for cand in [] if repeat or not profile_dir else timed:
            if cand.record.status == "ok":
                _profile(cand, profile_dir)
                progress(TIMED)
    if jobs and torch.device(jobs[0][0].device).type == "cuda":
        torch.cuda.empty_cache()
    return [c.record if isinstance(c, Candidate) else c for c in opened]


def _time_alone(cand: Candidate, budget: TimingBudget, drift) -> dict:
    try:
        timing = measure_interleaved([_timed_fn(cand)], cand.record.case.device, budget,
                                     probe=drift, warm=True, copies=[_copies(cand)])[0]
    except Exception as exc:
        failure(cand.record, exc)
        return {}
    return _timing_columns(cand, timing, budget)


def execute(case: Case, backend_name: str, budget: TimingBudget, cache: CaseCache,
            drift: probe.DriftProbe | None = None) -> Record:
    """One job on its own (a group of one)."""
    return execute_group([(case, backend_name)], budget, cache, drift)[0]
