"""flex: ``torch.nn.attention.flex_attention`` compiled with ``torch.compile``.

Masks are ``mask_mod`` functions turned into a ``BlockMask`` by ``create_block_mask``:
each is its kind's ``visible(q_idx, kv_idx)`` (core/masks/), so any declared kind runs here;
block-sparse layouts are the case's (n_q_blocks, n_k_blocks) layout, the one the
block_sparse backend uses, put on the device once. GQA through ``enable_gqa``. A packed batch
(``lengths``) gets a document mask read from a (B, N) document-id tensor built from the
offsets, one BlockMask per row. A paged cache (``page_size``) is read in place: K and V are
the whole pool, and the mask translates each pool slot to its sequence's logical position
through the inverse of the block table (``paged_flex``), so the BlockMask skips every pool
block sequence b does not own.

Compilation happens once per (shape, mask) in ``prepare``: the first call (forward, plus
backward in backward modes) is timed on its own and recorded as ``compile_s``; the timed
closure only ever hits the compiled code. Rows that see no key give 0 (as the reference).

Limits (torch 2.13): on CPU inductor's flex template runs inference only (no backward)
in float32 / float16 / bfloat16, needs AVX2 and a C++ compiler; on CUDA the Triton
template needs head dims >= 16.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import sys
import time

import torch

from attnbench.core.backend import ALL_MASKS, Backend, Capabilities, wrap_mode
from attnbench.core.masks import Geometry
from attnbench.implementations import _paged
from attnbench.implementations._varlen import document_ids

# Per device type: dtypes, modes and smallest head dim the compiled kernel accepts.
DEVICE_LIMITS = {
    "cpu": {"dtypes": ("float32", "float16", "bfloat16"), "modes": ("fwd",), "head_dim_min": 1},
    "cuda": {"dtypes": ("float32", "float16", "bfloat16"), "modes": ("fwd", "bwd", "fwd_bwd"),
             "head_dim_min": 16},
}

# Enough compiled variants of flex_attention for a whole sweep in one process: past
# dynamo's recompile limit (8 by default) it would silently run flex eagerly.
RECOMPILE_LIMIT = 256

_compiled = None


def compiled_flex():
    """The process-wide ``torch.compile(flex_attention)`` (shape-specialized)."""
    global _compiled
    if _compiled is None:
        from torch.nn.attention.flex_attention import flex_attention

        cfg = torch._dynamo.config
        cfg.recompile_limit = max(cfg.recompile_limit, RECOMPILE_LIMIT)
        _compiled = torch.compile(flex_attention, dynamic=False)
    return _compiled


def mask_mod_for(case, device):
    """The case's mask as a flex ``mask_mod(b, h, q_idx, kv_idx) -> bool`` read from its
    kind's ``visible`` (any declared kind); None when it masks nothing."""
    if case.lengths:
        return document_mask_mod(case, device)
    spec = case.mask_spec
    if spec.unmasked:
        return None
    layout = case.block_layout  # (n_qb, n_kb) or None
    # On the device once: the traced mask_mod then indexes a captured tensor, no copy.
    layout = None if layout is None else layout.to(device=device, dtype=torch.bool)
    geom = Geometry(case.seq_q, case.seq_k, case.param("block_size"), layout)
    visible = spec.declaration.visible

    def mask_mod(b, h, q_idx, kv_idx):
        return visible(spec, geom, q_idx, kv_idx)

    return mask_mod


def document_mask_mod(case, device):
    """A packed batch's mask: query and key in one document of their row (from the offsets,
    as a (B, N) document-id tensor), and the kind's ``visible`` on the row (causal: key <=
    query); lengths allow only the kinds that declare ``per_document``."""
    doc = document_ids(case, device)  # (B, N)
    spec = case.mask_spec
    if spec.unmasked:
        def document(b, h, q_idx, kv_idx):
            return doc[b, q_idx] == doc[b, kv_idx]

        return document
    geom, visible = Geometry(case.seq_q, case.seq_k), spec.declaration.visible

    def document(b, h, q_idx, kv_idx):
        return (doc[b, q_idx] == doc[b, kv_idx]) & visible(spec, geom, q_idx, kv_idx)

    return document


@functools.cache  # a property of the process: a plan asks it of every case
def _cpu_compile_problem() -> str:
    """Why inductor cannot compile flex for CPU here ('' when it can)."""
    if sys.platform == "darwin":
        return "inductor's CPU flex_attention is not supported on macOS"
    try:
        avx2 = torch.cpu._is_avx2_supported()
    except Exception:
        avx2 = True
    if not avx2 or os.environ.get("ATEN_CPU_CAPABILITY") == "default":
        return "inductor's CPU flex_attention needs AVX2 (and ATEN_CPU_CAPABILITY != default)"
    try:
        from torch._inductor import cpp_builder

        cpp_builder.get_cpp_compiler()
    except Exception as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        return f"no C++ compiler for inductor's CPU code ({first})"
    return ""


