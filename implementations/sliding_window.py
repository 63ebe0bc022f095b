"""sliding_window: exact local attention for a bounded window, in O(N * window) time and memory.

Query rows are cut into blocks of ``Bq``. Under a bottom-right aligned window (left L,
right R; ``off = seq_k - seq_q``) query ``i`` sees keys ``[i + off - L, i + off + R]``, so
block ``b`` (rows ``b*Bq .. b*Bq + Bq - 1``) sees the contiguous key span that starts at
``b*Bq + off - L`` and is ``W = Bq + L + R`` keys long. K and V are padded once, and
``Tensor.unfold`` turns them into overlapping views of shape (B, Hkv, n_blocks, W, D)
without copying. One batched matmul gives (B, Hkv, n_blocks, G*Bq, W) scores, a
precomputed additive bias removes what the window (or the sequence ends) hides, then
softmax and a second batched matmul. In a window-relative column ``c`` the band test
``a <= c <= a + L + R`` (``a`` the row inside its block) is the same for every block;
only the blocks at the sequence ends also hide padded keys.

Work is ``Nq * (Bq + L + R) * (D + Dv)`` multiply-adds, and the largest temporaries are
the (n_blocks, G*Bq, W) scores and probabilities: both linear in N for a fixed window.
GQA is done by folding the ``G`` query heads that share a K/V head into the row dimension
of a block, so K/V are never repeated. Rows that see no key output 0.

Causal and ``none`` are unbounded windows; this backend refuses them (and windows with an
infinite side) rather than silently running in O(N^2): use sdpa or naive for those.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from attnbench.backend import Backend, Capabilities
from attnbench.masks import INF


def _query_block(left: int, right: int) -> int:
    """Rows per query block: small enough that the ragged edge of the band wastes little
    (each row computes Bq + L + R scores for L + R + 1 useful ones), large enough for
    efficient matmuls."""
    span = left + right + 1
    if span <= 64:
        return 16
    if span <= 512:
        return 32
    return 64


@dataclass
class WindowPlan:
    """Geometry of the blocked computation for one case (all Python ints)."""

    seq_q: int
    seq_k: int
    left: int  # effective (clamped) window bounds
    right: int
    block: int  # Bq
    n_blocks: int
    width: int  # W = Bq + L + R keys per block
    pad_left: int  # zero keys prepended
    pad_right: int  # zero keys appended
    base: int  # padded index where block 0's key span starts

    @property
    def padded_q(self) -> int:
        return self.n_blocks * self.block

    def workspace_elements(self, batch: int, heads_q: int) -> int:
        """Elements of the largest temporary (the scores) for batch and heads_q."""
        return batch * heads_q * self.padded_q * self.width


def window_plan(seq_q: int, seq_k: int, left: float, right: float,
                block: int | None = None) -> WindowPlan:
    """Plan the blocked computation of a bottom-right aligned window (left, right)."""
    if left == INF or right == INF:
        raise ValueError("sliding_window needs a bounded window")
    # A side of the window wider than the sequence changes nothing: clamp it so the work
    # follows the span that can actually be visible.
    left = min(int(left), max(seq_k - 1, 0))
    right = min(int(right), max(seq_q - 1, 0))
    bq = block or _query_block(left, right)
    n_blocks = max(1, math.ceil(seq_q / bq))
    width = bq + left + right
    off = seq_k - seq_q
    start0 = off - left  # first key of block 0's span (unpadded index)
    pad_left = max(0, -start0)
    base = start0 + pad_left
    need = base + (n_blocks - 1) * bq + width  # padded length the last span needs
    pad_right = max(0, need - pad_left - seq_k)
    return WindowPlan(seq_q, seq_k, left, right, bq, n_blocks, width, pad_left, pad_right, base)


def window_bias(plan: WindowPlan, dtype: torch.dtype, device, group: int = 1
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Additive bias (n_blocks, group*Bq, W): 0 where a query may see a key, a huge negative
    where not (repeated for the ``group`` query heads folded into a block's rows).

    Also returns a (n_blocks * Bq, 1) boolean of rows that see at least one key, or None
    when every real row does. Rows that see nothing get a zero bias row (so their softmax
    stays finite) and are zeroed afterwards.
    """
    bq, w, nb = plan.block, plan.width, plan.n_blocks
    a = torch.arange(bq, device=device)[:, None]  # (Bq, 1) row inside the block
    c = torch.arange(w, device=device)[None, :]  # (1, W) column inside the span
    band = (c >= a) & (c <= a + plan.left + plan.right)  # (Bq, W)
    start = (torch.arange(nb, device=device) * bq + plan.base - plan.pad_left)  # (nb,)
    key = start[:, None] + torch.arange(w, device=device)[None, :]  # (nb, W) key index
    in_seq = (key >= 0) & (key < plan.seq_k)  # (nb, W)
    ok = band[None] & in_seq[:, None, :]  # (nb, Bq, W)
    row = torch.arange(nb * bq, device=device).view(nb, bq)  # (nb, Bq) query index
    seen = ok.any(dim=-1) & (row < plan.seq_q)  # (nb, Bq)
    ok = ok | ~seen[..., None]  # empty rows: keep every column, zeroed later
    neg = torch.finfo(dtype).min / 2  # finite: s + neg never overflows to -inf
    bias = torch.zeros(nb, bq, w, dtype=dtype, device=device)
    bias.masked_fill_(~ok, neg)
    keep = seen.reshape(nb * bq, 1)  # (Nq_pad, 1)
    real = row.reshape(-1) < plan.seq_q
    keep = None if bool(keep[real].all()) else keep
    bias = bias[:, None].expand(nb, group, bq, w).reshape(nb, group * bq, w)
    return bias, keep  # (nb, G*Bq, W), (nb*Bq, 1) or None


