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

The work goes in cache-sized chunks of blocks, one K/V head at a time, shared out over
the CPU threads by ``split_work`` (one parallel region per call, as a fused kernel has, not
one per op); each piece's chunk-sized work buffers serve all of its chunks. Work is
``Nq * (Bq + L + R) * (D + Dv)`` multiply-adds; memory is the output plus the chunk
buffers in the forward, and O(N * W) saved probabilities under autograd: linear in N for a
fixed window either way. GQA folds the ``G`` query heads
that share a K/V head into the rows of a block, so K/V are never repeated. Rows that see
no key output 0.

The backward is explicit (an ``autograd.Function``): it replays the chunks with the saved
P. A dq row is one matmul; a key lies in up to ceil(W / Bq) overlapping spans, so dk and dv
are summed over the spans in an fp32 accumulator and rounded once. fp16/bf16 follow
FlashAttention's numerics: Q K^T, dO V^T and the dQ/dK/dV products are summed in fp32 and
never rounded to the dtype (CUDA: bmm's fp32 ``out_dtype``; elsewhere the operands are
upcast exactly, so on a CPU these matmuls run at fp32 speed); scale, bias and softmax are
applied in fp32, and only P is rounded (for P @ V and for the backward).

This is the eager path. fp32 on a CPU runs the fused kernels instead (``_segment_attention``:
the forward, and under autograd its backward where both head dims are multiples of 16);
a record's ``kernel`` says which ran.

Causal and ``none`` are unbounded windows; this backend refuses them (and windows with an
infinite side) rather than silently running in O(N^2): use sdpa or naive for those.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from attnbench.core.backend import Backend, Capabilities, wrap_mode
from attnbench.core.case import MODE_FLOP_FACTOR
from attnbench.core.masks import INF, band_reach
from attnbench.implementations import _native
from attnbench.implementations import _segment_attention as segments
from attnbench.implementations._cpu_threads import split_work


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


def _fused_block(left: int, right: int) -> int:
    """Rows per query block of the fused CPU forward (``_segment_attention``). With its
    register tiles the block size matters little above 16 rows; 32 rows keep the wasted edge
    of a wide band small (W = Bq + L + R)."""
    return 16 if left + right + 1 <= 64 else 32


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
    reach_left, reach_right = band_reach(seq_q, seq_k)
    left, right = min(int(left), reach_left), min(int(right), reach_right)
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


LOW_PRECISION = (torch.float16, torch.bfloat16)

# Scores per chunk: 2^17 fp32 scores (512 KiB) stay in a core's L2 between the two
# matmuls and the softmax; larger chunks spill it, and 64-row blocks compute more wasted
# scores for no gain.
CHUNK_ELEMENTS = 1 << 17


def softmax_dtype(dtype: torch.dtype) -> torch.dtype:
    """Dtype of the bias, the softmax and the dK/dV sums: fp32 for fp16/bf16 inputs."""
    return torch.float32 if dtype in LOW_PRECISION else dtype


def bmm_acc(a, b, out=None) -> torch.Tensor:
    """a @ b (batched), summed in fp32 and not rounded when the inputs are fp16/bf16.

    The operands are in the inputs' dtype or in its ``softmax_dtype``; the product is in
    ``softmax_dtype`` (or written into ``out``). CUDA: an fp32 operand is rounded to the
    inputs' dtype (as FlashAttention rounds P and dS for its matmuls) and bmm's fp32
    ``out_dtype`` keeps the sums in fp32. Elsewhere both are upcast (exactly) to fp32.
    """
    low = a.dtype if a.dtype in LOW_PRECISION else b.dtype
    acc = softmax_dtype(low)
    if acc == low:  # fp32, fp64: a plain bmm
        return torch.bmm(a, b, out=out)
    direct = out if out is not None and out.dtype == acc else None
    if a.is_cuda:
        c = torch.bmm(a.to(low), b.to(low), acc, out=direct)
    else:
        c = torch.bmm(a.to(acc), b.to(acc), out=direct)
    return c if out is None or direct is not None else out.copy_(c)  # rounded once


def work_buffers(like: torch.Tensor, numel: int) -> list[torch.Tensor]:
    """Flat chunk buffers for ``softmax_probs``, in ``softmax_dtype``: the scores, plus the
    fp32 probabilities when ``like`` is fp16/bf16."""
    acc = softmax_dtype(like.dtype)
    return [like.new_empty(numel, dtype=acc) for _ in range(1 + (acc != like.dtype))]


