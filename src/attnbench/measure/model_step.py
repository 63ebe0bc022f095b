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
4. attention's share of the step: separate passes of the step, each timed by the timing
   loop with ``AttentionClock`` marking its attention calls (it synchronises, so never
   inside the rounds of 2), one share per pass;
5. peak memory of one step above what the model and inputs hold;
6. output deviation from eager on the forward: relative L2 of the last hidden state and,
   for a sentence-embedding model, the cosine similarity of the mean-pooled embeddings.

Each result is a ``Record`` whose case is a ``ModelCase`` (the job, the step, the level), with
the timing columns of a kernel record (``execute.sample_columns``) and the model columns that
``core.record.MODEL_COLUMNS`` declares.
"""

from __future__ import annotations

import importlib.metadata
import statistics
from dataclasses import dataclass

import torch

from attnbench.core.backend import EXACT
from attnbench.core.errors import NotSupported
from attnbench.core.model_case import STEPS, ModelCase
from attnbench.core.record import Record
from attnbench.core.registry import all_backends
from attnbench.measure import hf_adapter
from attnbench.measure.execute import sample_columns
from attnbench.measure.memory import peak_memory_bytes
from attnbench.measure.model_zoo import REAL, BuiltModel
from attnbench.measure.timing import Timing, TimingBudget, measure_interleaved
from attnbench.stats.intervals import median_interval

EAGER = "eager"
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

    def case(self, step: str, level: str = "model") -> ModelCase:
        """The identity of this job's record of one step at one level."""
        size = "real" if self.model == REAL else self.scale
        return ModelCase(self.model, size, self.batch, self.seq_len, self.dtype, self.device,
                         step, level)


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


# The share's passes: exactly ``passes`` timed calls of the step (it has just been timed, so
# no warm-up), each by CUDA events after the L2 flush on a GPU (a graph cannot hold the
# attention clock's synchronisations, so never cudagraph), by the loop's clock on a CPU.
def share_budget(passes: int) -> TimingBudget:
    return TimingBudget(warmup_s=0.0, budget_s=0.0, min_reps=passes, max_reps=passes,
                        min_warmup=0, rewarm_s=0.0, method="events")


def attention_share(built: BuiltModel, backend: str, step: str, passes: int) -> dict:
    """Median share of the step spent in attention calls, with its 95% interval: passes of
    the step timed by the timing loop, the attention calls inside each by ``AttentionClock``."""
    if backend == EAGER:
        return {"attn_share_note": "eager runs transformers' own attention code, which the "
                                   "adapter does not time"}
    attn = hf_adapter.adapter(backend)
    fn = step_closure(built, backend, step)
    dev = next(built.model.parameters()).device
    attention_s = []

    def step_pass():
        attn.clock = hf_adapter.AttentionClock(dev)
        try:
            fn()
        finally:
            attention_s.append(attn.clock.seconds)
            attn.clock = None

    timing = measure_interleaved([step_pass], dev, share_budget(passes), samplers=[])[0]
    shares = [a / (ms / 1e3) for a, ms in zip(attention_s, timing.samples_ms)]
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


def _backend_hash(backend: str, level: str) -> str | None:
    """What the measured code is, for compare's unchanged-code witness: the backend's source
    and, for a whole step, the transformers release that runs the rest of the model."""
    impl = all_backends().get(backend)
    code = impl.code_hash() if impl is not None else None
    if level == "kernel":
        return code
    model_code = f"transformers {importlib.metadata.version('transformers')}"
    return model_code if code is None else f"{code}+{model_code}"


def measure_job(job: ModelJob, built: BuiltModel, budget: TimingBudget) -> list[Record]:
    """Records for every (backend, step): the model level and the kernel level."""
    skipped = hf_adapter.register([b for b in job.backends if b != EAGER])
    dev = torch.device(job.device)
    records = []

    def base(backend, step, level) -> Record:
        impl = all_backends().get(backend)
        return Record.new(job.case(step, level), backend, "error", "not measured",
                          weights=built.weights, backend_hash=_backend_hash(backend, level),
                          semantics=impl.semantics if impl is not None else EXACT)

    for step in job.steps:
        ok, cases, recs, outs, ref = {}, {}, {}, {}, None
        for backend in job.backends:
            rec = recs[backend] = base(backend, step, "model")
            if backend in skipped:
                rec.update(status="unavailable", reason=skipped[backend])
                continue
            if backend != EAGER:
                hf_adapter.adapter(backend).calls.clear()
            try:
                out = step_closure(built, backend, step)()
            except NotSupported as exc:
                rec.update(status="unsupported", reason="; ".join(exc.reasons))
                continue
            except torch.OutOfMemoryError as exc:
                rec.update(status="oom", reason=one_line(exc))
                continue
            except Exception as exc:  # one failing backend costs one record
                rec.update(status="error", reason=one_line(exc))
                continue
            if not bool(torch.isfinite(out).all()):
                rec.update(status="wrong", reason="the last hidden state holds NaN or Inf")
                continue
            if backend == EAGER:
                ref = out
            else:
                calls = list(hf_adapter.adapter(backend).calls)
                cases[backend] = calls[0] if calls else None
                rec.update(attn_case=calls[0].key if calls else None)
            outs[backend] = out
            ok[backend] = step_closure(built, backend, step)
        if ref is not None and step == "fwd":
            for backend, out in outs.items():
                recs[backend].update(**deviation(out, ref, built))
        if ok:
            timings = measure_interleaved(list(ok.values()), dev, budget)
            for backend, timing in zip(ok, timings):
                rec = recs[backend]
                rec.update(status="ok", reason="", **step_columns(timing, budget))
                rec.update(**attention_share(built, backend, step, job.share_passes))
                peak = peak_memory_bytes(ok[backend], dev)
                if peak is not None:
                    rec.update(peak_mem_bytes=peak)
        records.extend(recs.values())
        records.extend(kernel_records(job, step, cases, budget, base))
    return records


def step_columns(timing: Timing, budget: TimingBudget) -> dict:
    """A timed step's columns: the kernel records' timing columns, the samplers' fields."""
    return sample_columns(timing.samples_ms, timing.stop, timing.probe_readings,
                          budget) | timing.fields


def kernel_records(job: ModelJob, step: str, cases: dict, budget: TimingBudget,
                   base) -> list[Record]:
    """The attention case each backend ran inside the model, timed alone."""
    recs, fns = {}, {}
    for backend, case in cases.items():
        if case is None:
            continue
        case = case.replace(mode=KERNEL_MODE[step], scale=case.scale)
        rec = recs[backend] = base(backend, step, "kernel")
        rec.update(attn_case=case.key)
        try:
            fns[backend] = kernel_closure(backend, case)
            fns[backend]()
        except NotSupported as exc:
            rec.update(status="unsupported", reason="; ".join(exc.reasons))
            fns.pop(backend, None)
        except Exception as exc:
            rec.update(status="error", reason=one_line(exc))
            fns.pop(backend, None)
    if fns:
        timings = measure_interleaved(list(fns.values()), torch.device(job.device), budget)
        for backend, timing in zip(fns, timings):
            recs[backend].update(status="ok", reason="", **step_columns(timing, budget))
    return list(recs.values())