class Flex(Backend):
    name = "flex"
    description = "FlexAttention (torch.compile'd flex_attention) with BlockMask masks"
    caps = Capabilities(
        devices=tuple(DEVICE_LIMITS),
        dtypes=("float32", "float16", "bfloat16"),
        masks=ALL_MASKS,
        any_mask=True,
        lengths=True,
        paged=True,
    )

    def is_available(self):
        if importlib.util.find_spec("torch.nn.attention.flex_attention") is None:
            return False, f"torch {torch.__version__} has no torch.nn.attention.flex_attention"
        return True, ""

    def extra_reasons(self, case):
        dev = torch.device(case.device).type
        lim = DEVICE_LIMITS.get(dev)
        if lim is None:
            return []
        out = []
        if case.dtype in self.caps.dtypes and case.dtype not in lim["dtypes"]:
            out.append(f"dtype {case.dtype} not supported on {dev}")
        if case.mode not in lim["modes"]:
            out.append(f"mode {case.mode}: FlexAttention does not support backward on {dev}")
        if min(case.head_dim, case.head_dim_v) < lim["head_dim_min"]:
            out.append(f"head dims must be >= {lim['head_dim_min']} on {dev} "
                       f"(got {case.head_dim}, {case.head_dim_v})")
        if dev == "cpu":
            problem = _cpu_compile_problem()
            if problem:
                out.append(problem)
        if dev == "cuda" and importlib.util.find_spec("triton") is None:
            out.append("triton is not installed (torch.compile needs it on CUDA)")
        return out

    def kernel(self):
        """The flex_attention callable the wrapper calls: the compiled one. Tests swap in
        eager ``flex_attention`` to check the wrapper (mask mods, GQA, scale, alignment)
        without asserting anything about the host's inductor code."""
        return compiled_flex()

    def build(self, case, inputs):
        from torch.nn.attention.flex_attention import create_block_mask

        if case.page_size:
            return paged_flex(case, inputs, self.kernel())
        device = inputs.q.device
        mask_mod = mask_mod_for(case, device)
        block_mask = None
        if mask_mod is not None:
            rows = case.batch if case.lengths else None  # documents differ from row to row
            block_mask = create_block_mask(mask_mod, rows, None, case.seq_q, case.seq_k,
                                           device=device)
        scale, gqa = case.softmax_scale, case.heads_q != case.heads_kv
        flex = self.kernel()

        def flex_fn(q, k, v):
            return flex(q, k, v, block_mask=block_mask, scale=scale,
                        enable_gqa=gqa)  # (B, Hq, Nq, Dv)

        return flex_fn

    def prepare(self, case, inputs):
        f = self.build(case, inputs)
        compile_s = _first_call(f, case, inputs)
        prepared = wrap_mode(f, case, inputs)
        prepared.extras["compile_s"] = compile_s
        return prepared


def paged_mask_mod(case, pc):
    """mask_mod over the pool's slots: slot kv_idx is page kv_idx // page_size; sequence b
    sees it iff b owns that page, its logical position is inside b's context, and (causal)
    not past query i's position (bottom-right aligned on the context)."""
    p2l = _paged.physical_to_logical(pc)  # (B, P)
    ctx = pc.context  # (B,)
    ps, nq, causal = case.page_size, case.seq_q, case.mask == "causal"

    def paged(b, h, q_idx, kv_idx):
        page = p2l[b, kv_idx // ps]
        logical = page * ps + kv_idx % ps
        ok = (page >= 0) & (logical < ctx[b])
        if causal:
            ok = ok & (logical <= q_idx + ctx[b] - nq)
        return ok

    return paged


def paged_flex(case, inputs, flex):
    """flex over the pool in place: K, V (1, Hkv, P * page_size, D) broadcast over the
    batch, the block table's translation in the mask (``paged_mask_mod``). The pool is
    built at setup and put in flex's head-major layout there; k, v are not read."""
    from torch.nn.attention.flex_attention import create_block_mask

    pc = _paged.setup(case, inputs)
    P, ps, H, _ = pc.k_pool.shape
    kp = pc.k_pool.reshape(P * ps, H, -1).transpose(0, 1)[None].contiguous()  # (1, Hkv, S, D)
    vp = pc.v_pool.reshape(P * ps, H, -1).transpose(0, 1)[None].contiguous()  # (1, Hkv, S, Dv)
    B = case.batch
    block_mask = create_block_mask(paged_mask_mod(case, pc), B, None, case.seq_q, P * ps,
                                   device=inputs.q.device)
    scale, gqa = case.softmax_scale, case.heads_q != case.heads_kv

    def flex_paged(q, k, v):
        return flex(q, kp.expand(B, -1, -1, -1), vp.expand(B, -1, -1, -1),
                    block_mask=block_mask, scale=scale, enable_gqa=gqa)  # (B, Hq, Nq, Dv)

    return flex_paged


def _first_call(f, case, inputs) -> float:
    """Compile by calling once (forward, and backward in backward modes); seconds taken."""
    q, k, v = (t.detach().requires_grad_(case.needs_grad) for t in (inputs.q, inputs.k,
                                                                      inputs.v))
    sync = torch.cuda.synchronize if inputs.q.is_cuda else (lambda: None)
    try:  # past the recompile limit, fail loudly rather than time eager flex
        patch = torch._dynamo.config.patch(fail_on_recompile_limit_hit=True)
    except Exception:
        patch = None
    t0 = time.perf_counter()
    if patch is not None:
        patch.__enter__()
    try:
        with torch.set_grad_enabled(case.needs_grad):
            out = f(q, k, v)
            if case.needs_grad:
                torch.autograd.grad(out, (q, k, v), inputs.grad_out)
        sync()
    finally:
        if patch is not None:
            patch.__exit__(None, None, None)
    return time.perf_counter() - t0


BACKENDS = [Flex()]
