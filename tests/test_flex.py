"""flex: mask functions, compiled FlexAttention against the float64 reference, limits.

Compilation through inductor's CPU path takes seconds per case on 2 cores, so the
compiled cases are few and small; the mask functions are checked exhaustively without
compiling (``create_mask`` evaluates a mask_mod densely).
"""

from __future__ import annotations

import pytest
import torch
from torch.nn.attention.flex_attention import create_mask

from attnbench.case import Case
from attnbench.dtypes import TOLERANCE_OUT
from attnbench.implementations.flex import mask_mod_for
from attnbench.masks import allowed_rows
from attnbench.reference import case_reference
from attnbench.registry import get_backend


@pytest.mark.parametrize("mask", ["causal", "window(0,0)", "window(3,0)", "window(2,5)",
                                  "window(inf,1)", "window(4,inf)", "block_sparse(local)",
                                  "block_sparse(bigbird)"])
@pytest.mark.parametrize("nq,nk", [(16, 16), (10, 23), (23, 10)])
def test_mask_mod_matches_mask(mask, nq, nk):
    case = Case(seq_q=nq, seq_k=nk, mask=mask, block_size=4, block_band=1, block_global=1,
                block_random=1)
    mod = mask_mod_for(case, "cpu")
    got = create_mask(mod, 1, 1, nq, nk, device="cpu")[0, 0]  # (Nq, Nk)
    want = allowed_rows(case.mask_spec, 0, nq, nq, nk, "cpu", case.block_layout,
                        case.block_size)
    assert torch.equal(got, want)


def test_unmasked_cases_have_no_mask_mod():
    assert mask_mod_for(Case(mask="none"), "cpu") is None
    assert mask_mod_for(Case(mask="window(inf,inf)"), "cpu") is None


COMPILED = [
    # GQA, cross-attention, d_v != d, bottom-right causal
    Case(batch=1, heads_q=4, heads_kv=2, seq_q=24, seq_k=40, head_dim=16, head_dim_v=8,
         mask="causal"),
    # rows 0..15 see no key (off = -16): flex must give 0 there, like the reference
    Case(batch=2, heads_q=2, heads_kv=2, seq_q=40, seq_k=24, head_dim=16, head_dim_v=16,
         mask="window(3,0)", dtype="bfloat16"),
    # a block layout whose blocks (32) are smaller than flex's 128-wide sparse blocks
    Case(batch=1, heads_q=2, heads_kv=2, seq_q=150, seq_k=150, head_dim=16, head_dim_v=16,
         mask="block_sparse(bigbird)", block_size=32),
]


@pytest.mark.parametrize("case", COMPILED, ids=lambda c: c.mask)
def test_compiled_flex_against_reference(case):
    backend = get_backend("flex")
    assert backend.is_available()[0]
    assert not backend.not_supported_reasons(case), backend.not_supported_reasons(case)
    inputs = case.make_inputs()
    prepared = backend.prepare(case, inputs)
    assert prepared.extras["compile_s"] > 0
    from torch._dynamo.utils import counters

    graphs = counters["stats"]["unique_graphs"]
    out = prepared.outputs(prepared.fn())["out"]
    prepared.fn()
    assert counters["stats"]["unique_graphs"] == graphs  # the timed closure never compiles
    ref = case_reference(case, inputs).out
    assert out.shape == ref.shape and torch.isfinite(out).all()
    rel = float((out.double() - ref).norm() / ref.norm())
    assert rel < TOLERANCE_OUT[case.dtype], rel
    if case.mask == "window(3,0)":
        assert torch.equal(out[:, :, :16], torch.zeros_like(out[:, :, :16]))


def test_declared_limits():
    flex = get_backend("flex")
    bwd = flex.not_supported_reasons(Case(mode="bwd"))
    assert any("backward on cpu" in r for r in bwd)
    assert flex.not_supported_reasons(Case(dtype="float64"))
    cuda = Case(device="cuda", head_dim=8, head_dim_v=8, mode="fwd_bwd")
    reasons = flex.extra_reasons(cuda)
    assert any(">= 16" in r for r in reasons)
    assert not any("backward" in r for r in reasons)
    assert not flex.not_supported_reasons(Case(mask="block_sparse(local)"))
