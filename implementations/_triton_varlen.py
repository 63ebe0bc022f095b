"""FlashAttention-2 over packed variable-length batches (``cu_seqlens``), forward and backward.

A packed batch is a list of documents, each a run of consecutive tokens that attends only
within itself (causal or not). The kernels take the tensors in the dense kernel's 4-D
layout, (B, H, N, D) with any strides, plus a ``Packing``: where each document starts in
the rows laid end to end (B*N tokens) and how long it is. A document never crosses a row, so
its tokens are ``n0 .. n0 + L`` of row ``b``: the flash_attn-style token-major layout
(T, H, D) is the case B = 1, N = T (``varlen_attention``), and the suite's packed (B, H, N, D)
rows are read in place, without a copy (``attention``).

Each document is its own small self-attention problem (seq_q = seq_k = L), so the programs
run the dense kernel's loops (``_triton_flash_kernels``: ``_fwd_inner``, ``_dkdv_inner``,
``_dq_inner`` and their segment bounds) on pointers moved to the document's start. The grid
is a host-built block list, one entry per (document, query or key block), longest work first:
no program is launched for a block past a document's end, and no key outside the document is
ever read, so the work is the within-document pairs (causal: the lower triangles).

The log-sum-exp and the backward's ``delta`` are kept per token in (B, H, N) fp32; dK and
dV of a shared K/V head are summed over its GQA group inside one program, as in the dense
kernel. Imported on first use, after TRITON_INTERPRET is known (see triton_flash.py).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from attnbench.implementations import _triton_flash_kernels as F
from attnbench.implementations._triton_flash_kernels import (
    INTERPRET,
    _cast,
    _dkdv_inner,
    _dq_inner,
    _fwd_inner,
    _key_segments,
    _load_tile,
    _query_segments,
)

LOG2E = F.LOG2E
_WHILE_LOOPS = tl.constexpr(INTERPRET)  # see _triton_flash_kernels._WHILE_LOOPS


# ---------------------------------------------------------------------------------------------
# Kernels
# ---------------------------------------------------------------------------------------------
@triton.jit
def _block_entry(BLOCKS, pid, ROW_LEN):
    """(row b, first token n0 within the row, document length L, block start within the
    document) of block-list entry ``pid`` (int32 triples: flat start, length, block start)."""
    start = tl.load(BLOCKS + 3 * pid)
    L = tl.load(BLOCKS + 3 * pid + 1)
    blk0 = tl.load(BLOCKS + 3 * pid + 2)
    b = start // ROW_LEN
    n0 = start - b * ROW_LEN
    return b, n0, L, blk0


@triton.jit
def _varlen_fwd_kernel(Q, K, V, O, LSE, BLOCKS,
                       sqb, sqh, sqm, sqd, skb, skh, skn, skd, svb, svh, svn, svd,
                       sob, soh, som, sod,
                       H, GROUP, ROW_LEN, qk_scale,
                       HEAD_D: tl.constexpr, HEAD_DV: tl.constexpr,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                       BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
                       CAUSAL: tl.constexpr, DOT_PREC: tl.constexpr):
    pid = tl.program_id(0)
    h = tl.program_id(1)
    b, n0, L, m0 = _block_entry(BLOCKS, pid, ROW_LEN)
    hk = h // GROUP
    offs_m = m0 + tl.arange(0, BLOCK_M)  # within the document
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    m_ok = offs_m < L

    Q_base = Q + b.to(tl.int64) * sqb + h.to(tl.int64) * sqh + n0.to(tl.int64) * sqm
    K_base = K + b.to(tl.int64) * skb + hk.to(tl.int64) * skh + n0.to(tl.int64) * skn
    V_base = V + b.to(tl.int64) * svb + hk.to(tl.int64) * svh + n0.to(tl.int64) * svn
    q = _load_tile(Q_base + offs_m[:, None] * sqm + offs_d[None, :] * sqd, m_ok,
                   offs_d < HEAD_D, True, BLOCK_D != HEAD_D)  # (BLOCK_M, BLOCK_D)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)
    # the document is a square self-attention problem: seq_q = seq_k = L, no left edge
    lo, a, bnd, hi = _key_segments(m0, L, L, 0, 0, False, CAUSAL, BLOCK_M, BLOCK_N)
    acc, l_i, m_i = _fwd_inner(acc, l_i, m_i, q, K_base, V_base, skn, skd, svn, svd, offs_m,
                               offs_d, offs_dv, a, bnd, L, L, 0, 0, qk_scale,
                               HEAD_D, HEAD_DV, BLOCK_N, BLOCK_D, BLOCK_DV, False,
                               False, CAUSAL, DOT_PREC)
    acc, l_i, m_i = _fwd_inner(acc, l_i, m_i, q, K_base, V_base, skn, skd, svn, svd, offs_m,
                               offs_d, offs_dv, bnd, hi, L, L, 0, 0, qk_scale,
                               HEAD_D, HEAD_DV, BLOCK_N, BLOCK_D, BLOCK_DV, True,
                               False, CAUSAL, DOT_PREC)

    empty = l_i == 0.0
    l_safe = tl.where(empty, 1.0, l_i)
    out = acc / l_safe[:, None]
    lse = tl.where(empty, float("inf"), m_i + tl.log2(l_safe))
    O_base = O + b.to(tl.int64) * sob + h.to(tl.int64) * soh + n0.to(tl.int64) * som
    tl.store(O_base + offs_m[:, None] * som + offs_dv[None, :] * sod,
             _cast(out, O.dtype.element_ty, DOT_PREC),
             mask=m_ok[:, None] & (offs_dv[None, :] < HEAD_DV))
    row0 = (b * H + h).to(tl.int64) * ROW_LEN + n0  # (B, H, N) per-token statistics
    tl.store(LSE + row0 + offs_m, lse, mask=m_ok)


@triton.jit
def _varlen_bwd_dkdv_kernel(Q, K, V, DO, DK, DV, LSE, DELTA, BLOCKS,
                            sqb, sqh, sqm, sqd, skb, skh, skn, skd, svb, svh, svn, svd,
                            sdb, sdh, sdm, sdd, s_dkb, s_dkh, s_dkn, s_dkd,
                            s_dvb, s_dvh, s_dvn, s_dvd,
                            H, GROUP, ROW_LEN, qk_scale, sm_scale,
                            HEAD_D: tl.constexpr, HEAD_DV: tl.constexpr,
                            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                            BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
                            CAUSAL: tl.constexpr, DOT_PREC: tl.constexpr):
    pid = tl.program_id(0)
    hk = tl.program_id(1)
    b, n0_doc, L, kb0 = _block_entry(BLOCKS, pid, ROW_LEN)
    offs_n = kb0 + tl.arange(0, BLOCK_N)  # within the document
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    n_ok = offs_n < L
    k = _load_tile(K + b.to(tl.int64) * skb + hk.to(tl.int64) * skh
                   + (n0_doc + offs_n)[:, None].to(tl.int64) * skn + offs_d[None, :] * skd,
                   n_ok, offs_d < HEAD_D, True, BLOCK_D != HEAD_D)  # (BLOCK_N, BLOCK_D)
    v = _load_tile(V + b.to(tl.int64) * svb + hk.to(tl.int64) * svh
                   + (n0_doc + offs_n)[:, None].to(tl.int64) * svn + offs_dv[None, :] * svd,
                   n_ok, offs_dv < HEAD_DV, True, BLOCK_DV != HEAD_DV)  # (BLOCK_N, BLOCK_DV)
    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_DV], dtype=tl.float32)
    lo, a, bnd, hi = _query_segments(kb0, L, L, 0, 0, False, CAUSAL, BLOCK_M, BLOCK_N)
    # the query heads sharing this K/V head: their gradients add up (see _WHILE_LOOPS)
    if _WHILE_LOOPS:
        g = hk * 0
        while g < GROUP:
            dk, dv = _varlen_dkdv_head(dk, dv, k, v, Q, DO, LSE, DELTA, sqb, sqh, sqm, sqd,
                                       sdb, sdh, sdm, sdd, b, n0_doc, hk * GROUP + g, H,
                                       ROW_LEN, L, offs_n, offs_d, offs_dv, lo, a, bnd, hi,
                                       qk_scale, HEAD_D, HEAD_DV, BLOCK_M, BLOCK_D, BLOCK_DV,
                                       CAUSAL, DOT_PREC)
            g += 1
    else:
        for g in range(0, GROUP):
            dk, dv = _varlen_dkdv_head(dk, dv, k, v, Q, DO, LSE, DELTA, sqb, sqh, sqm, sqd,
                                       sdb, sdh, sdm, sdd, b, n0_doc, hk * GROUP + g, H,
                                       ROW_LEN, L, offs_n, offs_d, offs_dv, lo, a, bnd, hi,
                                       qk_scale, HEAD_D, HEAD_DV, BLOCK_M, BLOCK_D, BLOCK_DV,
                                       CAUSAL, DOT_PREC)
    dk = dk * sm_scale
    rows_n = (n0_doc + offs_n)[:, None].to(tl.int64)
    tl.store(DK + b.to(tl.int64) * s_dkb + hk.to(tl.int64) * s_dkh + rows_n * s_dkn
             + offs_d[None, :] * s_dkd, _cast(dk, DK.dtype.element_ty, DOT_PREC),
             mask=n_ok[:, None] & (offs_d[None, :] < HEAD_D))
    tl.store(DV + b.to(tl.int64) * s_dvb + hk.to(tl.int64) * s_dvh + rows_n * s_dvn
             + offs_dv[None, :] * s_dvd, _cast(dv, DV.dtype.element_ty, DOT_PREC),
             mask=n_ok[:, None] & (offs_dv[None, :] < HEAD_DV))


@triton.jit
def _varlen_dkdv_head(dk, dv, k, v, Q, DO, LSE, DELTA, sqb, sqh, sqm, sqd, sdb, sdh, sdm, sdd,
                      b, n0_doc, h, H, ROW_LEN, L, offs_n, offs_d, offs_dv, lo, a, bnd, hi,
                      qk_scale, HEAD_D: tl.constexpr, HEAD_DV: tl.constexpr,
                      BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
                      CAUSAL: tl.constexpr, DOT_PREC: tl.constexpr):
    """Add the dK, dV contribution of query head h (one of the GQA group) of one document."""
    Q_base = Q + b.to(tl.int64) * sqb + h.to(tl.int64) * sqh + n0_doc.to(tl.int64) * sqm
    DO_base = DO + b.to(tl.int64) * sdb + h.to(tl.int64) * sdh + n0_doc.to(tl.int64) * sdm
    row0 = (b * H + h).to(tl.int64) * ROW_LEN + n0_doc
    if CAUSAL:  # query blocks that see only part of this key block (the diagonal)
        dk, dv = _dkdv_inner(dk, dv, k, v, Q_base, DO_base, LSE + row0, DELTA + row0,
                             sqm, sqd, sdm, sdd, offs_n, offs_d, offs_dv, lo, a, L, L, 0, 0,
                             qk_scale, HEAD_D, HEAD_DV, BLOCK_M, BLOCK_D, BLOCK_DV, True,
                             False, CAUSAL, DOT_PREC)
    dk, dv = _dkdv_inner(dk, dv, k, v, Q_base, DO_base, LSE + row0, DELTA + row0,
                         sqm, sqd, sdm, sdd, offs_n, offs_d, offs_dv, a, bnd, L, L, 0, 0,
                         qk_scale, HEAD_D, HEAD_DV, BLOCK_M, BLOCK_D, BLOCK_DV, False,
                         False, CAUSAL, DOT_PREC)
    dk, dv = _dkdv_inner(dk, dv, k, v, Q_base, DO_base, LSE + row0, DELTA + row0,
                         sqm, sqd, sdm, sdd, offs_n, offs_d, offs_dv, bnd, hi, L, L, 0, 0,
                         qk_scale, HEAD_D, HEAD_DV, BLOCK_M, BLOCK_D, BLOCK_DV, True,
                         False, CAUSAL, DOT_PREC)
    return dk, dv


@triton.jit
def _varlen_bwd_dq_kernel(Q, K, V, DO, DQ, LSE, DELTA, BLOCKS,
                          sqb, sqh, sqm, sqd, skb, skh, skn, skd, svb, svh, svn, svd,
                          sdb, sdh, sdm, sdd, s_dqb, s_dqh, s_dqm, s_dqd,
                          H, GROUP, ROW_LEN, qk_scale, sm_scale,
                          HEAD_D: tl.constexpr, HEAD_DV: tl.constexpr,
                          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                          BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
                          CAUSAL: tl.constexpr, DOT_PREC: tl.constexpr):
    pid = tl.program_id(0)
    h = tl.program_id(1)
    b, n0, L, m0 = _block_entry(BLOCKS, pid, ROW_LEN)
    hk = h // GROUP
    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    m_ok = offs_m < L
    Q_base = Q + b.to(tl.int64) * sqb + h.to(tl.int64) * sqh + n0.to(tl.int64) * sqm
    DO_base = DO + b.to(tl.int64) * sdb + h.to(tl.int64) * sdh + n0.to(tl.int64) * sdm
    q = _load_tile(Q_base + offs_m[:, None] * sqm + offs_d[None, :] * sqd, m_ok,
                   offs_d < HEAD_D, True, BLOCK_D != HEAD_D)
    do = _load_tile(DO_base + offs_m[:, None] * sdm + offs_dv[None, :] * sdd, m_ok,
                    offs_dv < HEAD_DV, True, BLOCK_DV != HEAD_DV)
    row0 = (b * H + h).to(tl.int64) * ROW_LEN + n0
    lse = tl.load(LSE + row0 + offs_m, mask=m_ok, other=float("inf"))
    delta = tl.load(DELTA + row0 + offs_m, mask=m_ok, other=0.0)
    K_base = K + b.to(tl.int64) * skb + hk.to(tl.int64) * skh + n0.to(tl.int64) * skn
    V_base = V + b.to(tl.int64) * svb + hk.to(tl.int64) * svh + n0.to(tl.int64) * svn
    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    lo, a, bnd, hi = _key_segments(m0, L, L, 0, 0, False, CAUSAL, BLOCK_M, BLOCK_N)
    dq = _dq_inner(dq, q, do, lse, delta, K_base, V_base, skn, skd, svn, svd, offs_m, offs_d,
                   offs_dv, a, bnd, L, L, 0, 0, qk_scale, HEAD_D, HEAD_DV, BLOCK_N, BLOCK_D,
                   BLOCK_DV, False, False, CAUSAL, DOT_PREC)
    dq = _dq_inner(dq, q, do, lse, delta, K_base, V_base, skn, skd, svn, svd, offs_m, offs_d,
                   offs_dv, bnd, hi, L, L, 0, 0, qk_scale, HEAD_D, HEAD_DV, BLOCK_N, BLOCK_D,
                   BLOCK_DV, True, False, CAUSAL, DOT_PREC)
    dq = dq * sm_scale
    tl.store(DQ + b.to(tl.int64) * s_dqb + h.to(tl.int64) * s_dqh + n0.to(tl.int64) * s_dqm
             + offs_m[:, None] * s_dqm + offs_d[None, :] * s_dqd,
             _cast(dq, DQ.dtype.element_ty, DOT_PREC),
             mask=m_ok[:, None] & (offs_d[None, :] < HEAD_D))


# ---------------------------------------------------------------------------------------------
# The packing and its block lists
# ---------------------------------------------------------------------------------------------
class Packing:
    """Documents of a packed batch: flat starts and lengths over rows of ``row_len`` tokens
    laid end to end. Block lists (the kernels' grids) are built on the host once per block
    size and device, outside any timed call."""

    def __init__(self, starts, lengths, row_len: int):
        self.starts = tuple(int(s) for s in starts)
        self.lengths = tuple(int(n) for n in lengths)
        self.row_len = int(row_len)
        for s, n in zip(self.starts, self.lengths):
            if n < 1 or s // self.row_len != (s + n - 1) // self.row_len:
                raise ValueError(f"triton_flash varlen: document at {s} of length {n} "
                                 f"crosses a row of {self.row_len} tokens")
        self.max_seqlen = max(self.lengths) if self.lengths else 0
        self._blocks: dict[tuple, torch.Tensor] = {}

    @classmethod
    def of_rows(cls, rows, row_len: int) -> Packing:
        """From per-row document lengths (``core/lengths.draw``), each row summing to row_len."""
        starts, lengths = [], []
        for b, row in enumerate(rows):
            if sum(row) != row_len:
                raise ValueError(f"row {b}'s documents hold {sum(row)} tokens, the row "
                                 f"{row_len}")
            s = b * row_len
            for n in row:
                starts.append(s)
                lengths.append(n)
                s += n
        return cls(starts, lengths, row_len)

    @classmethod
    def of_cu_seqlens(cls, cu_seqlens) -> Packing:
        """From flash_attn's cumulative lengths (count + 1,) over one token-major row."""
        cu = [int(x) for x in torch.as_tensor(cu_seqlens).tolist()]
        return cls(cu[:-1], [b - a for a, b in zip(cu[:-1], cu[1:])], max(cu[-1], 1))

    def pairs(self, causal: bool) -> int:
        """Within-document query-key pairs: the work the kernels do (up to tile edges)."""
        return sum(n * (n + 1) // 2 if causal else n * n for n in self.lengths)

    def blocks(self, block: int, causal: bool, device) -> torch.Tensor:
        """(entries, 3) int32 (flat start, length, block start): every block of every
        document, those with the most keys (queries) to visit first, which shortens the
        launch's tail."""
        key = (block, causal, str(device))
        if key not in self._blocks:
            rows = [(s, n, b0) for s, n in zip(self.starts, self.lengths)
                    for b0 in range(0, n, block)]
            # causal: query block b0 of a document of n visits its first min(b0 + block, n)
            # keys, key block b0 its last n - b0 queries; one list serves both, ordered by
            # the larger
            rows.sort(key=lambda r: -(max(min(r[2] + block, r[1]), r[1] - r[2]) if causal
                                      else r[1]))
            self._blocks[key] = torch.tensor(rows, dtype=torch.int32,
                                             device=device).reshape(-1, 3)
        return self._blocks[key]


# ---------------------------------------------------------------------------------------------
# Launch configuration and tuning (the dense kernel's candidates and tuner)
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Plan:
    """What one packed call computes: the scale, and causal within each document or not."""

    scale: float
    causal: bool = False

    @property
    def kind(self) -> str:
        return "causal" if self.causal else "none"


Config = F.Config
INTERPRETER_CONFIG = F.INTERPRETER_CONFIG
candidate_configs = F.candidate_configs
head_block = F.head_block
_dot_precision = F._dot_precision

# (kernel, d, dv, dtype, causal, gqa, longest-document bucket, total bucket) -> Config
_TUNED: dict[tuple, Config] = {}


def launch_constants(d: int, dv: int, plan: Plan, cfg: Config, dtype: torch.dtype) -> dict:
    """The compile-time arguments of the three kernels (launchers and the sm_90 compile)."""
    return dict(HEAD_D=d, HEAD_DV=dv, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
                BLOCK_D=head_block(d), BLOCK_DV=head_block(dv), CAUSAL=plan.causal,
                DOT_PREC=_dot_precision(dtype))


def tune_key(kernel: str, q, k, v, plan: Plan, packing: Packing | None = None) -> tuple:
    longest = packing.max_seqlen if packing is not None else q.shape[2]
    return (kernel, q.shape[-1], v.shape[-1], str(q.dtype), plan.causal,
            q.shape[1] != k.shape[1], F._seq_bucket(longest),
            F._seq_bucket(q.shape[0] * q.shape[2]))


def config_for(kernel: str, q, k, v, plan: Plan, packing: Packing | None = None) -> Config:
    if INTERPRET or q.device.type != "cuda":
        return INTERPRETER_CONFIG
    hit = _TUNED.get(tune_key(kernel, q, k, v, plan, packing))
    return hit if hit is not None else F.configs_for(kernel, q, v)[0]


def bound(packing: Packing):
    """This module as _triton_flash_meta reads a kernel module, with ``config_for`` bound to
    one packing (the tuned configuration depends on its documents)."""
    import types

    names = ("INTERPRET", "KERNELS", "POINTERS", "FP32_POINTERS", "I32_POINTERS", "Plan",
             "launch_constants", "candidate_configs")
    ns = types.SimpleNamespace(**{n: globals()[n] for n in names})
    ns.__name__ = __name__
    ns.config_for = lambda kernel, q, k, v, plan: config_for(kernel, q, k, v, plan, packing)
    return ns


def tune(q, k, v, grad_out, packing: Packing, plan: Plan, log=None) -> dict[str, Config]:
    """The fastest candidate of each kernel for these inputs (cached per tuning key); outside
    any timed region. A CUDA fault is raised (see _triton_flash_kernels.tune)."""
    if INTERPRET or q.device.type != "cuda":
        names = ["fwd", "dkdv", "dq"] if grad_out is not None else ["fwd"]
        return {n: INTERPRETER_CONFIG for n in names}

    def pick(kernel, run):
        key = tune_key(kernel, q, k, v, plan, packing)
        # a dense call of the longest document's length tuned in this process: its tile,
        # with no candidate compiled again (the GPU check's time budget counts on it)
        longest = F._seq_bucket(packing.max_seqlen)
        dense = F._TUNED.get((kernel, *key[1:4], plan.kind, key[5], longest, longest))
        if key not in _TUNED and dense is not None:
            if log:
                log(f"triton_flash varlen tune {kernel}: {dense}, the dense kernel's")
            _TUNED[key] = dense
        if key not in _TUNED:
            best = F.fastest(kernel, F.configs_for(kernel, q, v), run, F._bench_ms, log)
            if best is None:
                raise RuntimeError(f"triton_flash varlen: no {kernel} configuration ran")
            _TUNED[key] = best
        return _TUNED[key]

    chosen = {"fwd": pick("fwd", lambda cfg: forward(q, k, v, packing, plan, cfg))}
    if grad_out is not None:
        o, lse = forward(q, k, v, packing, plan, chosen["fwd"])
        delta = F._delta(o, grad_out)
        dk, dvv, dq = torch.empty_like(k), torch.empty_like(v), torch.empty_like(q)
        chosen["dkdv"] = pick("dkdv", lambda cfg: _launch_dkdv(
            q, k, v, grad_out, dk, dvv, lse, delta, packing, plan, cfg))
        chosen["dq"] = pick("dq", lambda cfg: _launch_dq(
            q, k, v, grad_out, dq, lse, delta, packing, plan, cfg))
    return chosen


def timed_tune(q, k, v, grad_out, packing, plan, log=None) -> tuple[dict[str, Config], float]:
    t0 = time.perf_counter()
    chosen = tune(q, k, v, grad_out, packing, plan, log)
    return chosen, time.perf_counter() - t0


# ---------------------------------------------------------------------------------------------
# Launchers
# ---------------------------------------------------------------------------------------------
def _check(q, k, v, packing: Packing):
    B, H, N, D = q.shape
    if k.shape[:3] != v.shape[:3] or k.shape[0] != B or k.shape[2] != N or k.shape[3] != D \
            or H % k.shape[1]:
        raise ValueError(f"triton_flash varlen: incompatible shapes q {tuple(q.shape)}, "
                         f"k {tuple(k.shape)}, v {tuple(v.shape)}")
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError("triton_flash varlen: q, k and v must share a dtype")
    if packing.row_len != N or sum(packing.lengths) != B * N:
        raise ValueError(f"triton_flash varlen: the packing holds {sum(packing.lengths)} "
                         f"tokens in rows of {packing.row_len}, the inputs {B} x {N}")


def forward(q, k, v, packing: Packing, plan: Plan, cfg: Config | None = None):
    """O (B, Hq, N, Dv) in q's dtype and the base-2 log-sum-exp (B, Hq, N) in fp32."""
    _check(q, k, v, packing)
    cfg = cfg or config_for("fwd", q, k, v, plan, packing)
    B, H, N, D = q.shape
    Hk, Dv = k.shape[1], v.shape[-1]
    o = torch.empty((B, H, N, Dv), device=q.device, dtype=q.dtype)  # (B, Hq, N, Dv)
    lse = torch.empty((B, H, N), device=q.device, dtype=torch.float32)  # (B, Hq, N)
    blocks = packing.blocks(cfg.block_m, plan.causal, q.device)
    _varlen_fwd_kernel[(blocks.shape[0], H)](
        q, k, v, o, lse, blocks, *q.stride(), *k.stride(), *v.stride(), *o.stride(),
        H, H // Hk, N, plan.scale * LOG2E, **launch_constants(D, Dv, plan, cfg, q.dtype),
        num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    return o, lse


def _launch_dkdv(q, k, v, do, dk, dv, lse, delta, packing, plan: Plan, cfg: Config):
    B, H, N, D = q.shape
    Hk, Dv = k.shape[1], v.shape[-1]
    blocks = packing.blocks(cfg.block_n, plan.causal, q.device)
    _varlen_bwd_dkdv_kernel[(blocks.shape[0], Hk)](
        q, k, v, do, dk, dv, lse, delta, blocks, *q.stride(), *k.stride(), *v.stride(),
        *do.stride(), *dk.stride(), *dv.stride(), H, H // Hk, N, plan.scale * LOG2E,
        plan.scale, **launch_constants(D, Dv, plan, cfg, q.dtype),
        num_warps=cfg.num_warps, num_stages=cfg.num_stages)


def _launch_dq(q, k, v, do, dq, lse, delta, packing, plan: Plan, cfg: Config):
    B, H, N, D = q.shape
    Hk, Dv = k.shape[1], v.shape[-1]
    blocks = packing.blocks(cfg.block_m, plan.causal, q.device)
    _varlen_bwd_dq_kernel[(blocks.shape[0], H)](
        q, k, v, do, dq, lse, delta, blocks, *q.stride(), *k.stride(), *v.stride(),
        *do.stride(), *dq.stride(), H, H // Hk, N, plan.scale * LOG2E, plan.scale,
        **launch_constants(D, Dv, plan, cfg, q.dtype),
        num_warps=cfg.num_warps, num_stages=cfg.num_stages)


def backward(q, k, v, o, lse, do, packing: Packing, plan: Plan):
    """dQ, dK, dV (shapes and dtypes of q, k, v); dK/dV summed over each GQA group."""
    delta = F._delta(o, do)  # (B, Hq, N) fp32: rowsum(dO * O), per token
    dq = torch.empty(q.shape, device=q.device, dtype=q.dtype)  # (B, Hq, N, D)
    dk = torch.empty(k.shape, device=k.device, dtype=k.dtype)  # (B, Hkv, N, D)
    dv = torch.empty(v.shape, device=v.device, dtype=v.dtype)  # (B, Hkv, N, Dv)
    _launch_dkdv(q, k, v, do, dk, dv, lse, delta, packing, plan,
                 config_for("dkdv", q, k, v, plan, packing))
    _launch_dq(q, k, v, do, dq, lse, delta, packing, plan,
               config_for("dq", q, k, v, plan, packing))
    return dq, dk, dv


class VarlenFlashAttention(torch.autograd.Function):
    """Differentiable packed FlashAttention-2: saves O and the log-sum-exp per token."""

    @staticmethod
    def forward(ctx, q, k, v, packing: Packing, plan: Plan):
        o, lse = forward(q, k, v, packing, plan)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.packing, ctx.plan = packing, plan
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        dq, dk, dv = backward(q, k, v, o, lse, do, ctx.packing, ctx.plan)
        return dq, dk, dv, None, None


def attention(q, k, v, packing: Packing, plan: Plan):
    """Packed attention (B, Hq, N, Dv) of q (B, Hq, N, D), k (B, Hkv, N, D), v (B, Hkv, N, Dv):
    each document of ``packing`` attends within itself."""
    return VarlenFlashAttention.apply(q, k, v, packing, plan)


def varlen_attention(q, k, v, cu_seqlens, scale: float | None = None, causal: bool = False,
                     packing: Packing | None = None):
    """flash_attn_varlen_func's interface: q (T, Hq, D), k (T, Hkv, D), v (T, Hkv, Dv) token
    major, ``cu_seqlens`` (count + 1,) int; out (T, Hq, Dv). Views only, no copy; pass a
    ``packing`` built once (``Packing.of_cu_seqlens``) to keep the host read of cu_seqlens
    out of a timed loop."""
    packing = packing or Packing.of_cu_seqlens(cu_seqlens)
    plan = Plan(float(scale if scale is not None else 1.0 / math.sqrt(q.shape[-1])), causal)

    def rows(t):  # (T, H, D) -> (1, H, T, D)
        return t.permute(1, 0, 2).unsqueeze(0)

    out = attention(rows(q), rows(k), rows(v), packing, plan)  # (1, Hq, T, Dv)
    return out.squeeze(0).permute(1, 0, 2)  # (T, Hq, Dv)


# The kernels a call launches by name, for records (_triton_flash_meta), and which of their
# pointer arguments point at fp32 or int32 (the rest hold the inputs' dtype).
KERNELS = {"fwd": _varlen_fwd_kernel, "dkdv": _varlen_bwd_dkdv_kernel,
           "dq": _varlen_bwd_dq_kernel}
POINTERS = ("Q", "K", "V", "O", "DO", "DQ", "DK", "DV")
FP32_POINTERS = ("LSE", "DELTA")
I32_POINTERS = ("BLOCKS",)
