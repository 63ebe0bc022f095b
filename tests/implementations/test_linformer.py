"""linformer: its own float64 function on odd shapes, the chain-rule reference against
brute-force autograd, seeded projections, an approximation of softmax, O(N k) memory."""

from __future__ import annotations

import pytest
import torch
from allocation_spy import LargestTensor

from attnbench.core.accuracy import errors, tolerance
from attnbench.core.backend import APPROXIMATE
from attnbench.core.case import Case
from attnbench.core.reference import case_reference
from attnbench.implementations import linformer as LF

BACKEND = LF.Linformer()


def rel(x, ref):
    return errors(x, ref.double())[1]  # the relative L2 error records carry


# (batch, heads_q, heads_kv, seq_q, seq_k, head_dim, head_dim_v, linformer_k): ragged
# lengths, GQA, Nq != Nk both ways, d = 40, k above and below seq_k
SHAPES = [
    pytest.param(2, 2, 2, 77, 77, 40, 40, 32, id="ragged-d40"),
    pytest.param(1, 6, 2, 83, 83, 40, 24, 16, id="gqa-dv"),
    pytest.param(1, 4, 1, 19, 131, 40, 40, 24, id="short-q"),
    pytest.param(1, 2, 2, 131, 19, 16, 16, 64, id="long-q-k-above-n"),
]


def make_case(shape, mode="fwd_bwd", dtype="float32"):
    b, hq, hkv, nq, nk, d, dv, kp = shape
    return Case(batch=b, heads_q=hq, heads_kv=hkv, seq_q=nq, seq_k=nk, head_dim=d,
                head_dim_v=dv, mode=mode, dtype=dtype, linformer_k=kp, seed=11)


def run(case, inputs=None):
    inputs = inputs or case.make_inputs()
    prepared = BACKEND.prepare(case, inputs)
    return inputs, prepared.outputs(prepared.fn())


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("shape", [p.values for p in SHAPES], ids=[p.id for p in SHAPES])
def test_matches_its_float64_function(shape, dtype):
    case = make_case(shape, dtype=dtype)
    assert BACKEND.not_supported_reasons(case) == []
    inputs, got = run(case)
    ref = BACKEND.impl_reference(case, inputs).as_dict()
    assert set(ref) == {"out", "dq", "dk", "dv"}
    for name, r in ref.items():
        tol = tolerance(dtype, name)
        tol = tol / 10 if dtype == "float32" else tol
        assert got[name].shape == r.shape and got[name].dtype == case.torch_dtype, name
        assert rel(got[name], r) < tol, (name, rel(got[name], r))


def brute_force(case, inputs):
    """Float64, no chunks, no chain rule by hand: E K, F V, full softmax, autograd."""
    e, f = LF.projections(case)
    q, k, v = (t.detach().double().requires_grad_(True) for t in (inputs.q, inputs.k, inputs.v))
    g = case.group_size
    kp = torch.einsum("rn,bhnd->bhrd", e, k).repeat_interleave(g, dim=1)
    vp = torch.einsum("rn,bhnd->bhrd", f, v).repeat_interleave(g, dim=1)
    p = torch.softmax(q @ kp.transpose(-1, -2) * case.head_dim ** -0.5, dim=-1)
    out = p @ vp
    grads = torch.autograd.grad(out, (q, k, v), inputs.grad_out.double())
    return {"out": out.detach(), "dq": grads[0], "dk": grads[1], "dv": grads[2]}


@pytest.mark.parametrize("shape", [SHAPES[1].values, SHAPES[2].values], ids=["gqa", "cross"])
def test_reference_equals_brute_force(shape):
    case = make_case(shape)
    inputs = case.make_inputs()
    ref = BACKEND.impl_reference(case, inputs).as_dict()
    for name, want in brute_force(case, inputs).items():
        assert torch.allclose(ref[name], want, rtol=1e-10, atol=1e-12), name


def test_float64_gradcheck():
    case = make_case((1, 2, 1, 7, 9, 3, 2, 4), dtype="float64")
    inputs = case.make_inputs()
    args = tuple(t.detach().clone().requires_grad_(True) for t in (inputs.q, inputs.k, inputs.v))
    assert torch.autograd.gradcheck(BACKEND.build(case, inputs), args, eps=1e-6, atol=1e-7)


