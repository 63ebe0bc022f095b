"""sdpa: ``torch.nn.functional.scaled_dot_product_attention``, PyTorch choosing the kernel.

Causal with seq_q != seq_k uses ``causal_lower_right`` (bottom-right aligned, as in
docs/design.md); windows and block layouts go in as an explicit boolean mask, which
restricts PyTorch to the kernels that accept a mask.

Which kernel PyTorch picked is recorded per case in the ``kernel`` column: ``prepare``
asks the dispatcher (``torch._fused_sdp_choice``), and where it cannot be asked runs the
function once under ``torch.profiler`` (outside the timed region) and maps the ATen op it
saw to a short name (:data:`KERNEL_OPS`). A profiler session per job cost 0.05-0.3 s on a
GPU and 5.5 s for the first one on a CPU.

A packed batch (``lengths``) runs over nested jagged tensors (``nested_sdpa``); where torch
refuses a combination (a causal mask on nested inputs, in torch 2.13) the record is
``unsupported`` with the reason a tiny probe call gave. On CPU, torch 2.13's jagged sdpa has
no fused kernel: it converts to strided nested tensors and runs the math kernel, whose
intermediates take memory like a batch padded to its longest document. ``sdpa_padded``
(its own file) is the padded baseline of the same cases.
"""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager
from functools import lru_cache

import torch
import torch.nn.functional as F

from attnbench.core.backend import Backend, Capabilities, wrap_mode
from attnbench.core.heads import repeat_kv
from attnbench.core.masks import allowed_rows
from attnbench.implementations import _paged
from attnbench.implementations._varlen import flat_offsets, from_tokens_major, tokens_major

# ATen ops that identify the SDPA kernel that ran, and their short names.
KERNEL_OPS = {
    "aten::_scaled_dot_product_flash_attention_for_cpu": "flash_cpu",
    "aten::_scaled_dot_product_flash_attention": "flash",
    "aten::_flash_attention_forward": "flash",  # causal_lower_right calls it directly
    "aten::_scaled_dot_product_efficient_attention": "efficient",
    "aten::_efficient_attention_forward": "efficient",  # causal_lower_right, idem
    "aten::_scaled_dot_product_cudnn_attention": "cudnn",
    "aten::_scaled_dot_product_attention_math": "math",
    "aten::_scaled_dot_product_attention_math_for_mps": "math_mps",
    "aten::_scaled_dot_product_fused_attention_overrideable": "overrideable",
}


def sdpa_arguments(case, device) -> dict:
    """Keyword arguments for scaled_dot_product_attention expressing the case's mask."""
    spec = case.mask_spec
    kwargs: dict = {"scale": case.softmax_scale}
    if case.heads_q != case.heads_kv:
        kwargs["enable_gqa"] = True
    if spec.kind == "causal" and case.seq_q == case.seq_k:
        kwargs["is_causal"] = True
    elif spec.kind == "causal":
        from torch.nn.attention.bias import causal_lower_right

        kwargs["attn_mask"] = causal_lower_right(case.seq_q, case.seq_k)
    elif spec.kind != "none":
        kwargs["attn_mask"] = allowed_rows(spec, 0, case.seq_q, case.seq_q, case.seq_k, device,
                                           case.block_layout, case.param("block_size"))  # (Nq, Nk)
    return kwargs


def kernel_from_ops(op_names) -> str:
    """Short name of the first SDPA kernel op among ``op_names`` (in call order)."""
    for name in op_names:
        if name in KERNEL_OPS:
            return KERNEL_OPS[name]
    return "unknown"


