"""block_sparse: softmax attention restricted to a block layout, computing only nonzero blocks.

The layout is a boolean (n_q_blocks, n_k_blocks) grid of ``b x b`` tiles (``local``,
``bigbird``, ``longformer``, ``strided`` or ``explicit``; see ``attnbench.core.block_layouts``).
For each query block the key blocks it may see are listed; query blocks are grouped into
*buckets* by how many key blocks they see, and inside a bucket every row's list is padded
to the bucket's maximum with a dummy (masked) key block. A bucket then runs as dense batched work:

    K_g = K_blocks[idx]                  (rows, kmax*b, D)   gathered copy, no dense N x N
    S   = scale * Q_rows @ K_g^T + bias  (rows, G*b, kmax*b)
    O   = softmax(S) @ V_g               (rows, G*b, Dv)

Bucketing keeps the cost honest for layouts with a few dense rows: BigBird's global query
blocks see every key block, and padding all rows to that length would be dense attention
again. Work is ``sum over rows of (padded count) * b * b * (D + Dv)``, so O(N) when every
row sees a bounded number of blocks (local, bigbird's band + random) plus O(N) per global
row. GQA folds the G query heads sharing a K/V head into a block's rows (no K/V repeat).

The backward is explicit (an ``autograd.Function``): it replays the chunks with the saved
P, gathering K/V again. A dq row is one matmul; dk and dv sum over every query block that
sees a key block, in an fp32 accumulator (``index_add_``), rounded once. fp16/bf16 use
sliding_window's helpers and FlashAttention's numerics: products summed in fp32 and never
rounded to the dtype, scale, bias and softmax in fp32, only P rounded.

This is the eager path. fp32 on a CPU runs the fused kernels instead (``_segment_attention``:
the forward, and under autograd its backward where both head dims are multiples of 16);
a record's ``kernel`` says which ran.

On a ``block_sparse(LAYOUT)`` case it computes the case's function exactly. On a dense
case (mask ``none``) it applies the layout named by the case knob ``block_layout_name``
(default ``bigbird``) and is an approximation of dense attention: ``impl_reference`` is the
float64 attention under that block mask, and ``err_vs_softmax`` says how far it is from
dense softmax.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from attnbench.core import block_layouts, knobs
from attnbench.core.backend import APPROXIMATE, EXACT, Backend, Capabilities, wrap_mode
from attnbench.core.case import MODE_FLOP_FACTOR
from attnbench.core.reference import RefResult, chunked_reference
from attnbench.implementations import _native
from attnbench.implementations import _segment_attention as segments
from attnbench.implementations._cpu_threads import split_work
from attnbench.implementations.sliding_window import (
    bmm_acc,
    score_grad,
    softmax_dtype,
    softmax_probs,
    work_buffers,
)

# Scores per chunk. Measured at N = 8192, bigbird (band 2, 1 global, 6 random), 1 thread,
# as a fraction of an interleaved 1024^3 matmul (thread CPU time): 2^16 0.30, 2^17 0.37,
# 2^18 0.42, 2^19 (the former default) 0.39. A chunk also holds the gathered K and V
# (kmax * 64 keys per query block), so the best size is larger than sliding_window's.
CHUNK_ELEMENTS = 1 << 18


def case_layout(case) -> torch.Tensor:
    """The (n_q_blocks, n_k_blocks) layout this backend applies to ``case``."""
    if case.mask_spec.kind == "block_sparse":
        return case.block_layout
    return case.layout_named(case.param("block_layout_name"))


@dataclass
class Bucket:
    rows: torch.Tensor  # (nr,) query-block indices, int64
    idx: torch.Tensor  # (nr, kmax) key-block indices; dummy slots (masked) hold block 0
    bias: torch.Tensor  # (nr, 1, kmax*b): 0 for real keys, a huge negative for padding
    n_full: int  # rows [0, n_full) hide nothing: their chunks skip the bias
    row_list: list[int]  # ``rows`` as Python ints (consecutive runs are sliced, not gathered)

    @property
    def kmax(self) -> int:
        return self.idx.shape[1]

    @property
    def flat_idx(self) -> torch.Tensor:
        return self.idx.reshape(-1)  # (nr*kmax,)


@dataclass
class BlockPlan:
    seq_q: int
    seq_k: int
    block: int
    n_q_blocks: int
    n_k_blocks: int
    buckets: list[Bucket]
    order: torch.Tensor  # (n_q_blocks,) query blocks in processing order (buckets, then empty)
    inverse: torch.Tensor | None  # position of each query block in ``order``; None if identity
    n_empty: int  # query blocks that see no key block: output 0

    def computed_blocks(self) -> int:
        """Tiles computed per (batch, kv head, group member), padding included."""
        return sum(b.idx.numel() for b in self.buckets)


def _group_counts(counts: list[int], slack: float) -> list[list[int]]:
    """Group distinct per-row counts into buckets; padding every row of a bucket to its max
    may cost at most ``slack`` times the bucket's real work."""
    groups: list[list[int]] = []
    hist: dict[int, int] = {}
    for c in counts:
        hist[c] = hist.get(c, 0) + 1
    for c in sorted(hist, reverse=True):  # largest first: each bucket's max is its first count
        if groups:
            g = groups[-1]
            rows = sum(hist[x] for x in g) + hist[c]
            work = sum(x * hist[x] for x in g) + c * hist[c]
            if rows * g[0] <= slack * work:
                g.append(c)
                continue
        groups.append([c])
    return groups


