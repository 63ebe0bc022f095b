"""linear's fused CPU forward for phi = elu + 1, non-causal (``native/linear_attention.cpp``).

The eager forward (``linear._global_stream``) spends about a third of its time in the
feature map's elementwise passes; the kernel computes phi 64 rows at a time into a buffer
in L1 and feeds it to register-blocked tiles. It runs the fp32 CPU forward without
autograd when Dv is a multiple of 16; FAVOR+, the causal form, autograd and other dtypes
keep the eager path. Which one ran is in a record's ``kernel``.
"""

from __future__ import annotations

import torch

from attnbench.implementations import _native
from attnbench.implementations._cpu_threads import split_work

KERNEL = "linear_attention"
ROWS = 64  # query rows per output task (the kernel's kChunk)


def fused_applies(case, device, dtype: torch.dtype, needs_grad: bool) -> bool:
    return (case.feature_map == "elu" and case.mask_spec.kind == "none"
            and case.head_dim_v % 16 == 0 and _native.applies(KERNEL, device, dtype, needs_grad))


def fused_forward(q, k, v) -> torch.Tensor:
    """q (B, Hq, Nq, D); k (B, Hkv, Nk, D); v (B, Hkv, Nk, Dv), fp32 CPU -> (B, Hq, Nq, Dv):
    phi(Q) (phi(K)^T V) / (phi(Q) sum_j phi(K_j)) with phi = elu + 1."""
    module, reason = _native.load(KERNEL)
    if module is None:
        raise RuntimeError(f"the fused linear kernel is unavailable: {reason}")
    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    B, Hq, Nq, D = q.shape
    Hkv, Dv = k.shape[1], v.shape[-1]
    state = q.new_empty(B, Hkv, D, Dv)  # phi(K)^T V per kv head
    zsum = q.new_empty(B, Hkv, D)  # sum_j phi(K_j)
    out = q.new_empty(B, Hq, Nq, Dv)
    split_work(lambda lo, hi: module.linear_elu_state(k, v, state, zsum, lo, hi), B * Hkv,
               q.device)
    blocks = -(-Nq // ROWS)
    split_work(lambda lo, hi: module.linear_elu_output(q, state, zsum, out, lo, hi),
               B * Hq * blocks, q.device)
    return out