def softmax_probs(q, k, bias, scale: float, bufs, p_out=None):
    """p_out = softmax(scale * q @ k + bias) over the last dim; q (n, M, D), k (n, D, W).

    ``bias`` (broadcasts to (n, M, W); or None) is 0 or a huge negative, in ``softmax_dtype``.
    fp32/fp64: one baddbmm, then softmax. fp16/bf16 (as FlashAttention): the scores are
    summed in fp32 and never rounded; scale, bias and softmax are applied in fp32 and only P
    is rounded, for P @ V. Uses ``work_buffers`` as scratch; without ``p_out`` (fp32/fp64
    only) the probabilities overwrite the scores in the first buffer, which halves the
    chunk's working set in cache.
    """
    shape = (q.shape[0], q.shape[1], k.shape[2])  # (n, M, W)
    numel = shape[0] * shape[1] * shape[2]
    s = bufs[0][:numel].view(shape)
    if len(bufs) == 1:
        if bias is None:  # beta=0: s is only the destination
            torch.baddbmm(s, q, k, beta=0, alpha=scale, out=s)
        else:
            torch.baddbmm(bias, q, k, alpha=scale, out=s)
        return torch.softmax(s, dim=-1, out=s if p_out is None else p_out)
    bmm_acc(q, k, out=s).mul_(scale)  # (n, M, W) fp32
    if bias is not None:
        s.add_(bias)
    return p_out.copy_(torch.softmax(s, dim=-1, out=bufs[1][:numel].view(shape)))


def score_grad(p, dp, scale: float):
    """Gradient of the scores s (P = softmax(scale * s + bias)) from P and dP = dO @ V^T:
    scale * P * (dP - rowsum(P * dP)), (n, M, W) in ``softmax_dtype``. Consumes ``dp``."""
    acc = softmax_dtype(p.dtype)
    p32, dp = p.to(acc), dp.to(acc)  # no copies in fp32
    delta = (p32 * dp).sum(dim=-1, keepdim=True)  # (n, M, 1)
    return dp.sub_(delta).mul_(p32).mul_(scale)


