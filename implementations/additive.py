"""additive: Bahdanau attention, ``e_ij = w^T tanh(W_q q_i + W_k k_j)``, softmax over j.

Not softmax dot-product attention but another score function (semantics DIFFERENT):
its ``err_impl`` is measured against the float64 additive reference with the same
parameters, and ``err_vs_softmax`` is left empty.

Parameters ``W_q, W_k`` of shape (D, d_a) and ``w`` of shape (d_a,) are made from the
case seed (Xavier-normal scale) by :func:`additive_parameters`, shared by ``build`` and
``impl_reference``; they are set up outside the timed closure and receive no gradient.
The softmax scale of the case does not enter (additive scores carry no scale).

The projections ``W_q q`` and ``W_k k`` are done once. The cost is the
(B, H, Nq, Nk, d_a) tensor ``tanh(qp_i + kp_j)``, so the forward and the backward walk
over query chunks whose (B, H, rows, keys, d_a) slice stays within
``case.param("memory_budget_mb")`` (:func:`chunk_plan`). A custom autograd function recomputes
the chunk in the backward and turns it in place into its gradient, so the backward
holds one such slice too. Causal and window masks (bottom-right aligned) also narrow
each chunk to the key range its rows can see. Rows that see no key produce zeros.
The slice is evaluated as ``tanh(x) = 2 sigmoid(2x) - 1`` (the same function; PyTorch's
CPU sigmoid is several times faster than its tanh), in the input dtype; scores,
softmax and the products with V are in fp32 for fp16/bf16 inputs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from attnbench.core import knobs
from attnbench.core.backend import DIFFERENT, Backend, Capabilities, wrap_mode
from attnbench.core.case import MODE_FLOP_FACTOR
from attnbench.core.dtypes import element_size
from attnbench.core.masks import INF, Geometry, allowed_rows, band_row_counts
from attnbench.core.reference import chunk_rows, chunked_reference, masked_softmax

# Bytes per (row, key) pair besides the d_a-wide slice: scores, probabilities and
# their gradients in the compute dtype (fp32, or fp64 for fp64 inputs), plus the mask.
_PAIR_OVERHEAD_ELEMS = 4
# Cap on the (rows, keys, d_a) slice: larger chunks are no faster per element (the slice
# is written, passed through sigmoid and read back), while far smaller ones multiply the
# per-op overhead, which on a busy 2-core CPU (threads waiting on each other) dominates.
CACHE_TARGET_BYTES = 32 * 2**20
_SEED_SALT = 0xADD17E  # parameters come from another stream than the inputs


@dataclass(frozen=True)
class AdditiveParams:
    w_q: torch.Tensor  # (D, d_a)
    w_k: torch.Tensor  # (D, d_a)
    w: torch.Tensor  # (d_a,)


def hidden(case) -> int:
    """d_a, the width of the tanh terms: ``additive_dim``, or head_dim when it is 0."""
    return case.param("additive_dim") or case.head_dim


def additive_parameters(case, device=None, dtype=torch.float64) -> AdditiveParams:
    """W_q, W_k (D, d_a) and w (d_a,), Xavier-normal, deterministic in ``case.seed``.

    Drawn in float64 on the CPU and then converted, so every device and dtype gets the
    same values (up to rounding) and the float64 reference uses exactly the drawn ones.
    """
    D, da = case.head_dim, hidden(case)
    gen = torch.Generator().manual_seed(case.seed * 1_000_003 + _SEED_SALT)
    std_w = math.sqrt(2.0 / (D + da))
    std_v = math.sqrt(2.0 / (da + 1))
    w_q = torch.randn(D, da, generator=gen, dtype=torch.float64) * std_w
    w_k = torch.randn(D, da, generator=gen, dtype=torch.float64) * std_w
    w = torch.randn(da, generator=gen, dtype=torch.float64) * std_v
    return AdditiveParams(*(t.to(device=device or "cpu", dtype=dtype) for t in (w_q, w_k, w)))


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def key_range(spec, r0: int, r1: int, seq_q: int, seq_k: int) -> tuple[int, int]:
    """Keys [c0, c1) that query rows [r0, r1) may see, as the mask's kind declares them
    (a band narrows them; other kinds see all keys)."""
    return spec.declaration.columns(spec, Geometry(seq_q, seq_k), r0, r1)


@dataclass(frozen=True)
class ChunkPlan:
    rows: int  # query rows per chunk
    slice_numel: int  # elements of the largest (B, H, rows, keys, d_a) slice of a chunk
    chunk_bytes: int  # largest working set of a chunk: its slice plus per-pair temporaries
    chunks: tuple[tuple[int, int, int, int], ...]  # (r0, r1, c0, c1): rows and keys


def _rows_within(pairs: int, seq_k: int, width: int | None) -> int:
    """Largest R with R * min(seq_k, R + width) <= pairs (width None: unbounded band)."""
    rows = pairs // max(1, seq_k)
    if width is not None:
        rows = max(rows, int((-width + math.sqrt(width * width + 4 * pairs)) // 2))
    return rows


def chunk_plan(case, cache_cap: bool = True) -> ChunkPlan:
    """Query chunks whose working set fits ``case.param("memory_budget_mb")`` (``_chunk_plan``)."""
    return _chunk_plan(*_geometry(case), cache_cap)


def one_row_bytes(case) -> int:
    """``chunk_plan(case).chunk_bytes`` where a chunk is one row (else 0), without listing
    the chunks: the row that sees the most keys (a plan asks this of every case)."""
    rows, per_pair = _rows(*_geometry(case), True)
    if rows > 1:
        return 0
    spec = case.mask_spec
    keys = case.seq_k if not spec.is_banded else int(
        band_row_counts(case.seq_q, case.seq_k, spec.left, spec.right).max())
    return keys * per_pair


def _geometry(case) -> tuple:
    return (case.param("memory_budget_mb"), case.dtype, case.batch * case.heads_q, hidden(case),
            case.seq_q, case.seq_k, case.mask_spec)


def _rows(memory_budget_mb: int, dtype: str, bh: int, additive_hidden: int, Nq: int, Nk: int,
          spec, cache_cap: bool) -> tuple[int, int]:
    """(query rows per chunk, bytes per visible pair)."""
    budget = memory_budget_mb * 2**20
    elem = element_size(dtype)
    celem = 8 if dtype == "float64" else 4
    per_pair = bh * (additive_hidden * elem + _PAIR_OVERHEAD_ELEMS * celem)
    width = None
    if spec.is_banded and spec.left != INF and spec.right != INF:
        width = int(spec.left) + int(spec.right)
    rows = _rows_within(budget // per_pair, Nk, width)
    if cache_cap:
        target = CACHE_TARGET_BYTES // (bh * additive_hidden * elem)
        rows = min(rows, max(1, _rows_within(target, Nk, width)))
    return max(1, min(Nq, rows)), per_pair


def _chunk_plan(memory_budget_mb: int, dtype: str, bh: int, additive_hidden: int, Nq: int,
                Nk: int, spec, cache_cap: bool) -> ChunkPlan:
    """Query chunks whose working set fits ``memory_budget_mb``.

    A chunk of R rows seeing C keys holds the (B, Hq, R, C, d_a) slice in the input dtype
    plus about 4 per-pair temporaries (scores, probabilities, their gradients) in the
    compute dtype: B*Hq*R*C*(d_a*elem + 4*celem) bytes. C = seq_k without a mask; under
    a band of finite width W (left + right), C <= R + W, which allows taller chunks.
    ``cache_cap`` keeps the slice near CACHE_TARGET_BYTES (a few MiB), which is faster.
    """
    rows, per_pair = _rows(memory_budget_mb, dtype, bh, additive_hidden, Nq, Nk, spec,
                           cache_cap)
    chunks, most_pairs = [], 0
    for r0 in range(0, Nq, rows):
        r1 = min(Nq, r0 + rows)
        c0, c1 = key_range(spec, r0, r1, Nq, Nk)
        chunks.append((r0, r1, c0, c1))
        most_pairs = max(most_pairs, (r1 - r0) * max(0, c1 - c0))
    return ChunkPlan(rows, most_pairs * bh * additive_hidden, most_pairs * per_pair,
                     tuple(chunks))


class _Additive(torch.autograd.Function):
    """out = softmax_j(w^T tanh(qp_i + kp_j)) @ V, chunk by chunk, recomputing in backward.

    Takes the doubled projections u_q = 2 W_q q, u_k = 2 W_k k and evaluates
    ``tanh(x) = 2 sigmoid(2x) - 1``, i.e. e = (2w)^T sigmoid(u_q + u_k) - sum(w): the same
    function, and sigmoid is several times cheaper than tanh in PyTorch's CPU kernels.
    One buffer holds the (B, Hkv, G, rows, keys, d_a) slice for every chunk.
    """

    @staticmethod
    def forward(ctx, uq, uk, v, w2, w_sum, case, plan):
        # uq (B, Hkv, G, Nq, da); uk (B, Hkv, Nk, da); v (B, Hkv, Nk, Dv) in compute dtype
        B, Hkv, G, Nq, _ = uq.shape
        out = v.new_zeros(B, Hkv, G, Nq, v.shape[-1])  # (B, Hkv, G, Nq, Dv)
        buf = uq.new_empty(plan.slice_numel)
        for r0, r1, c0, c1 in plan.chunks:
            if c1 <= c0:
                continue  # these rows see no key: zeros
            p, _ = _chunk_probs(uq, uk, w2, w_sum, case, r0, r1, c0, c1, buf)
            R = r1 - r0
            o = torch.matmul(p.reshape(B, Hkv, G * R, c1 - c0), v[:, :, c0:c1])
            out[:, :, :, r0:r1] = o.reshape(B, Hkv, G, R, -1)  # (B, Hkv, G, R, Dv)
        del buf
        ctx.save_for_backward(uq, uk, v, w2, w_sum, out)
        ctx.case, ctx.plan = case, plan
        return out

    @staticmethod
    def backward(ctx, grad_out):
        uq, uk, v, w2, w_sum, out = ctx.saved_tensors
        case, plan = ctx.case, ctx.plan
        B, Hkv, G, Nq, da = uq.shape
        go = grad_out.to(v.dtype)  # (B, Hkv, G, Nq, Dv)
        duq = torch.zeros_like(uq)
        duk = torch.zeros_like(uk)
        dv = torch.zeros_like(v)
        buf = uq.new_empty(plan.slice_numel)
        for r0, r1, c0, c1 in plan.chunks:
            if c1 <= c0:
                continue
            R, C = r1 - r0, c1 - c0
            p, s = _chunk_probs(uq, uk, w2, w_sum, case, r0, r1, c0, c1, buf)
            p = p.reshape(B, Hkv, G * R, C)  # (B, Hkv, G*R, C)
            go_c = go[:, :, :, r0:r1].reshape(B, Hkv, G * R, -1)  # (B, Hkv, G*R, Dv)
            o_c = out[:, :, :, r0:r1].reshape(B, Hkv, G * R, -1)
            v_c = v[:, :, c0:c1]  # (B, Hkv, C, Dv)
            dv[:, :, c0:c1] += torch.matmul(p.transpose(-1, -2), go_c)  # (B, Hkv, C, Dv)
            dp = torch.matmul(go_c, v_c.transpose(-1, -2))  # (B, Hkv, G*R, C)
            delta = (go_c * o_c).sum(dim=-1, keepdim=True)  # (B, Hkv, G*R, 1)
            de = dp.sub_(delta).mul_(p)  # softmax backward; masked pairs have p = 0
            # de/du = de * 2w * s (1 - s), turned in place from s: (B, Hkv, G, R, C, da)
            s.addcmul_(s, s, value=-1)  # s - s^2
            s.mul_(de.reshape(B, Hkv, G, R, C, 1).to(s.dtype))
            duq[:, :, :, r0:r1] = s.sum(dim=4) * w2  # (B, Hkv, G, R, da)
            duk[:, :, c0:c1] += s.sum(dim=(2, 3)) * w2  # (B, Hkv, C, da)
        return duq, duk, dv, None, None, None, None


def _chunk_probs(uq, uk, w2, w_sum, case, r0, r1, c0, c1, buf):
    """Probabilities (B, Hkv, G, R, C) of rows [r0, r1) over keys [c0, c1), and the sigmoid
    slice (B, Hkv, G, R, C, da), a view of ``buf``."""
    B, Hkv, G, _, da = uq.shape
    R, C = r1 - r0, c1 - c0
    s = buf[: B * Hkv * G * R * C * da].view(B, Hkv, G, R, C, da)
    torch.add(uq[:, :, :, r0:r1].unsqueeze(-2), uk[:, :, None, None, c0:c1], out=s)
    s.sigmoid_()
    e = torch.matmul(s, w2).to(w_sum.dtype).sub_(w_sum)  # (B, Hkv, G, R, C) = w^T tanh(.)
    spec = case.mask_spec
    if spec.kind != "none":
        allowed = allowed_rows(spec, r0, r1, case.seq_q, case.seq_k, uq.device, case.block_layout,
                               case.param("block_size"))[:, c0:c1]  # (R, C)
        e.masked_fill_(~allowed, -math.inf)
    m = e.amax(dim=-1, keepdim=True)  # (B, Hkv, G, R, 1)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    p = e.sub_(m).exp_()  # masked pairs: exp(-inf) = 0
    den = p.sum(dim=-1, keepdim=True)
    p.div_(torch.where(den > 0, den, torch.ones_like(den)))  # rows that see nothing: zeros
    return p, s


def additive_rows(case, params: AdditiveParams):
    """Row function of additive attention for :func:`chunked_reference` (any dtype)."""
    spec = case.mask_spec

    def fn(qc, k, v, r0, r1):
        B, Hq, R, _ = qc.shape
        Hkv = k.shape[1]
        G = Hq // Hkv
        qp = torch.matmul(qc, params.w_q).reshape(B, Hkv, G, R, -1)  # (B, Hkv, G, R, da)
        kp = torch.matmul(k, params.w_k)  # (B, Hkv, Nk, da)
        t = torch.tanh(qp.unsqueeze(-2) + kp[:, :, None, None])  # (B, Hkv, G, R, Nk, da)
        e = torch.matmul(t, params.w)  # (B, Hkv, G, R, Nk)
        allowed = allowed_rows(spec, r0, r1, case.seq_q, case.seq_k, qc.device,
                               case.block_layout, case.param("block_size"))
        p = masked_softmax(e, allowed)  # (B, Hkv, G, R, Nk)
        o = torch.matmul(p, v.unsqueeze(2))  # (B, Hkv, G, R, Dv)
        return o.reshape(B, Hq, R, v.shape[-1])

    return fn


class Additive(Backend):
    name = "additive"
    description = ("Bahdanau additive attention w^T tanh(W_q q + W_k k), seeded parameters, "
                   "query-chunked under memory_budget_mb")
    caps = Capabilities(masks=("none", "causal", "window", "block_sparse"))
    params = knobs.ADDITIVE
    semantics = DIFFERENT

    def extra_reasons(self, case):
        if self.param_reasons(case):  # refused by its declared parameters already
            return []
        need = one_row_bytes(case)
        if need > case.param("memory_budget_mb") * 2**20:
            return [f"one query row needs {need / 2**20:.1f} MiB of tanh terms, more than "
                    f"memory_budget_mb={case.param('memory_budget_mb')}"]
        return []

    def work_flops(self, case):
        """Per visible pair: d_a adds (qp_i + kp_j), d_a tanh, d_a multiply-adds with w
        (counted 4 d_a), plus 2 Dv for P V; the projections 2 (Nq + Nk) D d_a once."""
        da = hidden(case)
        pairs = case.visible_pairs
        fwd = pairs * (4.0 * da + 2.0 * case.head_dim_v) + \
            2.0 * (case.seq_q + case.seq_k) * case.head_dim * da
        return case.batch * case.heads_q * fwd * MODE_FLOP_FACTOR[case.mode]

    def build(self, case, inputs):
        dev = inputs.q.device
        cdt = _compute_dtype(case.torch_dtype)
        params = additive_parameters(case, dev, case.torch_dtype)
        plan = chunk_plan(case)
        B, Hq, Hkv, G = case.batch, case.heads_q, case.heads_kv, case.group_size

        w_q2, w_k2, w2 = 2 * params.w_q, 2 * params.w_k, 2 * params.w  # tanh(x) = 2sig(2x) - 1
        w_sum = params.w.to(cdt).sum()

        def additive(q, k, v):
            # (B, Hq, Nq, D) @ (D, da): projections in the input dtype
            uq = torch.matmul(q, w_q2).reshape(B, Hkv, G, q.shape[2], -1)  # (B, Hkv, G, Nq, da)
            uk = torch.matmul(k, w_k2)  # (B, Hkv, Nk, da)
            out = _Additive.apply(uq, uk, v.to(cdt), w2, w_sum, case, plan)  # (B,Hkv,G,Nq,Dv)
            return out.reshape(B, Hq, q.shape[2], v.shape[-1]).to(q.dtype)

        additive.plan = plan
        return additive

    def prepare(self, case, inputs):
        f = self.build(case, inputs)
        prepared = wrap_mode(f, case, inputs)
        prepared.extras["kernel"] = f"chunked(rows={f.plan.rows},chunks={len(f.plan.chunks)})"
        return prepared

    def impl_reference(self, case, inputs):
        params = additive_parameters(case, inputs.q.device)  # float64, the draw build uses
        rows = chunk_rows(case.batch, case.heads_q, case.seq_k, width=hidden(case) + 2)
        grad_out = inputs.grad_out if case.needs_grad else None
        return chunked_reference(additive_rows(case, params), inputs.q, inputs.k, inputs.v,
                                 grad_out, rows_per_chunk=rows)


BACKENDS = [Additive()]