def block_plan(layout: torch.Tensor, seq_q: int, seq_k: int, block: int, dtype: torch.dtype,
               device, slack: float = 1.25) -> BlockPlan:
    """Gather indices, key-padding biases and bucket order for a layout."""
    layout = layout.to("cpu", torch.bool)
    nqb, nkb = layout.shape
    counts = layout.sum(dim=1).tolist()
    neg = torch.finfo(dtype).min / 2  # finite: s + neg never overflows to -inf
    key_ok = torch.arange(nkb * block) < seq_k  # (nkb*b,) keys past seq_k are masked
    buckets, order = [], []
    for group in _group_counts([c for c in counts if c > 0], slack):
        kmax = group[0]
        # Longest rows first: the rows needing dummy padding come last, so chunks of full
        # rows can skip the bias.
        rows = sorted((r for r in range(nqb) if counts[r] in group),
                      key=lambda r: (-counts[r], r))
        # Dummy slots point at key block 0 (any real block would do): the bias hides them.
        idx = torch.zeros((len(rows), kmax), dtype=torch.int64)
        for i, r in enumerate(rows):
            cols = layout[r].nonzero().flatten()
            idx[i, :len(cols)] = cols
        real = torch.arange(kmax)[None, :] < torch.tensor([counts[r] for r in rows])[:, None]
        cols = (idx[:, :, None] * block + torch.arange(block)).reshape(len(rows), kmax * block)
        visible = key_ok[cols] & real.repeat_interleave(block, dim=1)  # (nr, kmax*b)
        hidden = ~visible[:, None, :]  # (nr, 1, kmax*b)
        padded = hidden.flatten(1).any(dim=1)  # (nr,) rows with something to hide
        n_full = int(padded.to(torch.int64).argmax()) if bool(padded.any()) else len(rows)
        if not bool(padded[n_full:].all()):
            n_full = 0  # padded rows are not all at the end (partial last key block)
        bias = torch.zeros(len(rows), 1, kmax * block, dtype=dtype)
        bias = bias.masked_fill_(hidden, neg).to(device)
        buckets.append(Bucket(torch.tensor(rows, dtype=torch.int64, device=device),
                              idx.to(device), bias, n_full, rows))
        order += rows
    empty = [r for r in range(nqb) if counts[r] == 0]
    order_t = torch.tensor(order + empty, dtype=torch.int64)
    inverse = None
    if not torch.equal(order_t, torch.arange(nqb)):
        inverse = torch.empty_like(order_t)
        inverse[order_t] = torch.arange(nqb)
        inverse = inverse.to(device)
    return BlockPlan(seq_q, seq_k, block, nqb, nkb, buckets, order_t.to(device), inverse,
                     len(empty))


