"""Float64 reference of a paged decode step: each sequence against its own context.

Read from the logical cache (the case's contiguous k, v), never from the pool, so it
checks the backends that read through a page table. Sequence b's ``seq_q`` queries see its
first ``context[b]`` keys (bottom-right aligned when causal), as ``core/paging.py`` says.
"""

from __future__ import annotations

import torch

from attnbench.core.masks import MaskSpec
from attnbench.core.reference import RefResult, softmax_reference


def paged_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, context, causal: bool,
                    scale: float | None = None) -> RefResult:
    """q (B, Hq, Nq, D), k (B, Hkv, Nk, D), v (B, Hkv, Nk, Dv); ``context[b]`` the keys
    sequence b holds. Float64 output (B, Hq, Nq, Dv)."""
    B, Hq, Nq, _ = q.shape
    out = torch.zeros(B, Hq, Nq, v.shape[-1], dtype=torch.float64, device=q.device)
    for b, n in enumerate(context):
        mask = MaskSpec.parse("causal" if causal else "none").clamped(Nq, n)
        out[b:b + 1] = softmax_reference(q[b:b + 1], k[b:b + 1, :, :n], v[b:b + 1, :, :n],
                                         mask, scale).out
    return RefResult(out)


def case_paged_reference(case, inputs) -> RefResult:
    from attnbench.core.paging import context_lengths

    return paged_reference(inputs.q, inputs.k, inputs.v, context_lengths(case),
                           case.mask == "causal", case.softmax_scale)
