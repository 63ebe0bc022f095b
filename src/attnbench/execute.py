"""Run one (case, backend) job and turn what happens into a record.

Order: availability, support, inputs, setup (``prepare``), one checked call against the
float64 evaluation, timing, then a separate call for peak memory. Every exception is
classified into a status; none escapes.
"""

from __future__ import annotations

import time

import torch

from . import accuracy
from .backend import DIFFERENT, EXACT, Backend
from .case import Case
from .errors import NotSupported
from .memory import peak_memory_bytes
from .reference import RefResult, case_reference
from .registry import get_backend
from .timing import TimingBudget, measure


class CaseCache:
    """Inputs and the exact reference of the current case, shared by all its backends."""

    def __init__(self):
        self.key = None
        self.inputs = None
        self.reference: RefResult | None = None

    def inputs_for(self, case: Case):
        if self.key != case.key:
            self.key, self.reference = case.key, None
            self.inputs = None  # free the last case's tensors before making this one's
            self.inputs = case.make_inputs()
        return self.inputs

    def reference_for(self, case: Case) -> RefResult:
        if self.reference is None:
            self.reference = case_reference(case, self.inputs_for(case))
        return self.reference


def one_line(exc: BaseException, limit: int = 300) -> str:
    text = str(exc).strip().splitlines()
    msg = f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__
    return msg if len(msg) <= limit else msg[: limit - 3] + "..."


def is_oom(exc: BaseException) -> bool:
    if isinstance(exc, (MemoryError, torch.cuda.OutOfMemoryError)):
        return True
    text = str(exc)
    return isinstance(exc, RuntimeError) and ("out of memory" in text.lower()
                                              or "can't allocate memory" in text)


def base_record(case: Case, backend: str) -> dict:
    return {"key": case.key, "backend": backend, **case.to_dict()}


def execute(case: Case, backend_name: str, budget: TimingBudget, cache: CaseCache) -> dict:
    record = base_record(case, backend_name)
    try:
        backend = get_backend(backend_name)
    except KeyError as exc:
        return record | {"status": "unavailable", "reason": str(exc).strip("'\"")}
    record["semantics"] = backend.semantics
    ok, why = backend.is_available()
    if not ok:
        return record | {"status": "unavailable", "reason": why}
    reasons = backend.not_supported_reasons(case)
    if reasons:
        return record | {"status": "unsupported", "reason": "; ".join(reasons)}
    try:
        record |= _measure(case, backend, budget, cache)
    except NotSupported as exc:
        record |= {"status": "unsupported", "reason": "; ".join(exc.reasons)}
    except Exception as exc:  # classify, record, and let the sweep go on
        status = "oom" if is_oom(exc) else "error"
        record |= {"status": status, "reason": one_line(exc)}
    finally:
        if torch.device(case.device).type == "cuda":
            torch.cuda.empty_cache()
    return record


def _measure(case: Case, backend: Backend, budget: TimingBudget, cache: CaseCache) -> dict:
    inputs = cache.inputs_for(case)
    t0 = time.perf_counter()
    prepared = backend.prepare(case, inputs)
    setup_s = time.perf_counter() - t0
    outputs = prepared.outputs(prepared.fn())

    impl_ref = backend.impl_reference(case, inputs)
    exact_ref = cache.reference_for(case) if (impl_ref is None
                                              or backend.semantics != DIFFERENT) else None
    impl_cols = accuracy.error_columns("err_impl", outputs, (impl_ref or exact_ref).as_dict())
    if backend.semantics == DIFFERENT:
        soft_cols = {}
    elif backend.semantics == EXACT and impl_ref is None:
        soft_cols = {k.replace("err_impl", "err_vs_softmax"): v for k, v in impl_cols.items()}
    else:
        soft_cols = accuracy.error_columns("err_vs_softmax", outputs, exact_ref.as_dict())
    wrong = accuracy.verdict(outputs, impl_cols, case.dtype)
    del outputs

    timing = measure(prepared.fn, case.device, budget, warm=True)
    peak = peak_memory_bytes(prepared.fn, case.device)
    sec = timing.median_ms * 1e-3
    rec = {
        "status": "wrong" if wrong else "ok",
        "reason": wrong or "",
        "time_ms_median": timing.median_ms,
        "time_ms_iqr": timing.iqr_ms,
        "time_ms_min": timing.min_ms,
        "time_cv": timing.cv,
        "n_samples": len(timing.samples_ms),
        "samples_ms": timing.samples_ms,
        "tflops": case.flops / sec / 1e12,
        "tflops_dense": case.flops_dense / sec / 1e12,
        "gbps": case.bytes / sec / 1e9,
        "peak_mem_bytes": peak,
        "input_bytes": inputs.nbytes,
        "setup_s": setup_s,
        "flops": case.flops,
        "flops_dense": case.flops_dense,
        "density": case.density,
        **impl_cols,
        **soft_cols,
    }
    for key in ("kernel", "compile_s"):
        if key in prepared.extras:
            rec[key] = prepared.extras[key]
    return rec
