"""One model at one (batch, N) measured with each attention backend.

For every backend (``eager`` is transformers' own attention; the others are attnbench
backends through ``hf_adapter``), and for each step, ``fwd`` (inference forward) and
``train`` (forward, loss, backward; no optimizer step):

1. a checked call first, untimed: a backend that cannot run the model's attention is
   ``unsupported`` with its reasons before any timing, one that fails is ``error``;
2. the step's time, every runnable backend's closure timed in the same interleaved rounds
   (``measure_interleaved``), samples kept;
3. the kernel level: the very attention case the model called (shape, mask, GQA, scale,
   mode), timed as ``backend.prepare`` closures in interleaved rounds of their own, so a
   model-level speedup sits beside the kernel-level one of the same shapes (Amdahl);
4. attention's share of the step: separate passes with ``AttentionClock`` (it synchronises,
   so never inside the timed rounds), one share per pass;
5. peak memory of one step above what the model and inputs hold;
6. output deviation from eager on the forward: relative L2 of the last hidden state and,
   for a sentence-embedding model, the cosine similarity of the mean-pooled embeddings.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import torch

from attnbench.core.backend import EXACT
from attnbench.core.errors import NotSupported
from attnbench.core.registry import all_backends
from attnbench.measure import hf_adapter
from attnbench.measure.memory import peak_memory_bytes
from attnbench.measure.model_zoo import BuiltModel
from attnbench.measure.timing import TimingBudget, measure_interleaved
from attnbench.stats.intervals import median_interval

EAGER = "eager"
STEPS = ("fwd", "train")
KERNEL_MODE = {"fwd": "fwd", "train": "fwd_bwd"}


@dataclass
class ModelJob:
    model: str
    scale: str
    batch: int
    seq_len: int
    dtype: str
    device: str
    backends: tuple[str, ...]  # eager first; attnbench backend names after
    steps: tuple[str, ...] = STEPS
    share_passes: int = 6


def one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def use(model: torch.nn.Module, backend: str) -> None:
    """Switch the model's attention; masks and attention calls read it at each forward."""
    name = EAGER if backend == EAGER else hf_adapter.implementation_name(backend)
    model.config._attn_implementation = name


def step_closure(built: BuiltModel, backend: str, step: str):
    model, inputs = built.model, built.inputs

    def fwd():
        use(model, backend)
        with torch.no_grad():
            return model(**inputs).last_hidden_state

    def train():
        use(model, backend)
        with torch.enable_grad():
            out = model(**inputs).last_hidden_state  # (B, N, hidden)
            out.float().pow(2).mean().backward()
        for p in model.parameters():
            p.grad = None
        return out.detach()

    return fwd if step == "fwd" else train


def pooled(hidden: torch.Tensor) -> torch.Tensor:
    """Mean over tokens, L2-normalised: the sentence embedding of all-MiniLM-L6-v2."""
    return torch.nn.functional.normalize(hidden.double().mean(dim=1), dim=-1)  # (B, hidden)


def deviation(out: torch.Tensor, ref: torch.Tensor, built: BuiltModel) -> dict:
    a, b = out.double(), ref.double()
    cols = {"rel_l2_vs_eager": float(torch.linalg.vector_norm(a - b)
                                     / torch.linalg.vector_norm(b))}
    if built.pooled:
        cos = (pooled(out) * pooled(ref)).sum(dim=-1)  # (B,)
        cols["cos_sim_vs_eager"] = float(cos.mean())
        cols["cos_sim_min"] = float(cos.min())
    return cols


def timing_cols(samples: list[float], prefix: str) -> dict:
    iv = median_interval(samples)
    return {f"{prefix}_ms": statistics.median(samples), f"{prefix}_ms_lo": iv.low,
            f"{prefix}_ms_hi": iv.high, "samples_ms": list(samples)}


def attention_share(built: BuiltModel, backend: str, step: str, passes: int) -> dict:
    """Median share of the step spent in attention calls, with its 95% interval."""
    import time

    if backend == EAGER:
        return {"attn_share_note": "eager runs transformers' own attention code, which the "
                                   "adapter does not time"}
    attn = hf_adapter.adapter(backend)
    fn = step_closure(built, backend, step)
    dev = next(built.model.parameters()).device
    shares = []
    for _ in range(passes):
        attn.clock = hf_adapter.AttentionClock(dev)
        try:
            if dev.type == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            fn()
            if dev.type == "cuda":
                torch.cuda.synchronize()
            total = time.perf_counter() - t0
            shares.append(attn.clock.seconds / total)
        finally:
            attn.clock = None
    iv = median_interval(shares)
    return {"attn_share": statistics.median(shares), "attn_share_lo": iv.low,
            "attn_share_hi": iv.high, "attn_share_samples": shares}