@contextmanager
def _quiet_stderr():
    """Silence fd 2 (kineto prints a line to it when a profiler starts and stops)."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError, AttributeError):
        yield
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


# torch._fused_sdp_choice's answer (an SDPBackend value) as a kernel's short name.
_CHOICE_NAMES = {0: "math", 1: "flash", 2: "efficient", 3: "cudnn", 4: "overrideable"}


def kernel_name(kernel: str, device_type: str) -> str:
    """The short name of ``kernel`` as it runs on ``device_type`` (flash on CPU is its own)."""
    return "flash_cpu" if kernel == "flash" and device_type == "cpu" else kernel


def _call_inputs(case, inputs):
    """q, k, v requiring grad in backward modes, as in the timed run (the kernel choice
    may depend on it)."""
    return tuple(t.detach().requires_grad_(case.needs_grad)
                 for t in (inputs.q, inputs.k, inputs.v))


def _asks_without_running(case, device) -> dict | None:
    """sdpa's arguments when the dispatcher can be asked which kernel it picks (no
    ``causal_lower_right`` bias, a torch that has ``_fused_sdp_choice``), else None."""
    from torch.nn.attention.bias import CausalBias

    kwargs = sdpa_arguments(case, device)
    if not hasattr(torch, "_fused_sdp_choice") or isinstance(kwargs.get("attn_mask"),
                                                             CausalBias):
        return None
    return kwargs


def chosen_kernel(case, inputs) -> str | None:
    """The kernel PyTorch's dispatcher picks for this call, asked without running it
    (``torch._fused_sdp_choice``, what ``scaled_dot_product_attention`` itself consults),
    or None where it cannot be asked: then :func:`detect_kernel` profiles a call."""
    kwargs = _asks_without_running(case, inputs.q.device)
    if kwargs is None:
        return None
    q, k, v = _call_inputs(case, inputs)
    try:
        choice = int(torch._fused_sdp_choice(
            q, k, v, kwargs.get("attn_mask"), 0.0, kwargs.get("is_causal", False),
            scale=kwargs["scale"], enable_gqa=kwargs.get("enable_gqa", False)))
    except (RuntimeError, TypeError):
        return None
    name = _CHOICE_NAMES.get(choice)
    return None if name is None else kernel_name(name, q.device.type)


def run_pinned_once(f, case, inputs, kernel: str) -> str | None:
    """Call ``f`` (SDPA with only ``kernel`` enabled) once, untimed. With one kernel enabled
    PyTorch runs it or refuses (a RuntimeError, left to the caller), so no profiler is
    needed; None (not called) where a ``causal_lower_right`` bias may route around the
    pinned kernel: then :func:`detect_kernel` profiles a call."""
    if _asks_without_running(case, inputs.q.device) is None:
        return None
    with torch.set_grad_enabled(case.needs_grad):
        f(*_call_inputs(case, inputs))
    if inputs.q.is_cuda:
        torch.cuda.synchronize()
    return kernel_name(kernel, inputs.q.device.type)


def detect_kernel(f, case, inputs) -> str:
    """Run ``f`` once under the profiler (untimed) and name the SDPA kernel that ran."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if inputs.q.is_cuda:
        activities.append(ProfilerActivity.CUDA)
    q, k, v = _call_inputs(case, inputs)
    prof = profile(activities=activities)
    with _quiet_stderr():
        prof.start()
    try:
        with torch.set_grad_enabled(case.needs_grad):
            f(q, k, v)
        if inputs.q.is_cuda:
            torch.cuda.synchronize()
    finally:
        with _quiet_stderr():
            prof.stop()
    return kernel_from_ops(e.name for e in prof.events())


def nested_sdpa(case, device):
    """sdpa over nested jagged tensors (torch.nested, layout=torch.jagged), one component
    per document. The token-major copy in and the view out are part of the timed call (the
    rows' (B, H, N, D) layout is not the jagged one); K and V are repeated to the query heads
    (nested sdpa does not broadcast GQA heads)."""
    offsets = flat_offsets(case).to(device)  # (count + 1,)
    scale, group, causal = case.softmax_scale, case.group_size, case.mask == "causal"

    def jagged(t):  # (B, H, N, D) -> nested (count, H, j, D)
        return torch.nested.nested_tensor_from_jagged(tokens_major(t), offsets).transpose(1, 2)

    def sdpa_nested(q, k, v):
        k, v = repeat_kv(k, group), repeat_kv(v, group)  # (B, Hq, N, D|Dv)
        o = F.scaled_dot_product_attention(jagged(q), jagged(k), jagged(v), scale=scale,
                                           is_causal=causal)
        return from_tokens_major(o.transpose(1, 2).values(), q.shape[0])  # (B, Hq, N, Dv)

    return sdpa_nested


