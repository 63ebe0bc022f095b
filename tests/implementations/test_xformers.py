"""xformers backends: availability reasons, bias choice, layouts, and the adapter.

xformers is not installed here (it would pull its own torch), so the adapter is
exercised against a stand-in ``fmha`` module written from xformers' documented API:
``memory_efficient_attention(q, k, v, attn_bias, p, scale, *, op)`` on BMHK / BMGHK
tensors with the bottom-right bias classes. On a machine with xformers, the real
thing is tested by the runner's checked call like every other backend.
"""

from __future__ import annotations

import importlib.util
import math
import types

import pytest
import torch

from attnbench.core.case import Case
from attnbench.core.dtypes import TOLERANCE_GRAD, TOLERANCE_OUT
from attnbench.core.errors import NotSupported
from attnbench.core.masks import MaskSpec, allowed_rows
from attnbench.core.reference import case_reference
from attnbench.core.registry import all_backends, get_backend
from attnbench.implementations import xformers_backend as xb

HAS_XFORMERS = importlib.util.find_spec("xformers") is not None


def test_backends_listed_with_sub_operators():
    names = set(all_backends())
    assert {"xformers", "xformers_cutlass", "xformers_flash", "xformers_triton_splitk"} <= names
    assert get_backend("xformers_triton_splitk").caps.modes == ("fwd",)
    assert "block_sparse" not in get_backend("xformers").caps.masks


@pytest.mark.skipif(HAS_XFORMERS, reason="xformers is installed")
def test_unavailable_with_install_hint():
    for name, b in all_backends().items():
        if name.startswith("xformers"):
            ok, why = b.is_available()
            assert not ok
            assert why == "xformers is not installed (pip install attnbench[xformers])"


@pytest.mark.parametrize("mask", ["none", "causal", "window(0,0)", "window(3,0)", "window(2,5)",
                                  "window(inf,2)", "window(4,inf)", "window(inf,inf)"])
@pytest.mark.parametrize("nq,nk", [(8, 8), (5, 12), (12, 5)])
def test_bias_choice_matches_the_mask(mask, nq, nk):
    spec = MaskSpec.parse(mask)
    bias = xb.bias_spec(spec, nq, nk)
    got = xb.bias_allowed(bias, nq, nk)
    want = allowed_rows(spec, 0, nq, nq, nk)
    if got is None:  # no bias: the mask must let everything through
        assert want is None or bool(want.all())
    else:
        assert got is not None and torch.equal(got, want)
    if mask == "causal":
        assert bias[0] == "LowerTriangularFromBottomRightMask"
    if mask == "window(3,0)":
        assert bias == ("LowerTriangularFromBottomRightLocalAttentionMask", (4,))
    if mask == "window(2,5)":
        assert bias == ("LocalAttentionFromBottomRightMask", (2, 5))


def test_layout_round_trips():
    q = torch.randn(2, 6, 5, 4)  # (B, Hq, N, D)
    k = torch.randn(2, 3, 7, 4)  # (B, Hkv, N, D)
    assert xb.q_to_xformers(q, 1).shape == (2, 5, 6, 4)
    x = xb.q_to_xformers(q, 2)
    assert x.shape == (2, 5, 3, 2, 4)  # BMGHK: query head h -> (h // 2, h % 2)
    assert torch.equal(x[:, :, 1, 0], q[:, 2].unsqueeze(1).squeeze(1))
    assert torch.equal(xb.q_from_xformers(x.contiguous()), q)
    kn = xb.kv_to_xformers(k, 2)
    assert kn.shape == (2, 7, 3, 1, 4)
    e = xb.kv_expand(kn, 2)
    assert e.shape == (2, 7, 3, 2, 4) and e.stride(3) == 0
    assert torch.equal(e[:, :, 1, 1], k[:, 1])  # kv head 1 serves query heads 2 and 3
    assert torch.equal(xb.kv_from_xformers(kn.contiguous()), k)
    assert torch.equal(xb.kv_from_xformers(xb.kv_to_xformers(k, 1)), k)


def test_condense_xformers_message():
    text = """No operator found for `memory_efficient_attention_forward` with inputs:
     query       : shape=(1, 40, 2, 16) (torch.float32)
     key         : shape=(1, 40, 2, 16) (torch.float32)
     value       : shape=(1, 40, 2, 16) (torch.float32)
     attn_bias   : <class 'NoneType'>
     p           : 0.0
`fa2F@2.5.7-pt` is not supported because:
    device=cpu (supported: {'cuda'})
    dtype=torch.float32 (supported: {torch.bfloat16, torch.float16})
`cutlassF-pt` is not supported because:
    device=cpu (supported: {'cuda'})"""
    line = xb.condense_xformers_message(text)
    assert "\n" not in line and "shape=" not in line
    assert line == ("no xformers operator for memory_efficient_attention_forward: "
                    "fa2F@2.5.7-pt: device=cpu (supported: {'cuda'}), dtype=torch.float32 "
                    "(supported: {torch.bfloat16, torch.float16}); "
                    "cutlassF-pt: device=cpu (supported: {'cuda'})")