def sliding_window_attention(q, k, v, plan: WindowPlan, bias: torch.Tensor,
                             keep: torch.Tensor | None, scale: float,
                             chunk_elements: int = 1 << 18) -> torch.Tensor:
    """Blocked local attention. q (B, Hq, Nq, D); k (B, Hkv, Nk, D); v (B, Hkv, Nk, Dv).

    Work goes in chunks of query blocks of one K/V head, sized so that a chunk's scores hold
    about ``chunk_elements`` elements and stay in cache. The K/V spans are ``unfold`` views of
    the padded K/V: overlapping, never copied (``bmm`` reads strided batches directly).
    """
    B, Hq, Nq, D = q.shape
    Hkv, Dv = k.shape[1], v.shape[-1]
    G = Hq // Hkv
    nb, bq, w = plan.n_blocks, plan.block, plan.width
    qs = q
    if plan.padded_q != Nq:
        qs = F.pad(qs, (0, 0, 0, plan.padded_q - Nq))  # (B, Hq, nb*Bq, D)
    qs = qs.view(B * Hkv, G, nb, bq, D)  # (B*Hkv, G, nb, Bq, D)
    kp = F.pad(k, (0, 0, plan.pad_left, plan.pad_right)).flatten(0, 1)  # (B*Hkv, Np, D)
    vp = F.pad(v, (0, 0, plan.pad_left, plan.pad_right)).flatten(0, 1)  # (B*Hkv, Np, Dv)
    kw = kp[:, plan.base:].unfold(1, w, bq)  # (B*Hkv, >=nb, D, W) overlapping view
    vw = vp[:, plan.base:].unfold(1, w, bq).transpose(-1, -2)  # (B*Hkv, >=nb, W, Dv) view
    per = max(1, chunk_elements // (G * bq * w))  # query blocks per chunk
    grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
    # Without autograd each chunk's result goes straight into the output.
    o = None if grad else q.new_empty(B * Hkv * nb, G * bq, Dv)  # (B*Hkv*nb, G*Bq, Dv)
    outs = []
    for h in range(B * Hkv):
        for b0 in range(0, nb, per):
            b1 = min(nb, b0 + per)
            qc = qs[h, :, b0:b1]  # (G, n, Bq, D)
            qc = qc[0] if G == 1 else qc.transpose(0, 1).reshape(b1 - b0, G * bq, D)
            # scale * q k^T + bias in one call; bias (n, G*Bq, W) is 0 or a huge negative.
            s = torch.baddbmm(bias[b0:b1], qc, kw[h, b0:b1], alpha=scale)  # (n, G*Bq, W)
            p = torch.softmax(s, dim=-1)  # (n, G*Bq, W)
            if o is None:
                outs.append(torch.bmm(p, vw[h, b0:b1]))  # (n, G*Bq, Dv)
            else:
                torch.bmm(p, vw[h, b0:b1], out=o[h * nb + b0:h * nb + b1])
    if o is None:
        o = torch.cat(outs) if len(outs) > 1 else outs[0]  # (B*Hkv*nb, G*Bq, Dv)
    o = o.view(B, Hkv, nb, G, bq, Dv).transpose(2, 3).reshape(B, Hq, nb * bq, Dv)
    if keep is not None:
        o = o * keep.to(o.dtype)  # rows that see no key output 0
    return o[:, :, :Nq]  # (B, Hq, Nq, Dv)


class SlidingWindow(Backend):
    name = "sliding_window"
    description = ("exact local attention, blocked: each query block attends its contiguous "
                   "key span via unfold views; O(N * window) time and memory")
    caps = Capabilities(masks=("window",))

    def extra_reasons(self, case):
        spec = case.mask_spec
        if spec.kind in ("none", "causal"):
            return [f"mask {spec.kind} is an unbounded window: sliding_window is O(N * window) "
                    "by design and only runs bounded window(L,R) masks (use sdpa or naive)"]
        if spec.kind == "window" and (spec.left == INF or spec.right == INF):
            return [f"mask {case.mask} has an unbounded side: sliding_window is O(N * window) "
                    "by design and needs finite L and R"]
        return []

    def plan(self, case) -> WindowPlan:
        spec = case.mask_spec
        return window_plan(case.seq_q, case.seq_k, spec.left, spec.right)

    def build(self, case, inputs):
        plan = self.plan(case)
        bias, keep = window_bias(plan, inputs.q.dtype, inputs.q.device, case.group_size)
        scale = case.softmax_scale

        def sliding_window(q, k, v):
            return sliding_window_attention(q, k, v, plan, bias, keep, scale)

        return sliding_window


BACKENDS = [SlidingWindow()]
