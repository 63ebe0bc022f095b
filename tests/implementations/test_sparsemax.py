"""sparsemax: the paper's properties, the seed articles' examples, the sort-based backend
against the bisection-based float64 reference on odd shapes (forward and gradients), and
records that carry err_impl but no err_vs_softmax."""

from __future__ import annotations

import math

import pytest
import torch

from attnbench.core.accuracy import errors, tolerance
from attnbench.core.backend import DIFFERENT
from attnbench.core.case import Case, Inputs
from attnbench.core.dtypes import TOLERANCE_OUT
from attnbench.implementations import sparsemax as SM
from attnbench.measure.execute import CaseCache, execute
from attnbench.measure.timing import TimingBudget

BACKEND = SM.Sparsemax()
FUNCTIONS = {"sorted": SM.sparsemax_sorted, "bisect": SM.sparsemax_bisect,
             "sorted-top1": lambda z: SM.sparsemax_sorted(z, top=1)}  # widened 1, 2, 4, ...


def rel(x, ref):
    return errors(x, ref.double())[1]  # the relative L2 error records carry


@pytest.mark.parametrize("name", FUNCTIONS)
def test_small_vectors_by_hand(name):
    fn = FUNCTIONS[name]
    z = torch.tensor([[1.0, 0.5, -1.0],  # support {1, 0.5}: tau = 0.25
                      [1.0, 1.0, 1.0],  # ties: uniform
                      [3.0, 0.0, 0.0],  # one entry far ahead: one-hot
                      [0.2, 0.1, 0.0]], dtype=torch.float64)  # close scores: all kept
    want = torch.tensor([[0.75, 0.25, 0.0], [1 / 3, 1 / 3, 1 / 3], [1.0, 0.0, 0.0],
                         [0.2 + 0.7 / 3, 0.1 + 0.7 / 3, 0.7 / 3]],  # tau = (0.3 - 1) / 3
                        dtype=torch.float64)
    assert torch.allclose(fn(z), want, atol=1e-12)


@pytest.mark.parametrize("name", FUNCTIONS)
def test_simplex_projection_properties(name):
    gen = torch.Generator().manual_seed(0)
    z = torch.randn(64, 50, generator=gen, dtype=torch.float64) * 3
    p = FUNCTIONS[name](z)
    assert (p >= 0).all() and torch.allclose(p.sum(-1), torch.ones(64, dtype=torch.float64))
    assert (p == 0).any(dim=-1).all()  # sparse: each row drops some entries
    assert torch.allclose(FUNCTIONS[name](z + 7.5), p, atol=1e-12)  # shift invariant
    # the projection: no point of the simplex is closer to z (checked against random ones)
    other = torch.distributions.Dirichlet(torch.ones(50, dtype=torch.float64)).sample((64,))
    assert ((p - z).norm(dim=-1) <= (other - z).norm(dim=-1) + 1e-12).all()


def test_sorted_and_bisection_agree_and_have_the_papers_jacobian():
    gen = torch.Generator().manual_seed(1)
    z = torch.randn(200, 37, generator=gen, dtype=torch.float64)
    assert torch.allclose(SM.sparsemax_sorted(z), SM.sparsemax_bisect(z), atol=1e-13)
    wide = z * 0.01  # supports of about every entry: the partial sort must widen to all
    assert bool(((SM.sparsemax_sorted(wide, top=4) > 0).sum(-1) > 30).all())
    assert torch.allclose(SM.sparsemax_sorted(wide, top=4), SM.sparsemax_bisect(wide),
                          atol=1e-13)
    for fn in FUNCTIONS.values():  # Martins & Astudillo eq. 12: diag(s) - s s^T / |S|
        row = z[3]
        jac = torch.autograd.functional.jacobian(fn, row)
        s = (fn(row) > 0).double()
        assert torch.allclose(jac, torch.diag(s) - torch.outer(s, s) / s.sum(), atol=1e-12)


def three_tokens():
    # "Transformers and Attention 13" section 7: X = [[1,0],[0,1],[1,1]], W = I, d_k = 2
    x = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])[None, None]
    return Case(batch=1, heads_q=1, heads_kv=1, seq_q=3, seq_k=3, head_dim=2, head_dim_v=2,
                mode="fwd"), x


