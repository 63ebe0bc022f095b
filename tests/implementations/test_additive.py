"""The additive (Bahdanau) backend against its own float64 reference, and its memory plan."""

from __future__ import annotations

import math

import pytest
import torch
from allocation_spy import LargestTensor

from attnbench.core.backend import DIFFERENT
from attnbench.core.case import Case
from attnbench.core.dtypes import TOLERANCE_GRAD, TOLERANCE_OUT
from attnbench.core.reference import case_reference
from attnbench.implementations import additive as A

BACKEND = A.Additive()


def rel(x, ref):
    ref = ref.double()
    return float((x.double() - ref).norm() / ref.norm().clamp_min(1e-300))


def small(**kw) -> Case:
    base = dict(batch=2, heads_q=2, heads_kv=2, seq_q=24, seq_k=24, head_dim=8, head_dim_v=8,
                mode="fwd_bwd")
    base.update(kw)
    return Case(**base)


def run(case):
    inputs = case.make_inputs()
    prepared = BACKEND.prepare(case, inputs)
    return inputs, prepared.outputs(prepared.fn())


def check_against_reference(case):
    assert BACKEND.not_supported_reasons(case) == []
    inputs, got = run(case)
    ref = BACKEND.impl_reference(case, inputs).as_dict()
    assert set(ref) == ({"out", "dq", "dk", "dv"} if case.needs_grad else {"out"})
    for name, r in ref.items():
        tol = TOLERANCE_OUT[case.dtype] if name == "out" else TOLERANCE_GRAD[case.dtype]
        assert got[name].shape == r.shape, name
        assert torch.isfinite(got[name].float()).all(), name
        assert rel(got[name], r) < tol, (name, rel(got[name], r))
    return inputs, got, ref


CASES = {
    "plain": small(),
    "causal": small(mask="causal"),
    "window": small(mask="window(3,2)", seq_q=30, seq_k=30),
    "gqa": small(heads_q=6, heads_kv=2, mask="causal"),
    "cross_q_lt_k": small(seq_q=10, seq_k=29, mask="causal"),
    "cross_q_gt_k": small(seq_q=29, seq_k=13, mask="window(4,1)"),
    "dv_differs": small(head_dim_v=5, additive_dim=12),
    "block_sparse": small(seq_q=32, seq_k=32, mask="block_sparse(local)", block_size=8),
    "fwd_only": small(mode="fwd", mask="causal"),
    "bwd_only": small(mode="bwd", heads_q=4, heads_kv=1),
}


@pytest.mark.parametrize("name", list(CASES))
def test_fp32_matches_own_reference(name):
    check_against_reference(CASES[name])


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float64"])
def test_other_dtypes_match_own_reference(dtype):
    check_against_reference(small(dtype=dtype, mask="causal", heads_q=4, heads_kv=2))


def test_many_chunks_match_reference():
    # a 1 MiB budget forces chunks of a few rows; the banded key range is used per chunk
    case = small(batch=1, seq_q=96, seq_k=80, head_dim=16, additive_dim=64, mask="window(20,5)",
                 memory_budget_mb=1, heads_q=4, heads_kv=2)
    plan = A.chunk_plan(case)
    assert len(plan.chunks) > 1
    assert any(c0 > 0 for _, _, c0, _ in plan.chunks)  # key ranges narrowed by the band
    check_against_reference(case)


def test_reference_is_the_bahdanau_formula():
    """impl_reference against an explicit per-pair loop of w^T tanh(W_q q_i + W_k k_j)."""
    case = small(batch=1, heads_q=2, heads_kv=1, seq_q=4, seq_k=5, head_dim=3, head_dim_v=2,
                 additive_dim=4, mask="causal", mode="fwd")
    inputs = case.make_inputs()
    p = A.additive_parameters(case)
    q, k, v = (t.double() for t in (inputs.q, inputs.k, inputs.v))
    off = case.seq_k - case.seq_q
    expect = torch.zeros(1, 2, 4, 2, dtype=torch.float64)
    for h in range(2):
        for i in range(4):
            scores = []
            for j in range(5):
                hidden = torch.tanh(q[0, h, i] @ p.w_q + k[0, 0, j] @ p.w_k)
                scores.append(float(p.w @ hidden) if j <= i + off else -math.inf)
            a = torch.softmax(torch.tensor(scores, dtype=torch.float64), dim=0)
            expect[0, h, i] = a @ v[0, 0]
    ref = BACKEND.impl_reference(case, inputs).out
    assert torch.allclose(ref, expect, atol=1e-12)
    assert torch.allclose(run(case)[1]["out"].double(), expect, atol=1e-5)


def test_fully_masked_rows_give_zeros_and_finite_grads():
    # causal with seq_q > seq_k: the first seq_q - seq_k rows see no key at all
    case = small(seq_q=20, seq_k=8, mask="causal")
    inputs, got, ref = check_against_reference(case)
    empty = case.seq_q - case.seq_k
    assert torch.equal(got["out"][:, :, :empty], torch.zeros_like(got["out"][:, :, :empty]))
    assert torch.equal(got["dq"][:, :, :empty], torch.zeros_like(got["dq"][:, :, :empty]))
    assert got["out"][:, :, empty:].abs().sum() > 0
    for t in got.values():
        assert torch.isfinite(t).all()