def kernel_closure(backend: str, case):
    impl = all_backends()[backend]
    if case.heads_q != case.heads_kv and not impl.caps.gqa:
        case = case.replace(heads_kv=case.heads_q)  # as the adapter runs it
    reasons = impl.not_supported_reasons(case)
    if reasons:
        raise NotSupported(backend, reasons)
    return impl.prepare(case, case.make_inputs()).fn


def measure_job(job: ModelJob, built: BuiltModel, budget: TimingBudget) -> list[dict]:
    """Records (dicts) for every (backend, step): the model level and the kernel level."""
    skipped = hf_adapter.register([b for b in job.backends if b != EAGER])
    dev = torch.device(job.device)
    records = []

    def base(backend, step, level):
        impl = all_backends().get(backend)
        return {"model": job.model, "scale": job.scale, "weights": built.weights,
                "batch": job.batch, "seq_len": job.seq_len, "dtype": job.dtype,
                "device": job.device, "backend": backend, "step": step, "level": level,
                "semantics": impl.semantics if impl is not None else EXACT}

    for step in job.steps:
        ok, cases, rows, ref = {}, {}, {}, None
        for backend in job.backends:
            row = base(backend, step, "model")
            rows[backend] = row
            if backend in skipped:
                row.update(status="unavailable", reason=skipped[backend])
                continue
            if backend != EAGER:
                hf_adapter.adapter(backend).calls.clear()
            try:
                out = step_closure(built, backend, step)()
            except NotSupported as exc:
                row.update(status="unsupported", reason="; ".join(exc.reasons))
                continue
            except torch.OutOfMemoryError as exc:
                row.update(status="oom", reason=one_line(exc))
                continue
            except Exception as exc:  # one failing backend costs one record
                row.update(status="error", reason=one_line(exc))
                continue
            if not bool(torch.isfinite(out).all()):
                row.update(status="wrong", reason="the last hidden state holds NaN or Inf")
                continue
            if backend == EAGER:
                ref = out
            else:
                calls = list(hf_adapter.adapter(backend).calls)
                cases[backend] = calls[0] if calls else None
                row["attn_case"] = calls[0].key if calls else None
            row["_out"] = out
            ok[backend] = step_closure(built, backend, step)
        for row in rows.values():
            out = row.pop("_out", None)
            if out is not None and ref is not None and step == "fwd":
                row.update(deviation(out, ref, built))
        if ok:
            timings = measure_interleaved(list(ok.values()), dev, budget)
            for backend, timing in zip(ok, timings):
                row = rows[backend]
                row.update(status="ok", reason="", stop=timing.stop,
                           **timing_cols(timing.samples_ms, "time"))
                row.update(attention_share(built, backend, step, job.share_passes))
                peak = peak_memory_bytes(ok[backend], dev)
                row["peak_mem_mb"] = None if peak is None else peak / 2**20
        records.extend(rows.values())
        records.extend(kernel_records(job, step, cases, budget, base))
    return records


def kernel_records(job: ModelJob, step: str, cases: dict, budget: TimingBudget,
                   base) -> list[dict]:
    """The attention case each backend ran inside the model, timed alone."""
    rows, fns = {}, {}
    for backend, case in cases.items():
        if case is None:
            continue
        case = case.replace(mode=KERNEL_MODE[step], scale=case.scale)
        row = base(backend, step, "kernel")
        row["attn_case"] = case.key
        rows[backend] = row
        try:
            fns[backend] = kernel_closure(backend, case)
            fns[backend]()
        except NotSupported as exc:
            row.update(status="unsupported", reason="; ".join(exc.reasons))
            fns.pop(backend, None)
        except Exception as exc:
            row.update(status="error", reason=one_line(exc))
            fns.pop(backend, None)
    if fns:
        timings = measure_interleaved(list(fns.values()), torch.device(job.device), budget)
        for backend, timing in zip(fns, timings):
            rows[backend].update(status="ok", reason="", stop=timing.stop,
                                 **timing_cols(timing.samples_ms, "time"))
    return list(rows.values())
