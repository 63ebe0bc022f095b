"""linear's fused CPU forwards for phi = elu + 1 (``native/linear_attention.cpp``).

The eager forwards spend about a third of their time in the feature map's elementwise
passes (non-causal) or in batched 64 x 64 products (causal); the kernels compute phi 64
rows at a time into buffers in L1 and feed them to register-blocked tiles. They run the
fp32 CPU forward without autograd when Dv is a multiple of 16, non-causal or causal with
seq_q == seq_k; FAVOR+, autograd, other dtypes and shapes keep the eager path. Which one
ran is in a record's ``kernel``.
"""

from __future__ import annotations

import torch

from attnbench.implementations import _native
from attnbench.implementations._cpu_threads import split_work

KERNEL = "linear_attention"
ROWS = 64  # query rows per output task (the kernel's kChunk)


def shape_fits(case) -> bool:
    """The forms and shapes the kernels compute (the dtype, device and mode aside)."""
    kind = case.mask_spec.kind
    return (case.feature_map == "elu" and case.head_dim_v % 16 == 0
            and (kind == "none" or (kind == "causal" and case.seq_q == case.seq_k)))


def fused_applies(case, device, dtype: torch.dtype, needs_grad: bool) -> bool:
    return shape_fits(case) and _native.applies(KERNEL, device, dtype, needs_grad)


def fused_forward(q, k, v, causal: bool = False) -> torch.Tensor:
    """q (B, Hq, Nq, D); k (B, Hkv, Nk, D); v (B, Hkv, Nk, Dv), fp32 CPU -> (B, Hq, Nq, Dv):
    phi(Q) (phi(K)^T V) / (phi(Q) sum_j phi(K_j)) with phi = elu + 1; ``causal`` (Nq == Nk):
    query i sums over keys j <= i only."""
    module, reason = _native.load(KERNEL)
    if module is None:
        raise RuntimeError(f"the fused linear kernel is unavailable: {reason}")
    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    B, Hq, Nq, D = q.shape
    Hkv, Dv = k.shape[1], v.shape[-1]
    out = q.new_empty(B, Hq, Nq, Dv)
    if causal:
        split_work(lambda lo, hi: module.linear_elu_causal(q, k, v, out, lo, hi), B * Hq,
                   q.device)
        return out
    state = q.new_empty(B, Hkv, D, Dv)  # phi(K)^T V per kv head
    zsum = q.new_empty(B, Hkv, D)  # sum_j phi(K_j)
    split_work(lambda lo, hi: module.linear_elu_state(k, v, state, zsum, lo, hi), B * Hkv,
               q.device)
    blocks = -(-Nq // ROWS)
    split_work(lambda lo, hi: module.linear_elu_output(q, state, zsum, out, lo, hi),
               B * Hq * blocks, q.device)
    return out
