"""xformers over packed variable-length batches: the glue (the documents' lengths, the
(1, B*N, H, D) layout, GQA's BMGHK expansion, the way back to (B, H, N, D)) against a fake
``xformers`` package put in ``sys.modules``. The fake records every call and computes the
answer in float64, document by document, from the lengths its bias was built with, so a
token put in the wrong place or a wrong length shows in the numbers.

On a machine without xformers (or without a GPU) the backend says so; the real kernels run
only in the GPU suite.
"""

from __future__ import annotations

import importlib.machinery
import math
import sys
import types

import pytest
import torch

from attnbench.core import lengths
from attnbench.core.case import Case
from attnbench.core.reference import case_reference
from attnbench.implementations import xformers_backend as xb


def fake_xformers(monkeypatch):
    """Install ``xformers``, ``xformers.ops`` and ``xformers.ops.fmha`` (with ``attn_bias``)
    in sys.modules; returns the list every memory_efficient_attention call is appended to."""
    calls = []

    class BlockDiagonalMask:
        causal = False

        def __init__(self, seqlens):
            self.seqlens = list(seqlens)

        @classmethod
        def from_seqlens(cls, q_seqlen, kv_seqlen=None):
            assert kv_seqlen is None, "self-attention: one list of lengths"
            return cls(q_seqlen)

    class BlockDiagonalCausalMask(BlockDiagonalMask):
        causal = True

    def memory_efficient_attention(query, key, value, attn_bias=None, p=0.0, scale=None, *,
                                   op=None):
        calls.append({"q": tuple(query.shape), "k": tuple(key.shape), "k_stride": key.stride(),
                      "bias": attn_bias, "scale": scale, "dtype": query.dtype})
        assert query.shape[0] == 1, "a block-diagonal bias takes batch 1"
        five = query.dim() == 5
        q, k, v = (t if five else t.unsqueeze(3) for t in (query, key, value))  # BMGHK
        _, T, Hkv, G, D = q.shape
        assert sum(attn_bias.seqlens) == T == k.shape[1]
        scale = D ** -0.5 if scale is None else scale
        q, k, v = (t[0].double() for t in (q, k, v))  # (T, Hkv, G, D)
        outs, start = [], 0
        for n in attn_bias.seqlens:
            s = torch.einsum("qghd,sghd->ghqs", q[start:start + n], k[start:start + n]) * scale
            if attn_bias.causal:
                s = s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), -math.inf)
            outs.append(torch.einsum("ghqs,sghv->qghv", torch.softmax(s, -1),
                                     v[start:start + n]))
            start += n
        out = torch.cat(outs).unsqueeze(0).to(query.dtype)  # (1, T, Hkv, G, Dv)
        return out if five else out.squeeze(3)

    def module(name, **attrs):
        m = types.ModuleType(name)
        m.__spec__ = importlib.machinery.ModuleSpec(name, None)
        m.__dict__.update(attrs)
        monkeypatch.setitem(sys.modules, name, m)
        return m

    bias = module("xformers.ops.fmha.attn_bias", BlockDiagonalMask=BlockDiagonalMask,
                  BlockDiagonalCausalMask=BlockDiagonalCausalMask)
    fmha = module("xformers.ops.fmha", attn_bias=bias,
                  memory_efficient_attention=memory_efficient_attention,
                  memory_efficient_attention_forward=memory_efficient_attention)
    ops = module("xformers.ops", fmha=fmha)
    module("xformers", ops=ops)
    return calls


def packed_case(mask, mode, hq=4, hkv=2, spec="uniform(1,20)", **kw):
    return Case(batch=2, heads_q=hq, heads_kv=hkv, seq_q=32, seq_k=32, head_dim=8,
                head_dim_v=4, mask=mask, mode=mode, lengths=spec, seed=5, **kw)


@pytest.mark.parametrize("mode", ["fwd", "bwd", "fwd_bwd"])
@pytest.mark.parametrize("mask,hq,hkv", [("none", 4, 2), ("causal", 4, 2), ("causal", 2, 2)])
def test_packed_batch_through_a_fake_xformers(monkeypatch, mask, hq, hkv, mode):
    calls = fake_xformers(monkeypatch)
    case = packed_case(mask, mode, hq, hkv)
    backend = xb.Xformers()
    assert backend.is_available() == (True, "")
    x = case.make_inputs()
    prepared = backend.prepare(case, x)
    calls.clear()
    got = prepared.outputs(prepared.fn())
    ref = case_reference(case, x).as_dict()
    assert set(got) == set(ref)
    for name, r in ref.items():
        assert got[name].shape == r.shape, name
        assert float((got[name].double() - r).norm() / r.norm()) < 1e-5, name
    rows = lengths.draw(case.lengths, case.batch, case.seq_q, case.seed)
    assert prepared.extras["lengths_count"] == sum(map(len, rows))
    if mode == "bwd":  # the forward ran in prepare; the timed call is the backward alone
        assert not calls
        return
    (call,) = calls
    T, group = case.batch * case.seq_q, case.group_size
    assert call["bias"].seqlens == [n for row in rows for n in row]
    assert type(call["bias"]).__name__ == ("BlockDiagonalCausalMask" if mask == "causal"
                                          else "BlockDiagonalMask")
    if group > 1:  # BMGHK, K/V expanded along the group without a copy
        assert call["q"] == (1, T, hkv, group, case.head_dim)
        assert call["k"] == (1, T, hkv, group, case.head_dim) and call["k_stride"][3] == 0
    else:
        assert call["q"] == (1, T, hq, case.head_dim)
    assert call["scale"] is None  # the case's default: xformers' own 1/sqrt(D)


def test_build_takes_and_returns_the_case_layout(monkeypatch):
    calls = fake_xformers(monkeypatch)
    case = packed_case("causal", "fwd", spec="fixed(7)", scale=0.25)
    x = case.make_inputs()
    with torch.no_grad():
        out = xb.Xformers().build(case, x)(x.q, x.k, x.v)  # (B, Hq, N, Dv)
    ref = case_reference(case, x).out
    assert out.shape == ref.shape
    assert float((out.double() - ref).abs().max()) < 1e-5
    assert calls[-1]["scale"] == 0.25
    assert calls[-1]["bias"].seqlens == [7, 7, 7, 7, 4] * 2


def test_packed_layout_round_trips():
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 6, 5, 3, generator=g)  # (B, Hq, N, D)
    k = torch.randn(2, 3, 5, 3, generator=g)  # (B, Hkv, N, D)
    pq, pk = xb.packed_q(q, 2), xb.packed_kv(k, 2)
    assert pq.shape == (1, 10, 3, 2, 3) and pk.shape == (1, 10, 3, 1, 3)
    assert torch.equal(pq[0, 5 + 1, 2, 1], q[1, 2 * 2 + 1, 1])  # token (b=1, n=1), head 5
    assert torch.equal(xb.from_packed(pq, 2), q) and torch.equal(xb.from_packed(pk, 2), k)
    assert xb.packed_q(q, 1).shape == (1, 10, 6, 3)
    assert xb.varlen_bias_spec(((3, 2), (5,)), True) == ("BlockDiagonalCausalMask", [3, 2, 5])


def test_without_xformers_or_a_gpu_the_reason_is_said(monkeypatch):
    backend = xb.Xformers()
    case = packed_case("causal", "fwd").replace(device="cpu")
    reasons = backend.not_supported_reasons(case)
    assert reasons == ["device cpu not supported (supports cuda)"]  # not "not implemented"
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "xformers" else real(name, *a))
    assert backend.is_available() == (False, xb.INSTALL_HINT)