def test_identity_projections_give_exact_attention():
    # with E = F = I (k = seq_k) the formula is softmax attention itself
    case = make_case(SHAPES[1].values, mode="fwd").replace(linformer_k=83)
    inputs = case.make_inputs()
    eye = torch.eye(83)
    out = LF.linformer_attention(inputs.q, inputs.k, inputs.v, eye, eye, case.softmax_scale)
    assert rel(out, case_reference(case, inputs).out) < 1e-5


def test_projections_are_seeded_and_scaled():
    case = Case(seq_q=64, seq_k=4096, linformer_k=256, seed=3)
    e, f = LF.projections(case)
    assert e.shape == f.shape == (256, 4096) and e.dtype == torch.float64
    again = LF.projections(case)
    assert torch.equal(e, again[0]) and torch.equal(f, again[1])
    assert not torch.equal(e, LF.projections(case.replace(seed=4))[0])
    assert not torch.equal(e, f)
    # the inputs' stream is not reused: E's first entries are not K's
    assert not torch.allclose(e[0, :8] * 64, case.make_inputs().q.flatten()[:8].double())
    assert abs(float(e.var()) * 4096 - 1) < 0.02  # N(0, 1/seq_k)


def test_is_an_approximation_and_declares_it():
    assert BACKEND.semantics == APPROXIMATE
    case = make_case(SHAPES[0].values, mode="fwd")
    assert "linformer_k = 32" in BACKEND.approximation(case)
    inputs, got = run(case)
    assert rel(got["out"], case_reference(case, inputs).out) > 1e-2


def test_masks_are_unsupported_with_a_reason():
    for mask in ("causal", "window(4,4)", "block_sparse(local)"):
        reasons = BACKEND.not_supported_reasons(Case(mask=mask))
        assert reasons and all("mask" in r for r in reasons)


def test_work_is_counted_from_k_not_n():
    small, big = (Case(seq_q=n, seq_k=n, linformer_k=256) for n in (2048, 4096))
    assert BACKEND.work_flops(big) == pytest.approx(2 * BACKEND.work_flops(small))
    assert BACKEND.work_flops(big) < big.flops_dense / 4


@pytest.mark.parametrize("mode", ["fwd", "fwd_bwd"])
def test_largest_tensor_is_n_times_k(mode):
    sizes = {}
    for n in (512, 1024, 2048):
        case = Case(batch=1, heads_q=2, heads_kv=2, seq_q=n, seq_k=n, head_dim=16,
                    head_dim_v=16, mode=mode, linformer_k=64)
        prepared = BACKEND.prepare(case, case.make_inputs())
        with LargestTensor(skip_views=True) as spy:
            prepared.fn()
        sizes[n] = spy.largest_numel
        # scores (H, N, k) or the (k, N) projections: never an N x N matrix
        assert spy.largest_numel <= max(2 * n * 64, 2 * n * 16), (n, spy.largest_numel)
    assert sizes[2048] <= 2.1 * sizes[1024] <= 2.1 ** 2 * sizes[512]



def test_query_rows_in_blocks_compute_the_same_values_and_gradients():
    """On CPU the scores go in blocks of query rows (SCORE_BLOCK_BYTES); a block size that
    does not divide the rows and crosses a GQA group's boundary changes nothing."""
    case = make_case(SHAPES[1].values)  # GQA 6/2: 3 * 83 = 249 folded rows per K/V head
    inputs = case.make_inputs()
    e, f = LF.projections(case, dtype=torch.float32)

    def outputs(rows):
        q, k, v = (t.detach().clone().requires_grad_(True)
                   for t in (inputs.q, inputs.k, inputs.v))
        out = LF.linformer_attention(q, k, v, e, f, case.softmax_scale, rows)
        return (out, *torch.autograd.grad(out, (q, k, v), inputs.grad_out))

    for got, want in zip(outputs(37), outputs(None)):
        assert torch.allclose(got, want, rtol=1e-5, atol=1e-6)
    # the family suite's shape (B=1, H=8, k=256, fp32): 512 rows of scores, 4 MiB a block
    family = Case(batch=1, heads_q=8, heads_kv=8, seq_q=16384, seq_k=16384, linformer_k=256)
    assert LF.block_rows(family, torch.device("cpu"), 4) == 512
    assert LF.block_rows(family, torch.device("cuda"), 4) is None  # a GPU: one launch
