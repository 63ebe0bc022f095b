"""Float64 references, computed over query-row chunks so memory stays O(chunk x seq_k).

A row of attention output depends only on its own query row and on all of K and V,
so the output (and, by per-chunk autograd, dq/dk/dv) can be assembled chunk by chunk
without ever holding the full (seq_q, seq_k) score matrix.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from attnbench.core.host_memory import release_freed
from attnbench.core.masks import Geometry, MaskSpec, allowed_rows

# Bytes of float64 temporaries one chunk may hold (scores, probabilities, their grads).
# On a GPU a larger chunk keeps the many small launches of a long reference off the
# critical path; memory is still O(chunk x seq_k), never O(seq_q x seq_k).
CHUNK_BUDGET_BYTES = 64 * 2**20
CUDA_CHUNK_BUDGET_BYTES = 1024 * 2**20


@dataclass
class RefResult:
    out: torch.Tensor  # (B, Hq, Nq, Dv) float64
    dq: torch.Tensor | None = None
    dk: torch.Tensor | None = None
    dv: torch.Tensor | None = None

    def as_dict(self) -> dict[str, torch.Tensor]:
        return {n: t for n, t in (("out", self.out), ("dq", self.dq), ("dk", self.dk),
                                  ("dv", self.dv)) if t is not None}


# fn(q_rows (B,Hq,R,D), k (B,Hkv,Nk,D), v (B,Hkv,Nk,Dv), row0, row1) -> out rows (B,Hq,R,Dv)
RowFunction = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, int, int], torch.Tensor]


def chunk_rows(batch: int, heads: int, seq_k: int, width: int = 1,
               budget: int = CHUNK_BUDGET_BYTES) -> int:
    """Query rows per chunk so that ~4 float64 (B, H, rows, seq_k * width) temporaries fit."""
    per_row = 4 * 8 * batch * heads * seq_k * width
    return max(1, min(4096, budget // max(per_row, 1)))


def chunked_reference(row_fn: RowFunction, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                      grad_out: torch.Tensor | None = None, rows_per_chunk: int | None = None
                      ) -> RefResult:
    """Evaluate ``row_fn`` in float64 chunk by chunk; gradients too when ``grad_out`` is given."""
    B, Hq, Nq, _ = q.shape
    Nk = k.shape[2]
    budget = CUDA_CHUNK_BUDGET_BYTES if q.device.type == "cuda" else CHUNK_BUDGET_BYTES
    rows = rows_per_chunk or chunk_rows(B, Hq, Nk, budget=budget)
    q64, k64, v64 = (t.detach().to(torch.float64) for t in (q, k, v))
    want_grad = grad_out is not None
    trim = q.device.type == "cpu"  # each chunk's freed temporaries back to the OS
    if want_grad:
        k64.requires_grad_(True)
        v64.requires_grad_(True)
        go64 = grad_out.detach().to(torch.float64)
        dq = torch.zeros_like(q64)
        dk = torch.zeros_like(k64)
        dv = torch.zeros_like(v64)
    outs = []
    for r0 in range(0, Nq, rows):
        r1 = min(Nq, r0 + rows)
        qc = q64[:, :, r0:r1]  # (B, Hq, R, D)
        if not want_grad:
            with torch.no_grad():
                outs.append(row_fn(qc, k64, v64, r0, r1))
            if trim:
                release_freed()
            continue
        qc = qc.clone().requires_grad_(True)
        with torch.enable_grad():
            oc = row_fn(qc, k64, v64, r0, r1)  # (B, Hq, R, Dv)
            gq, gk, gv = torch.autograd.grad(oc, (qc, k64, v64), go64[:, :, r0:r1],
                                             allow_unused=True)
        outs.append(oc.detach())
        if gq is not None:
            dq[:, :, r0:r1] = gq
        if gk is not None:
            dk += gk
        if gv is not None:
            dv += gv
        if trim:
            release_freed()
    out = torch.cat(outs, dim=2) if outs else q64.new_zeros(B, Hq, 0, v.shape[-1])
    if not want_grad:
        return RefResult(out)
    return RefResult(out, dq, dk.detach(), dv.detach())


def masked_softmax(scores: torch.Tensor, allowed: torch.Tensor | None) -> torch.Tensor:
    """Softmax over the last dim keeping only ``allowed`` (broadcast) entries, differentiable.

    Rows with no allowed entry give zeros rather than NaN (FlashAttention's convention).
    """
    if allowed is not None:
        scores = scores.masked_fill(~allowed, -math.inf)
    m = scores.amax(dim=-1, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m)).detach()
    p = torch.exp(scores - m)  # masked entries are exp(-inf) = 0
    denom = p.sum(dim=-1, keepdim=True)
    return p / torch.where(denom > 0, denom, torch.ones_like(denom))


def _visible_columns(mask: MaskSpec, r0: int, r1: int, seq_q: int, seq_k: int
                     ) -> tuple[int, int]:
    """Key range [lo, hi) that rows [r0, r1) can see, as the mask's kind declares it: a
    band's reference costs O(N * window)."""
    lo, hi = mask.declaration.columns(mask, Geometry(seq_q, seq_k), r0, r1)
    if lo >= hi:  # no row sees anything: keep one (masked) key so the shapes stay valid
        lo, hi = min(lo, seq_k - 1), min(lo, seq_k - 1) + 1
    return lo, hi


def softmax_rows(mask: MaskSpec, scale: float, seq_q: int, seq_k: int,
                 layout: torch.Tensor | None = None, block_size: int = 64) -> RowFunction:
    """Row function of exact softmax attention with a mask; GQA by grouping query heads.

    Rows that see no key at all produce zeros (FlashAttention's convention).
    """

    def fn(qc, k, v, r0, r1):
        B, Hq, R, D = qc.shape
        Hkv = k.shape[1]
        G = Hq // Hkv
        lo, hi = _visible_columns(mask, r0, r1, seq_q, seq_k)
        k, v = k[:, :, lo:hi], v[:, :, lo:hi]  # only keys some row of the chunk can see
        qg = qc.reshape(B, Hkv, G, R, D)  # (B, Hkv, G, R, D)
        s = torch.matmul(qg, k.unsqueeze(2).transpose(-1, -2)) * scale  # (B, Hkv, G, R, Nk')
        allowed = allowed_rows(mask, r0, r1, seq_q, seq_k, qc.device, layout, block_size)
        p = masked_softmax(s, None if allowed is None else allowed[:, lo:hi])
        o = torch.matmul(p, v.unsqueeze(2))  # (B, Hkv, G, R, Dv)
        return o.reshape(B, Hq, R, v.shape[-1])

    return fn


def softmax_reference(q, k, v, mask: MaskSpec, scale: float | None = None,
                      grad_out: torch.Tensor | None = None, layout: torch.Tensor | None = None,
                      block_size: int = 64) -> RefResult:
    """Exact softmax attention in float64 for any mask, GQA, cross-attention and d_v != d_k."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    fn = softmax_rows(mask, scale, q.shape[2], k.shape[2], layout, block_size)
    return chunked_reference(fn, q, k, v, grad_out)


def case_reference(case, inputs, need_grads: bool | None = None) -> RefResult:
    """Exact softmax reference of a case (its mask, its block layout)."""
    grads = case.needs_grad if need_grads is None else need_grads
    if case.page_size:  # a paged decode step: each sequence against its own context
        return case_paged_reference(case, inputs)
    if case.lengths:  # a packed batch: each document on its own
        return case_varlen_reference(case, inputs, grads)
    return softmax_reference(inputs.q, inputs.k, inputs.v, case.mask_spec, case.softmax_scale,
                             grad_out=inputs.grad_out if grads else None,
                             layout=case.block_layout, block_size=case.param("block_size"))


# A packed batch: each document (a slice of a row, core/lengths.py) is its own small problem,
# computed by the chunked reference with its own mask and put back in place; no
# block-diagonal mask is built, so it checks the backends that build one.
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


# A paged decode step: read from the logical cache (the case's contiguous k, v), never from
# the pool, so it checks the backends that read through a page table; sequence b's queries
# see its first context[b] keys (bottom-right aligned when causal), as core/paging.py says.
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