@lru_cache(maxsize=32)
def nested_problem(dtype: str, device: str, causal: bool, grad: bool) -> str:
    """Why nested jagged sdpa refuses this combination here ('' when it runs): a tiny call
    of two documents, its exception and the reasons torch logs for it."""
    import logging

    from attnbench.core.case import Case

    case = Case(batch=1, heads_q=1, heads_kv=1, seq_q=3, seq_k=3, head_dim=8, head_dim_v=8,
                dtype=dtype, device=device, mask="causal" if causal else "none",
                mode="fwd_bwd" if grad else "fwd", lengths="fixed(2)")
    said: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record):
            msg = record.getMessage().strip()
            if msg and not msg.endswith("because:") and msg not in said:
                said.append(msg)

    log = logging.getLogger("torch.nested._internal.sdpa")
    keep, propagate = Keep(), log.propagate
    log.addHandler(keep)
    log.propagate = False  # torch's own lines would reach stderr for every probe
    try:
        x = case.make_inputs()
        q, k, v = (t.detach().requires_grad_(grad) for t in (x.q, x.k, x.v))
        with torch.set_grad_enabled(grad):
            out = nested_sdpa(case, q.device)(q, k, v)
            if grad:
                torch.autograd.grad(out, (q, k, v), x.grad_out)
    except Exception as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        logged = f" ({'; '.join(said)})" if said else ""
        return (f"sdpa over nested jagged tensors (torch {torch.__version__}, "
                f"{'causal' if causal else 'no mask'}, {case.mode}): {first}{logged}")
    finally:
        log.removeHandler(keep)
        log.propagate = propagate
    return ""


def paged_sdpa(case, inputs):
    """The paged baseline: gather each sequence's pages by the block table into a
    contiguous cache (part of the timed call, as a kernel without paging pays it), then sdpa
    with each sequence's context mask. The pool is built at setup; k, v are not read."""
    pc = _paged.setup(case, inputs)
    Np = pc.block_table.shape[1] * case.page_size
    kwargs = {"scale": case.softmax_scale, "attn_mask": _paged.context_allowed(
        pc.context, case.seq_q, Np, case.mask == "causal")}  # (B, 1, Nq, Np)
    if case.heads_q != case.heads_kv:
        kwargs["enable_gqa"] = True

    gather_k = _paged.gatherer(pc.k_pool, pc.block_table)
    gather_v = _paged.gatherer(pc.v_pool, pc.block_table)

    def sdpa_paged(q, k, v):
        k, v = gather_k(), gather_v()  # (B, Hkv, Np, D|Dv)
        return F.scaled_dot_product_attention(q, k, v, **kwargs)  # (B, Hq, Nq, Dv)

    return sdpa_paged


class Sdpa(Backend):
    name = "sdpa"
    description = "torch scaled_dot_product_attention, kernel chosen by PyTorch"
    caps = Capabilities(masks=("none", "causal", "window", "block_sparse"), any_mask=True,
                        lengths=True, paged=True)

    def extra_reasons(self, case):
        if not case.lengths or case.page_size:
            return []
        why = nested_problem(case.dtype, case.device, case.mask == "causal", case.needs_grad)
        return [why] if why else []

    def build(self, case, inputs):
        if case.page_size:  # a paged cache: gathered to a contiguous one, then sdpa
            return paged_sdpa(case, inputs)
        if case.lengths:  # a packed batch: over nested jagged tensors
            return nested_sdpa(case, inputs.q.device)
        kwargs = sdpa_arguments(case, inputs.q.device)

        def sdpa(q, k, v):
            return F.scaled_dot_product_attention(q, k, v, **kwargs)

        return sdpa

    def prepare(self, case, inputs):
        f = self.build(case, inputs)
        plain = not case.lengths and not case.page_size
        kernel = (plain and chosen_kernel(case, inputs)) or detect_kernel(f, case, inputs)
        prepared = wrap_mode(f, case, inputs)
        prepared.extras["kernel"] = kernel
        return prepared


BACKENDS = [Sdpa()]
