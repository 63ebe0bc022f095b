"""triton_flash's paged decode: attention read through a block table, split over the keys.

One program per (sequence, KV head, split) walks its split's pages of the block table: each
page is a (page_size, D) tile of the pool (num_pages, page_size, Hkv, D), loaded where the
table points, scored against every query row of the head's group at once (the G query
heads x Nq new tokens share the KV head's tiles), and folded into an online softmax. Each
split writes its unnormalised output with its row max and sum; ``combine`` merges the splits
(flash-decoding). Long contexts get more splits, so a decode step of few sequences still
fills the machine.

Tiles are multiplied in fp32 (``input_precision="ieee"``), whatever the cache's dtype: a
decode step is bound by reading the cache, and one multiply path is also the one the Triton
interpreter runs correctly for bf16. Imported on first use, after TRITON_INTERPRET is known
(see triton_flash.py); loops are ``while`` loops under the interpreter, as in
``_triton_flash_kernels`` (its ``_WHILE_LOOPS``).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from attnbench.implementations._triton_flash_kernels import INTERPRET

_WHILE_LOOPS = tl.constexpr(INTERPRET)
FLOOR = -1.0e30  # a row max below any score, so a split that sees no key gives exp(...) = 0
PAGES_PER_SPLIT_MIN = 8  # a split reads at least this many pages before another is added
SPLITS_MAX = 32


def _pow2(n: int) -> int:
    """The next power of two, at least 16 (tl.dot's smallest tile side)."""
    return max(16, triton.next_power_of_2(n))


@triton.jit
def _page_step(acc, l_i, m_i, q, K, V, T, b_row, h, lp, ctx, rows_i, t, d, dv,
               skp, skt, skh, svp, svt, svh, NQ, PS, scale,
               D: tl.constexpr, DV: tl.constexpr, CAUSAL: tl.constexpr):
    """Fold logical page ``lp`` of one sequence into the online softmax of its rows."""
    page = tl.load(T + b_row + lp)
    pos = lp * PS + t  # (BLOCK_N,) logical positions
    kv_ok = (t < PS) & (pos < ctx)
    k = tl.load(K + page * skp + t[:, None] * skt + h * skh + d[None, :],
                mask=kv_ok[:, None] & (d[None, :] < D), other=0.0)  # (BLOCK_N, BD)
    s = tl.dot(q, tl.trans(k.to(tl.float32)), input_precision="ieee") * scale  # (M, BLOCK_N)
    ok = kv_ok[None, :]
    if CAUSAL:
        ok = ok & (pos[None, :] <= rows_i[:, None] + ctx - NQ)
    s = tl.where(ok, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    alpha = tl.exp(m_i - m_new)
    p = tl.exp(s - m_new[:, None])
    v = tl.load(V + page * svp + t[:, None] * svt + h * svh + dv[None, :],
                mask=kv_ok[:, None] & (dv[None, :] < DV), other=0.0)  # (BLOCK_N, BDV)
    acc = acc * alpha[:, None] + tl.dot(p, v.to(tl.float32), input_precision="ieee")
    return acc, l_i * alpha + tl.sum(p, 1), m_new


@triton.jit
def _paged_decode_kernel(Q, K, V, T, C, O, ML,
                         sqb, sqh, sqm, skp, skt, skh, svp, svt, svh, stb,
                         sob, soh, sos, som, smb, smh, sms,
                         HKV, G, NQ, PS, PAGES_PER_SPLIT, scale,
                         M: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr,
                         DV: tl.constexpr, BD: tl.constexpr, BDV: tl.constexpr,
                         CAUSAL: tl.constexpr):
    bh = tl.program_id(0)
    split = tl.program_id(1)
    b = bh // HKV
    h = bh % HKV
    ctx = tl.load(C + b)
    rows = tl.arange(0, M)  # row r: query head h * G + r // NQ, new token r % NQ
    rows_g = rows // NQ
    rows_i = rows % NQ
    row_ok = rows < G * NQ
    d = tl.arange(0, BD)
    dv = tl.arange(0, BDV)
    t = tl.arange(0, BLOCK_N)
    q = tl.load(Q + b * sqb + (h * G + rows_g)[:, None] * sqh + rows_i[:, None] * sqm
                + d[None, :], mask=row_ok[:, None] & (d[None, :] < D), other=0.0)  # (M, BD)
    q = q.to(tl.float32)
    m_i = tl.zeros([M], dtype=tl.float32) + FLOOR
    l_i = tl.zeros([M], dtype=tl.float32)
    acc = tl.zeros([M, BDV], dtype=tl.float32)
    n_pages = (ctx + PS - 1) // PS
    start = split * PAGES_PER_SPLIT
    end = tl.minimum(start + PAGES_PER_SPLIT, n_pages)
    b_row = b * stb
    if _WHILE_LOOPS:
        lp = start
        while lp < end:
            acc, l_i, m_i = _page_step(acc, l_i, m_i, q, K, V, T, b_row, h, lp, ctx, rows_i,
                                       t, d, dv, skp, skt, skh, svp, svt, svh, NQ, PS, scale,
                                       D, DV, CAUSAL)
            lp += 1
    else:
        for lp in range(start, end):
            acc, l_i, m_i = _page_step(acc, l_i, m_i, q, K, V, T, b_row, h, lp, ctx, rows_i,
                                       t, d, dv, skp, skt, skh, svp, svt, svh, NQ, PS, scale,
                                       D, DV, CAUSAL)
    o_base = O + b * sob + h * soh + split * sos
    tl.store(o_base + rows[:, None] * som + dv[None, :], acc,
             mask=row_ok[:, None] & (dv[None, :] < DV))
    ml_base = ML + b * smb + h * smh + split * sms
    tl.store(ml_base + rows, m_i, mask=row_ok)
    tl.store(ml_base + M + rows, l_i, mask=row_ok)


def splits_for(max_pages: int) -> tuple[int, int]:
    """(splits, pages per split): one split until a context passes PAGES_PER_SPLIT_MIN
    pages, then as many as keep each at least that long, up to SPLITS_MAX."""
    splits = max(1, min(SPLITS_MAX, max_pages // PAGES_PER_SPLIT_MIN))
    return splits, math.ceil(max_pages / splits)


def paged_decode(q, k_pool, v_pool, block_table, context, scale: float, causal: bool):
    """q (B, Hq, Nq, D); pools (P, page_size, Hkv, D|Dv); block_table (B, max_pages) int32;
    context (B,) int32. Returns (B, Hq, Nq, Dv) in q's dtype."""
    B, Hq, Nq, D = q.shape
    P, PS, Hkv, _ = k_pool.shape
    Dv = v_pool.shape[-1]
    G = Hq // Hkv
    M = _pow2(G * Nq)
    splits, per_split = splits_for(block_table.shape[1])
    q = q.contiguous()
    o = torch.empty(B, Hkv, splits, M, Dv, dtype=torch.float32, device=q.device)
    ml = torch.empty(B, Hkv, splits, 2, M, dtype=torch.float32, device=q.device)  # max, sum
    grid = (B * Hkv, splits)
    _paged_decode_kernel[grid](
        q, k_pool, v_pool, block_table, context, o, ml,
        q.stride(0), q.stride(1), q.stride(2), k_pool.stride(0), k_pool.stride(1),
        k_pool.stride(2), v_pool.stride(0), v_pool.stride(1), v_pool.stride(2),
        block_table.stride(0), o.stride(0), o.stride(1), o.stride(2), o.stride(3),
        ml.stride(0), ml.stride(1), ml.stride(2),
        Hkv, G, Nq, PS, per_split, scale,
        M=M, BLOCK_N=_pow2(PS), D=D, DV=Dv, BD=_pow2(D), BDV=_pow2(Dv), CAUSAL=causal)
    return combine(o, ml, G, Nq).to(q.dtype)


def combine(o, ml, G: int, Nq: int):
    """Merge the splits' partial outputs o (B, Hkv, S, M, Dv) with their row max and sum
    ml (B, Hkv, S, 2, M) into (B, Hkv * G, Nq, Dv)."""
    B, Hkv, _, _, Dv = o.shape
    m, s = ml[:, :, :, 0, :G * Nq], ml[:, :, :, 1, :G * Nq]  # (B, Hkv, S, G*Nq)
    w = torch.exp(m - m.amax(dim=2, keepdim=True))  # (B, Hkv, S, G*Nq)
    out = (o[:, :, :, :G * Nq] * w[..., None]).sum(2) / (s * w).sum(2)[..., None]
    return out.reshape(B, Hkv * G, Nq, Dv)  # (B, Hq, Nq, Dv): head h * G + g
