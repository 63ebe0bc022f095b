"""sliding_window: exact local attention for a bounded window, in O(N * window) time and memory.

Query rows are cut into blocks of ``Bq``. Under a bottom-right aligned window (left L,
right R; ``off = seq_k - seq_q``) query ``i`` sees keys ``[i + off - L, i + off + R]``, so
block ``b`` (rows ``b*Bq .. b*Bq + Bq - 1``) sees the contiguous key span that starts at
``b*Bq + off - L`` and is ``W = Bq + L + R`` keys long. ``Tensor.unfold`` turns K and V
into overlapping per-head views of shape (n_blocks, W, D) without copying (only the few
spans that reach past a sequence end are copied, zero-padded). A batched matmul gives
(n_blocks, G*Bq, W) scores, an additive bias removes what the window (or a sequence end)
hides, then softmax and a second batched matmul. In a span-relative column ``c`` the band
test ``a <= c <= a + L + R`` (``a`` the row inside its block) is the same for every block,
so all interior blocks share one small bias; only the blocks at the ends have their own.

The work goes in cache-sized chunks of blocks, one K/V head at a time; without autograd two
chunk-sized buffers serve every chunk. Work is ``Nq * (Bq + L + R) * (D + Dv)``
multiply-adds; memory is the output plus the chunk buffers in the forward, and O(N * W)
saved probabilities under autograd: linear in N for a fixed window either way. GQA folds
the ``G`` query heads that share a K/V head into the rows of a block, so K/V are never
repeated. Rows that see no key output 0.

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
    start0: int  # first key of block 0's span (may be < 0 or past the keys)

    @property
    def padded_q(self) -> int:
        return self.n_blocks * self.block

    def span(self, b0: int, b1: int) -> tuple[int, int]:
        """Key range [start, end) that blocks [b0, b1) together need (may leave [0, Nk))."""
        return self.start0 + b0 * self.block, self.start0 + (b1 - 1) * self.block + self.width


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
    return WindowPlan(seq_q, seq_k, left, right, bq, n_blocks, bq + left + right,
                      seq_k - seq_q - left)


def key_windows(x: torch.Tensor, plan: WindowPlan, b0: int, b1: int) -> torch.Tensor:
    """(BH, Nk, E) keys or values -> (BH, b1 - b0, E, W): the span of each block in [b0, b1).

    Where the spans lie inside the sequence this is an overlapping ``unfold`` view of ``x``
    (no copy); only the ranges that reach past an end are copied, with zero padding.
    """
    start, end = plan.span(b0, b1)
    a = min(max(start, 0), plan.seq_k)
    b = max(min(end, plan.seq_k), a)
    src = x[:, a:b]  # (BH, b - a, E)
    if a - start or end - b:
        src = F.pad(src, (0, 0, a - start, end - b))  # (BH, end - start, E)
    return src.unfold(1, plan.width, plan.block)  # (BH, b1 - b0, E, W)


@dataclass
class WindowBias:
    """Additive biases: 0 where a query may see a key, a huge negative where not.

    Interior blocks ``[lo, hi)`` all share one (G*Bq, W) band pattern, small enough to stay
    in cache; only the few blocks at the ends (keys off the sequence, rows past seq_q, rows
    that see nothing) carry their own bias.
    """

    band: torch.Tensor  # (1, G*Bq, W) bias of every interior block
    head: torch.Tensor  # (lo, G*Bq, W) bias of blocks [0, lo)
    tail: torch.Tensor  # (nb - hi, G*Bq, W) bias of blocks [hi, nb)
    lo: int
    hi: int
    keep: torch.Tensor | None  # (nb*Bq, 1) rows that see a key; None when all real rows do

    def regions(self, nb: int) -> list[tuple[int, int]]:
        return [(a, b) for a, b in ((0, self.lo), (self.lo, self.hi), (self.hi, nb)) if b > a]

    def of(self, b0: int, b1: int) -> torch.Tensor:
        """Bias of blocks [b0, b1), a range inside one region: (n or 1, G*Bq, W)."""
        if b1 <= self.lo:
            return self.head[b0:b1]
        if b0 >= self.hi:
            return self.tail[b0 - self.hi:b1 - self.hi]
        return self.band.expand(b1 - b0, -1, -1)


def window_bias(plan: WindowPlan, dtype: torch.dtype, device, group: int = 1) -> WindowBias:
    """The biases of a plan, rows repeated for the ``group`` query heads folded into a block.

    Rows that see nothing get a zero bias row (so their softmax stays finite) and are zeroed
    afterwards through ``keep``.
    """
    bq, w, nb = plan.block, plan.width, plan.n_blocks
    a = torch.arange(bq)[:, None]  # (Bq, 1) row inside the block
    c = torch.arange(w)[None, :]  # (1, W) column inside the span
    band = (c >= a) & (c <= a + plan.left + plan.right)  # (Bq, W)
    start = torch.arange(nb) * bq + plan.start0  # (nb,) first key of each block's span
    key = start[:, None] + torch.arange(w)[None, :]  # (nb, W) key index
    in_seq = (key >= 0) & (key < plan.seq_k)  # (nb, W)
    ok = band[None] & in_seq[:, None, :]  # (nb, Bq, W)
    row = torch.arange(nb * bq).view(nb, bq)  # (nb, Bq) query index
    seen = ok.any(dim=-1) & (row < plan.seq_q)  # (nb, Bq)
    ok = ok | ~seen[..., None]  # empty rows: keep every column, zeroed later
    keep = seen.reshape(nb * bq, 1)  # (Nq_pad, 1)
    keep = None if bool(keep[row.reshape(-1) < plan.seq_q].all()) else keep.to(device)
    interior = (ok == band).flatten(1).all(dim=1).tolist()  # (nb,) plain band blocks
    lo = interior.index(True) if True in interior else nb
    hi = nb - interior[::-1].index(True) if True in interior else nb
    if not all(interior[lo:hi]):  # not one contiguous run: give every block its own bias
        lo = hi = nb
    neg = torch.finfo(dtype).min / 2  # finite: s + neg never overflows to -inf

    def as_bias(allowed):  # (n, Bq, W) bool -> (n, G*Bq, W) additive bias
        bias = torch.zeros(allowed.shape, dtype=dtype).masked_fill_(~allowed, neg)
        n = allowed.shape[0]
        return bias[:, None].expand(n, group, bq, w).reshape(n, group * bq, w).to(device)

    return WindowBias(as_bias(band[None]), as_bias(ok[:lo]), as_bias(ok[hi:]), lo, hi, keep)


def sliding_window_attention(q, k, v, plan: WindowPlan, bias: WindowBias, scale: float,
                             chunk_elements: int = 1 << 19) -> torch.Tensor:
    """Blocked local attention. q (B, Hq, Nq, D); k (B, Hkv, Nk, D); v (B, Hkv, Nk, Dv).

    Work goes in chunks of query blocks of one K/V head, sized so that a chunk's scores hold
    about ``chunk_elements`` elements and stay in cache. The K/V spans are overlapping
    ``unfold`` views of K/V (``bmm`` reads strided batches directly); only the few spans at
    the sequence ends are copied with zero padding.
    """
    B, Hq, Nq, D = q.shape
    Hkv, Dv = k.shape[1], v.shape[-1]
    G = Hq // Hkv
    nb, bq, w = plan.n_blocks, plan.block, plan.width
    qs = q
    if plan.padded_q != Nq:
        qs = F.pad(qs, (0, 0, 0, plan.padded_q - Nq))  # (B, Hq, nb*Bq, D)
    qs = qs.view(B * Hkv, G, nb, bq, D)  # (B*Hkv, G, nb, Bq, D)
    kf, vf = k.flatten(0, 1), v.flatten(0, 1)  # (B*Hkv, Nk, D), (B*Hkv, Nk, Dv)
    per = max(1, chunk_elements // (G * bq * w))  # query blocks per chunk
    grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
    # Without autograd, two chunk-sized work buffers serve every chunk (no allocation, and
    # no page faults, per chunk) and each chunk's result goes straight into the output.
    o = None if grad else q.new_empty(B * Hkv * nb, G * bq, Dv)  # (B*Hkv*nb, G*Bq, Dv)
    if not grad:
        s_buf = q.new_empty(min(per, nb), G * bq, w)  # scores
        p_buf = q.new_empty(min(per, nb), G * bq, w)  # probabilities
    outs: list[list[torch.Tensor]] = [[] for _ in range(B * Hkv)]
    for r0, r1 in bias.regions(nb):  # ends (own bias, padded spans), then the plain band
        kw = key_windows(kf, plan, r0, r1)  # (B*Hkv, r1 - r0, D, W)
        vw = key_windows(vf, plan, r0, r1).transpose(-1, -2)  # (B*Hkv, r1 - r0, W, Dv)
        for h in range(B * Hkv):
            for b0 in range(r0, r1, per):
                b1 = min(r1, b0 + per)
                n = b1 - b0
                qc = qs[h, :, b0:b1]  # (G, n, Bq, D)
                qc = qc[0] if G == 1 else qc.transpose(0, 1).reshape(n, G * bq, D)
                kc, vc = kw[h, b0 - r0:b1 - r0], vw[h, b0 - r0:b1 - r0]  # (n,D,W), (n,W,Dv)
                # scale * q k^T + bias in one call; the bias is 0 or a huge negative.
                if o is None:
                    s = torch.baddbmm(bias.of(b0, b1), qc, kc, alpha=scale)  # (n, G*Bq, W)
                    outs[h].append(torch.bmm(torch.softmax(s, dim=-1), vc))  # (n, G*Bq, Dv)
                else:
                    s = torch.baddbmm(bias.of(b0, b1), qc, kc, alpha=scale, out=s_buf[:n])
                    p = torch.softmax(s, dim=-1, out=p_buf[:n])
                    torch.bmm(p, vc, out=o[h * nb + b0:h * nb + b1])
    if o is None:
        flat = [t for head in outs for t in head]  # head-major, blocks in order
        o = torch.cat(flat) if len(flat) > 1 else flat[0]  # (B*Hkv*nb, G*Bq, Dv)
    o = o.view(B, Hkv, nb, G, bq, Dv).transpose(2, 3).reshape(B, Hq, nb * bq, Dv)
    if bias.keep is not None:
        o = o * bias.keep.to(o.dtype)  # rows that see no key output 0
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
        bias = window_bias(plan, inputs.q.dtype, inputs.q.device, case.group_size)
        scale = case.softmax_scale

        def sliding_window(q, k, v):
            return sliding_window_attention(q, k, v, plan, bias, scale)

        return sliding_window


BACKENDS = [SlidingWindow()]
