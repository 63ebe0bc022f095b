"""Attention over contiguous key segments: the fused CPU forward shared by sliding_window
and block_sparse (``native/segment_attention.cpp``).

Both backends reduce to the same computation: query rows in blocks, each block seeing a few
contiguous key ranges (a sliding window: one span; a block layout: runs of consecutive key
tiles), and within them a per-row visible interval ``[i + lo_off, i + hi_off]`` (the window
band; unbounded for a layout). A ``SegmentPlan`` is that geometry as data; the kernel reads
K and V rows in place (no gather, no padding) and keeps each block's scores in cache
between its two products (register tiles; MKL's sgemm when Dv is not a multiple of 16)
and the softmax.

The fused path runs the fp32 CPU forward, where the blocked eager path is bounded by its
separate small ops, and under autograd its backward too (``FusedSegmentAttention``: the
forward keeps each row's max and 1 / sum, the backward recomputes P block by block) where
both head dims are multiples of 16. Everything else (fp16/bf16, CUDA, other head dims
under autograd) stays on the eager path. Which one ran is in a record's ``kernel``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.autograd.function import once_differentiable

from attnbench.implementations import _native
from attnbench.implementations._cpu_threads import PIECES_PER_THREAD

KERNEL = "segment_attention"
UNBOUNDED = 1 << 62  # an offset no row index reaches


@dataclass(frozen=True)
class SegmentPlan:
    """Query blocks of ``block`` rows; block b sees segments [ptr[b], ptr[b + 1])."""

    seq_q: int
    seq_k: int
    block: int
    ptr: torch.Tensor  # (n_blocks + 1,) int64 offsets into start / length
    start: torch.Tensor  # (n_segments,) int64 first key of each segment
    length: torch.Tensor  # (n_segments,) int64 keys in each segment (> 0)
    lo_off: int  # row i sees key j only if i + lo_off <= j <= i + hi_off
    hi_off: int

    @property
    def n_blocks(self) -> int:
        return self.ptr.numel() - 1

    def computed_pairs(self) -> int:
        """(query, key) scores the kernel computes per (batch, query head)."""
        widths = torch.zeros(self.n_blocks, dtype=torch.int64)
        block_of = torch.repeat_interleave(torch.arange(self.n_blocks), self.ptr.diff())
        widths.index_add_(0, block_of, self.length)  # (n_blocks,) keys per block
        rows = torch.full((self.n_blocks,), self.block, dtype=torch.int64)
        rows[-1] = self.seq_q - self.block * (self.n_blocks - 1)
        return int((rows * widths).sum())


def _plan(seq_q, seq_k, block, ranges_per_block, lo_off, hi_off) -> SegmentPlan:
    """``ranges_per_block``: per query block, its (start, end) key ranges, clipped here to
    [0, seq_k); empty ranges are dropped."""
    ptr, start, length = [0], [], []
    for ranges in ranges_per_block:
        for a, b in ranges:
            a, b = max(a, 0), min(b, seq_k)
            if b > a:
                start.append(a)
                length.append(b - a)
        ptr.append(len(start))
    as_t = lambda x: torch.tensor(x, dtype=torch.int64)  # noqa: E731
    return SegmentPlan(seq_q, seq_k, block, as_t(ptr), as_t(start), as_t(length),
                       lo_off, hi_off)


def window_segments(seq_q: int, seq_k: int, left: int, right: int, block: int) -> SegmentPlan:
    """Bottom-right aligned window (left, right), both finite: query i sees keys
    [i + off - left, i + off + right], off = seq_k - seq_q; block b needs one span."""
    off = seq_k - seq_q
    n_blocks = -(-seq_q // block)
    spans = ([(b * block + off - left, b * block + block - 1 + off + right + 1)]
             for b in range(n_blocks))
    return _plan(seq_q, seq_k, block, spans, off - left, off + right)


def layout_segments(layout: torch.Tensor, seq_q: int, seq_k: int, block: int) -> SegmentPlan:
    """A (n_q_blocks, n_k_blocks) tile layout of ``block``-wide tiles: each query block sees
    the runs of consecutive key tiles in its row, every key in them."""
    layout = layout.to("cpu", torch.bool)
    runs_per_block = []
    for row in layout.tolist():
        runs, k = [], 0
        while k < len(row):
            if row[k]:
                k0 = k
                while k < len(row) and row[k]:
                    k += 1
                runs.append((k0 * block, k * block))
            else:
                k += 1
        runs_per_block.append(runs)
    return _plan(seq_q, seq_k, block, runs_per_block, -UNBOUNDED, UNBOUNDED)


def kernel_status() -> tuple[bool, str]:
    """Whether the fused kernel is usable here, and if not, why."""
    module, reason = _native.load(KERNEL)
    return module is not None, reason


PANEL = 16  # the backward's tiles: both head dims a multiple of it


def grad_fits(head_dim: int, head_dim_v: int) -> bool:
    """Whether the kernel's backward runs these head dims (its dq and dk come out of the
    same 16-wide tiles as dv)."""
    return head_dim % PANEL == 0 and head_dim_v % PANEL == 0


def fused_applies(device, dtype: torch.dtype, needs_grad: bool, head_dim: int,
                  head_dim_v: int) -> bool:
    """The cases the fused kernels run: fp32 on a CPU; under autograd, head dims the
    backward fits."""
    return ((not needs_grad or grad_fits(head_dim, head_dim_v))
            and _native.applies(KERNEL, device, dtype, needs_grad=False))


def _module():
    module, reason = _native.load(KERNEL)
    if module is None:
        raise RuntimeError(f"the fused segment kernel is unavailable: {reason}")
    return module


def fused_forward(q, k, v, plan: SegmentPlan, scale: float,
                  stats: torch.Tensor | None = None) -> torch.Tensor:
    """q (B, Hq, Nq, D); k (B, Hkv, Nk, D); v (B, Hkv, Nk, Dv) fp32 CPU -> (B, Hq, Nq, Dv);
    each row's score max and 1 / sum into ``stats`` (B, Hq, Nq, 2) where given (0, 0: the
    row sees no key).

    The kernel shares the (batch, query head, query block) tasks out over the CPU threads
    in pieces, in one parallel region (``native/cpu_pieces.h``), without the GIL.
    """
    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    B, Hq, Nq, _ = q.shape
    out = q.new_empty(B, Hq, Nq, v.shape[-1])  # (B, Hq, Nq, Dv)
    stats = q.new_empty(0) if stats is None else stats
    _module().segment_attention_forward_parallel(
        q, k, v, out, stats, plan.ptr, plan.start, plan.length, plan.block, plan.lo_off,
        plan.hi_off, scale, PIECES_PER_THREAD)
    return out


class FusedSegmentAttention(torch.autograd.Function):
    """The fused forward under autograd; it saves each row's score max and 1 / sum (O(N)),
    from which the backward (the kernel's ``segment_attention_backward``) recomputes P,
    one task per (batch, kv head) so that each head's dk and dv have one writer."""

    @staticmethod
    def forward(ctx, q, k, v, plan: SegmentPlan, scale: float):
        q, k, v = (t.contiguous() for t in (q, k, v))
        stats = q.new_empty(*q.shape[:3], 2)  # (B, Hq, Nq, 2)
        out = fused_forward(q, k, v, plan, scale, stats)
        ctx.save_for_backward(q, k, v, stats)
        ctx.plan, ctx.scale = plan, scale
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, dout):
        q, k, v, stats = ctx.saved_tensors
        plan = ctx.plan
        dout = dout.contiguous()
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        _module().segment_attention_backward_parallel(
            q, k, v, dout, stats, dq, dk, dv, plan.ptr, plan.start, plan.length, plan.block,
            plan.lo_off, plan.hi_off, ctx.scale, PIECES_PER_THREAD)
        return dq, dk, dv, None, None


def fused_call(plan: SegmentPlan | None, q, k, v, scale: float) -> torch.Tensor | None:
    """The fused kernels' output for this call, or None where they do not run it: no plan
    (``fused_applies`` said no), or autograd records a call whose head dims the backward
    does not fit (a forward-only case run under autograd)."""
    if plan is None:
        return None
    if not _native.records_grad(q, k, v):
        return fused_forward(q, k, v, plan, scale)
    if grad_fits(q.shape[-1], v.shape[-1]):
        return FusedSegmentAttention.apply(q, k, v, plan, scale)
    return None


def kernel_name(fused: SegmentPlan | None, eager: str, device, dtype, needs_grad: bool) -> str:
    """A record's ``kernel``: the fused kernel and its block (",fused-backward" under
    autograd), or the eager path (and why)."""
    label = f"fused-segments(Bq={fused.block})" if fused is not None else ""
    if fused is not None and needs_grad:
        label += ",fused-backward"
    return _native.kernel_name(KERNEL, fused is not None, eager, device, dtype, needs_grad,
                               label)
