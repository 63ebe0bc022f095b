"""Longformer and Sparse Transformer strided layouts: their geometry (at block size 1 the
papers' token patterns), and block_sparse, flex (eager, see host_neutral.py) and naive all
computing the same masked attention as the float64 reference on odd shapes."""

from __future__ import annotations

import math

import pytest
import torch
from host_neutral import EagerFlex

from attnbench.core import block_layouts
from attnbench.core.case import Case
from attnbench.core.dtypes import TOLERANCE_GRAD, TOLERANCE_OUT
from attnbench.core.masks import allowed_rows
from attnbench.core.reference import case_reference
from attnbench.implementations.block_sparse import BlockSparse, block_plan
from attnbench.implementations.naive import Naive


def token_longformer(nq, nk, w, g):
    """Beltagy et al.: query i sees keys within w of its (bottom-right aligned) diagonal;
    the first g tokens see every key and every query sees them. Plain loops."""
    off = nk - nq
    return torch.tensor([[abs(j - (i + off)) <= w or i < g or j < g for j in range(nk)]
                         for i in range(nq)])


def token_strided(nq, nk, stride):
    """Child et al. 2019, strided: i sees j <= i with i - j <= l or (i - j) mod l == 0."""
    off = nk - nq
    return torch.tensor([[0 <= i + off - j and (i + off - j <= stride
                                                 or (i + off - j) % stride == 0)
                          for j in range(nk)] for i in range(nq)])


@pytest.mark.parametrize("nq,nk", [(23, 23), (9, 31), (31, 9)])
def test_block_size_one_gives_the_papers_token_patterns(nq, nk):
    for w, g in ((0, 0), (2, 1), (3, 4)):
        got = block_layouts.make_layout("longformer", nq, nk, 1, band=w, global_blocks=g)
        assert torch.equal(got, token_longformer(nq, nk, w, g)), (w, g)
    for stride in (1, 3, 5):
        got = block_layouts.make_layout("strided", nq, nk, 1, stride=stride)
        assert torch.equal(got, token_strided(nq, nk, stride)), stride


def test_longformer_is_bigbird_without_random_blocks():
    for nq, nk in ((200, 200), (90, 300)):
        kw = dict(band=2, global_blocks=2, seed=4)
        assert torch.equal(block_layouts.make_layout("longformer", nq, nk, 16, **kw),
                           block_layouts.make_layout("bigbird", nq, nk, 16, random_blocks=0,
                                                     **kw))


def test_strided_default_stride_is_sqrt_n_and_work_is_n_sqrt_n():
    for nkb in (16, 64, 256):
        layout = block_layouts.make_layout("strided", nkb * 8, nkb * 8, 8)
        stride = block_layouts.default_stride(nkb)
        assert stride == round(math.sqrt(nkb))
        assert not bool(layout.triu(1).any())  # never a later block
        assert bool(layout.diagonal().all())
        per_row = layout.sum(dim=1)
        assert int(per_row.max()) <= stride + 1 + math.ceil(nkb / stride)
        # about 2 sqrt(n) blocks a row on average: O(N sqrt N) tiles in all
        assert 1.0 * math.sqrt(nkb) <= float(per_row.float().mean()) <= 2.5 * math.sqrt(nkb)


def test_global_query_blocks_do_not_pad_the_window_rows():
    case = Case(seq_q=4096, seq_k=4096, mask="block_sparse(longformer)", block_size=64,
                block_band=2)
    plan = block_plan(case.block_layout, 4096, 4096, 64, torch.float32, "cpu")
    assert plan.computed_blocks() < 1.3 * int(case.block_layout.sum()) < 64 * 64 / 4


MASKS = ["block_sparse(longformer)", "block_sparse(strided)"]
# (batch, heads_q, heads_kv, seq_q, seq_k, head_dim, head_dim_v, knobs): ragged lengths,
# GQA, Nq != Nk both ways, d = 40, a stride and globals other than the defaults
SHAPES = [
    pytest.param(2, 2, 2, 70, 70, 40, 40, {}, id="ragged-d40"),
    pytest.param(1, 6, 2, 83, 83, 40, 24, {"block_band": 2, "block_global": 2}, id="gqa"),
    pytest.param(1, 4, 1, 45, 130, 40, 40, {"block_stride": 3}, id="short-q"),
    pytest.param(1, 2, 2, 130, 45, 16, 16, {}, id="long-q"),
]