def test_parameters_are_deterministic_in_seed():
    case = small(head_dim=16, additive_dim=32)
    a, b = A.additive_parameters(case), A.additive_parameters(case)
    for x, y in zip((a.w_q, a.w_k, a.w), (b.w_q, b.w_k, b.w)):
        assert torch.equal(x, y)
    other = A.additive_parameters(case.replace(seed=1))
    assert not torch.equal(a.w_q, other.w_q)
    assert a.w_q.shape == (16, 32) and a.w_k.shape == (16, 32) and a.w.shape == (32,)
    assert not torch.equal(a.w_q, a.w_k)
    # Xavier-like scale: std sqrt(2 / (D + d_a)) within sampling error
    assert abs(float(a.w_q.std()) / math.sqrt(2 / 48) - 1) < 0.2
    # the fp32 parameters of build are the float64 draw rounded
    f32 = A.additive_parameters(case, dtype=torch.float32)
    assert torch.equal(f32.w_q, a.w_q.float())
    # and two builds give bit-identical outputs
    inputs = case.make_inputs()
    with torch.no_grad():
        o1 = BACKEND.build(case, inputs)(inputs.q, inputs.k, inputs.v)
        o2 = BACKEND.build(case, inputs)(inputs.q, inputs.k, inputs.v)
    assert torch.equal(o1, o2)


def test_defaults_work_and_differ_from_softmax():
    case = Case(batch=1, heads_q=2, heads_kv=2, seq_q=16, seq_k=16, head_dim=8, head_dim_v=8)
    assert A.hidden(case) == 8 and case.param("memory_budget_mb") == 256
    assert BACKEND.semantics == DIFFERENT
    inputs, got = run(case)
    assert rel(got["out"], BACKEND.impl_reference(case, inputs).out) < TOLERANCE_OUT["float32"]
    # it is another function: far from softmax attention of the same inputs
    assert rel(got["out"], case_reference(case, inputs).out) > 0.05


def test_chunk_rows_for_a_budget():
    # the memory goal: N=4096, 8 heads, d_a=64, fp32, 256 MiB
    case = Case(seq_q=4096, seq_k=4096, heads_q=8, heads_kv=8, head_dim=64, additive_dim=64)
    per_pair = 8 * (64 * 4 + 4 * 4)
    budget = 256 * 2**20
    loose = A.chunk_plan(case, cache_cap=False)
    assert loose.rows == budget // per_pair // 4096  # = 30 rows of 8.5 MiB
    assert loose.chunk_bytes <= budget < (loose.rows + 1) * 4096 * per_pair
    plan = A.chunk_plan(case)  # the cache cap only ever shrinks chunks
    assert 1 <= plan.rows <= loose.rows and plan.chunk_bytes <= budget
    assert sum(r1 - r0 for r0, r1, _, _ in plan.chunks) == 4096
    unchunked = 8 * 4096 * 4096 * 64 * 4
    assert unchunked > 30 * budget
    # a smaller budget, smaller chunks
    assert A.chunk_plan(case.replace(memory_budget_mb=32), cache_cap=False).rows == \
        32 * 2**20 // per_pair // 4096
    # a band lets chunks be taller: rows * (rows + width) pairs
    band = A.chunk_plan(case.replace(mask="window(63,0)"), cache_cap=False)
    assert band.rows > loose.rows and band.chunk_bytes <= budget


def test_one_row_over_budget_is_unsupported():
    case = Case(seq_q=64, seq_k=8192, heads_q=16, heads_kv=16, additive_dim=64,
                memory_budget_mb=1)
    reasons = BACKEND.not_supported_reasons(case)
    assert reasons and "memory_budget_mb" in reasons[0]
    assert BACKEND.not_supported_reasons(case.replace(memory_budget_mb=256)) == []


@pytest.mark.parametrize("mode", ["fwd", "fwd_bwd"])
def test_no_tensor_exceeds_the_budget(mode):
    case = small(batch=1, heads_q=2, heads_kv=2, seq_q=256, seq_k=256, head_dim=16,
                 head_dim_v=16, additive_dim=64, memory_budget_mb=1, mode=mode)
    budget = 2**20
    unchunked = 2 * 256 * 256 * 64 * 4  # 32 MiB
    assert unchunked > 30 * budget
    inputs = case.make_inputs()
    prepared = BACKEND.prepare(case, inputs)
    spy = LargestTensor()
    with spy:
        result = prepared.fn()
    assert spy.ops > 50
    assert 0.5 * budget < spy.largest_bytes <= budget  # the chunk slice: biggest, within budget
    got = prepared.outputs(result)
    ref = BACKEND.impl_reference(case, inputs).as_dict()
    for name, r in ref.items():
        assert rel(got[name], r) < TOLERANCE_GRAD["float32"], name


def test_attention_api_with_defaults():
    import attnbench

    case = small(mode="fwd", mask="causal", seq_q=12, seq_k=20)
    inputs = case.make_inputs()
    out = attnbench.attention(inputs.q, inputs.k, inputs.v, backend="additive", causal=True)
    assert rel(out, BACKEND.impl_reference(case, inputs).out) < TOLERANCE_OUT["float32"]
