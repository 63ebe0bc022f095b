"""sparsemax: attention with sparsemax in place of softmax (Martins & Astudillo 2016).

``out = sparsemax(scale * Q K^T) V`` where ``sparsemax(z) = argmin_{p in simplex} ||p - z||``
is the Euclidean projection onto the probability simplex: ``p_j = max(z_j - tau, 0)`` with
the threshold ``tau`` chosen so that the row sums to 1. Unlike softmax it gives exact zeros
("Transformers and Attention 13", section 4.4, names it as the alternative to softmax's
"everything gets some weight"). It is another function altogether (semantics DIFFERENT):
``err_impl`` is measured against its own float64 reference, ``err_vs_softmax`` stays empty.

The backend is textbook and O(N^2) like ``naive``: full (Nq, Nk) scores, ``tau`` by the
paper's sort-based Algorithm 1 over the largest scores only (a partial sort, widened until
it holds every row's support), the backward by autograd through it (the support is
piecewise constant, so autograd gives the exact Jacobian ``diag(s) - s s^T / |s|``). The
float64 reference finds ``tau`` another way, by bisection on ``sum_j max(z_j - tau, 0) = 1``,
then the closed form over the support found, chunk by chunk over query rows. Masks as
``naive``: masked keys get no weight; rows that see no key give 0. fp16/bf16 inputs are
computed in fp32.
"""

from __future__ import annotations

import torch

from attnbench.core.backend import DIFFERENT, Backend, Capabilities
from attnbench.core.heads import repeat_kv
from attnbench.core.masks import allowed_rows
from attnbench.core.reference import RefResult, chunked_reference

BISECTION_STEPS = 64  # halvings of an interval of width 1: below float64's resolution
FIRST_TOP = 64  # entries sorted first; attention rows' supports are usually far smaller


def sparsemax_sorted(z: torch.Tensor, top: int = FIRST_TOP) -> torch.Tensor:
    """Sparsemax over the last dim by sorting (Martins & Astudillo 2016, Algorithm 1).

    With z sorted descending, the support size is ``k(z) = max{k : 1 + k z_(k) > sum_{j<=k}
    z_(j)}`` (the condition holds exactly for ``k <= k(z)``) and ``tau = (sum_{j<=k(z)}
    z_(j) - 1) / k(z)``. Only the ``top`` largest entries are sorted (``torch.topk``): if
    every row's support is smaller, that is all Algorithm 1 reads; otherwise ``top`` doubles
    and the rows are sorted again (the entmax package's partial sort, Peters et al. 2019).
    Entries of -inf (masked) never enter the support; every row needs a finite entry."""
    n = z.shape[-1]
    top = max(1, min(top, n))
    while True:
        zs = torch.topk(z, top, dim=-1, sorted=True).values  # (..., top) descending
        cums = zs.cumsum(dim=-1) - 1  # (..., top): sum_{j<=k} z_(j) - 1
        ks = torch.arange(1, top + 1, device=z.device, dtype=z.dtype)
        size = (ks * zs > cums).sum(dim=-1, keepdim=True)  # (..., 1): min(k(z), top)
        if top == n or bool((size < top).all()):
            break
        top = min(2 * top, n)
    tau = cums.gather(-1, size - 1) / size  # (..., 1)
    return torch.relu(z - tau)  # relu: a zero entry passes no gradient, as in the Jacobian


def sparsemax_bisect(z: torch.Tensor, steps: int = BISECTION_STEPS) -> torch.Tensor:
    """Sparsemax over the last dim by bisection on tau (a different algorithm from the
    backend's, for the reference): ``sum max(z - tau, 0)`` falls from >= 1 at ``max z - 1``
    to 0 at ``max z``. The support found fixes the closed form ``tau = (sum_S z - 1) / |S|``,
    which autograd differentiates exactly. Every row needs one finite entry."""
    hi = z.amax(dim=-1, keepdim=True).detach()  # (..., 1): total mass 0 here
    lo = hi - 1  # total mass >= 1 here
    zd = z.detach()
    for _ in range(steps):
        mid = (lo + hi) / 2
        heavy = (zd - mid).clamp(min=0).sum(dim=-1, keepdim=True) >= 1
        lo = torch.where(heavy, mid, lo)
        hi = torch.where(heavy, hi, mid)
    support = zd > lo  # (..., n): the entries above the threshold
    size = support.sum(dim=-1, keepdim=True)
    tau = (torch.where(support, z, torch.zeros_like(z)).sum(dim=-1, keepdim=True) - 1) / size
    return torch.where(support, z - tau, torch.zeros_like(z))


def _masked_sparsemax(s: torch.Tensor, allowed: torch.Tensor | None, fn) -> torch.Tensor:
    """``fn`` over the last dim of scores ``s`` keeping ``allowed`` (broadcast) entries;
    rows with no allowed entry give 0."""
    if allowed is None:
        return fn(s)
    empty = ~allowed.any(dim=-1, keepdim=True)  # (R, 1) rows that see nothing
    s = s.masked_fill(~allowed, float("-inf")).masked_fill(empty, 0.0)
    return fn(s).masked_fill(empty, 0.0)


def sparsemax_rows(case):
    """Row function of sparsemax attention in float64, for ``chunked_reference``."""
    spec, scale = case.mask_spec, case.softmax_scale

    def fn(qc, k, v, r0, r1):
        B, Hq, R, D = qc.shape
        Hkv = k.shape[1]
        qg = qc.reshape(B, Hkv, Hq // Hkv, R, D)  # (B, Hkv, G, R, D)
        s = torch.matmul(qg, k.unsqueeze(2).transpose(-1, -2)) * scale  # (B, Hkv, G, R, Nk)
        allowed = allowed_rows(spec, r0, r1, case.seq_q, case.seq_k, qc.device,
                               case.block_layout, case.param("block_size"))  # (R, Nk) or None
        p = _masked_sparsemax(s, allowed, sparsemax_bisect)
        return torch.matmul(p, v.unsqueeze(2)).reshape(B, Hq, R, v.shape[-1])  # (B, Hq, R, Dv)

    return fn


class Sparsemax(Backend):
    name = "sparsemax"
    description = ("sparsemax(Q K^T * scale) V with the full score matrix: sparsemax by "
                   "partial sort in place of softmax, autograd backward; O(N^2)")
    caps = Capabilities(masks=("none", "causal", "window", "block_sparse"))
    semantics = DIFFERENT

    def work_flops(self, case):
        """Visible pairs' matmuls as for softmax attention (the sort is not counted)."""
        return case.flops

    def build(self, case, inputs):
        allowed = allowed_rows(case.mask_spec, 0, case.seq_q, case.seq_q, case.seq_k,
                               inputs.q.device, case.block_layout,
                               case.param("block_size"))  # (Nq, Nk)
        scale, group = case.softmax_scale, case.group_size
        cdt = torch.float64 if case.dtype == "float64" else torch.float32

        def sparsemax(q, k, v):
            k, v = repeat_kv(k.to(cdt), group), repeat_kv(v.to(cdt), group)  # (B, Hq, Nk, .)
            s = torch.matmul(q.to(cdt) * scale, k.transpose(-1, -2))  # (B, Hq, Nq, Nk)
            p = _masked_sparsemax(s, allowed, sparsemax_sorted)
            return torch.matmul(p, v).to(q.dtype)  # (B, Hq, Nq, Dv)

        return sparsemax

    def impl_reference(self, case, inputs) -> RefResult:
        return chunked_reference(sparsemax_rows(case), inputs.q, inputs.k, inputs.v,
                                 inputs.grad_out if case.needs_grad else None)


BACKENDS = [Sparsemax()]