def make_case(mask, shape, mode):
    b, hq, hkv, nq, nk, d, dv, knobs = shape
    return Case(batch=b, heads_q=hq, heads_kv=hkv, seq_q=nq, seq_k=nk, head_dim=d,
                head_dim_v=dv, mask=mask, mode=mode, block_size=16, seed=7, **knobs)


def rel(a, b):
    return float((a.double() - b).norm() / b.norm().clamp_min(1e-300))


@pytest.mark.parametrize("mask", MASKS)
@pytest.mark.parametrize("shape", [p.values for p in SHAPES], ids=[p.id for p in SHAPES])
def test_block_sparse_flex_and_naive_agree_with_float64(mask, shape):
    case = make_case(mask, shape, "fwd_bwd")
    inputs = case.make_inputs()
    ref = case_reference(case, inputs).as_dict()
    # the masks really are sparse here, and every backend reads the same geometry
    allowed = allowed_rows(case.mask_spec, 0, case.seq_q, case.seq_q, case.seq_k, "cpu",
                           case.block_layout, case.param("block_size"))
    assert 0 < int(allowed.sum()) < case.seq_q * case.seq_k
    assert int(allowed.sum()) == case.visible_pairs
    outs = {}
    for backend in (BlockSparse(), Naive()):
        assert backend.not_supported_reasons(case) == []
        prepared = backend.prepare(case, inputs)
        got = prepared.outputs(prepared.fn())
        for name, r in ref.items():
            tol = TOLERANCE_OUT["float32"] if name == "out" else TOLERANCE_GRAD["float32"]
            assert rel(got[name], r) < tol / 10, (backend.name, name, rel(got[name], r))
        outs[backend.name] = got["out"]
    flex = EagerFlex().build(case, inputs)(inputs.q, inputs.k, inputs.v)  # fwd on CPU
    assert rel(flex, ref["out"]) < TOLERANCE_OUT["float32"] / 10
    for name, out in outs.items():  # and pairwise, in the case's dtype
        assert torch.allclose(out, flex, atol=1e-5, rtol=1e-4), name


@pytest.mark.parametrize("mask", MASKS)
def test_block_sparse_sparse_reference_equals_the_dense_one(mask):
    case = make_case(mask, SHAPES[2].values, "fwd_bwd")
    inputs = case.make_inputs()
    own = BlockSparse().impl_reference(case, inputs).as_dict()
    dense = case_reference(case, inputs).as_dict()
    for name in dense:
        assert torch.allclose(own[name], dense[name], rtol=0, atol=1e-12), name


@pytest.mark.parametrize("mask", MASKS)
def test_bf16_block_sparse(mask):
    case = make_case(mask, SHAPES[1].values, "fwd_bwd").replace(dtype="bfloat16")
    inputs = case.make_inputs()
    prepared = BlockSparse().prepare(case, inputs)
    got = prepared.outputs(prepared.fn())
    for name, r in case_reference(case, inputs).as_dict().items():
        tol = TOLERANCE_OUT["bfloat16"] if name == "out" else TOLERANCE_GRAD["bfloat16"]
        assert rel(got[name], r) < tol, (name, rel(got[name], r))


def test_dense_case_with_a_named_layout_is_its_approximation():
    case = Case(batch=1, heads_q=2, heads_kv=2, seq_q=96, seq_k=96, head_dim=16,
                block_size=16, block_layout_name="strided")
    inputs = case.make_inputs()
    backend = BlockSparse()
    assert backend.approximation(case)
    out = backend.prepare(case, inputs).fn()
    assert rel(out, case_reference(case, inputs).out) > 1e-2
    as_mask = case.replace(mask="block_sparse(strided)")
    assert rel(out, case_reference(as_mask, inputs).out) < 1e-5