def _query_blocks(x, plan: WindowPlan, heads_kv: int) -> torch.Tensor:
    """(B, Hq, Nq, E) -> (B*Hkv, G, nb, Bq, E), rows zero-padded to nb * Bq."""
    B, Hq, Nq, E = x.shape
    if plan.padded_q != Nq:
        x = F.pad(x, (0, 0, 0, plan.padded_q - Nq))  # (B, Hq, nb*Bq, E)
    return x.reshape(B * heads_kv, Hq // heads_kv, plan.n_blocks, plan.block, E)


def _rows(xs, h: int, b0: int, b1: int) -> torch.Tensor:
    """Query blocks [b0, b1) of K/V head h, its G query heads folded in: (n, G*Bq, E)."""
    x = xs[h, :, b0:b1]  # (G, n, Bq, E)
    G, n, bq, E = x.shape
    return x[0] if G == 1 else x.transpose(0, 1).reshape(n, G * bq, E)


def _from_rows(x, plan: WindowPlan, B: int, Hq: int, Nq: int) -> torch.Tensor:
    """(B*Hkv*nb, G*Bq, E) block rows -> (B, Hq, Nq, E)."""
    E, nb, bq = x.shape[-1], plan.n_blocks, plan.block
    Hkv = x.shape[0] // (B * nb)
    x = x.view(B, Hkv, nb, Hq // Hkv, bq, E).transpose(2, 3).reshape(B, Hq, nb * bq, E)
    return x[:, :, :Nq]


def span_index(plan: WindowPlan, n: int, device) -> torch.Tensor:
    """(n * W,) row of each (block, span column) of n consecutive query blocks, counted from
    the first block's span start: block i's column c is key row i * Bq + c."""
    rows = torch.arange(n)[:, None] * plan.block + torch.arange(plan.width)[None, :]
    return rows.reshape(-1).to(device)  # (n * W,)


def _add_spans(acc, b0: int, x, index: torch.Tensor | None = None) -> None:
    """acc (n_span_blocks, Bq, E) += x (n, W, E), the key spans of query blocks b0, b0+1, ...

    Block b's span starts Bq keys after block b-1's. On a CPU (``index`` from
    ``span_index``) it is one ``index_add_`` over the span rows, in order (deterministic):
    the loop below issued 2 * ceil(W / Bq) small ops a call, and Python's few us per op
    were most of the backward's overhead. Elsewhere (CUDA's index_add_ adds in no fixed
    order) the spans are cut into Bq-wide segments; one segment of consecutive blocks lands
    on consecutive, disjoint span blocks (one in-place add, in acc's dtype)."""
    n, w, e = x.shape
    bq = acc.shape[1]
    if index is not None:
        acc.view(-1, e)[b0 * bq:].index_add_(0, index[:n * w], x.reshape(n * w, e))
        return
    for c0 in range(0, w, bq):
        c = min(bq, w - c0)
        t = b0 + c0 // bq
        acc[t:t + n, :c].add_(x[:, c0:c0 + c])


def _span_keys(acc, plan: WindowPlan, like) -> torch.Tensor:
    """(B*Hkv, n_span_blocks, Bq, E) sums over span positions -> like's (B, Hkv, Nk, E), in
    like's dtype (a view of acc, no copy, in fp32 when every key lies inside the spans)."""
    acc = acc.flatten(1, 2)  # (B*Hkv, span, E): row i is key start0 + i
    lo = max(plan.start0, 0)  # keys [lo, hi) lie inside the spans
    hi = max(min(plan.seq_k, plan.start0 + acc.shape[1]), lo)
    x = acc[:, lo - plan.start0:hi - plan.start0]  # (B*Hkv, hi - lo, E)
    if hi - lo != plan.seq_k:  # keys no block can see: zero gradient
        x = F.pad(x, (0, 0, lo, plan.seq_k - hi))  # (B*Hkv, Nk, E)
    return x.to(like.dtype).view(like.shape)


def _chunks(k, v, plan: WindowPlan, bias: WindowBias, per: int):
    """(h, b0, b1, keys (n, D, W), values (n, W, Dv)) for chunks of at most ``per`` query
    blocks of one K/V head: the ends (own bias, padded spans) first, then the plain band."""
    kf, vf = k.flatten(0, 1), v.flatten(0, 1)  # (B*Hkv, Nk, D), (B*Hkv, Nk, Dv)
    for r0, r1 in bias.regions(plan.n_blocks):
        kw = key_windows(kf, plan, r0, r1)  # (B*Hkv, r1 - r0, D, W)
        vw = key_windows(vf, plan, r0, r1).transpose(-1, -2)  # (B*Hkv, r1 - r0, W, Dv)
        for h in range(kf.shape[0]):
            for b0 in range(r0, r1, per):
                b1 = min(r1, b0 + per)
                yield h, b0, b1, kw[h, b0 - r0:b1 - r0], vw[h, b0 - r0:b1 - r0]


def _blocks_per_chunk(plan: WindowPlan, group: int, chunk_elements: int) -> int:
    return max(1, chunk_elements // (group * plan.block * plan.width))


def _window_forward(q, k, v, plan: WindowPlan, bias: WindowBias, scale: float,
                    chunk_elements: int, save_p: bool):
    """Output (B, Hq, Nq, Dv) and, with ``save_p``, P of every chunk for the backward:
    {(h, b0): (n, G*Bq, W)}.

    The chunks are shared out over the CPU threads (``split_work``); each piece's
    chunk-sized work buffers serve all of its chunks (no allocation, and no page faults,
    per chunk) and each chunk's result goes straight into the output. P is kept as one
    tensor per chunk rather than one (B*Hkv*nb, G*Bq, W) tensor: chunk-sized blocks come
    back from malloc's heap call after call, while one block of tens of MiB is mapped
    afresh each call and its page faults and zeroing land in the softmax (most of its
    time at N = 4096, fwd_bwd).
    """
    B, Hq, Nq, _ = q.shape
    Hkv, Dv = k.shape[1], v.shape[-1]
    G, nb, bq, w = Hq // Hkv, plan.n_blocks, plan.block, plan.width
    qs = _query_blocks(q, plan, Hkv)  # (B*Hkv, G, nb, Bq, D)
    per = _blocks_per_chunk(plan, G, chunk_elements)
    chunk = min(per, nb) * G * bq * w  # scores in the largest chunk
    o = q.new_empty(B * Hkv * nb, G * bq, Dv)  # (B*Hkv*nb, G*Bq, Dv)
    probs: dict[tuple[int, int], torch.Tensor] = {}  # (h, b0) -> (n, G*Bq, W)
    chunks = list(_chunks(k, v, plan, bias, per))

    def work(lo: int, hi: int) -> None:
        bufs = work_buffers(q, chunk)
        # fp32 without autograd: P overwrites the scores (one chunk-sized buffer in cache)
        p_buf = None if save_p or len(bufs) == 1 else q.new_empty(chunk)
        for h, b0, b1, kc, vc in chunks[lo:hi]:
            rows = slice(h * nb + b0, h * nb + b1)
            n = b1 - b0
            p_out = (q.new_empty(n, G * bq, w) if save_p else
                     None if p_buf is None else p_buf[:n * G * bq * w].view(n, G * bq, w))
            # softmax(scale * q k^T + bias); the bias is 0 or a huge negative.
            p = softmax_probs(_rows(qs, h, b0, b1), kc, bias.of(b0, b1), scale, bufs, p_out)
            torch.bmm(p, vc, out=o[rows])  # (n, G*Bq, Dv)
            if save_p:
                probs[h, b0] = p  # each chunk is one thread's: distinct keys

    split_work(work, len(chunks), q.device)
    o = _from_rows(o, plan, B, Hq, plan.padded_q)  # (B, Hq, nb*Bq, Dv)
    if bias.keep is not None:
        o = o * bias.keep.to(o.dtype)  # rows that see no key output 0
    return o[:, :, :Nq], probs  # (B, Hq, Nq, Dv)


def _window_backward(q, k, v, probs, do, plan: WindowPlan, bias: WindowBias, scale: float,
                     chunk_elements: int):
    """dq, dk, dv from the saved P, chunk by chunk as in the forward.

    A query row belongs to one block, so each dq row is one matmul, rounded once. A key
    lies in the spans of up to ceil(W / Bq) blocks: dk and dv are summed over those spans in
    ``softmax_dtype`` (fp32 for fp16/bf16) and rounded once at the end.
    """
    B, Hq, Nq, D = q.shape
    Hkv, Dv = k.shape[1], v.shape[-1]
    G, nb, bq = Hq // Hkv, plan.n_blocks, plan.block
    if bias.keep is not None:  # rows that see no key output 0: nothing flows back from them
        do = do * bias.keep[:Nq].to(do.dtype)
    qs = _query_blocks(q, plan, Hkv)  # (B*Hkv, G, nb, Bq, D)
    dos = _query_blocks(do, plan, Hkv)  # (B*Hkv, G, nb, Bq, Dv)
    acc = softmax_dtype(q.dtype)
    span_blocks = nb - 1 + -(-plan.width // bq)  # Bq-wide key blocks the spans cover
    dk = q.new_zeros(B * Hkv, span_blocks, bq, D, dtype=acc)  # (B*Hkv, span_blocks, Bq, D)
    dv = q.new_zeros(B * Hkv, span_blocks, bq, Dv, dtype=acc)  # (B*Hkv, span_blocks, Bq, Dv)
    dq = q.new_empty(B * Hkv * nb, G * bq, D)  # (B*Hkv*nb, G*Bq, D)
    per = _blocks_per_chunk(plan, G, chunk_elements)
    index = span_index(plan, min(per, nb), q.device) if q.device.type == "cpu" else None
    by_head: dict[int, list] = {}
    for c in _chunks(k, v, plan, bias, per):
        by_head.setdefault(c[0], []).append(c)
    heads = list(by_head.values())

    def work(lo: int, hi: int) -> None:  # whole K/V heads: dk[h], dv[h] have one writer
        for h, b0, b1, kc, vc in (c for chunks in heads[lo:hi] for c in chunks):
            rows = slice(h * nb + b0, h * nb + b1)
            p, doc = probs[h, b0], _rows(dos, h, b0, b1)  # (n, G*Bq, W), (n, G*Bq, Dv)
            _add_spans(dv[h], b0, bmm_acc(p.transpose(1, 2), doc), index)  # (n, W, Dv)
            ds = score_grad(p, bmm_acc(doc, vc.transpose(1, 2)), scale)  # (n, G*Bq, W)
            bmm_acc(ds, kc.transpose(1, 2), out=dq[rows])  # (n, G*Bq, D)
            _add_spans(dk[h], b0, bmm_acc(ds.transpose(1, 2), _rows(qs, h, b0, b1)), index)

    split_work(work, len(heads), q.device)
    return _from_rows(dq, plan, B, Hq, Nq), _span_keys(dk, plan, k), _span_keys(dv, plan, v)


class _WindowAttention(torch.autograd.Function):
    """Saves P (O(N * W)); the backward is ``_window_backward``."""

    @staticmethod
    def forward(ctx, q, k, v, plan, bias, scale, chunk_elements):
        o, probs = _window_forward(q, k, v, plan, bias, scale, chunk_elements, save_p=True)
        ctx.save_for_backward(q, k, v)
        ctx.probs = probs  # intermediates (neither inputs nor outputs) may live on ctx
        ctx.args = (plan, bias, scale, chunk_elements)
        return o

    @staticmethod
    @once_differentiable
    def backward(ctx, do):
        q, k, v = ctx.saved_tensors
        return (*_window_backward(q, k, v, ctx.probs, do, *ctx.args), None, None, None, None)


def sliding_window_attention(q, k, v, plan: WindowPlan, bias: WindowBias, scale: float,
                             chunk_elements: int = CHUNK_ELEMENTS) -> torch.Tensor:
    """Blocked local attention. q (B, Hq, Nq, D); k (B, Hkv, Nk, D); v (B, Hkv, Nk, Dv).

    Work goes in chunks of query blocks of one K/V head, sized so that a chunk's scores hold
    about ``chunk_elements`` elements and stay in cache. The K/V spans are overlapping
    ``unfold`` views of K/V (``bmm`` reads strided batches directly); only the few spans at
    the sequence ends are copied with zero padding. ``bias`` is best built in
    ``softmax_dtype`` of the inputs' dtype.
    """
    if _native.records_grad(q, k, v):
        return _WindowAttention.apply(q, k, v, plan, bias, scale, chunk_elements)
    return _window_forward(q, k, v, plan, bias, scale, chunk_elements, save_p=False)[0]
class SlidingWindow(Backend):
    name = "sliding_window"
    description = ("exact local attention, blocked: each query block attends its contiguous "
                   "key span via unfold views; O(N * window) time and memory")
    code_modules = ("attnbench.implementations._segment_attention",)
    code_files = _native.sources(segments.KERNEL)
    native_kernels = (segments.KERNEL,)  # a run builds these before its first pair
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

    def work_flops(self, case):
        """Every block computes Bq x W scores (the band's ragged edge included); the fused
        kernel's blocks, their spans clipped to the keys (its Q K^T also fills the few
        masked columns that round a span out to 16-key panels: not counted)."""
        fused = self.fused_plan(case, case.device, case.torch_dtype)
        if fused is not None:
            pairs = fused.computed_pairs()
        else:
            plan = self.plan(case)
            pairs = plan.padded_q * plan.width
        fwd = 2.0 * case.batch * case.heads_q * pairs * (case.head_dim + case.head_dim_v)
        return fwd * MODE_FLOP_FACTOR[case.mode]

    def plan(self, case) -> WindowPlan:
        spec = case.mask_spec
        return window_plan(case.seq_q, case.seq_k, spec.left, spec.right)

    def fused_plan(self, case, device, dtype) -> segments.SegmentPlan | None:
        """The fused kernel's plan where it runs this case (``segments.fused_applies``)."""
        if not segments.fused_applies(device, dtype, case.needs_grad, case.head_dim,
                                      case.head_dim_v):
            return None
        plan = self.plan(case)
        return segments.window_segments(case.seq_q, case.seq_k, plan.left, plan.right,
                                        _fused_block(plan.left, plan.right))

    def build(self, case, inputs):
        plan = self.plan(case)
        bias = window_bias(plan, softmax_dtype(inputs.q.dtype), inputs.q.device,
                           case.group_size)
        fused = self.fused_plan(case, inputs.q.device, inputs.q.dtype)
        scale = case.softmax_scale

        def sliding_window(q, k, v):
            out = segments.fused_call(fused, q, k, v, scale)
            return sliding_window_attention(q, k, v, plan, bias, scale) if out is None else out

        return sliding_window

    def prepare(self, case, inputs):
        prepared = wrap_mode(self.build(case, inputs), case, inputs)
        fused = self.fused_plan(case, inputs.q.device, inputs.q.dtype)
        prepared.extras["kernel"] = segments.kernel_name(
            fused, f"eager(Bq={self.plan(case).block})", inputs.q.device, inputs.q.dtype,
            case.needs_grad)
        return prepared


BACKENDS = [SlidingWindow()]