def _per(chunk_elements: int, group: int, block: int, kmax: int) -> int:
    """Query blocks per chunk so that a chunk's scores hold about ``chunk_elements``."""
    return max(1, chunk_elements // (group * block * kmax * block))


def _chunks(n: int, per: int, split: int) -> list[tuple[int, int]]:
    """[r0, r1) ranges of at most ``per`` rows covering [0, n), none straddling ``split``."""
    return ([(r, min(split, r + per)) for r in range(0, split, per)]
            + [(r, min(n, r + per)) for r in range(split, n, per)])


def _chunk_list(plan: BlockPlan, group: int, chunk_elements: int) -> list[tuple]:
    """The chunks of one K/V head in processing order, as (bucket, r0, r1, pos, first): rows
    [r0, r1) of the bucket, ``pos`` the place of row r0 in the bucket-ordered output, and
    ``first`` the first query block when the rows are consecutive (q is then sliced, not
    gathered), else None."""
    out, pos = [], 0
    for bucket in plan.buckets:
        nr, kmax = bucket.idx.shape
        for r0, r1 in _chunks(nr, _per(chunk_elements, group, plan.block, kmax), bucket.n_full):
            first = bucket.row_list[r0]
            run = bucket.row_list[r0:r1] == list(range(first, first + r1 - r0))
            out.append((bucket, r0, r1, pos + r0, first if run else None))
        pos += nr
    return out


def _query_blocks(x, plan: BlockPlan, heads_kv: int) -> torch.Tensor:
    """(B, Hq, Nq, E) -> (B*Hkv, G, nqb, b, E), rows zero-padded to whole blocks."""
    B, Hq, N, E = x.shape
    if plan.n_q_blocks * plan.block != N:
        x = F.pad(x, (0, 0, 0, plan.n_q_blocks * plan.block - N))  # (B, Hq, nqb*b, E)
    return x.reshape(B * heads_kv, Hq // heads_kv, plan.n_q_blocks, plan.block, E)


def _key_blocks(x, plan: BlockPlan) -> torch.Tensor:
    """(B, Hkv, Nk, E) -> (B*Hkv, nkb, b, E): a view unless the last block needs padding."""
    B, H, N, E = x.shape
    if plan.n_k_blocks * plan.block != N:
        x = F.pad(x, (0, 0, 0, plan.n_k_blocks * plan.block - N))  # (B, Hkv, nkb*b, E)
    return x.reshape(B * H, plan.n_k_blocks, plan.block, E)


def _rows(xs, h: int, chunk) -> torch.Tensor:
    """A chunk's query blocks of K/V head h, its G query heads folded in: (n, G*b, E)."""
    bucket, r0, r1, _, first = chunk
    n = r1 - r0
    if first is not None:
        x = xs[h, :, first:first + n]  # (G, n, b, E) consecutive rows: a view
    else:
        x = xs[h].index_select(1, bucket.rows[r0:r1])  # (G, n, b, E)
    G, _, b, E = x.shape
    return x[0] if G == 1 else x.transpose(0, 1).reshape(n, G * b, E)


def _gather(xb, h: int, chunk, out=None) -> torch.Tensor:
    """The key (or value) blocks a chunk's rows see, K/V head h: (n, kmax*b, E), a copy."""
    bucket, r0, r1 = chunk[:3]
    idx = bucket.flat_idx[r0 * bucket.kmax:r1 * bucket.kmax]  # (n*kmax,)
    g = torch.index_select(xb[h], 0, idx, out=out)  # (n*kmax, b, E)
    return g.view(r1 - r0, -1, xb.shape[-1])


def _bias(chunk):
    bucket, r0, r1 = chunk[:3]
    return None if r1 <= bucket.n_full else bucket.bias[r0:r1]  # (n, 1, kmax*b)


def _from_rows(x, plan: BlockPlan, B: int, Hq: int, Nq: int) -> torch.Tensor:
    """(B*Hkv, nqb, G*b, E) query-block rows in bucket order -> (B, Hq, Nq, E)."""
    BH, nqb, gb, E = x.shape
    if plan.inverse is not None:
        x = x.index_select(1, plan.inverse)  # back to query-block order
    b = plan.block
    x = x.view(B, BH // B, nqb, gb // b, b, E).transpose(2, 3).reshape(B, Hq, nqb * b, E)
    return x[:, :, :Nq]


def _block_forward(q, k, v, plan: BlockPlan, scale: float, chunk_elements: int,
                   save_p: bool):
    """Output (B, Hq, Nq, Dv) and, with ``save_p``, P of every chunk (for the backward).

    The (head, chunk) items are shared out over the CPU threads (``split_work``); each
    piece's chunk-sized work buffers serve all of its chunks, and each chunk's result goes
    straight into its slot of the output, laid out in bucket order (each bucket's rows are
    contiguous there).
    """
    B, Hq, Nq, D = q.shape
    Hkv, Dv = k.shape[1], v.shape[-1]
    G, b, nqb = Hq // Hkv, plan.block, plan.n_q_blocks
    qs = _query_blocks(q, plan, Hkv)  # (B*Hkv, G, nqb, b, D)
    kb, vb = _key_blocks(k, plan), _key_blocks(v, plan)  # (B*Hkv, nkb, b, D|Dv)
    chunks = _chunk_list(plan, G, chunk_elements)
    o = q.new_empty(B * Hkv, nqb, G * b, Dv)  # (B*Hkv, nqb, G*b, Dv)
    items = [(h, chunk) for h in range(B * Hkv) for chunk in chunks]
    probs: list = [None] * len(items) if save_p else []

    def work(lo: int, hi: int) -> None:  # each piece: buffers for its own largest chunk
        most = max((c[2] - c[1]) * c[0].kmax for _, c in items[lo:hi])  # key blocks
        k_buf, v_buf = q.new_empty(most, b, D), q.new_empty(most, b, Dv)
        bufs = work_buffers(q, most * G * b * b)
        # fp32 without autograd: P overwrites the scores (one chunk-sized buffer in cache)
        p_buf = None if save_p or len(bufs) == 1 else q.new_empty(most * G * b * b)
        for i in range(lo, hi):
            h, chunk = items[i]
            bucket, r0, r1, pos, _ = chunk
            n, m = r1 - r0, (r1 - r0) * bucket.kmax
            kc = _gather(kb, h, chunk, k_buf[:m])  # (n, kmax*b, D) gathered keys
            vc = _gather(vb, h, chunk, v_buf[:m])  # (n, kmax*b, Dv) gathered values
            shape = (n, G * b, bucket.kmax * b)  # (n, G*b, kmax*b)
            p_out = (q.new_empty(shape) if save_p else
                     None if p_buf is None else p_buf[:m * G * b * b].view(shape))
            # softmax(scale * q k^T + bias); the bias hides padding keys (None: nothing)
            p = softmax_probs(_rows(qs, h, chunk), kc.transpose(1, 2), _bias(chunk), scale,
                              bufs, p_out)
            torch.bmm(p, vc, out=o[h, pos:pos + n])  # (n, G*b, Dv)
            if save_p:
                probs[i] = p

    split_work(work, len(items), q.device)
    o[:, nqb - plan.n_empty:].zero_()  # query blocks that see no key output 0
    return _from_rows(o, plan, B, Hq, Nq), probs


def _block_backward(q, k, v, probs, do, plan: BlockPlan, scale: float, chunk_elements: int):
    """dq, dk, dv from the saved P, chunk by chunk as in the forward (K/V gathered again).

    A query block is in one chunk, so each dq row is one matmul. A key block is seen by
    many query blocks: dk and dv are summed over them in ``softmax_dtype`` (fp32 for
    fp16/bf16), from unrounded per-chunk products, and rounded once at the end.
    """
    B, Hq, Nq, D = q.shape
    Hkv, Nk, Dv = k.shape[1], k.shape[2], v.shape[-1]
    G, b, nqb, nkb = Hq // Hkv, plan.block, plan.n_q_blocks, plan.n_k_blocks
    qs = _query_blocks(q, plan, Hkv)  # (B*Hkv, G, nqb, b, D)
    dos = _query_blocks(do, plan, Hkv)  # (B*Hkv, G, nqb, b, Dv)
    kb, vb = _key_blocks(k, plan), _key_blocks(v, plan)  # (B*Hkv, nkb, b, D|Dv)
    acc = softmax_dtype(q.dtype)
    dk = q.new_zeros(B * Hkv, nkb, b, D, dtype=acc)  # (B*Hkv, nkb, b, D)
    dv = q.new_zeros(B * Hkv, nkb, b, Dv, dtype=acc)  # (B*Hkv, nkb, b, Dv)
    dq = q.new_empty(B * Hkv, nqb, G * b, D)  # (B*Hkv, nqb, G*b, D) bucket order
    chunks = _chunk_list(plan, G, chunk_elements)

    def work(h0: int, h1: int) -> None:  # whole K/V heads: dk[h], dv[h] have one writer
        for h in range(h0, h1):
            for ci, chunk in enumerate(chunks):
                bucket, r0, r1, pos, _ = chunk
                idx = bucket.flat_idx[r0 * bucket.kmax:r1 * bucket.kmax]  # (n*kmax,)
                p = probs[h * len(chunks) + ci]  # (n, G*b, kmax*b), saved by the forward
                doc, vc = _rows(dos, h, chunk), _gather(vb, h, chunk)  # (n,G*b,Dv) (n,kmax*b,Dv)
                dv[h].index_add_(0, idx, bmm_acc(p.transpose(1, 2), doc).view(-1, b, Dv))
                ds = score_grad(p, bmm_acc(doc, vc.transpose(1, 2)), scale)  # (n,G*b,kmax*b)
                bmm_acc(ds, _gather(kb, h, chunk), out=dq[h, pos:pos + r1 - r0])  # (n,G*b,D)
                dk_c = bmm_acc(ds.transpose(1, 2), _rows(qs, h, chunk))  # (n, kmax*b, D)
                dk[h].index_add_(0, idx, dk_c.view(-1, b, D))

    split_work(work, B * Hkv, q.device)
    dq[:, nqb - plan.n_empty:].zero_()  # query blocks that see no key
    dk = dk.flatten(1, 2)[:, :Nk].to(k.dtype).view(k.shape)  # (B, Hkv, Nk, D)
    dv = dv.flatten(1, 2)[:, :Nk].to(v.dtype).view(v.shape)  # (B, Hkv, Nk, Dv)
    return _from_rows(dq, plan, B, Hq, Nq), dk, dv


class _BlockSparseAttention(torch.autograd.Function):
    """Keeps P of every chunk (O(computed tiles)); the backward is ``_block_backward``."""

    @staticmethod
    def forward(ctx, q, k, v, plan, scale, chunk_elements):
        o, probs = _block_forward(q, k, v, plan, scale, chunk_elements, save_p=True)
        ctx.save_for_backward(q, k, v)
        ctx.probs = probs  # intermediates (neither inputs nor outputs) may live on ctx
        ctx.args = (plan, scale, chunk_elements)
        return o

    @staticmethod
    @once_differentiable
    def backward(ctx, do):
        q, k, v = ctx.saved_tensors
        return (*_block_backward(q, k, v, ctx.probs, do, *ctx.args), None, None, None)


def block_sparse_attention(q, k, v, plan: BlockPlan, scale: float,
                           chunk_elements: int = CHUNK_ELEMENTS) -> torch.Tensor:
    """q (B, Hq, Nq, D); k (B, Hkv, Nk, D); v (B, Hkv, Nk, Dv) -> (B, Hq, Nq, Dv).

    Per K/V head and bucket, rows are processed in chunks whose scores hold about
    ``chunk_elements`` elements, so the gathered K/V and the scores stay in cache.
    """
    if _native.records_grad(q, k, v):
        return _BlockSparseAttention.apply(q, k, v, plan, scale, chunk_elements)
    return _block_forward(q, k, v, plan, scale, chunk_elements, save_p=False)[0]


def block_mask_reference(q, k, v, layout: torch.Tensor, block: int, scale: float,
                         grad_out: torch.Tensor | None = None) -> RefResult:
    """Float64 softmax attention under a block mask, one query block at a time.

    Equal to ``softmax_reference`` with the ``block_sparse`` mask (the tests check it), but
    each query block only evaluates the keys its layout row lets through, with plain
    indexing (no padding, buckets or biases), so a sparse layout at N = 16K costs seconds,
    not the dense N x N evaluation.
    """
    layout = layout.to("cpu", torch.bool)
    seq_k = k.shape[2]

    def rows(qc, k64, v64, r0, r1):  # qc (B, Hq, R, D), rows [r0, r1) in one query block
        B, Hq, R, D = qc.shape
        Hkv = k64.shape[1]
        kblocks = layout[r0 // block].nonzero().flatten()  # visible key blocks
        cols = (kblocks[:, None] * block + torch.arange(block)).flatten()
        cols = cols[cols < seq_k].to(k64.device)  # (C,) visible keys
        if cols.numel() == 0:  # sees nothing: output 0 (kept in the graph for autograd.grad)
            return qc.new_zeros(B, Hq, R, v64.shape[-1]) + 0 * qc.sum()
        kc, vc = k64[:, :, cols], v64[:, :, cols]  # (B, Hkv, C, D|Dv)
        qg = qc.reshape(B, Hkv, Hq // Hkv, R, D)  # (B, Hkv, G, R, D)
        p = torch.softmax(qg @ kc.unsqueeze(2).transpose(-1, -2) * scale, dim=-1)
        return (p @ vc.unsqueeze(2)).reshape(B, Hq, R, v64.shape[-1])  # (B, Hq, R, Dv)

    return chunked_reference(rows, q, k, v, grad_out, rows_per_chunk=block)


class BlockSparse(Backend):
    name = "block_sparse"
    description = ("softmax attention over the nonzero tiles of a block layout only "
                   "(gathered per query block, bucketed by row length); exact for "
                   "block_sparse masks, an approximation on dense cases")
    code_files = _native.sources(segments.KERNEL)
    native_kernels = (segments.KERNEL,)  # a run builds these before its first pair
    caps = Capabilities(masks=("none", "block_sparse"))
    params = knobs.BLOCK_SPARSE
    semantics = APPROXIMATE  # exact on block_sparse cases: impl_reference == case reference
    # Its softmax and gradient numerics are sliding_window's helpers.
    code_modules = ("attnbench.implementations.sliding_window",
                    "attnbench.implementations._segment_attention")

    def layout_density(self, case) -> float:
        """Share of the case's pairs its layout holds; 1.0 when it covers every tile, and
        then this is dense attention, exact whatever the case's mask."""
        name = case.mask_spec.layout or case.param("block_layout_name")
        if name not in block_layouts.LAYOUTS:  # refused by extra_reasons
            return 0.0
        return block_layouts.layout_pairs(name, case.seq_q, case.seq_k, case.param("block_size"),
                                          **case.layout_knobs) / (case.seq_q * case.seq_k)

    def approximation(self, case):
        if case.mask_spec.kind == "block_sparse" or self.layout_density(case) == 1.0:
            return ""  # the case's own block mask, or every tile: exact
        name, size = case.param("block_layout_name"), case.param("block_size")
        return (f"keeps only the {name!r} layout's {size}-wide blocks; choose with "
                f"block_layout_name=")

    def work_flops(self, case):
        """The tiles it computes (bucket padding included; the fused kernel pads nothing),
        not the dense case's pairs."""
        fused = self.fused_plan(case, case.device, case.torch_dtype)
        if fused is not None:
            pairs = fused.computed_pairs()
        else:
            plan = block_plan(case_layout(case), case.seq_q, case.seq_k, case.param("block_size"),
                              torch.float32, "cpu")
            pairs = plan.computed_blocks() * case.param("block_size")**2
        fwd = 2.0 * case.batch * case.heads_q * pairs * (case.head_dim + case.head_dim_v)
        return fwd * MODE_FLOP_FACTOR[case.mode]

    def plan(self, case, dtype=None, device="cpu") -> BlockPlan:
        return block_plan(case_layout(case), case.seq_q, case.seq_k, case.param("block_size"),
                          softmax_dtype(dtype or case.torch_dtype), device)

    def fused_plan(self, case, device, dtype) -> segments.SegmentPlan | None:
        """The fused kernel's plan where it runs this case (``segments.fused_applies``)."""
        if not segments.fused_applies(device, dtype, case.needs_grad, case.head_dim,
                                      case.head_dim_v):
            return None
        return segments.layout_segments(case_layout(case), case.seq_q, case.seq_k,
                                        case.param("block_size"))

    def build(self, case, inputs):
        plan = self.plan(case, inputs.q.dtype, inputs.q.device)
        fused = self.fused_plan(case, inputs.q.device, inputs.q.dtype)
        scale = case.softmax_scale

        def block_sparse(q, k, v):
            out = segments.fused_call(fused, q, k, v, scale)
            return block_sparse_attention(q, k, v, plan, scale) if out is None else out

        return block_sparse

    def prepare(self, case, inputs):
        prepared = wrap_mode(self.build(case, inputs), case, inputs)
        fused = self.fused_plan(case, inputs.q.device, inputs.q.dtype)
        prepared.extras["kernel"] = segments.kernel_name(
            fused, "eager(buckets)", inputs.q.device, inputs.q.dtype, case.needs_grad)
        density = self.layout_density(case)
        columns = {"layout_density": density} | ({"semantics": EXACT} if density == 1.0
                                                  else {})
        prepared.extras["columns_after_check"] = lambda: columns
        return prepared

    def impl_reference(self, case, inputs):
        """Float64 softmax attention under the block mask this backend applies."""
        return block_mask_reference(inputs.q, inputs.k, inputs.v, case_layout(case),
                                    case.param("block_size"), case.softmax_scale,
                                    inputs.grad_out if case.needs_grad else None)


BACKENDS = [BlockSparse()]