def test_seed_articles_examples():
    case, x = three_tokens()
    out = BACKEND.build(case, Inputs(x, x, x))(x, x, x)[0, 0].double()
    # rows 0 and 1: scores (1/sqrt2, 0, 1/sqrt2) -> weights (1/2, 0, 1/2), row 2 keeps all
    # three: tau = (2 sqrt2 - 1) / 3, weights (1/sqrt2 - tau, 1/sqrt2 - tau, sqrt2 - tau)
    tau = (2 * math.sqrt(2) - 1) / 3
    both = 1 / math.sqrt(2) + math.sqrt(2) - 2 * tau
    want = torch.tensor([[1.0, 0.5], [0.5, 1.0], [both, both]], dtype=torch.float64)
    assert torch.allclose(out, want, atol=1e-6)
    # "From Bit to AGI, ch. 5": scores 2, 5, 1 with d_k = 2, where softmax gives
    # (0.102, 0.848, 0.050): the gap 5/sqrt2 - 2/sqrt2 > 1, so sparsemax keeps one key only
    q = torch.tensor([[1.0, 0.0]])[None, None]
    k = torch.tensor([[2.0, 0.0], [5.0, 0.0], [1.0, 0.0]])[None, None]
    one = case.replace(seq_q=1, head_dim_v=3)
    v = torch.eye(3)[None, None]  # V = I: the output row is the weights
    weights = BACKEND.build(one, Inputs(q, k, v))(q, k, v)[0, 0, 0]
    assert torch.equal(weights, torch.tensor([0.0, 1.0, 0.0]))


# (batch, heads_q, heads_kv, seq_q, seq_k, head_dim, head_dim_v, mask): ragged lengths,
# GQA, Nq != Nk both ways, d = 40, each mask kind
SHAPES = [
    pytest.param(2, 2, 2, 77, 77, 40, 40, "none", id="ragged-d40"),
    pytest.param(1, 6, 2, 83, 83, 40, 24, "causal", id="gqa-causal"),
    pytest.param(1, 4, 1, 19, 131, 40, 40, "window(20,3)", id="short-q-window"),
    pytest.param(1, 2, 2, 131, 19, 16, 16, "causal", id="long-q-empty-rows"),
    pytest.param(1, 4, 2, 90, 90, 40, 40, "block_sparse(longformer)", id="longformer"),
]


def make_case(shape, mode="fwd_bwd", dtype="float32"):
    b, hq, hkv, nq, nk, d, dv, mask = shape
    return Case(batch=b, heads_q=hq, heads_kv=hkv, seq_q=nq, seq_k=nk, head_dim=d,
                head_dim_v=dv, mode=mode, dtype=dtype, mask=mask, block_size=16, seed=13)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("shape", [p.values for p in SHAPES], ids=[p.id for p in SHAPES])
def test_matches_its_float64_reference(shape, dtype):
    case = make_case(shape, dtype=dtype)
    assert BACKEND.not_supported_reasons(case) == []
    inputs = case.make_inputs()
    prepared = BACKEND.prepare(case, inputs)
    got = prepared.outputs(prepared.fn())
    ref = BACKEND.impl_reference(case, inputs).as_dict()
    assert set(ref) == {"out", "dq", "dk", "dv"}
    for name, r in ref.items():
        tol = tolerance(dtype, name)
        tol = tol / 10 if dtype == "float32" else tol
        assert got[name].shape == r.shape and got[name].dtype == case.torch_dtype, name
        assert torch.isfinite(got[name]).all(), name
        assert rel(got[name], r) < tol, (name, rel(got[name], r))
    if case.seq_q > case.seq_k and case.mask == "causal":  # the first rows see no key
        empty = slice(0, case.seq_q - case.seq_k)
        assert torch.equal(got["out"][:, :, empty], torch.zeros_like(got["out"][:, :, empty]))


def test_float64_gradients_agree_across_algorithms_and_finite_differences():
    case = make_case((1, 2, 1, 9, 11, 5, 3, "causal"), dtype="float64")
    inputs = case.make_inputs()
    prepared = BACKEND.prepare(case, inputs)
    got = prepared.outputs(prepared.fn())
    for name, r in BACKEND.impl_reference(case, inputs).as_dict().items():
        assert torch.allclose(got[name], r, rtol=1e-10, atol=1e-12), name
    args = tuple(t.detach().clone().requires_grad_(True) for t in (inputs.q, inputs.k, inputs.v))
    assert torch.autograd.gradcheck(BACKEND.build(case, inputs), args, eps=1e-6, atol=1e-6)


def test_records_carry_err_impl_and_no_err_vs_softmax():
    assert BACKEND.semantics == DIFFERENT
    budget = TimingBudget(warmup_s=0.0, budget_s=0.01, min_reps=1, max_reps=2)
    case = make_case(SHAPES[0].values, mode="fwd")
    row = execute(case, "sparsemax", budget, CaseCache()).to_row()
    assert row["status"] == "ok" and row["semantics"] == DIFFERENT
    assert row["err_impl_out_rel"] < TOLERANCE_OUT["float32"] / 10
    assert row.get("err_vs_softmax_out_rel") is None
