"""linformer: softmax attention over K and V projected along the sequence (Wang et al. 2020).

``out = softmax(scale * Q (E K)^T) (F V)`` with E, F of shape (k, seq_k): the seq_k keys
and values are mixed into k = ``case.param("linformer_k")`` rows (256 by default, the paper's usual
choice), so scores are (Nq, k) and time and memory are O(N k) instead of O(N^2). One E and
one F serve every head and batch element (the paper's headwise sharing).

E and F stand for learned projections, which a benchmark has not trained: they are drawn
from ``case.seed`` (their own stream, not the inputs'), entries N(0, 1 / seq_k), so that a
projected key row has about the scale of one key. Untrained, the result is a rough
approximation of softmax attention: ``err_vs_softmax`` records how rough, ``err_impl`` is
measured against the float64 evaluation of this same formula with the same E and F
(:meth:`Linformer.impl_reference`). fp16/bf16 inputs are computed in fp32, float64 in
float64. The projection mixes all positions, so only the unmasked case is defined (a
causal Linformer is not: a projected row would carry future keys).
"""

from __future__ import annotations

import torch

from attnbench.core import knobs
from attnbench.core.backend import APPROXIMATE, Backend, Capabilities
from attnbench.core.case import MODE_FLOP_FACTOR
from attnbench.core.masks import MaskSpec
from attnbench.core.reference import RefResult, softmax_reference

_SEED_SALT = 0x11F0A  # projections come from another stream than the inputs


def projections(case, device=None, dtype=torch.float64) -> tuple[torch.Tensor, torch.Tensor]:
    """(E, F), each (k, seq_k), deterministic in ``case.seed``; N(0, 1/seq_k) entries."""
    gen = torch.Generator().manual_seed(case.seed * 1_000_003 + _SEED_SALT)
    shape = (case.param("linformer_k"), case.seq_k)
    std = case.seq_k ** -0.5
    e = torch.randn(*shape, generator=gen, dtype=torch.float64) * std
    f = torch.randn(*shape, generator=gen, dtype=torch.float64) * std
    return e.to(device=device or "cpu", dtype=dtype), f.to(device=device or "cpu", dtype=dtype)


# The (rows, k) scores of every query row at once leave a CPU's last-level cache as N grows
# (B=1, H=8, k=256: 32 MiB at N = 4K), and then each row costs more than the last, so the
# time grows faster than the O(N k) work. On CPU the query rows go in blocks whose scores
# fit SCORE_BLOCK_BYTES. A GPU takes all rows in one launch.
SCORE_BLOCK_BYTES = {"cpu": 4 * 2**20}


def block_rows(case, device: torch.device, itemsize: int) -> int | None:
    """Query rows per block of scores on this device (None: all rows at once)."""
    budget = SCORE_BLOCK_BYTES.get(torch.device(device).type)
    if budget is None:
        return None
    return max(1, budget // (case.batch * case.heads_kv * case.param("linformer_k") * itemsize))


def linformer_attention(q, k, v, e, f, scale: float, rows: int | None = None) -> torch.Tensor:
    """q (B, Hq, Nq, D); k (B, Hkv, Nk, D); v (B, Hkv, Nk, Dv); e, f (kp, Nk).

    Returns (B, Hq, Nq, Dv). The G query heads of a K/V head share its projected rows, so
    they are folded into the rows of one matmul (no K/V repeat); ``rows``: that many of
    those rows per block of scores (None: all at once)."""
    B, Hq, Nq, D = q.shape
    Hkv, Dv = k.shape[1], v.shape[-1]
    kp = torch.matmul(e, k)  # (B, Hkv, kp, D)
    vp = torch.matmul(f, v)  # (B, Hkv, kp, Dv)
    qg = q.reshape(B, Hkv, (Hq // Hkv) * Nq, D)  # (B, Hkv, G*Nq, D)
    kp_t = kp.transpose(-1, -2)  # (B, Hkv, D, kp)
    step = rows or qg.shape[2]
    blocks = []
    for i in range(0, qg.shape[2], step):
        s = torch.matmul(qg[:, :, i:i + step], kp_t).mul_(scale)  # (B, Hkv, r, kp)
        blocks.append(torch.matmul(torch.softmax(s, dim=-1), vp))  # (B, Hkv, r, Dv)
    out = blocks[0] if len(blocks) == 1 else torch.cat(blocks, dim=2)  # (B, Hkv, G*Nq, Dv)
    return out.reshape(B, Hq, Nq, Dv)  # (B, Hq, Nq, Dv)


def linformer_reference(q, k, v, e, f, scale: float, grad_out=None) -> RefResult:
    """The same formula in float64: project, then the chunked exact softmax reference on the
    projected K and V; gradients of k and v by the chain rule (dk = E^T dK', dv = F^T dV')."""
    e64, f64 = e.to(torch.float64), f.to(torch.float64)
    kp = torch.matmul(e64, k.detach().to(torch.float64))  # (B, Hkv, kp, D)
    vp = torch.matmul(f64, v.detach().to(torch.float64))  # (B, Hkv, kp, Dv)
    ref = softmax_reference(q, kp, vp, MaskSpec("none"), scale, grad_out=grad_out)
    if grad_out is None:
        return ref
    return RefResult(ref.out, ref.dq, torch.matmul(e64.T, ref.dk), torch.matmul(f64.T, ref.dv))


class Linformer(Backend):
    name = "linformer"
    description = ("softmax attention over K, V projected along the sequence to k rows "
                   "(linformer_k, default 256) by seeded projections; O(N k)")
    caps = Capabilities(masks=("none",))
    params = knobs.LINFORMER
    semantics = APPROXIMATE

    def approximation(self, case):
        return (f"keys and values projected along the sequence to linformer_k = "
                f"{case.param('linformer_k')} rows by seeded, untrained projections")

    def work_flops(self, case):
        """The two projections (per K/V head) and attention over kp rows (per query head)."""
        kp, width = case.param("linformer_k"), case.head_dim + case.head_dim_v
        project = 2.0 * case.batch * case.heads_kv * kp * case.seq_k * width
        attend = 2.0 * case.batch * case.heads_q * case.seq_q * kp * width
        return (project + attend) * MODE_FLOP_FACTOR[case.mode]

    def build(self, case, inputs):
        cdt = torch.float64 if case.dtype == "float64" else torch.float32
        e, f = projections(case, inputs.q.device, cdt)
        scale = case.softmax_scale
        rows = block_rows(case, inputs.q.device, torch.tensor([], dtype=cdt).element_size())

        def linformer(q, k, v):
            return linformer_attention(q.to(cdt), k.to(cdt), v.to(cdt), e, f,
                                       scale, rows).to(q.dtype)

        return linformer

    def impl_reference(self, case, inputs) -> RefResult:
        e, f = projections(case, inputs.q.device)
        return linformer_reference(inputs.q, inputs.k, inputs.v, e, f, case.softmax_scale,
                                   inputs.grad_out if case.needs_grad else None)


BACKENDS = [Linformer()]
