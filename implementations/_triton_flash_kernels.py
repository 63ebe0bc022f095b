"""FlashAttention-2 in Triton: forward, backward and the autograd wrapper (used by triton_flash).

Written from the algorithm of Dao, "FlashAttention-2: Faster Attention with Better Parallelism
and Work Partitioning" (2023), Algorithms 1 and 2:

* forward: one program per (query block, batch x head); online softmax with a running row
  maximum and sum in fp32, ``exp2`` with ``scale * log2(e)`` folded into the scores; it stores
  the output and the base-2 log-sum-exp of every row for the backward pass;
* backward: a pre-pass ``delta = rowsum(dO * O)``, then one program per (key block, batch x
  kv-head) accumulating dK and dV over the query blocks (and over the query heads of its GQA
  group, so shared K/V heads get summed gradients without atomics or extra copies), and one
  program per (query block, batch x head) accumulating dQ over the key blocks.

Masks are bottom-right aligned bands (``off = seq_k - seq_q``; query ``i`` sees key ``j`` iff
``i + off - left <= j <= i + off + right``). Every loop over the other sequence runs over three
segments: blocks that are only partly visible at the start (masked), blocks that are fully
visible (no mask arithmetic, no bounds checks), and partly visible blocks at the end (masked,
which also covers the ragged tail). Blocks that are entirely invisible are never visited, so
causal costs about half of the full product and a window costs O(N * window).

Head dimensions that are not powers of two are padded to the next power of two (at least 16)
inside the kernel by masked loads; the inputs are never copied. Any strides are accepted.

Rows that see no key output zeros and get zero gradients: their log-sum-exp is stored as +inf,
which turns every recomputed probability of the row into exp2(-inf) = 0.

This module decides at import whether Triton runs compiled or through its interpreter
(``TRITON_INTERPRET=1`` must be set before the first import); ``INTERPRET`` records which.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

try:  # Triton >= 3.2 keeps the switch in knobs; older ones read the variable directly.
    from triton import knobs as _knobs

    INTERPRET = bool(_knobs.runtime.interpret)
except Exception:  # pragma: no cover - depends on the installed Triton
    import os

    INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")

LOG2E = 1.4426950408889634

# Loop form of the kernels. Compiled, every loop is ``for x in range(lo, hi, step)`` (an scf.for,
# which Triton software-pipelines over num_stages). Under the interpreter the same iterations run
# as a ``while`` loop: the interpreter keeps every runtime scalar (program ids, integer arguments
# and anything computed from them) as a 1-element numpy array, and Triton 3.6's interpreter
# hands a tensor loop bound to ``range`` through ``tensor.__index__ = int(self.handle.data)``,
# which NumPy >= 2.4 refuses ("only 0-dimensional arrays can be converted to Python scalars",
# triton-lang/triton#9171; later releases squeeze first). A ``while`` condition goes through
# ``bool()``, which NumPy still allows on one element. A constexpr ``if`` compiles only the taken
# branch, so the compiled kernels contain the ``for`` loops alone.
_WHILE_LOOPS = tl.constexpr(INTERPRET)


# ---------------------------------------------------------------------------------------------
# Kernels
# ---------------------------------------------------------------------------------------------
@triton.jit
def _load_tile(ptrs, row_ok, col_ok, CHECK_ROWS: tl.constexpr, CHECK_COLS: tl.constexpr):
    """Load a 2-D tile, bounds-checking rows and/or columns only where asked (0 elsewhere)."""
    if CHECK_ROWS:
        if CHECK_COLS:
            x = tl.load(ptrs, mask=row_ok[:, None] & col_ok[None, :], other=0.0)
        else:
            x = tl.load(ptrs, mask=row_ok[:, None], other=0.0)
    else:
        if CHECK_COLS:
            x = tl.load(ptrs, mask=col_ok[None, :], other=0.0)
        else:
            x = tl.load(ptrs)
    return x


@triton.jit
def _mma(a, b, DOT_PREC: tl.constexpr):
    """a @ b accumulated in fp32. DOT_PREC "upcast" multiplies in fp32 (the Triton 3.9
    interpreter's dot mishandles bf16, which it stores as uint16)."""
    if DOT_PREC == "upcast":
        c = tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    else:
        c = tl.dot(a, b, input_precision=DOT_PREC)
    return c


@triton.jit
def _cast(x, dtype: tl.constexpr, DOT_PREC: tl.constexpr):
    """x.to(dtype), rounding to nearest even. Under "upcast" (the interpreter with bf16) the
    rounding is done by hand: the Triton 3.9 interpreter truncates fp32 -> bf16 instead."""
    if DOT_PREC == "upcast":
        bits = x.to(tl.uint32, bitcast=True)
        bits = (bits + (((bits >> 16) & 1) + 0x7FFF)) & 0xFFFF0000
        y = bits.to(tl.float32, bitcast=True).to(dtype)
    else:
        y = x.to(dtype)
    return y


@triton.jit
def _band_visible(rows, cols, off, LEFT, RIGHT, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr):
    """(len(rows), len(cols)) bool: query row may see key column under the band mask."""
    rel = cols[None, :] - (rows[:, None] + off)  # j - (i + off)
    vis = rel == rel
    if HAS_LEFT:
        vis = vis & (rel >= -LEFT)
    if HAS_RIGHT:
        vis = vis & (rel <= RIGHT)
    return vis


@triton.jit
def _key_segments(m0, SEQ_Q, SEQ_K, LEFT, RIGHT, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Key-block bounds for the query block starting at m0: lo <= a <= b <= hi.

    [lo, a) partly visible (left edge), [a, b) fully visible and in bounds, [b, hi) partly
    visible (right edge / diagonal / ragged tail). Keys outside [lo, hi) are invisible.
    """
    off = SEQ_K - SEQ_Q
    m_last = tl.minimum(m0 + BLOCK_M, SEQ_Q) - 1
    if HAS_LEFT:
        lo = (tl.maximum(m0 + off - LEFT, 0) // BLOCK_N) * BLOCK_N
        a = tl.cdiv(tl.maximum(m_last + off - LEFT, 0), BLOCK_N) * BLOCK_N
    else:
        lo = m0 * 0
        a = lo
    if HAS_RIGHT:
        hi = tl.minimum(m_last + off + RIGHT + 1, SEQ_K)
        end_full = tl.minimum(m0 + off + RIGHT + 1, SEQ_K)
    else:
        hi = m0 * 0 + SEQ_K
        end_full = hi
    b = (tl.maximum(end_full, 0) // BLOCK_N) * BLOCK_N
    b = tl.maximum(b, lo)
    a = tl.minimum(tl.maximum(a, lo), b)
    return lo, a, b, hi


@triton.jit
def _query_segments(n0, SEQ_Q, SEQ_K, LEFT, RIGHT, HAS_LEFT: tl.constexpr,
                    HAS_RIGHT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Query-block bounds for the key block starting at n0 (the transpose of _key_segments).

    Key j is seen by rows i with j - off - right <= i <= j - off + left.
    """
    off = SEQ_K - SEQ_Q
    n_last = tl.minimum(n0 + BLOCK_N, SEQ_K) - 1
    if HAS_RIGHT:
        lo = (tl.maximum(n0 - off - RIGHT, 0) // BLOCK_M) * BLOCK_M
        a = tl.cdiv(tl.maximum(n_last - off - RIGHT, 0), BLOCK_M) * BLOCK_M
    else:
        lo = n0 * 0
        a = lo
    if HAS_LEFT:
        hi = tl.minimum(n_last - off + LEFT + 1, SEQ_Q)
        end_full = tl.minimum(n0 - off + LEFT + 1, SEQ_Q)
    else:
        hi = n0 * 0 + SEQ_Q
        end_full = hi
    b = (tl.maximum(end_full, 0) // BLOCK_M) * BLOCK_M
    b = tl.maximum(b, lo)
    a = tl.minimum(tl.maximum(a, lo), b)
    return lo, a, b, hi


@triton.jit
def _fwd_step(acc, l_i, m_i, q, K_base, V_base, skn, skd, svn, svd, offs_m, offs_d, offs_dv,
              d_ok, dv_ok, start_n, off, SEQ_K, LEFT, RIGHT, qk_scale,
              HEAD_D: tl.constexpr, HEAD_DV: tl.constexpr, BLOCK_N: tl.constexpr,
              BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, MASKED: tl.constexpr,
              HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, DOT_PREC: tl.constexpr):
    """One key block of the forward loop: the online-softmax update for keys start_n + [0, N)."""
    offs_n = start_n + tl.arange(0, BLOCK_N)
    n_ok = offs_n < SEQ_K
    kT = _load_tile(K_base + offs_d[:, None] * skd + offs_n[None, :] * skn, d_ok, n_ok,
                    BLOCK_D != HEAD_D, MASKED)  # (BLOCK_D, BLOCK_N)
    s = _mma(q, kT, DOT_PREC) * qk_scale  # (BLOCK_M, BLOCK_N), log2 units
    if MASKED:
        vis = _band_visible(offs_m, offs_n, off, LEFT, RIGHT, HAS_LEFT, HAS_RIGHT)
        vis = vis & n_ok[None, :]
        s = tl.where(vis, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    if MASKED:  # a row with nothing visible yet keeps m = -inf; shift it by 0 instead
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
    else:
        m_use = m_new
    p = tl.exp2(s - m_use[:, None])
    alpha = tl.exp2(m_i - m_use)
    l_i = l_i * alpha + tl.sum(p, 1)
    v = _load_tile(V_base + offs_n[:, None] * svn + offs_dv[None, :] * svd, n_ok, dv_ok,
                   MASKED, BLOCK_DV != HEAD_DV)  # (BLOCK_N, BLOCK_DV)
    acc = acc * alpha[:, None] + _mma(_cast(p, v.dtype, DOT_PREC), v, DOT_PREC)
    m_i = m_new
    return acc, l_i, m_i


@triton.jit
def _fwd_inner(acc, l_i, m_i, q, K_base, V_base, skn, skd, svn, svd, offs_m, offs_d, offs_dv,
               start, end, SEQ_Q, SEQ_K, LEFT, RIGHT, qk_scale,
               HEAD_D: tl.constexpr, HEAD_DV: tl.constexpr, BLOCK_N: tl.constexpr,
               BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, MASKED: tl.constexpr,
               HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, DOT_PREC: tl.constexpr):
    """Run _fwd_step over the key blocks [start, end) (a while loop under the interpreter,
    see _WHILE_LOOPS)."""
    off = SEQ_K - SEQ_Q
    d_ok = offs_d < HEAD_D
    dv_ok = offs_dv < HEAD_DV
    if _WHILE_LOOPS:
        start_n = start
        while start_n < end:
            acc, l_i, m_i = _fwd_step(acc, l_i, m_i, q, K_base, V_base, skn, skd, svn, svd,
                                      offs_m, offs_d, offs_dv, d_ok, dv_ok, start_n, off, SEQ_K,
                                      LEFT, RIGHT, qk_scale, HEAD_D, HEAD_DV, BLOCK_N, BLOCK_D,
                                      BLOCK_DV, MASKED, HAS_LEFT, HAS_RIGHT, DOT_PREC)
            start_n += BLOCK_N
    else:
        for start_n in range(start, end, BLOCK_N):
            acc, l_i, m_i = _fwd_step(acc, l_i, m_i, q, K_base, V_base, skn, skd, svn, svd,
                                      offs_m, offs_d, offs_dv, d_ok, dv_ok, start_n, off, SEQ_K,
                                      LEFT, RIGHT, qk_scale, HEAD_D, HEAD_DV, BLOCK_N, BLOCK_D,
                                      BLOCK_DV, MASKED, HAS_LEFT, HAS_RIGHT, DOT_PREC)
    return acc, l_i, m_i


@triton.jit
def _fwd_kernel(Q, K, V, O, LSE,
                sqb, sqh, sqm, sqd, skb, skh, skn, skd, svb, svh, svn, svd,
                sob, soh, som, sod,
                H, GROUP, SEQ_Q, SEQ_K, LEFT, RIGHT, qk_scale,
                HEAD_D: tl.constexpr, HEAD_DV: tl.constexpr,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
                HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, DOT_PREC: tl.constexpr):
    # Last query blocks first: under a causal mask they have the most keys, and starting the
    # longest programs first shortens the tail of the launch.
    pid_m = tl.num_programs(0) - 1 - tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    hk = h // GROUP
    m0 = pid_m * BLOCK_M
    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    m_ok = offs_m < SEQ_Q

    Q_base = Q + b.to(tl.int64) * sqb + h.to(tl.int64) * sqh
    K_base = K + b.to(tl.int64) * skb + hk.to(tl.int64) * skh
    V_base = V + b.to(tl.int64) * svb + hk.to(tl.int64) * svh
    q = _load_tile(Q_base + offs_m[:, None] * sqm + offs_d[None, :] * sqd, m_ok,
                   offs_d < HEAD_D, True, BLOCK_D != HEAD_D)  # (BLOCK_M, BLOCK_D)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)

    lo, a, bnd, hi = _key_segments(m0, SEQ_Q, SEQ_K, LEFT, RIGHT, HAS_LEFT, HAS_RIGHT,
                                   BLOCK_M, BLOCK_N)
    if HAS_LEFT:  # left edge of a window
        acc, l_i, m_i = _fwd_inner(acc, l_i, m_i, q, K_base, V_base, skn, skd, svn, svd, offs_m,
                                   offs_d, offs_dv, lo, a, SEQ_Q, SEQ_K, LEFT, RIGHT, qk_scale,
                                   HEAD_D, HEAD_DV, BLOCK_N, BLOCK_D, BLOCK_DV, True,
                                   HAS_LEFT, HAS_RIGHT, DOT_PREC)
    acc, l_i, m_i = _fwd_inner(acc, l_i, m_i, q, K_base, V_base, skn, skd, svn, svd, offs_m,
                               offs_d, offs_dv, a, bnd, SEQ_Q, SEQ_K, LEFT, RIGHT, qk_scale,
                               HEAD_D, HEAD_DV, BLOCK_N, BLOCK_D, BLOCK_DV, False,
                               HAS_LEFT, HAS_RIGHT, DOT_PREC)
    acc, l_i, m_i = _fwd_inner(acc, l_i, m_i, q, K_base, V_base, skn, skd, svn, svd, offs_m,
                               offs_d, offs_dv, bnd, hi, SEQ_Q, SEQ_K, LEFT, RIGHT, qk_scale,
                               HEAD_D, HEAD_DV, BLOCK_N, BLOCK_D, BLOCK_DV, True,
                               HAS_LEFT, HAS_RIGHT, DOT_PREC)

    empty = l_i == 0.0  # rows that see no key: output 0, log-sum-exp +inf
    l_safe = tl.where(empty, 1.0, l_i)
    out = acc / l_safe[:, None]
    lse = tl.where(empty, float("inf"), m_i + tl.log2(l_safe))
    O_base = O + b.to(tl.int64) * sob + h.to(tl.int64) * soh
    o_ptrs = O_base + offs_m[:, None] * som + offs_dv[None, :] * sod
    tl.store(o_ptrs, _cast(out, O.dtype.element_ty, DOT_PREC),
             mask=m_ok[:, None] & (offs_dv[None, :] < HEAD_DV))
    tl.store(LSE + pid_bh.to(tl.int64) * SEQ_Q + offs_m, lse, mask=m_ok)


@triton.jit
def _bwd_delta_kernel(O, DO, DELTA, sob, soh, som, sod, sdb, sdh, sdm, sdd, H, SEQ_Q,
                      HEAD_DV: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_DV: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_dv = tl.arange(0, BLOCK_DV)
    m_ok = offs_m < SEQ_Q
    dv_ok = offs_dv < HEAD_DV
    o = _load_tile(O + b.to(tl.int64) * sob + h.to(tl.int64) * soh + offs_m[:, None] * som
                   + offs_dv[None, :] * sod, m_ok, dv_ok, True, BLOCK_DV != HEAD_DV)
    do = _load_tile(DO + b.to(tl.int64) * sdb + h.to(tl.int64) * sdh + offs_m[:, None] * sdm
                    + offs_dv[None, :] * sdd, m_ok, dv_ok, True, BLOCK_DV != HEAD_DV)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)  # (BLOCK_M,)
    tl.store(DELTA + pid_bh.to(tl.int64) * SEQ_Q + offs_m, delta, mask=m_ok)


@triton.jit
def _dkdv_step(dk, dv, k, v, Q_base, DO_base, LSE_base, DELTA_base, sqm, sqd, sdm, sdd,
               offs_n, offs_d, offs_dv, d_ok, dv_ok, start_m, off, SEQ_Q, LEFT, RIGHT, qk_scale,
               HEAD_D: tl.constexpr, HEAD_DV: tl.constexpr, BLOCK_M: tl.constexpr,
               BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, MASKED: tl.constexpr,
               HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, DOT_PREC: tl.constexpr):
    """One query block of the dK/dV loop: the contribution of rows start_m + [0, M)."""
    offs_m = start_m + tl.arange(0, BLOCK_M)
    m_ok = offs_m < SEQ_Q
    qT = _load_tile(Q_base + offs_d[:, None] * sqd + offs_m[None, :] * sqm, d_ok, m_ok,
                    BLOCK_D != HEAD_D, MASKED)  # (BLOCK_D, BLOCK_M)
    if MASKED:  # padded rows: lse = +inf makes their probabilities 0
        lse = tl.load(LSE_base + offs_m, mask=m_ok, other=float("inf"))
        delta = tl.load(DELTA_base + offs_m, mask=m_ok, other=0.0)
    else:
        lse = tl.load(LSE_base + offs_m)
        delta = tl.load(DELTA_base + offs_m)
    sT = _mma(k, qT, DOT_PREC) * qk_scale  # (BLOCK_N, BLOCK_M)
    pT = tl.exp2(sT - lse[None, :])
    if MASKED:
        vis = _band_visible(offs_n, offs_m, -off, RIGHT, LEFT, HAS_RIGHT, HAS_LEFT)
        pT = tl.where(vis, pT, 0.0)
    do = _load_tile(DO_base + offs_m[:, None] * sdm + offs_dv[None, :] * sdd, m_ok, dv_ok,
                    MASKED, BLOCK_DV != HEAD_DV)  # (BLOCK_M, BLOCK_DV)
    dv += _mma(_cast(pT, do.dtype, DOT_PREC), do, DOT_PREC)
    dpT = _mma(v, tl.trans(do), DOT_PREC)  # (BLOCK_N, BLOCK_M)
    dsT = pT * (dpT - delta[None, :])
    dk += _mma(_cast(dsT, qT.dtype, DOT_PREC), tl.trans(qT), DOT_PREC)
    return dk, dv


@triton.jit
def _dkdv_inner(dk, dv, k, v, Q_base, DO_base, LSE_base, DELTA_base, sqm, sqd, sdm, sdd,
                offs_n, offs_d, offs_dv, start, end, SEQ_Q, SEQ_K, LEFT, RIGHT, qk_scale,
                HEAD_D: tl.constexpr, HEAD_DV: tl.constexpr, BLOCK_M: tl.constexpr,
                BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, MASKED: tl.constexpr,
                HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, DOT_PREC: tl.constexpr):
    """Accumulate dK, dV of one key block over query blocks [start, end) (transposed tiles;
    a while loop under the interpreter, see _WHILE_LOOPS)."""
    off = SEQ_K - SEQ_Q
    d_ok = offs_d < HEAD_D
    dv_ok = offs_dv < HEAD_DV
    if _WHILE_LOOPS:
        start_m = start
        while start_m < end:
            dk, dv = _dkdv_step(dk, dv, k, v, Q_base, DO_base, LSE_base, DELTA_base, sqm, sqd,
                                sdm, sdd, offs_n, offs_d, offs_dv, d_ok, dv_ok, start_m, off,
                                SEQ_Q, LEFT, RIGHT, qk_scale, HEAD_D, HEAD_DV, BLOCK_M, BLOCK_D,
                                BLOCK_DV, MASKED, HAS_LEFT, HAS_RIGHT, DOT_PREC)
            start_m += BLOCK_M
    else:
        for start_m in range(start, end, BLOCK_M):
            dk, dv = _dkdv_step(dk, dv, k, v, Q_base, DO_base, LSE_base, DELTA_base, sqm, sqd,
                                sdm, sdd, offs_n, offs_d, offs_dv, d_ok, dv_ok, start_m, off,
                                SEQ_Q, LEFT, RIGHT, qk_scale, HEAD_D, HEAD_DV, BLOCK_M, BLOCK_D,
                                BLOCK_DV, MASKED, HAS_LEFT, HAS_RIGHT, DOT_PREC)
    return dk, dv


@triton.jit
def _dkdv_head(dk, dv, k, v, Q, DO, LSE, DELTA, sqb, sqh, sqm, sqd, sdb, sdh, sdm, sdd,
               b, h, H, offs_n, offs_d, offs_dv, lo, a, bnd, hi, SEQ_Q, SEQ_K, LEFT, RIGHT,
               qk_scale, HEAD_D: tl.constexpr, HEAD_DV: tl.constexpr, BLOCK_M: tl.constexpr,
               BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, HAS_LEFT: tl.constexpr,
               HAS_RIGHT: tl.constexpr, DOT_PREC: tl.constexpr):
    """Add the dK, dV contribution of query head h (one of the GQA group) of batch b."""
    Q_base = Q + b.to(tl.int64) * sqb + h.to(tl.int64) * sqh
    DO_base = DO + b.to(tl.int64) * sdb + h.to(tl.int64) * sdh
    row0 = (b * H + h).to(tl.int64) * SEQ_Q
    if HAS_RIGHT:  # rows above the diagonal edge
        dk, dv = _dkdv_inner(dk, dv, k, v, Q_base, DO_base, LSE + row0, DELTA + row0,
                             sqm, sqd, sdm, sdd, offs_n, offs_d, offs_dv, lo, a, SEQ_Q,
                             SEQ_K, LEFT, RIGHT, qk_scale, HEAD_D, HEAD_DV, BLOCK_M,
                             BLOCK_D, BLOCK_DV, True, HAS_LEFT, HAS_RIGHT, DOT_PREC)
    dk, dv = _dkdv_inner(dk, dv, k, v, Q_base, DO_base, LSE + row0, DELTA + row0,
                         sqm, sqd, sdm, sdd, offs_n, offs_d, offs_dv, a, bnd, SEQ_Q,
                         SEQ_K, LEFT, RIGHT, qk_scale, HEAD_D, HEAD_DV, BLOCK_M,
                         BLOCK_D, BLOCK_DV, False, HAS_LEFT, HAS_RIGHT, DOT_PREC)
    dk, dv = _dkdv_inner(dk, dv, k, v, Q_base, DO_base, LSE + row0, DELTA + row0,
                         sqm, sqd, sdm, sdd, offs_n, offs_d, offs_dv, bnd, hi, SEQ_Q,
                         SEQ_K, LEFT, RIGHT, qk_scale, HEAD_D, HEAD_DV, BLOCK_M,
                         BLOCK_D, BLOCK_DV, True, HAS_LEFT, HAS_RIGHT, DOT_PREC)
    return dk, dv


@triton.jit
def _bwd_dkdv_kernel(Q, K, V, DO, DK, DV, LSE, DELTA,
                     sqb, sqh, sqm, sqd, skb, skh, skn, skd, svb, svh, svn, svd,
                     sdb, sdh, sdm, sdd, s_dkb, s_dkh, s_dkn, s_dkd, s_dvb, s_dvh, s_dvn, s_dvd,
                     H, H_KV, GROUP, SEQ_Q, SEQ_K, LEFT, RIGHT, qk_scale, sm_scale,
                     HEAD_D: tl.constexpr, HEAD_DV: tl.constexpr,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                     BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
                     HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, DOT_PREC: tl.constexpr):
    pid_n = tl.program_id(0)
    pid_bk = tl.program_id(1)
    b = pid_bk // H_KV
    hk = pid_bk % H_KV
    n0 = pid_n * BLOCK_N
    offs_n = n0 + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    n_ok = offs_n < SEQ_K
    k = _load_tile(K + b.to(tl.int64) * skb + hk.to(tl.int64) * skh + offs_n[:, None] * skn
                   + offs_d[None, :] * skd, n_ok, offs_d < HEAD_D, True,
                   BLOCK_D != HEAD_D)  # (BLOCK_N, BLOCK_D)
    v = _load_tile(V + b.to(tl.int64) * svb + hk.to(tl.int64) * svh + offs_n[:, None] * svn
                   + offs_dv[None, :] * svd, n_ok, offs_dv < HEAD_DV, True,
                   BLOCK_DV != HEAD_DV)  # (BLOCK_N, BLOCK_DV)
    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_DV], dtype=tl.float32)

    lo, a, bnd, hi = _query_segments(n0, SEQ_Q, SEQ_K, LEFT, RIGHT, HAS_LEFT, HAS_RIGHT,
                                     BLOCK_M, BLOCK_N)
    # The query heads sharing this K/V head: their gradients add up (see _WHILE_LOOPS).
    if _WHILE_LOOPS:
        g = hk * 0
        while g < GROUP:
            dk, dv = _dkdv_head(dk, dv, k, v, Q, DO, LSE, DELTA, sqb, sqh, sqm, sqd, sdb, sdh,
                                sdm, sdd, b, hk * GROUP + g, H, offs_n, offs_d, offs_dv, lo, a,
                                bnd, hi, SEQ_Q, SEQ_K, LEFT, RIGHT, qk_scale, HEAD_D, HEAD_DV,
                                BLOCK_M, BLOCK_D, BLOCK_DV, HAS_LEFT, HAS_RIGHT, DOT_PREC)
            g += 1
    else:
        for g in range(0, GROUP):
            dk, dv = _dkdv_head(dk, dv, k, v, Q, DO, LSE, DELTA, sqb, sqh, sqm, sqd, sdb, sdh,
                                sdm, sdd, b, hk * GROUP + g, H, offs_n, offs_d, offs_dv, lo, a,
                                bnd, hi, SEQ_Q, SEQ_K, LEFT, RIGHT, qk_scale, HEAD_D, HEAD_DV,
                                BLOCK_M, BLOCK_D, BLOCK_DV, HAS_LEFT, HAS_RIGHT, DOT_PREC)

    dk = dk * sm_scale
    dk_ptrs = (DK + b.to(tl.int64) * s_dkb + hk.to(tl.int64) * s_dkh + offs_n[:, None] * s_dkn
               + offs_d[None, :] * s_dkd)
    dv_ptrs = (DV + b.to(tl.int64) * s_dvb + hk.to(tl.int64) * s_dvh + offs_n[:, None] * s_dvn
               + offs_dv[None, :] * s_dvd)
    tl.store(dk_ptrs, _cast(dk, DK.dtype.element_ty, DOT_PREC),
             mask=n_ok[:, None] & (offs_d[None, :] < HEAD_D))
    tl.store(dv_ptrs, _cast(dv, DV.dtype.element_ty, DOT_PREC),
             mask=n_ok[:, None] & (offs_dv[None, :] < HEAD_DV))


@triton.jit
def _dq_step(dq, q, do, lse, delta, K_base, V_base, skn, skd, svn, svd, offs_m, offs_d, offs_dv,
             d_ok, dv_ok, start_n, off, SEQ_K, LEFT, RIGHT, qk_scale,
             HEAD_D: tl.constexpr, HEAD_DV: tl.constexpr, BLOCK_N: tl.constexpr,
             BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, MASKED: tl.constexpr,
             HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, DOT_PREC: tl.constexpr):
    """One key block of the dQ loop: the contribution of keys start_n + [0, N)."""
    offs_n = start_n + tl.arange(0, BLOCK_N)
    n_ok = offs_n < SEQ_K
    kT = _load_tile(K_base + offs_d[:, None] * skd + offs_n[None, :] * skn, d_ok, n_ok,
                    BLOCK_D != HEAD_D, MASKED)  # (BLOCK_D, BLOCK_N)
    vT = _load_tile(V_base + offs_dv[:, None] * svd + offs_n[None, :] * svn, dv_ok, n_ok,
                    BLOCK_DV != HEAD_DV, MASKED)  # (BLOCK_DV, BLOCK_N)
    s = _mma(q, kT, DOT_PREC) * qk_scale  # (BLOCK_M, BLOCK_N)
    p = tl.exp2(s - lse[:, None])
    if MASKED:
        vis = _band_visible(offs_m, offs_n, off, LEFT, RIGHT, HAS_LEFT, HAS_RIGHT)
        p = tl.where(vis & n_ok[None, :], p, 0.0)
    dp = _mma(do, vT, DOT_PREC)  # (BLOCK_M, BLOCK_N)
    ds = p * (dp - delta[:, None])
    dq += _mma(_cast(ds, kT.dtype, DOT_PREC), tl.trans(kT), DOT_PREC)
    return dq


@triton.jit
def _dq_inner(dq, q, do, lse, delta, K_base, V_base, skn, skd, svn, svd, offs_m, offs_d,
              offs_dv, start, end, SEQ_Q, SEQ_K, LEFT, RIGHT, qk_scale,
              HEAD_D: tl.constexpr, HEAD_DV: tl.constexpr, BLOCK_N: tl.constexpr,
              BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, MASKED: tl.constexpr,
              HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, DOT_PREC: tl.constexpr):
    """Accumulate dQ of one query block over key blocks [start, end) (a while loop under the
    interpreter, see _WHILE_LOOPS)."""
    off = SEQ_K - SEQ_Q
    d_ok = offs_d < HEAD_D
    dv_ok = offs_dv < HEAD_DV
    if _WHILE_LOOPS:
        start_n = start
        while start_n < end:
            dq = _dq_step(dq, q, do, lse, delta, K_base, V_base, skn, skd, svn, svd, offs_m,
                          offs_d, offs_dv, d_ok, dv_ok, start_n, off, SEQ_K, LEFT, RIGHT,
                          qk_scale, HEAD_D, HEAD_DV, BLOCK_N, BLOCK_D, BLOCK_DV, MASKED,
                          HAS_LEFT, HAS_RIGHT, DOT_PREC)
            start_n += BLOCK_N
    else:
        for start_n in range(start, end, BLOCK_N):
            dq = _dq_step(dq, q, do, lse, delta, K_base, V_base, skn, skd, svn, svd, offs_m,
                          offs_d, offs_dv, d_ok, dv_ok, start_n, off, SEQ_K, LEFT, RIGHT,
                          qk_scale, HEAD_D, HEAD_DV, BLOCK_N, BLOCK_D, BLOCK_DV, MASKED,
                          HAS_LEFT, HAS_RIGHT, DOT_PREC)
    return dq


@triton.jit
def _bwd_dq_kernel(Q, K, V, DO, DQ, LSE, DELTA,
                   sqb, sqh, sqm, sqd, skb, skh, skn, skd, svb, svh, svn, svd,
                   sdb, sdh, sdm, sdd, s_dqb, s_dqh, s_dqm, s_dqd,
                   H, GROUP, SEQ_Q, SEQ_K, LEFT, RIGHT, qk_scale, sm_scale,
                   HEAD_D: tl.constexpr, HEAD_DV: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                   BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
                   HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, DOT_PREC: tl.constexpr):
    # Last query blocks first: under a causal mask they have the most keys, and starting the
    # longest programs first shortens the tail of the launch.
    pid_m = tl.num_programs(0) - 1 - tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    hk = h // GROUP
    m0 = pid_m * BLOCK_M
    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    m_ok = offs_m < SEQ_Q
    q = _load_tile(Q + b.to(tl.int64) * sqb + h.to(tl.int64) * sqh + offs_m[:, None] * sqm
                   + offs_d[None, :] * sqd, m_ok, offs_d < HEAD_D, True, BLOCK_D != HEAD_D)
    do = _load_tile(DO + b.to(tl.int64) * sdb + h.to(tl.int64) * sdh + offs_m[:, None] * sdm
                    + offs_dv[None, :] * sdd, m_ok, offs_dv < HEAD_DV, True,
                    BLOCK_DV != HEAD_DV)
    row0 = pid_bh.to(tl.int64) * SEQ_Q
    lse = tl.load(LSE + row0 + offs_m, mask=m_ok, other=float("inf"))
    delta = tl.load(DELTA + row0 + offs_m, mask=m_ok, other=0.0)
    K_base = K + b.to(tl.int64) * skb + hk.to(tl.int64) * skh
    V_base = V + b.to(tl.int64) * svb + hk.to(tl.int64) * svh
    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

    lo, a, bnd, hi = _key_segments(m0, SEQ_Q, SEQ_K, LEFT, RIGHT, HAS_LEFT, HAS_RIGHT,
                                   BLOCK_M, BLOCK_N)
    if HAS_LEFT:
        dq = _dq_inner(dq, q, do, lse, delta, K_base, V_base, skn, skd, svn, svd, offs_m, offs_d,
                       offs_dv, lo, a, SEQ_Q, SEQ_K, LEFT, RIGHT, qk_scale, HEAD_D, HEAD_DV,
                       BLOCK_N, BLOCK_D, BLOCK_DV, True, HAS_LEFT, HAS_RIGHT, DOT_PREC)
    dq = _dq_inner(dq, q, do, lse, delta, K_base, V_base, skn, skd, svn, svd, offs_m, offs_d,
                   offs_dv, a, bnd, SEQ_Q, SEQ_K, LEFT, RIGHT, qk_scale, HEAD_D, HEAD_DV,
                   BLOCK_N, BLOCK_D, BLOCK_DV, False, HAS_LEFT, HAS_RIGHT, DOT_PREC)
    dq = _dq_inner(dq, q, do, lse, delta, K_base, V_base, skn, skd, svn, svd, offs_m, offs_d,
                   offs_dv, bnd, hi, SEQ_Q, SEQ_K, LEFT, RIGHT, qk_scale, HEAD_D, HEAD_DV,
                   BLOCK_N, BLOCK_D, BLOCK_DV, True, HAS_LEFT, HAS_RIGHT, DOT_PREC)
    dq = dq * sm_scale
    tl.store(DQ + b.to(tl.int64) * s_dqb + h.to(tl.int64) * s_dqh + offs_m[:, None] * s_dqm
             + offs_d[None, :] * s_dqd, _cast(dq, DQ.dtype.element_ty, DOT_PREC),
             mask=m_ok[:, None] & (offs_d[None, :] < HEAD_D))


# ---------------------------------------------------------------------------------------------
# Launch configuration and tuning
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Plan:
    """What one attention call computes: the scale and the band (bottom-right aligned)."""

    scale: float
    has_left: bool = False
    has_right: bool = False
    left: int = 0
    right: int = 0

    @property
    def kind(self) -> str:
        if not (self.has_left or self.has_right):
            return "none"
        if self.has_right and not self.has_left and self.right == 0:
            return "causal"
        return "window"


def make_plan(scale: float, window: tuple[float, float] | None) -> Plan:
    """Plan of a call; ``window`` is (left, right) with math.inf for an open side, or None."""
    if window is None:
        return Plan(float(scale))
    left, right = window
    has_left, has_right = left != math.inf, right != math.inf
    return Plan(float(scale), has_left, has_right, int(left) if has_left else 0,
                int(right) if has_right else 0)


@dataclass(frozen=True)
class Config:
    """One launch configuration. For dK/dV, BLOCK_N is the key block each program keeps and
    BLOCK_M the query step of its loop; elsewhere BLOCK_M is the resident query block."""

    block_m: int
    block_n: int
    num_warps: int = 4
    num_stages: int = 2

    def __str__(self) -> str:
        return f"M{self.block_m}N{self.block_n}w{self.num_warps}s{self.num_stages}"


INTERPRETER_CONFIG = Config(16, 16, 1, 1)


def head_block(d: int) -> int:
    """Padded head dimension: the next power of two, at least 16 (tl.dot's minimum)."""
    return max(16, triton.next_power_of_2(d))


def candidate_configs(kernel: str, d: int, dv: int, elem_bytes: int = 2) -> list[Config]:
    """Hopper-friendly tiles to tune over; the first entry is the untuned default.

    fp32 inputs (``elem_bytes=4``) get half-size tiles: their tiles take twice the shared
    memory and registers, and fp32 is here for accuracy, not speed.
    """
    big = max(head_block(d), head_block(dv))
    # Candidates that spill registers on sm_90 under any mask form are left out
    # (scripts/triton_resources.py; the table is in docs/gpu.md). fp32 tiles at the smallest
    # size the kernels take still spill in dK/dV and (d=128) dQ: fp32 is for accuracy.
    if elem_bytes >= 4:
        if kernel == "fwd":
            return [Config(64, 32, 4, 2)]
        if kernel == "dkdv":
            return [Config(32, 64, 4, 2)]
        if kernel == "dq":
            return [Config(64, 32, 4, 2)]
        raise ValueError(f"unknown kernel {kernel!r}")
    if kernel == "fwd":
        if big <= 64:
            return [Config(128, 64, 4, 3), Config(128, 128, 8, 3), Config(64, 64, 4, 3),
                    Config(128, 32, 4, 4)]
        if big <= 128:
            return [Config(128, 64, 8, 3), Config(128, 64, 8, 2), Config(128, 32, 8, 3),
                    Config(64, 64, 4, 3), Config(64, 32, 4, 3)]
        return [Config(64, 64, 4, 2), Config(128, 64, 8, 2), Config(128, 32, 8, 2),
                Config(64, 32, 4, 3)]
    if kernel == "dkdv":  # (query step, key block)
        if big <= 64:
            return [Config(32, 128, 8, 3), Config(64, 128, 8, 3), Config(64, 64, 4, 3),
                    Config(32, 64, 4, 4)]
        if big <= 128:
            return [Config(32, 128, 8, 3), Config(32, 128, 8, 2), Config(64, 64, 8, 3),
                    Config(32, 64, 8, 3), Config(32, 64, 4, 3)]
        return [Config(32, 64, 4, 2), Config(64, 64, 8, 2), Config(32, 128, 8, 2)]
    if kernel == "dq":  # (query block, key step)
        if big <= 64:
            return [Config(128, 32, 4, 3), Config(128, 64, 8, 3), Config(64, 64, 4, 3),
                    Config(64, 32, 4, 4)]
        if big <= 128:
            return [Config(128, 32, 8, 3), Config(128, 64, 8, 2), Config(64, 64, 4, 3),
                    Config(64, 32, 4, 3)]
        return [Config(64, 32, 4, 2), Config(64, 64, 8, 2), Config(128, 32, 8, 2)]
    raise ValueError(f"unknown kernel {kernel!r}")


def configs_for(kernel: str, q: torch.Tensor, v: torch.Tensor) -> list[Config]:
    return candidate_configs(kernel, q.shape[-1], v.shape[-1], q.element_size())


# (kernel, d, dv, dtype, mask kind, gqa, seq bucket) -> Config chosen by tune()
_TUNED: dict[tuple, Config] = {}


def _seq_bucket(n: int) -> int:
    return min(triton.next_power_of_2(max(n, 1)), 1 << 20)


def tune_key(kernel: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: Plan) -> tuple:
    return (kernel, q.shape[-1], v.shape[-1], str(q.dtype), plan.kind, q.shape[1] != k.shape[1],
            _seq_bucket(q.shape[2]), _seq_bucket(k.shape[2]))


def config_for(kernel: str, q, k, v, plan: Plan) -> Config:
    if INTERPRET or q.device.type != "cuda":
        return INTERPRETER_CONFIG
    hit = _TUNED.get(tune_key(kernel, q, k, v, plan))
    return hit if hit is not None else configs_for(kernel, q, v)[0]


def _bench_ms(fn, reps: int = 10, device: str = "cuda") -> float:
    """Median time of ``fn`` in ms over ``reps`` calls, by the suite's timing loop (CUDA
    events, L2 flushed before each call, as the records are timed); the first call compiles
    and warms up."""
    from attnbench.measure.timing import TimingBudget, measure_interleaved

    budget = TimingBudget(warmup_s=0.0, budget_s=0.0, min_reps=reps, max_reps=reps,
                          min_warmup=1, method="events")
    # no samplers: device-state readings per candidate would only slow the tuning down
    return measure_interleaved([fn], device, budget, samplers=[])[0].median_ms


# How a CUDA fault reads once raised: torch's own errors and Triton's launcher's. After one the
# CUDA context is poisoned (every later call in the process fails), so it is never "a candidate
# that does not fit": the tuner and the GPU check re-raise it against what raised it.
CUDA_FAULT_MARKERS = ("CUDA error", "Triton Error [CUDA]", "illegal memory access",
                      "device-side assert", "unspecified launch failure", "misaligned address",
                      "illegal instruction", "CUBLAS_STATUS", "cuDNN error")


def is_cuda_fault(exc: BaseException) -> bool:
    """True if ``exc`` is a CUDA fault (not an out-of-resources or compile failure)."""
    if type(exc).__name__ == "AcceleratorError":  # torch >= 2.8 raises these for CUDA errors
        return True
    text = str(exc)
    return any(m in text for m in CUDA_FAULT_MARKERS)


def fastest(kernel: str, configs, run, bench, log=None) -> Config | None:
    """The candidate whose ``bench(lambda: run(cfg))`` is least; None if none ran. A candidate
    that fails to compile or launch (out of resources) is skipped; a CUDA fault is raised."""
    best, best_ms = None, math.inf
    for cfg in configs:
        try:
            ms = bench(lambda cfg=cfg: run(cfg))
        except Exception as exc:  # out of resources, compile failure: not a candidate
            if is_cuda_fault(exc):  # the context is poisoned: no later candidate can run
                raise
            if log:
                log(f"triton_flash tune {kernel} {cfg}: failed ({type(exc).__name__})")
            continue
        if log:
            log(f"triton_flash tune {kernel} {cfg}: {ms:.3f} ms")
        if ms < best_ms:
            best, best_ms = cfg, ms
    return best


def tune(q, k, v, grad_out, plan: Plan, log=None) -> dict[str, Config]:
    """Pick the fastest candidate of each kernel for these inputs; cached per tuning key.

    Call it outside any timed region (the backend's build does). Compilation of every
    candidate happens here. Configs that fail (e.g. out of shared memory) are skipped; a CUDA
    fault (``is_cuda_fault``) is raised, since it poisons the process for every later one.
    """
    chosen: dict[str, Config] = {}
    if INTERPRET or q.device.type != "cuda":
        chosen["fwd"] = INTERPRETER_CONFIG
        if grad_out is not None:
            chosen["dkdv"] = chosen["dq"] = INTERPRETER_CONFIG
        return chosen
    d, dv = q.shape[-1], v.shape[-1]

    def pick(kernel, run):
        key = tune_key(kernel, q, k, v, plan)
        if key not in _TUNED:
            best = fastest(kernel, configs_for(kernel, q, v), run, _bench_ms, log)
            if best is None:
                raise RuntimeError(f"triton_flash: no {kernel} configuration ran for d={d}, "
                                   f"dv={dv}")
            _TUNED[key] = best
        return _TUNED[key]

    chosen["fwd"] = pick("fwd", lambda cfg: forward(q, k, v, plan, cfg))
    if grad_out is not None:
        o, lse = forward(q, k, v, plan, chosen["fwd"])
        delta = _delta(o, grad_out)
        dk = torch.empty(k.shape, device=k.device, dtype=k.dtype)
        dvv = torch.empty(v.shape, device=v.device, dtype=v.dtype)
        dq = torch.empty(q.shape, device=q.device, dtype=q.dtype)
        chosen["dkdv"] = pick("dkdv", lambda cfg: _launch_dkdv(q, k, v, grad_out, dk, dvv, lse,
                                                                delta, plan, cfg))
        chosen["dq"] = pick("dq", lambda cfg: _launch_dq(q, k, v, grad_out, dq, lse, delta,
                                                          plan, cfg))
    return chosen


# ---------------------------------------------------------------------------------------------
# Launchers
# ---------------------------------------------------------------------------------------------
def _dot_precision(dtype: torch.dtype) -> str:
    # fp32 inputs: three TF32 products per product ("tf32x3") come within a few fp32 ulps on
    # tensor cores; plain tf32 would miss the fp32 tolerance, and "ieee" (FMA units) compiles
    # for minutes and runs slower still.
    if dtype == torch.float32:
        return "tf32x3"
    if INTERPRET and dtype == torch.bfloat16:
        return "upcast"
    return "tf32"  # ignored for 16-bit inputs: bf16/fp16 products, fp32 accumulation


def launch_constants(d: int, dv: int, plan: Plan, cfg: Config, dtype: torch.dtype) -> dict:
    """The compile-time arguments of the fwd, dkdv and dq kernels (one definition, used by
    the launchers and by the compile for sm_90 in _triton_flash_meta)."""
    return dict(HEAD_D=d, HEAD_DV=dv, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
                BLOCK_D=head_block(d), BLOCK_DV=head_block(dv), HAS_LEFT=plan.has_left,
                HAS_RIGHT=plan.has_right, DOT_PREC=_dot_precision(dtype))


def _check(q, k, v):
    B, H, Nq, D = q.shape
    Bk, Hk, Nk, Dk = k.shape
    if k.shape[:3] != v.shape[:3] or Bk != B or Dk != D or H % Hk:
        raise ValueError(f"triton_flash: incompatible shapes q {tuple(q.shape)}, "
                         f"k {tuple(k.shape)}, v {tuple(v.shape)}")
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError("triton_flash: q, k and v must share a dtype")


def forward(q, k, v, plan: Plan, cfg: Config | None = None):
    """O (B, Hq, Nq, Dv) in q's dtype and the base-2 log-sum-exp (B, Hq, Nq) in fp32."""
    _check(q, k, v)
    cfg = cfg or config_for("fwd", q, k, v, plan)
    B, H, Nq, D = q.shape
    Hk, Nk, Dv = k.shape[1], k.shape[2], v.shape[-1]
    o = torch.empty((B, H, Nq, Dv), device=q.device, dtype=q.dtype)  # (B, Hq, Nq, Dv)
    lse = torch.empty((B, H, Nq), device=q.device, dtype=torch.float32)  # (B, Hq, Nq)
    grid = (triton.cdiv(Nq, cfg.block_m), B * H)
    _fwd_kernel[grid](
        q, k, v, o, lse, *q.stride(), *k.stride(), *v.stride(), *o.stride(),
        H, H // Hk, Nq, Nk, plan.left, plan.right, plan.scale * LOG2E,
        **launch_constants(D, Dv, plan, cfg, q.dtype),
        num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    return o, lse


def _delta(o, do):
    B, H, Nq, Dv = o.shape
    delta = torch.empty((B, H, Nq), device=o.device, dtype=torch.float32)  # (B, Hq, Nq)
    block_m = 16 if INTERPRET else 64
    grid = (triton.cdiv(Nq, block_m), B * H)
    _bwd_delta_kernel[grid](o, do, delta, *o.stride(), *do.stride(), H, Nq, HEAD_DV=Dv,
                            BLOCK_M=block_m, BLOCK_DV=head_block(Dv), num_warps=4)
    return delta


def _launch_dkdv(q, k, v, do, dk, dv, lse, delta, plan: Plan, cfg: Config):
    B, H, Nq, D = q.shape
    Hk, Nk, Dv = k.shape[1], k.shape[2], v.shape[-1]
    grid = (triton.cdiv(Nk, cfg.block_n), B * Hk)
    _bwd_dkdv_kernel[grid](
        q, k, v, do, dk, dv, lse, delta, *q.stride(), *k.stride(), *v.stride(), *do.stride(),
        *dk.stride(), *dv.stride(), H, Hk, H // Hk, Nq, Nk, plan.left, plan.right,
        plan.scale * LOG2E, plan.scale,
        **launch_constants(D, Dv, plan, cfg, q.dtype),
        num_warps=cfg.num_warps, num_stages=cfg.num_stages)


def _launch_dq(q, k, v, do, dq, lse, delta, plan: Plan, cfg: Config):
    B, H, Nq, D = q.shape
    Hk, Nk, Dv = k.shape[1], k.shape[2], v.shape[-1]
    grid = (triton.cdiv(Nq, cfg.block_m), B * H)
    _bwd_dq_kernel[grid](
        q, k, v, do, dq, lse, delta, *q.stride(), *k.stride(), *v.stride(), *do.stride(),
        *dq.stride(), H, H // Hk, Nq, Nk, plan.left, plan.right, plan.scale * LOG2E, plan.scale,
        **launch_constants(D, Dv, plan, cfg, q.dtype),
        num_warps=cfg.num_warps, num_stages=cfg.num_stages)


def backward(q, k, v, o, lse, do, plan: Plan):
    """dQ, dK, dV (shapes and dtypes of q, k, v); dK/dV summed over each GQA group."""
    delta = _delta(o, do)  # (B, Hq, Nq) fp32: rowsum(dO * O)
    dq = torch.empty(q.shape, device=q.device, dtype=q.dtype)  # (B, Hq, Nq, D)
    dk = torch.empty(k.shape, device=k.device, dtype=k.dtype)  # (B, Hkv, Nk, D)
    dv = torch.empty(v.shape, device=v.device, dtype=v.dtype)  # (B, Hkv, Nk, Dv)
    _launch_dkdv(q, k, v, do, dk, dv, lse, delta, plan, config_for("dkdv", q, k, v, plan))
    _launch_dq(q, k, v, do, dq, lse, delta, plan, config_for("dq", q, k, v, plan))
    return dq, dk, dv


class FlashAttention(torch.autograd.Function):
    """Differentiable FlashAttention-2: saves O and the log-sum-exp, recomputes P backward."""

    @staticmethod
    def forward(ctx, q, k, v, plan: Plan):
        o, lse = forward(q, k, v, plan)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.plan = plan
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        dq, dk, dv = backward(q, k, v, o, lse, do, ctx.plan)
        return dq, dk, dv, None


def attention(q, k, v, plan: Plan):
    """Attention (B, Hq, Nq, Dv) of q (B, Hq, Nq, D), k (B, Hkv, Nk, D), v (B, Hkv, Nk, Dv)."""
    return FlashAttention.apply(q, k, v, plan)


# The kernels a call launches by name (the delta pre-pass, a row sum, is left out), and which
# of their pointer arguments point at fp32 (the rest hold the inputs' dtype).
KERNELS = {"fwd": _fwd_kernel, "dkdv": _bwd_dkdv_kernel, "dq": _bwd_dq_kernel}
POINTERS = ("Q", "K", "V", "O", "DO", "DQ", "DK", "DV")
FP32_POINTERS = ("LSE", "DELTA")


def timed_tune(q, k, v, grad_out, plan: Plan, log=None) -> tuple[dict[str, Config], float]:
    t0 = time.perf_counter()
    chosen = tune(q, k, v, grad_out, plan, log)
    return chosen, time.perf_counter() - t0
