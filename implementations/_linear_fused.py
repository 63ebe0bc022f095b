"""linear's fused CPU forwards (``native/linear_attention.cpp``): phi = elu + 1 or FAVOR+.

The eager forwards spend about a third of their time in the feature map's elementwise
passes (non-causal) or in batched 64 x 64 products (causal); the kernels compute phi 64
rows at a time (FAVOR+: the projection by the same register-blocked tiles, then the shift
and exp) into buffers in cache and feed them to the tiles. They run the fp32 CPU forward
when Dv (and FAVOR+'s m) is a multiple of 16, non-causal or causal with seq_q == seq_k.
Under autograd (``FusedLinear``) the backward is a kernel too (``linear_backward``,
``linear_causal_backward``; D also a multiple of 16), from the states the forward kept;
other dtypes and shapes keep the eager path. Which one ran is in a record's ``kernel``.
Each call shares its tasks out over the CPU threads inside the kernel, in one parallel
region (``native/cpu_pieces.h``; two for the non-causal forward over few heads).
"""

from __future__ import annotations

import torch

from attnbench.implementations import _native
from attnbench.implementations._cpu_threads import PIECES_PER_THREAD

KERNEL = "linear_attention"
ROWS = 64  # query rows per output task (the kernel's kChunk)
PANEL = 16  # features per packed projection panel (the tiles' width)


def shape_fits(case) -> bool:
    """The forms and shapes the kernels compute (the dtype, device and mode aside)."""
    kind = case.mask_spec.kind
    feats_fit = case.param("feature_map") == "elu" or (case.param("feature_map") == "favor"
                                              and case.param("num_features") % PANEL == 0)
    return (feats_fit and case.head_dim_v % PANEL == 0
            and (kind == "none" or (kind == "causal" and case.seq_q == case.seq_k)))


def grad_fits(case) -> bool:
    """The forms whose backward runs in the kernels too: D also a multiple of 16 (dq and
    dk come out of the same 16-wide tiles)."""
    return shape_fits(case) and case.head_dim % PANEL == 0


def fused_applies(case, device, dtype: torch.dtype, needs_grad: bool) -> bool:
    return (shape_fits(case) and (not needs_grad or grad_fits(case))
            and _native.applies(KERNEL, device, dtype, needs_grad=False))


def pack_projection(proj_s: torch.Tensor | None) -> torch.Tensor:
    """FAVOR+'s scaled projection W' (m, D) as the kernel's panels (m/16, D, 16), float32:
    panel p holds features 16p..16p+15 side by side; elu (None): an empty tensor."""
    if proj_s is None:
        return torch.empty(0)
    m, D = proj_s.shape
    return proj_s.to(torch.float32).reshape(m // PANEL, PANEL, D).transpose(1, 2).contiguous()


def _module():
    module, reason = _native.load(KERNEL)
    if module is None:
        raise RuntimeError(f"the fused linear kernel is unavailable: {reason}")
    return module


def _forward(q, k, v, causal, panels, half_scale, keep: bool):
    """The forward and what its backward needs (``keep``): non-causal (S, z, shift), causal
    each chunk's inclusive prefix states (S, z) and key shift; q, k, v with a contiguous
    last dim."""
    module = _module()
    B, Hq, Nq, D = q.shape
    Hkv, Dv = k.shape[1], v.shape[-1]
    feats = D if panels.numel() == 0 else panels.shape[0] * PANEL
    out = q.new_empty(B, Hq, Nq, Dv)
    if causal:
        nc = -(-Nq // ROWS)
        prefix = q.new_empty(B, Hkv, nc, feats, Dv) if keep else q.new_empty(0)
        zprefix = q.new_empty(B, Hkv, nc, feats) if keep else q.new_empty(0)
        tops = q.new_empty(B, Hkv, nc) if keep else q.new_empty(0)
        module.linear_causal_parallel(q, k, v, panels, half_scale, out, prefix, zprefix, tops,
                                      PIECES_PER_THREAD)
        return out, (prefix, zprefix, tops)
    state = q.new_empty(B, Hkv, feats, Dv)  # phi(K)^T V per kv head
    zsum = q.new_empty(B, Hkv, feats)  # sum_j phi(K_j)
    shift = q.new_empty(B, Hkv)  # FAVOR+'s key shift, at which S and z are
    module.linear_forward_parallel(q, k, v, panels, half_scale, state, zsum, shift, out,
                                   PIECES_PER_THREAD)
    return out, (state, zsum, shift)


def fused_forward(q, k, v, causal: bool = False, panels: torch.Tensor | None = None,
                  half_scale: float = 0.0) -> torch.Tensor:
    """q (B, Hq, Nq, D); k (B, Hkv, Nk, D); v (B, Hkv, Nk, Dv), fp32 CPU -> (B, Hq, Nq, Dv):
    phi(Q) (phi(K)^T V) / (phi(Q) sum_j phi(K_j)); phi = elu + 1, or FAVOR+ with ``panels``
    (``pack_projection``) and ``half_scale`` = scale / 2 (the keys' |x|^2 term);
    ``causal`` (Nq == Nk): query i sums over keys j <= i only. No autograd."""
    panels = torch.empty(0) if panels is None else panels
    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    return _forward(q, k, v, causal, panels, half_scale, keep=False)[0]


class FusedLinear(torch.autograd.Function):
    """The fused forward under autograd (``grad_fits`` forms), its backward the kernels'
    ``linear_backward`` (from the forward's S, z and key shift) or ``linear_causal_backward``
    (from each chunk's prefix states and shift). ``proj_rows`` is FAVOR+'s W' (m, D) in fp32
    (empty for elu)."""

    @staticmethod
    def forward(ctx, q, k, v, causal, panels, proj_rows, half_scale):
        q, k, v = (t.contiguous() for t in (q, k, v))
        out, saved = _forward(q, k, v, causal, panels, half_scale, keep=True)
        ctx.save_for_backward(q, k, v, out, panels, proj_rows, *saved)
        ctx.causal, ctx.half_scale = causal, half_scale
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, panels, proj_rows, *saved = ctx.saved_tensors
        dout = dout.contiguous()
        module = _module()
        grads = (torch.empty_like(q), torch.empty_like(k), torch.empty_like(v))
        backward = (module.linear_causal_backward_parallel if ctx.causal
                    else module.linear_backward_parallel)
        backward(q, k, v, panels, proj_rows, ctx.half_scale, out, dout, *saved, *grads,
                 PIECES_PER_THREAD)
        return (*grads, None, None, None, None)
