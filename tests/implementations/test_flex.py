"""flex: mask functions, the wrapper against the float64 reference, compile-once, limits.

The wrapper is judged through eager ``flex_attention`` with the very BlockMask the backend
builds; inductor's compiled CPU kernel is host-dependent (see docs/upstream-faults.md), so
no test here asserts its numbers: the harness does that at run time and records ``wrong``.
The mask functions are checked exhaustively (``create_mask`` evaluates a mask_mod densely).
"""

from __future__ import annotations

import pytest
import torch
from host_neutral import EagerFlex
from torch.nn.attention.flex_attention import create_mask

from attnbench.core.case import Case
from attnbench.core.dtypes import TOLERANCE_OUT
from attnbench.core.masks import allowed_rows
from attnbench.core.reference import case_reference
from attnbench.core.registry import get_backend
from attnbench.implementations.flex import mask_mod_for


@pytest.mark.parametrize("mask", ["causal", "window(0,0)", "window(3,0)", "window(2,5)",
                                  "window(inf,1)", "window(4,inf)", "block_sparse(local)",
                                  "block_sparse(bigbird)", "block_sparse(longformer)",
                                  "block_sparse(strided)"])
@pytest.mark.parametrize("nq,nk", [(16, 16), (10, 23), (23, 10)])
def test_mask_mod_matches_mask(mask, nq, nk):
    case = Case(seq_q=nq, seq_k=nk, mask=mask, block_size=4, block_band=1, block_global=1,
                block_random=1)
    mod = mask_mod_for(case, "cpu")
    got = create_mask(mod, 1, 1, nq, nk, device="cpu")[0, 0]  # (Nq, Nk)
    want = allowed_rows(case.mask_spec, 0, nq, nq, nk, "cpu", case.block_layout,
                        case.param("block_size"))
    assert torch.equal(got, want)


def test_unmasked_cases_have_no_mask_mod():
    assert mask_mod_for(Case(mask="none"), "cpu") is None
    assert mask_mod_for(Case(mask="window(inf,inf)"), "cpu") is None


WRAPPER_CASES = [
    # GQA, cross-attention, d_v != d, bottom-right causal
    Case(batch=1, heads_q=4, heads_kv=2, seq_q=24, seq_k=40, head_dim=16, head_dim_v=8,
         mask="causal"),
    # rows 0..15 see no key (off = -16): flex must give 0 there, like the reference
    Case(batch=2, heads_q=2, heads_kv=2, seq_q=40, seq_k=24, head_dim=16, head_dim_v=16,
         mask="window(3,0)", dtype="bfloat16"),
    # a block layout whose blocks (32) are smaller than flex's 128-wide sparse blocks
    Case(batch=1, heads_q=2, heads_kv=2, seq_q=150, seq_k=150, head_dim=16, head_dim_v=16,
         mask="block_sparse(bigbird)", block_size=32),
    # a scale that is not 1/sqrt(D), and a negative one
    Case(batch=1, heads_q=2, heads_kv=1, seq_q=33, seq_k=33, head_dim=16, head_dim_v=16,
         mask="causal", scale=-0.3),
]


@pytest.mark.parametrize("case", WRAPPER_CASES, ids=lambda c: f"{c.mask}-s{c.scale}")
def test_wrapper_through_eager_flex_against_reference(case):
    inputs = case.make_inputs()
    out = EagerFlex().build(case, inputs)(inputs.q, inputs.k, inputs.v)
    ref = case_reference(case, inputs).out
    assert out.shape == ref.shape and torch.isfinite(out).all()
    rel = float((out.double() - ref).norm() / ref.norm())
    assert rel < TOLERANCE_OUT[case.dtype], rel
    if case.mask == "window(3,0)":
        assert torch.equal(out[:, :, :16], torch.zeros_like(out[:, :, :16]))


@pytest.mark.slow
def test_compiles_once_outside_the_timed_closure():
    """prepare() compiles (and times it as compile_s); the timed closure never recompiles.
    Only behaviour is checked here, not the compiled kernel's numbers."""
    from torch._dynamo.utils import counters

    case = WRAPPER_CASES[0]
    backend = get_backend("flex")
    if backend.not_supported_reasons(case):
        pytest.skip("; ".join(backend.not_supported_reasons(case)))
    inputs = case.make_inputs()
    prepared = backend.prepare(case, inputs)
    assert prepared.extras["compile_s"] > 0
    graphs = counters["stats"]["unique_graphs"]
    out = prepared.outputs(prepared.fn())["out"]
    prepared.fn()
    assert counters["stats"]["unique_graphs"] == graphs
    assert out.shape == (1, 4, 24, 8) and out.dtype == torch.float32


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
