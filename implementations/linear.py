"""linear: kernelized attention ``phi(Q) (phi(K)^T V) / (phi(Q) sum_j phi(K_j))``.

Approximates softmax attention (semantics APPROXIMATE): ``err_impl`` is measured against
the float64 evaluation of this same formula with the same feature map and the same
random features (:meth:`Linear.impl_reference`), and ``err_vs_softmax`` is the
approximation error. Feature maps (``case.param("feature_map")``):

* ``elu``   -- ``phi(x) = elu(x) + 1`` on the raw q and k (Katharopoulos et al. 2020,
  "Transformers are RNNs"); the softmax scale does not enter.
* ``favor`` -- positive orthogonal random features of FAVOR+ (Choromanski et al. 2021,
  "Rethinking Attention with Performers"): ``phi(x) = exp(W x' - |x'|^2 / 2) / sqrt(m)``
  with ``x' = x * sqrt(scale)``, so that ``E[phi(q) . phi(k)] = exp(scale * q . k)``; the
  m = ``case.param("num_features")`` rows of W are blocks of orthogonal Gaussian directions with
  chi-distributed norms, drawn from ``case.seed`` (:func:`favor_projection`).

Non-causal: ``S = phi(K)^T [V, 1]`` once, then ``phi(Q) S``: O(N * F * Dv). The ones
column carries the normaliser through the same matmul. Causal: chunked prefix sums --
per chunk of C keys the state ``phi(K_c)^T [V_c, 1]``, an exclusive cumulative sum over
chunks, and inside a chunk a masked C x C product: O(N * F * (Dv + C)), no loop per
token and no (N, F, Dv) tensor. Causal with seq_q != seq_k is bottom-right aligned
(query i sees keys j <= i + seq_k - seq_q); rows that see no key produce zeros.
fp16/bf16 inputs are computed (and accumulated) in fp32, float64 in float64.
Windows and block-sparse masks are not supported. fp32 on the CPU runs the same formulas in
the C++ kernels of ``_linear_fused`` (forward and backward) where the shapes fit the tiles.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from attnbench.core import knobs
from attnbench.core.backend import APPROXIMATE, Backend, Capabilities, wrap_mode
from attnbench.core.case import MODE_FLOP_FACTOR
from attnbench.core.masks import allowed_rows
from attnbench.core.reference import RefResult, chunked_reference
from attnbench.implementations import _linear_fused, _native
from attnbench.implementations._cpu_threads import split_work
from attnbench.implementations._linear_features import elu1, elu1_into, phi_head
from attnbench.implementations._linear_grad import causal_backward, global_backward

FEATURE_MAPS = knobs.FEATURE_MAPS
CHUNK = 64  # keys per chunk of the causal prefix sum
BLOCK = 2048  # causal: query rows per block, bounds the temporaries
# Non-causal without autograd: elements of phi per streamed block. Larger than L2: each
# block costs about ten small ops whose fixed cost (a few us each from Python) outweighs
# the cache.
STREAM = 1 << 19
QBUDGET = 1 << 23  # non-causal: elements of phi(Q) per block of query rows
_SEED_SALT = 0xFA7012  # random features come from another stream than the inputs


def favor_projection(case, device=None, dtype=torch.float64) -> torch.Tensor:
    """(m, D) orthogonal random features for FAVOR+, deterministic in ``case.seed``.

    Blocks of D rows are orthonormal (QR of a Gaussian matrix, signs fixed by R's diagonal);
    each row is then scaled by the norm of an independent D-dimensional Gaussian vector, so
    every row is marginally N(0, I_D) while rows within a block stay orthogonal.
    """
    m, D = case.param("num_features"), case.head_dim
    gen = torch.Generator().manual_seed(case.seed * 1_000_003 + _SEED_SALT)
    blocks = []
    for _ in range(math.ceil(m / D)):
        g = torch.randn(D, D, generator=gen, dtype=torch.float64)
        qm, r = torch.linalg.qr(g)
        qm = qm * torch.sign(torch.diagonal(r)).where(torch.diagonal(r) != 0, 1.0)
        blocks.append(qm.T)  # rows orthonormal
    w = torch.cat(blocks, dim=0)[:m]  # (m, D)
    norms = torch.randn(m, D, generator=gen, dtype=torch.float64).norm(dim=1, keepdim=True)
    return (w * norms).to(device=device or "cpu", dtype=dtype)


def scaled_projection(proj: torch.Tensor, scale: float, dtype: torch.dtype) -> torch.Tensor:
    """W sqrt(scale) (m, D) in ``dtype``, scaled in float64 and rounded once."""
    return (proj.to(torch.float64) * math.sqrt(scale)).to(dtype)


def feature_fn(case, proj: torch.Tensor | None, dtype: torch.dtype | None = None):
    """phi for queries and for keys: ``(phi_q, phi_k)``, each x (..., N, D) -> (..., N, F).

    FAVOR+'s ``phi(x) = exp(W x' - |x'|^2 / 2) / sqrt(m)`` is evaluated up to factors that
    cancel between numerator and denominator: per query row the factor
    ``exp(-|x'|^2 / 2 - max_i (W x')_i) / sqrt(m)`` (the row's maximum is its shift, so the
    norm term drops out exactly), and for keys one factor per (batch, head),
    ``exp(-max) / sqrt(m)`` with the maximum over all keys. The function computed is
    unchanged, exp cannot overflow, and the query side needs no norm term at all.
    """
    if case.param("feature_map") == "elu":
        return elu1, elu1
    scale = case.softmax_scale
    proj_s = scaled_projection(proj, scale, dtype or proj.dtype)  # (m, D): x' folded into W

    def phi_q(x):
        a = torch.matmul(x, proj_s.T)  # (..., N, m)
        return torch.exp(a - a.amax(dim=-1, keepdim=True).detach())

    def phi_k(x):
        a = torch.matmul(x, proj_s.T) - (0.5 * scale) * (x * x).sum(dim=-1, keepdim=True)
        return torch.exp(a - a.amax(dim=(-2, -1), keepdim=True).detach())  # (..., N, m)

    return phi_q, phi_k


def _normalise(y: torch.Tensor) -> torch.Tensor:
    """[numerator, denominator] (..., Dv + 1) -> numerator / denominator (0 where no key)."""
    num, den = y[..., :-1], y[..., -1:]
    return num / torch.where(den > 0, den, torch.ones_like(den))


def _causal(fq, fk, v1, state0, chunk):
    """Causal linear attention, query i seeing keys j <= i (aligned), chunked prefix sums.

    fq (B, Hkv, G, n, F); fk (B, Hkv, n, F); v1 (B, Hkv, n, E) with E = Dv + 1;
    state0 (B, Hkv, F, E) or None: the state of all earlier keys.
    Returns y (B, Hkv, G, n, E) and the state after these n keys (B, Hkv, F, E).
    """
    B, Hkv, G, n, Fd = fq.shape
    E = v1.shape[-1]
    C = max(1, min(chunk, n))
    nc = -(-n // C)
    pad = nc * C - n
    if pad:  # padded keys have zero features: they add nothing
        fq = F.pad(fq, (0, 0, 0, pad))
        fk = F.pad(fk, (0, 0, 0, pad))
        v1 = F.pad(v1, (0, 0, 0, pad))
    fq = fq.reshape(B, Hkv, G, nc, C, Fd).transpose(2, 3).reshape(B, Hkv, nc, G * C, Fd)
    fk = fk.reshape(B, Hkv, nc, C, Fd)  # (B, Hkv, nc, C, F)
    v1 = v1.reshape(B, Hkv, nc, C, E)  # (B, Hkv, nc, C, E)
    kv = torch.matmul(fk.transpose(-1, -2), v1)  # (B, Hkv, nc, F, E) per-chunk states
    first = state0[:, :, None] if state0 is not None else torch.zeros_like(kv[:, :, :1])
    # exclusive prefix sum: the state before each chunk, earlier blocks' keys included
    state = torch.cumsum(torch.cat([first, kv[:, :, :-1]], dim=2), dim=2)  # (B, Hkv, nc, F, E)
    final = state[:, :, -1] + kv[:, :, -1]  # (B, Hkv, F, E): after the last chunk
    y = torch.matmul(fq, state)  # (B, Hkv, nc, G*C, E): keys of earlier chunks
    a = torch.matmul(fq, fk.transpose(-1, -2))  # (B, Hkv, nc, G*C, C)
    tri = torch.ones(C, C, dtype=torch.bool, device=fq.device).tril_()  # key <= query
    a.masked_fill_(~tri.repeat(G, 1), 0.0)
    # + keys of the own chunk, accumulated in place (y is not needed by any backward)
    y = y.reshape(-1, G * C, E).baddbmm_(a.reshape(-1, G * C, C), v1.reshape(-1, C, E))
    y = y.reshape(B, Hkv, nc, G, C, E).transpose(2, 3).reshape(B, Hkv, G, nc * C, E)
    return y[:, :, :, :n], final


def _with_ones(v):
    """(B, H, N, Dv) -> (B, H, N, Dv + 1): the ones column carries the normaliser."""
    return torch.cat([v, v.new_ones(*v.shape[:-1], 1)], dim=-1)


def _global(qc, fk, vc, phi_q, G, block, inplace):
    """Non-causal: ``S = phi(K)^T [V, 1]`` once, then ``phi(Q) S`` for blocks of query rows.

    qc (B, Hq, Nq, D); fk (B, Hkv, Nk, F); vc (B, Hkv, Nk, Dv). Returns (B, Hq, Nq, Dv).
    The normaliser rides in the last column of S, so each block is one matmul; with
    ``inplace`` (no autograd) the numerator is divided where the matmul wrote it.
    """
    B, Hq, Nq, _ = qc.shape
    Hkv, Fd, Dv = fk.shape[1], fk.shape[-1], vc.shape[-1]
    s = torch.cat([torch.matmul(fk.transpose(-1, -2), vc),  # (B, Hkv, F, Dv)
                   fk.sum(dim=-2).unsqueeze(-1)], dim=-1)  # (B, Hkv, F, E = Dv + 1)
    if block is None:  # rows per block: phi(Q) of a block stays under QBUDGET elements
        block = max(1, QBUDGET // max(1, B * Hq * Fd))
    out = qc.new_empty(B, Hq, Nq, Dv) if Nq > block or Nq == 0 else None
    for r0 in range(0, Nq, block):
        r1 = min(Nq, r0 + block)
        fq = phi_q(qc[:, :, r0:r1]).reshape(B, Hkv, G * (r1 - r0), Fd)  # (B, Hkv, G*R, F)
        y = torch.matmul(fq, s)  # (B, Hkv, G*R, E)
        num, den = y[..., :Dv], y[..., Dv:]  # (B, Hkv, G*R, Dv), (B, Hkv, G*R, 1)
        den = torch.where(den > 0, den, 1.0)  # rows that see no key: 0 / 1
        o = (num.div_(den) if inplace else num / den).reshape(B, Hq, r1 - r0, Dv)
        if out is None:
            return o  # (B, Hq, Nq, Dv): one block, a view of y when in place
        out[:, :, r0:r1] = o
    return out  # (B, Hq, Nq, Dv)


def _key_state(k2, v2, proj_s, half_scale, rows, bufs):
    """One K/V head's ``S = phi(K)^T V`` (F, Dv) and ``z = phi(K)^T 1`` (F,), no autograd.

    k2 (Nk, D), v2 (Nk, Dv). Keys go in blocks of ``rows`` whose phi is written into
    reused buffers and consumed while in cache. FAVOR+ (``proj_s`` given) shifts the
    exponents by a running maximum and rescales S and z when it grows (as flash attention
    does), so the shift is the maximum over all keys, as in ``feature_fn``, without a
    second pass over the keys.
    """
    Nk = k2.shape[0]
    fbuf, tbuf, ebuf = bufs
    s = v2.new_zeros(fbuf.shape[1], v2.shape[1])  # (F, Dv)
    z = v2.new_zeros(fbuf.shape[1])  # (F,)
    top = -math.inf
    for r0 in range(0, Nk, rows):
        r1 = min(Nk, r0 + rows)
        f = fbuf[:r1 - r0]  # (R, F)
        x = k2[r0:r1]  # (R, D)
        if proj_s is None:
            elu1_into(x, f, tbuf[:r1 - r0])
        else:
            torch.mm(x, proj_s.T, out=f)  # (R, m)
            nrm = ebuf[:r1 - r0]  # (R, 1)
            torch.sum(x * x, dim=-1, keepdim=True, out=nrm)
            f.sub_(nrm.mul_(half_scale))
            m = float(f.max())
            if m > top:
                if top > -math.inf:
                    rescale = math.exp(top - m)
                    s.mul_(rescale)
                    z.mul_(rescale)
                top = m
            f.sub_(top).exp_()
        s.addmm_(f.T, v2[r0:r1])  # (F, Dv)
        z.add_(f.sum(dim=0))
    return s, z


def _global_stream(qc, kc, vc, G, proj_s, half_scale, buf, states=None):
    """Non-causal without autograd (elu, or FAVOR+ with ``proj_s``), one head at a time.

    qc (B, Hq, Nq, D), kc (B, Hkv, Nk, D), vc (B, Hkv, Nk, Dv) -> (B, Hq, Nq, Dv). Blocks of
    rows whose phi holds about ``buf`` elements go through each thread's reused buffers
    (``STREAM``: large blocks, few ops); the output of a block is written in place by one
    matmul with S (F x Dv, a SIMD-friendly width) and divided by ``phi(Q) z`` (a
    matrix-vector product): no ones column, no strided division. The only large allocation
    is the output. ``states`` (a dict) receives each K/V head's (S, z) for the backward.
    """
    B, Hq, Nq, D = qc.shape
    Hkv, Nk, Dv = kc.shape[1], kc.shape[2], vc.shape[-1]
    Fd = D if proj_s is None else proj_s.shape[0]
    k3, v3 = kc.reshape(B * Hkv, Nk, D), vc.reshape(B * Hkv, Nk, Dv)
    q3 = qc.reshape(B * Hq, Nq, D)
    out = qc.new_empty(B, Hq, Nq, Dv)
    o3 = out.view(B * Hq, Nq, Dv)
    rows = max(1, min(buf // Fd, max(Nq, Nk)))  # buffers no longer than the sequence
    tiny = torch.finfo(qc.dtype).tiny

    def work(h0: int, h1: int) -> None:  # K/V heads [h0, h1) and their query heads
        fbuf, tbuf = qc.new_empty(rows, Fd), qc.new_empty(rows, Fd)  # phi of a block, scratch
        ebuf = qc.new_empty(rows, 1)  # per-row norms (keys) or maxima (queries)
        dbuf = qc.new_empty(rows)  # phi(Q) z of a block
        for h in range(h0, h1):
            s, z = _key_state(k3[h], v3[h], proj_s, half_scale, min(rows, Nk) or 1,
                              (fbuf, tbuf, ebuf))
            if states is not None:
                states[h] = (s, z)  # each head is one thread's: distinct keys
            for i in range(h * G, (h + 1) * G):
                for r0 in range(0, Nq, rows):
                    r1 = min(Nq, r0 + rows)
                    f, x, o = fbuf[:r1 - r0], q3[i, r0:r1], o3[i, r0:r1]  # (R,F) (R,D) (R,Dv)
                    if proj_s is None:
                        elu1_into(x, f, tbuf[:r1 - r0])
                    else:  # the row's own maximum is its shift (feature_fn)
                        torch.mm(x, proj_s.T, out=f)
                        f.sub_(torch.amax(f, dim=-1, keepdim=True, out=ebuf[:r1 - r0])).exp_()
                    torch.mm(f, s, out=o)  # (R, Dv) numerator
                    d = torch.mv(f, z, out=dbuf[:r1 - r0])  # (R,) denominator
                    # phi > 0, so d == 0 only where the numerator is 0 (no keys): 0 / tiny = 0
                    o.div_(d.clamp_(min=tiny).unsqueeze(1))

    split_work(work, B * Hkv, qc.device)
    return out  # (B, Hq, Nq, Dv)


def _causal_stream(qc, kc, vc, G, proj_s, half_scale, C, states=None):
    """Causal (seq_q == seq_k, a multiple of C) without autograd, one head at a time.

    Per chunk of C keys the state ``phi(K_c)^T V_c`` (F, Dv) and ``phi(K_c)^T 1``; their
    inclusive cumulative sums, read one chunk back, are the states of all earlier chunks
    (a slice, no shifted copy). A chunk's output is ``phi(Q_c) S_<c`` plus the masked C x C
    product inside the chunk, written in place into the output and divided by the same
    two terms with 1 in place of V: no ones column (V's width stays SIMD-friendly), no
    concatenations; the C x C products are masked by ``tril_`` (a broadcast boolean
    ``masked_fill_`` was far slower). qc (B, Hq, N, D), kc (B, Hkv, N, D),
    vc (B, Hkv, N, Dv). ``states`` (a dict) receives each K/V head's inclusive prefix sums
    (S, z) for the backward.
    """
    B, Hq, N, D = qc.shape
    Hkv, Dv = kc.shape[1], vc.shape[-1]
    Fd = D if proj_s is None else proj_s.shape[0]
    nc = N // C
    k3, v3 = kc.reshape(B * Hkv, N, D), vc.reshape(B * Hkv, N, Dv)
    q3 = qc.reshape(B * Hq, N, D)
    out = qc.new_empty(B, Hq, N, Dv)
    o3 = out.view(B * Hq, nc, C, Dv)
    tiny = torch.finfo(qc.dtype).tiny

    def work(h0: int, h1: int) -> None:  # K/V heads [h0, h1) and their query heads
        fk, fq, tmp = (qc.new_empty(N, Fd) for _ in range(3))  # phi(K), phi(Q), scratch
        a = qc.new_empty(nc, C, C)  # intra-chunk products
        den = qc.new_empty(nc, C)
        for h in range(h0, h1):
            phi_head(k3[h], proj_s, half_scale, fk, tmp, keys=True)
            fkc, vch = fk.view(nc, C, Fd), v3[h].view(nc, C, Dv)
            s = torch.bmm(fkc.transpose(1, 2), vch)  # (nc, F, Dv) per chunk
            for c in range(1, nc):  # inclusive prefix sum; cumsum over the outer dim ran
                s[c].add_(s[c - 1])  # at 14 ns an element here, 36% of the call
            z = fkc.sum(dim=1).cumsum_(0).unsqueeze(-1)  # (nc, F, 1) inclusive
            if states is not None:
                states[h] = (s, z)  # each head is one thread's: distinct keys
            for i in range(h * G, (h + 1) * G):
                phi_head(q3[i], proj_s, half_scale, fq, tmp, keys=False)
                fqc, o = fq.view(nc, C, Fd), o3[i]  # (nc, C, F), (nc, C, Dv)
                torch.bmm(fqc, fkc.transpose(1, 2), out=a).tril_()  # key <= query
                torch.bmm(a, vch, out=o)  # keys of the own chunk
                torch.sum(a, dim=-1, out=den)
                if nc > 1:  # keys of earlier chunks
                    o[1:].baddbmm_(fqc[1:], s[:-1])
                    den[1:].unsqueeze(-1).baddbmm_(fqc[1:], z[:-1])
                # phi > 0: den == 0 only where the numerator is 0 too
                o.div_(den.clamp_(min=tiny).unsqueeze(-1))

    split_work(work, B * Hkv, qc.device)
    return out  # (B, Hq, N, Dv)


class _ExplicitLinear(torch.autograd.Function):
    """Linear attention with an explicit backward (``_linear_grad``). ``stream`` is the
    forward without autograd (``_global_stream`` or ``_causal_stream``), which fills
    ``states`` with each K/V head's (S, z); only those and the output are kept, and
    ``grad`` (``global_backward`` or ``causal_backward``) takes the stream's own arguments
    after the states."""

    @staticmethod
    def forward(ctx, qc, kc, vc, stream, grad, *args):
        states: dict = {}
        out = stream(qc, kc, vc, *args, states=states)
        ctx.save_for_backward(qc, kc, vc, out)
        ctx.states = states  # intermediates (neither inputs nor outputs) may live on ctx
        ctx.grad, ctx.args = grad, args
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, dout):
        qc, kc, vc, out = ctx.saved_tensors
        grads = ctx.grad(qc, kc, vc, out, dout.contiguous(), ctx.states, *ctx.args)
        return (*grads, None, None) + (None,) * len(ctx.args)


def linear_attention(q, k, v, case, proj, causal: bool, chunk: int = CHUNK,
                     block: int | None = None, explicit_backward: bool = True):
    """The backend's computation, in fp32 for fp16/bf16 inputs and float64 for float64.

    Queries go in blocks of ``block`` rows (the causal state carried from block to
    block), so temporaries stay O(block) and the one O(N) allocation per input is phi(K).
    The default block is BLOCK rows for causal, and for non-causal as many rows as keep
    phi(Q) of a block under QBUDGET elements (all of them for elu at N = 8192, H = 8).
    Under autograd the non-causal form, and the causal one with seq_q == seq_k a multiple
    of the chunk, have an explicit backward (``_linear_grad``);
    ``explicit_backward=False`` differentiates the formula with autograd instead (the
    float64 reference does, so that the backend's gradients are checked against it).
    """
    B, Hq, Nq, _ = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    G = Hq // Hkv
    cdt = torch.float64 if q.dtype == torch.float64 else torch.float32
    phi_q, phi_k = feature_fn(case, proj, cdt)
    proj_s = None if proj is None else scaled_projection(proj, case.softmax_scale, cdt)
    qc, vc = q.to(cdt), v.to(cdt)
    grad = _native.records_grad(q, k, v)
    half_scale = 0.5 * case.softmax_scale
    if not causal:
        feats = q.shape[-1] if proj is None else proj.shape[0]
        rows = block * feats if block else STREAM
        if not grad:
            return _global_stream(qc, k.to(cdt), vc, G, proj_s, half_scale, rows).to(q.dtype)
        if explicit_backward:
            return _ExplicitLinear.apply(qc, k.to(cdt), vc, _global_stream, global_backward,
                                         G, proj_s, half_scale, rows).to(q.dtype)
        fk = phi_k(k.to(cdt))  # (B, Hkv, Nk, F)
        return _global(qc, fk, vc, phi_q, G, block, not grad).to(q.dtype)
    if Nq == Nk and Nk % chunk == 0 and (not grad or explicit_backward):
        args = (qc, k.to(cdt), vc, G, proj_s, half_scale, chunk)
        out = (_ExplicitLinear.apply(*args[:3], _causal_stream, causal_backward, *args[3:])
               if grad else _causal_stream(*args))
        return out.to(q.dtype)
    fk = phi_k(k.to(cdt))  # (B, Hkv, Nk, F)
    block = block or BLOCK
    outs = []
    off = Nk - Nq  # bottom-right: query i sees keys j <= i + off
    state = None
    if off > 0:  # the first `off` keys are seen by every query: the initial state
        state = torch.matmul(fk[:, :, :off].transpose(-1, -2), _with_ones(vc[:, :, :off]))
    elif off < 0:  # the first -off queries see nothing
        outs.append(qc.new_zeros(B, Hq, -off, v.shape[-1]))
    for r0 in range(max(0, -off), Nq, block):
        r1 = min(Nq, r0 + block)
        fq = phi_q(qc[:, :, r0:r1]).reshape(B, Hkv, G, r1 - r0, -1)  # (B, Hkv, G, R, F)
        c0, c1 = r0 + off, r1 + off  # the keys aligned with these rows
        fk_b = fk[:, :, c0:c1].contiguous()  # (B, Hkv, R, F), one copy for both products
        y, state = _causal(fq, fk_b, _with_ones(vc[:, :, c0:c1]), state, chunk)
        outs.append(_normalise(y).reshape(B, Hq, r1 - r0, -1))  # (B, Hq, R, Dv)
    return torch.cat(outs, dim=2).to(q.dtype)  # (B, Hq, Nq, Dv)


def linear_rows(case, proj):
    """Row function of the same formula as a masked quadratic (no prefix sums), any dtype."""
    phi_q, phi_k = feature_fn(case, proj)
    spec = case.mask_spec

    def fn(qc, k, v, r0, r1):
        B, Hq, R, _ = qc.shape
        Hkv = k.shape[1]
        G = Hq // Hkv
        hi = k.shape[2]
        if spec.kind == "causal":  # keys beyond the last row's limit are not needed
            hi = max(0, min(hi, r1 + case.seq_k - case.seq_q))
        fq = phi_q(qc).reshape(B, Hkv, G, R, -1)  # (B, Hkv, G, R, F)
        # phi_k's key shift is taken over all keys, as in the backend; it cancels anyway
        fk = phi_k(k)[:, :, :hi]  # (B, Hkv, hi, F)
        a = torch.matmul(fq, fk.unsqueeze(2).transpose(-1, -2))  # (B, Hkv, G, R, hi)
        allowed = allowed_rows(spec, r0, r1, case.seq_q, case.seq_k, qc.device)
        if allowed is not None:
            a = a.masked_fill(~allowed[:, :hi], 0.0)
        vv = v[:, :, None, :hi]  # (B, Hkv, 1, hi, Dv)
        num = torch.matmul(a, vv)  # (B, Hkv, G, R, Dv)
        den = a.sum(dim=-1, keepdim=True)
        out = num / torch.where(den > 0, den, torch.ones_like(den))
        return out.reshape(B, Hq, R, v.shape[-1])

    return fn


class Linear(Backend):
    name = "linear"
    description = ("kernelized linear attention phi(Q)(phi(K)^T V) / phi(Q) sum phi(K); "
                   "feature_map elu (elu+1) or favor (FAVOR+ random features)")
    code_modules = ("attnbench.implementations._linear_fused",
                    "attnbench.implementations._linear_features",
                    "attnbench.implementations._linear_grad")
    code_files = _native.sources(_linear_fused.KERNEL)
    native_kernels = (_linear_fused.KERNEL,)  # a run builds these before its first pair
    caps = Capabilities(masks=("none", "causal"))
    params = knobs.LINEAR
    semantics = APPROXIMATE

    def extra_reasons(self, case):
        out = []
        if case.mask_spec.kind == "window":
            out.append("linear attention keeps one running state per query and cannot drop "
                       "keys that leave a window; use sliding_window")
        return out

    def approximation(self, case):
        return f"kernel feature map {case.param('feature_map')!r} instead of exp(q.k)"

    def work_flops(self, case):
        """Matmul FLOPs of the formula as computed: features F = D (elu) or m (favor; plus
        the 2 N D m projections of q and k); non-causal ``phi(K)^T [V,1]`` and
        ``phi(Q) S``: 2 N F (Dv + 1) each; causal adds the masked C x C products inside a
        chunk (2 Nq C (F + Dv + 1)). Backward modes scale as the other backends do."""
        B, H, Nq, Nk = case.batch, case.heads_q, case.seq_q, case.seq_k
        D, Dv = case.head_dim, case.head_dim_v
        feats = case.param("num_features") if case.param("feature_map") == "favor" else D
        fwd = 2.0 * (Nk + Nq) * feats * (Dv + 1)
        if case.param("feature_map") == "favor":
            fwd += 2.0 * (Nq + Nk) * D * feats
        if case.mask_spec.kind == "causal":
            fwd += 2.0 * Nq * min(CHUNK, Nk) * (feats + Dv + 1)
        return B * H * fwd * MODE_FLOP_FACTOR[case.mode]

    def _projection(self, case, device, dtype):
        favor = case.param("feature_map") == "favor"
        return favor_projection(case, device, dtype) if favor else None

    def build(self, case, inputs):
        # float64: the scaled projection is rounded once, to the compute dtype
        proj = self._projection(case, inputs.q.device, torch.float64)
        causal = case.mask_spec.kind == "causal"
        fused = _linear_fused.fused_applies(case, inputs.q.device, inputs.q.dtype,
                                            case.needs_grad)
        proj_f = (None if proj is None or not fused
                  else scaled_projection(proj, case.softmax_scale, torch.float32))  # (m, D)
        panels = _linear_fused.pack_projection(proj_f)
        proj_rows = torch.empty(0) if proj_f is None else proj_f.contiguous()
        half_scale = 0.5 * case.softmax_scale
        fused_grad = fused and _linear_fused.grad_fits(case)

        def linear(q, k, v):
            if fused and _native.records_grad(q, k, v):
                if not fused_grad:  # a forward-only case called under autograd
                    return linear_attention(q, k, v, case, proj, causal)
                return _linear_fused.FusedLinear.apply(q, k, v, causal, panels, proj_rows,
                                                       half_scale)
            if fused:
                return _linear_fused.fused_forward(q, k, v, causal, panels, half_scale)
            return linear_attention(q, k, v, case, proj, causal)

        return linear

    def prepare(self, case, inputs):
        prepared = wrap_mode(self.build(case, inputs), case, inputs)
        how = f"chunked-prefix(C={CHUNK})" if case.mask_spec.kind == "causal" else "global-state"
        feats = (f"favor(m={case.param('num_features')})" if case.param('feature_map') == "favor"
                 else case.param("feature_map"))
        fused = _linear_fused.fused_applies(case, inputs.q.device, inputs.q.dtype,
                                            case.needs_grad)
        label = f"{feats},fused-{how}"
        if case.needs_grad:
            label += ",fused-backward"
        # under autograd too the kernels would run where the backward fits them: say why not
        grad_only = case.needs_grad and not _linear_fused.grad_fits(case)
        prepared.extras["kernel"] = (
            _native.kernel_name(_linear_fused.KERNEL, fused, f"{feats},{how}", inputs.q.device,
                                inputs.q.dtype, grad_only, label)
            if _linear_fused.shape_fits(case) else f"{feats},{how}")
        return prepared

    def impl_reference(self, case, inputs) -> RefResult:
        proj = self._projection(case, "cpu", torch.float64)
        grad_out = inputs.grad_out if case.needs_grad else None
        if case.mask_spec.kind == "none":  # the formula itself, O(N F Dv), in float64
            proj = None if proj is None else proj.to(inputs.q.device)
            q, k, v = (t.detach().to(torch.float64) for t in (inputs.q, inputs.k, inputs.v))
            if grad_out is None:
                return RefResult(linear_attention(q, k, v, case, proj, causal=False))
            q, k, v = (t.requires_grad_(True) for t in (q, k, v))
            with torch.enable_grad():
                out = linear_attention(q, k, v, case, proj, causal=False,
                                       explicit_backward=False)  # autograd: an independent check
                dq, dk, dv = torch.autograd.grad(out, (q, k, v), grad_out.to(torch.float64))
            return RefResult(out.detach(), dq, dk, dv)
        # causal: the masked quadratic form, chunk by chunk over query rows
        return chunked_reference(linear_rows(case, proj.to(inputs.q.device)
                                             if proj is not None else None),
                                 inputs.q, inputs.k, inputs.v, grad_out)


BACKENDS = [Linear()]