# ---- the adapter, against a stand-in for xformers.ops.fmha -----------------------------
def _fake_fmha(refuse: str | None = None):
    """A pure-torch ``fmha`` following xformers' documented semantics."""

    class Bias:
        def __init__(self, *args):
            self.args = args

    biases = types.SimpleNamespace(**{
        n: type(n, (Bias,), {}) for n in ("LowerTriangularFromBottomRightMask",
                                          "LowerTriangularFromBottomRightLocalAttentionMask",
                                          "LocalAttentionFromBottomRightMask")})
    calls = []

    def memory_efficient_attention(query, key, value, attn_bias=None, p=0.0, scale=None, *,
                                   op=None):
        calls.append((query.shape, key.shape, key.stride(), op))
        if refuse:
            raise NotImplementedError(refuse)
        assert query.dim() in (4, 5) and key.shape[:-1] == value.shape[:-1]
        five = query.dim() == 5
        q, k, v = (t if five else t.unsqueeze(3) for t in (query, key, value))  # BMGHK
        B, Mq, G, H, K = q.shape
        Mkv = k.shape[1]
        s = torch.einsum("bqghd,bsghd->bghqs", q, k) * (scale or K ** -0.5)
        if attn_bias is not None:
            spec = (type(attn_bias).__name__, attn_bias.args)
            s = s.masked_fill(~xb.bias_allowed(spec, Mq, Mkv), -math.inf)
        pr = torch.softmax(s, dim=-1).nan_to_num(0.0)
        out = torch.einsum("bghqs,bsghv->bqghv", pr, v)
        return out if five else out.squeeze(3)

    fmha = types.SimpleNamespace(__name__="fake_fmha", attn_bias=biases,
                                 memory_efficient_attention=memory_efficient_attention,
                                 memory_efficient_attention_forward=memory_efficient_attention)
    return fmha, calls


ADAPTER_CASES = [
    Case(batch=2, heads_q=4, heads_kv=2, seq_q=12, seq_k=20, head_dim=8, head_dim_v=8,
         mask="causal"),
    Case(batch=1, heads_q=2, heads_kv=2, seq_q=20, seq_k=12, head_dim=8, head_dim_v=4,
         mask="window(3,0)"),
    Case(batch=1, heads_q=3, heads_kv=1, seq_q=16, seq_k=16, head_dim=8, head_dim_v=8,
         mask="window(2,3)"),
]


@pytest.mark.parametrize("mode", ["fwd", "bwd", "fwd_bwd"])
@pytest.mark.parametrize("case", ADAPTER_CASES, ids=lambda c: c.mask)
def test_adapter_against_reference(monkeypatch, case, mode):
    fmha, calls = _fake_fmha()
    monkeypatch.setattr(xb, "_import_fmha", lambda: (fmha, ""))
    case = case.replace(mode=mode)
    inputs = case.make_inputs()
    backend = xb.Xformers()
    prepared = backend.prepare(case, inputs)
    calls.clear()
    outs = prepared.outputs(prepared.fn())
    ref = case_reference(case, inputs).as_dict()
    for name, r in ref.items():
        got = outs[name].double()
        assert got.shape == r.shape, name
        tol = TOLERANCE_OUT[case.dtype] if name == "out" else TOLERANCE_GRAD[case.dtype]
        assert float((got - r).norm() / r.norm()) < tol, name
    if mode != "bwd":  # the timed call gets native-layout tensors, K/V expanded for GQA
        (qshape, kshape, kstride, _), = calls
        if case.group_size > 1:
            assert len(qshape) == 5 and kstride[3] == 0
        else:
            assert qshape == (case.batch, case.seq_q, case.heads_q, case.head_dim)
    # the API path (build) takes and returns (B, H, N, D)
    with torch.no_grad():
        out = backend.build(case, inputs)(inputs.q, inputs.k, inputs.v)
    assert torch.allclose(out.double(), ref["out"], atol=1e-5)


def test_no_operator_becomes_unsupported(monkeypatch):
    msg = ("No operator found for `memory_efficient_attention_forward` with inputs:\n"
           "     query       : shape=(1, 8, 2, 8) (torch.float32)\n"
           "`cutlassF-pt` is not supported because:\n    device=cpu (supported: {'cuda'})")
    fmha, _ = _fake_fmha(refuse=msg)
    monkeypatch.setattr(xb, "_import_fmha", lambda: (fmha, ""))
    case = Case(heads_q=2, heads_kv=2, seq_q=8, seq_k=8, head_dim=8, head_dim_v=8)
    with pytest.raises(NotSupported) as info:
        xb.Xformers().prepare(case, case.make_inputs())
    assert info.value.reasons == [
        "no xformers operator for memory_efficient_attention_forward: "
        "cutlassF-pt: device=cpu (supported: {'cuda'})"]


def test_pinned_operator_uses_its_reasons(monkeypatch):
    fmha, calls = _fake_fmha()

    class FwOp:
        NAME = "cutlassF-fake"

        @staticmethod
        def not_supported_reasons(inp):
            return [f"device={inp.query.device.type} (supported: {{'cuda'}})"]

    class Inputs:
        def __init__(self, **kw):
            self.__dict__.update(kw)

    fmha.Inputs = Inputs
    monkeypatch.setattr(xb, "_import_fmha", lambda: (fmha, ""))
    monkeypatch.setattr(xb.Xformers, "_ops", lambda self, f: (FwOp, None))
    case = Case(heads_q=2, heads_kv=2, seq_q=8, seq_k=8, head_dim=8, head_dim_v=8)
    with pytest.raises(NotSupported) as info:
        xb.Xformers("triton_splitk").prepare(case, case.make_inputs())
    assert info.value.reasons == ["xformers: cutlassF-fake: device=cpu (supported: {'cuda'})"]
    assert not calls
