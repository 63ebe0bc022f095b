"""Float64 reference of a packed batch: attention within each document, independently.

Each document (a slice of a row, ``core/lengths.py``) is its own small self-attention
problem, computed by the chunked float64 reference (``core/reference.py``) with its own
mask (none or causal) and GQA; outputs and, with ``grad_out``, dq/dk/dv are put back in
place. No block-diagonal mask is built, so it checks the backends that build one.
"""

from __future__ import annotations

import torch

from attnbench.core.masks import MaskSpec
from attnbench.core.reference import RefResult, softmax_reference


def varlen_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rows, causal: bool,
                     scale: float | None = None, grad_out: torch.Tensor | None = None
                     ) -> RefResult:
    """q (B, Hq, N, D), k (B, Hkv, N, D), v (B, Hkv, N, Dv); ``rows[b]`` the lengths of row
    b's documents (summing to N). Float64 results of the same shapes."""
    B, Hq, N, _ = q.shape
    mask = MaskSpec.parse("causal" if causal else "none")
    out = torch.zeros(B, Hq, N, v.shape[-1], dtype=torch.float64, device=q.device)
    grads = [torch.zeros(t.shape, dtype=torch.float64, device=t.device) for t in (q, k, v)]
    for b, row in enumerate(rows):
        if sum(row) != N:
            raise ValueError(f"row {b}'s documents hold {sum(row)} tokens, the row {N}")
        start = 0
        for n in row:
            s = slice(start, start + n)
            start += n
            doc = softmax_reference(q[b:b + 1, :, s], k[b:b + 1, :, s], v[b:b + 1, :, s], mask,
                                    scale, None if grad_out is None else grad_out[b:b + 1, :, s])
            out[b:b + 1, :, s] = doc.out
            if grad_out is not None:
                for g, d in zip(grads, (doc.dq, doc.dk, doc.dv)):
                    g[b:b + 1, :, s] = d
    if grad_out is None:
        return RefResult(out)
    return RefResult(out, *grads)


def case_varlen_reference(case, inputs, need_grads: bool) -> RefResult:
    """The reference of a case with ``lengths``: its documents drawn from its seed."""
    from attnbench.core import lengths

    rows = lengths.draw(case.lengths, case.batch, case.seq_q, case.seed)
    return varlen_reference(inputs.q, inputs.k, inputs.v, rows, case.mask == "causal",
                            case.softmax_scale, inputs.grad_out if need_grads else None)
