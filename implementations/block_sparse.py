"""block_sparse: softmax attention restricted to a block layout, computing only nonzero blocks.

The layout is a boolean (n_q_blocks, n_k_blocks) grid of ``b x b`` tiles (``local``,
``bigbird`` or ``explicit``; see ``attnbench.block_layouts``). For each query block the
key blocks it may see are listed; query blocks are grouped into *buckets* by how many key
blocks they see, and inside a bucket every row's list is padded to the bucket's maximum
with a dummy (masked) key block. A bucket then runs as dense batched work:

    K_g = K_blocks[idx]                  (rows, kmax*b, D)   gathered copy, no dense N x N
    S   = scale * Q_rows @ K_g^T + bias  (rows, G*b, kmax*b)
    O   = softmax(S) @ V_g               (rows, G*b, Dv)

Bucketing keeps the cost honest for layouts with a few dense rows: BigBird's global query
blocks see every key block, and padding all rows to that length would be dense attention
again. Work is ``sum over rows of (padded count) * b * b * (D + Dv)``, so O(N) when every
row sees a bounded number of blocks (local, bigbird's band + random) plus O(N) per global
row. GQA folds the G query heads sharing a K/V head into a block's rows (no K/V repeat).

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

from attnbench import block_layouts
from attnbench.backend import APPROXIMATE, Backend, Capabilities
from attnbench.reference import RefResult, chunked_reference


def case_layout(case) -> torch.Tensor:
    """The (n_q_blocks, n_k_blocks) layout this backend applies to ``case``."""
    if case.mask_spec.kind == "block_sparse":
        return case.block_layout
    return block_layouts.make_layout(
        case.block_layout_name, case.seq_q, case.seq_k, case.block_size, band=case.block_band,
        global_blocks=case.block_global, random_blocks=case.block_random, seed=case.seed,
        pairs=case.block_pairs)


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


def block_sparse_attention(q, k, v, plan: BlockPlan, scale: float,
                           chunk_elements: int = 1 << 19) -> torch.Tensor:
    """q (B, Hq, Nq, D); k (B, Hkv, Nk, D); v (B, Hkv, Nk, Dv) -> (B, Hq, Nq, Dv).

    Per K/V head and bucket, rows are processed in chunks whose scores hold about
    ``chunk_elements`` elements, so the gathered K/V and the scores stay in cache.
    """
    B, Hq, Nq, D = q.shape
    Hkv, Nk, Dv = k.shape[1], k.shape[2], v.shape[-1]
    G, b = Hq // Hkv, plan.block
    nqb, nkb = plan.n_q_blocks, plan.n_k_blocks
    grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
    qs = q
    if nqb * b != Nq:
        qs = F.pad(qs, (0, 0, 0, nqb * b - Nq))  # (B, Hq, nqb*b, D)
    qs = qs.view(B * Hkv, G, nqb, b, D)  # (B*Hkv, G, nqb, b, D)
    # K/V as blocks (a view unless the last block is partial and needs zero padding).
    kb = (F.pad(k, (0, 0, 0, nkb * b - Nk)) if nkb * b != Nk else k).reshape(B * Hkv, nkb, b * D)
    vb = (F.pad(v, (0, 0, 0, nkb * b - Nk)) if nkb * b != Nk else v).reshape(B * Hkv, nkb,
                                                                            b * Dv)
    # Without autograd every chunk's result goes straight into its slot of the output,
    # laid out in bucket order (each bucket's rows are contiguous there).
    o = None if grad else q.new_empty(B * Hkv, nqb, G * b, Dv)  # (B*Hkv, nqb, G*b, Dv)
    if not grad:  # chunk-sized work buffers shared by every chunk: no allocation per chunk
        most = max((min(len(bk.rows), _per(chunk_elements, G, b, bk.kmax)) * bk.kmax
                    for bk in plan.buckets), default=0)  # key blocks in the largest chunk
        k_buf, v_buf = q.new_empty(most * b * D), q.new_empty(most * b * Dv)
        s_buf, p_buf = q.new_empty(most * G * b * b), q.new_empty(most * G * b * b)
    outs = []
    for h in range(B * Hkv):
        pos = 0
        for bucket in plan.buckets:
            nr, kmax = bucket.idx.shape
            for r0, r1 in _chunks(nr, _per(chunk_elements, G, b, kmax), bucket.n_full):
                n = r1 - r0
                first = bucket.row_list[r0]
                if bucket.row_list[r0:r1] == list(range(first, first + n)):
                    qc = qs[h, :, first:first + n]  # (G, n, b, D) consecutive rows: a view
                else:
                    qc = qs[h].index_select(1, bucket.rows[r0:r1])  # (G, n, b, D)
                qc = qc[0] if G == 1 else qc.transpose(0, 1).reshape(n, G * b, D)
                idx = bucket.flat_idx[r0 * kmax:r1 * kmax]  # (n*kmax,)
                bias = None if r1 <= bucket.n_full else bucket.bias[r0:r1]  # (n, 1, kmax*b)
                if o is None:
                    kc = kb[h].index_select(0, idx).view(n, kmax * b, D)  # gathered keys
                    vc = vb[h].index_select(0, idx).view(n, kmax * b, Dv)  # gathered values
                    if bias is None:
                        s = torch.bmm(qc, kc.transpose(1, 2)).mul_(scale)  # (n, G*b, kmax*b)
                    else:  # some keys are padding: the bias hides them
                        s = torch.baddbmm(bias, qc, kc.transpose(1, 2), alpha=scale)
                    outs.append(torch.bmm(torch.softmax(s, dim=-1), vc))  # (n, G*b, Dv)
                    continue
                m = n * kmax
                kc = torch.index_select(kb[h], 0, idx, out=k_buf[:m * b * D].view(m, b * D))
                vc = torch.index_select(vb[h], 0, idx, out=v_buf[:m * b * Dv].view(m, b * Dv))
                kc, vc = kc.view(n, kmax * b, D), vc.view(n, kmax * b, Dv)
                s = s_buf[:m * G * b * b].view(n, G * b, kmax * b)
                p = p_buf[:m * G * b * b].view(n, G * b, kmax * b)
                if bias is None:  # beta=0: s is only the destination
                    torch.baddbmm(s, qc, kc.transpose(1, 2), beta=0, alpha=scale, out=s)
                else:
                    torch.baddbmm(bias, qc, kc.transpose(1, 2), alpha=scale, out=s)
                torch.softmax(s, dim=-1, out=p)
                torch.bmm(p, vc, out=o[h, pos + r0:pos + r1])
            pos += nr
        if plan.n_empty:  # query blocks that see no key output 0
            if o is None:
                outs.append(q.new_zeros(plan.n_empty, G * b, Dv))
            else:
                o[h, pos:].zero_()
    if o is None:
        o = torch.cat(outs) if len(outs) > 1 else outs[0]  # (B*Hkv*nqb, G*b, Dv)
        o = o.view(B * Hkv, nqb, G * b, Dv)
    if plan.inverse is not None:
        o = o.index_select(1, plan.inverse)  # back to query-block order
    o = o.view(B, Hkv, nqb, G, b, Dv).transpose(2, 3).reshape(B, Hq, nqb * b, Dv)
    return o[:, :, :Nq]  # (B, Hq, Nq, Dv)


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
    caps = Capabilities(masks=("none", "block_sparse"))
    semantics = APPROXIMATE  # exact on block_sparse cases: impl_reference == case reference

    def extra_reasons(self, case):
        out = []
        if case.mask_spec.kind == "none" and case.block_layout_name not in block_layouts.LAYOUTS:
            out.append(f"block_layout_name {case.block_layout_name!r} unknown "
                       f"(allowed: {', '.join(block_layouts.LAYOUTS)})")
        return out

    def approximation(self, case):
        if case.mask_spec.kind == "block_sparse":
            return ""  # the case's own block mask: exact
        return (f"keeps only the {case.block_layout_name!r} layout's {case.block_size}-wide "
                f"blocks; choose with block_layout_name=")

    def plan(self, case, dtype=None, device="cpu") -> BlockPlan:
        return block_plan(case_layout(case), case.seq_q, case.seq_k, case.block_size,
                          dtype or case.torch_dtype, device)

    def build(self, case, inputs):
        plan = self.plan(case, inputs.q.dtype, inputs.q.device)
        scale = case.softmax_scale

        def block_sparse(q, k, v):
            return block_sparse_attention(q, k, v, plan, scale)

        return block_sparse

    def impl_reference(self, case, inputs):
        """Float64 softmax attention under the block mask this backend applies."""
        return block_mask_reference(inputs.q, inputs.k, inputs.v, case_layout(case),
                                    case.block_size, case.softmax_scale,
                                    inputs.grad_out if case.needs_grad else None)


BACKENDS = [BlockSparse()]
