"""The linear (kernelized) backend against its own float64 reference and a brute-force form."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from allocation_spy import LargestTensor
from kernel_paths import needs_native

from attnbench.core.backend import APPROXIMATE
from attnbench.core.case import Case, Inputs
from attnbench.core.dtypes import TOLERANCE_GRAD, TOLERANCE_OUT
from attnbench.core.reference import case_reference
from attnbench.implementations import _linear_fused, _native
from attnbench.implementations import linear as L

BACKEND = L.Linear()


def rel(x, ref):
    ref = ref.double()
    return float((x.double() - ref).norm() / ref.norm().clamp_min(1e-300))


def small(**kw) -> Case:
    base = dict(batch=2, heads_q=2, heads_kv=2, seq_q=40, seq_k=40, head_dim=8, head_dim_v=8,
                mode="fwd_bwd", num_features=24)
    base.update(kw)
    return Case(**base)


def run(case, inputs=None):
    inputs = inputs or case.make_inputs()
    prepared = BACKEND.prepare(case, inputs)
    return inputs, prepared.outputs(prepared.fn())


def check_against_reference(case):
    assert BACKEND.not_supported_reasons(case) == []
    inputs, got = run(case)
    ref = BACKEND.impl_reference(case, inputs).as_dict()
    assert set(ref) == ({"out", "dq", "dk", "dv"} if case.needs_grad else {"out"})
    for name, r in ref.items():
        tol = TOLERANCE_OUT[case.dtype] if name == "out" else TOLERANCE_GRAD[case.dtype]
        assert got[name].shape == r.shape and got[name].dtype == case.torch_dtype, name
        assert torch.isfinite(got[name].float()).all(), name
        assert rel(got[name], r) < tol, (name, rel(got[name], r))
    return inputs, got, ref


def brute_force(case, q, k, v):
    """O(N^2) float64 evaluation: phi from scratch, full masked kernel matrix, no tricks."""
    q, k, v = (t.double() for t in (q, k, v))
    if case.param("feature_map") == "elu":
        fq, fk = F.elu(q) + 1, F.elu(k) + 1
    else:
        w = L.favor_projection(case)  # (m, D)
        c = case.softmax_scale ** 0.5
        m = w.shape[0]
        fq = torch.exp((q * c) @ w.T - (q * c).pow(2).sum(-1, keepdim=True) / 2) / math.sqrt(m)
        fk = torch.exp((k * c) @ w.T - (k * c).pow(2).sum(-1, keepdim=True) / 2) / math.sqrt(m)
    g = case.group_size
    fk, v = fk.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
    a = fq @ fk.transpose(-1, -2)  # (B, Hq, Nq, Nk)
    if case.mask == "causal":
        i = torch.arange(case.seq_q)[:, None]
        j = torch.arange(case.seq_k)[None, :]
        a = a * (j <= i + case.seq_k - case.seq_q)
    den = a.sum(-1, keepdim=True)
    return (a @ v) / torch.where(den > 0, den, torch.ones_like(den))


CASES = {
    "elu": small(),
    "elu_causal": small(mask="causal"),
    "favor": small(feature_map="favor"),
    "favor_causal": small(feature_map="favor", mask="causal", num_features=40),
    "gqa_causal": small(heads_q=6, heads_kv=2, mask="causal"),
    "gqa_favor": small(heads_q=4, heads_kv=1, feature_map="favor"),
    "cross_q_lt_k": small(seq_q=13, seq_k=90, mask="causal"),
    "cross_q_gt_k": small(seq_q=90, seq_k=31, mask="causal", feature_map="favor"),
    "cross_none": small(seq_q=17, seq_k=50),
    "dv_differs": small(head_dim_v=5, mask="causal"),
    "long_causal": small(batch=1, seq_q=300, seq_k=300, mask="causal", heads_q=2, heads_kv=1),
    "fwd_only": small(mode="fwd", mask="causal"),
    "bwd_only": small(mode="bwd", feature_map="favor"),
}


@pytest.mark.parametrize("name", list(CASES))
def test_fp32_matches_own_reference(name):
    check_against_reference(CASES[name])


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float64"])
@pytest.mark.parametrize("feature_map", ["elu", "favor"])
def test_other_dtypes_match_own_reference(dtype, feature_map):
    check_against_reference(small(dtype=dtype, mask="causal", feature_map=feature_map,
                                  heads_q=4, heads_kv=2))


@pytest.mark.parametrize("feature_map", ["elu", "favor"])
@pytest.mark.parametrize("shape", [(50, 50), (23, 61), (61, 23)])
@pytest.mark.parametrize("mask", ["causal", "none"])
def test_against_brute_force(feature_map, shape, mask):
    """Many blocks and chunks (block 16, chunk 5), in float64: agrees to rounding."""
    case = small(seq_q=shape[0], seq_k=shape[1], mask=mask, feature_map=feature_map,
                 heads_q=4, heads_kv=2, dtype="float64", mode="fwd")
    inputs = case.make_inputs()
    expect = brute_force(case, inputs.q, inputs.k, inputs.v)
    proj = L.favor_projection(case) if feature_map == "favor" else None
    causal = mask == "causal"
    got = L.linear_attention(inputs.q, inputs.k, inputs.v, case, proj, causal, chunk=5, block=16)
    assert torch.allclose(got, expect, rtol=1e-10, atol=1e-12)
    # and with the default chunking, and the float64 reference
    got = L.linear_attention(inputs.q, inputs.k, inputs.v, case, proj, causal)
    assert torch.allclose(got, expect, rtol=1e-10, atol=1e-12)
    ref = BACKEND.impl_reference(case, inputs).out
    assert torch.allclose(ref, expect, rtol=1e-10, atol=1e-12)
    # the fp32 backend on the same inputs
    case32 = case.replace(dtype="float32")
    inputs32 = Inputs(*(t.float() for t in (inputs.q, inputs.k, inputs.v)))
    _, got32 = run(case32, inputs32)
    assert rel(got32["out"], expect) < TOLERANCE_OUT["float32"]


def test_chunked_gradients_match_brute_force():
    case = small(seq_q=37, seq_k=45, mask="causal", dtype="float64", heads_q=4, heads_kv=2)
    inputs = case.make_inputs()
    go = torch.randn(2, 4, 37, 8, dtype=torch.float64)
    grads = []
    for fn in (lambda q, k, v: L.linear_attention(q, k, v, case, None, True, chunk=4, block=9),
               lambda q, k, v: brute_force(case, q, k, v)):
        qkv = [t.clone().requires_grad_(True) for t in (inputs.q, inputs.k, inputs.v)]
        grads.append(torch.autograd.grad(fn(*qkv), qkv, go))
    for a, b in zip(*grads):
        assert torch.allclose(a, b, rtol=1e-9, atol=1e-11)


def test_rows_without_keys_are_zero():
    case = small(seq_q=30, seq_k=12, mask="causal")
    _, got, _ = check_against_reference(case)
    empty = 30 - 12
    assert torch.equal(got["out"][:, :, :empty], torch.zeros_like(got["out"][:, :, :empty]))
    assert torch.equal(got["dq"][:, :, :empty], torch.zeros_like(got["dq"][:, :, :empty]))
    assert got["out"][:, :, empty:].abs().sum() > 0


def test_is_an_approximation_of_softmax():
    assert BACKEND.semantics == APPROXIMATE
    for fmap in ("elu", "favor"):
        case = small(mode="fwd", feature_map=fmap, mask="causal")
        inputs, got = run(case)
        err = rel(got["out"], case_reference(case, inputs).out)
        assert err > 1e-2, fmap  # measurably not softmax attention


def test_favor_converges_to_softmax_with_more_features():
    # small-norm inputs keep the estimator's variance moderate; seeded, so deterministic
    base = small(batch=1, seq_q=48, seq_k=48, head_dim=16, head_dim_v=16, mode="fwd",
                 feature_map="favor")
    raw = base.make_inputs()
    inputs = Inputs(raw.q * 0.5, raw.k * 0.5, raw.v)
    errs = {}
    for m in (16, 4096):
        case = base.replace(num_features=m)
        errs[m] = rel(run(case, inputs)[1]["out"], case_reference(case, inputs).out)
    assert errs[4096] < errs[16] / 3


def test_favor_projection_is_seeded_and_orthogonal():
    case = small(head_dim=8, num_features=20, feature_map="favor")
    w = L.favor_projection(case)
    assert w.shape == (20, 8) and w.dtype == torch.float64
    assert torch.equal(w, L.favor_projection(case))
    assert not torch.equal(w, L.favor_projection(case.replace(seed=3)))
    for block in (w[:8], w[8:16]):  # rows within a block are orthogonal
        gram = block @ block.T
        off_diagonal = gram - torch.diag(torch.diagonal(gram))
        assert off_diagonal.abs().max() < 1e-10
    norms = w.norm(dim=1)
    assert norms.std() > 0.05  # chi-distributed norms, not all equal
    assert abs(float((norms**2).mean()) / 8 - 1) < 0.5  # E|w|^2 = D
    # build's fp32 projection is the same draw
    assert torch.equal(L.favor_projection(case, dtype=torch.float32), w.float())
    inputs = case.make_inputs()
    with torch.no_grad():
        o1 = BACKEND.build(case, inputs)(inputs.q, inputs.k, inputs.v)
        o2 = BACKEND.build(case, inputs)(inputs.q, inputs.k, inputs.v)
    assert torch.equal(o1, o2)
    case_b = case.replace(seed=3)
    with torch.no_grad():
        o3 = BACKEND.build(case_b, inputs)(inputs.q, inputs.k, inputs.v)
    assert not torch.equal(o1, o3)  # other seed, other features


def test_favor_does_not_overflow_on_large_inputs():
    case = small(feature_map="favor", mask="causal", mode="fwd", head_dim=16, head_dim_v=16)
    raw = case.make_inputs()
    inputs = Inputs(raw.q * 12, raw.k * 12, raw.v)  # exponents far beyond exp's fp32 range
    _, got = run(case, inputs)
    assert torch.isfinite(got["out"]).all()
    ref = BACKEND.impl_reference(case, inputs).out
    assert torch.isfinite(ref).all()


def test_unsupported_masks_and_knobs_have_reasons():
    for mask in ("window(8,0)", "block_sparse(local)"):
        reasons = BACKEND.not_supported_reasons(small(mask=mask))
        assert reasons and any("mask" in r for r in reasons), mask
    assert any("feature_map" in r for r in BACKEND.not_supported_reasons(small(feature_map="x")))
    assert BACKEND.not_supported_reasons(small(feature_map="favor", num_features=0))
    assert BACKEND.not_supported_reasons(small(mask="causal")) == []


@pytest.mark.parametrize("mode", ["fwd", "fwd_bwd"])
def test_causal_memory_is_linear_without_per_token_states(mode):
    B, H, N, D = 1, 2, 512, 16
    case = small(batch=B, heads_q=H, heads_kv=H, seq_q=N, seq_k=N, head_dim=D, head_dim_v=D,
                 mask="causal", mode=mode)
    inputs = case.make_inputs()
    prepared = BACKEND.prepare(case, inputs)
    spy = LargestTensor()
    with spy:
        prepared.fn()
    per_token_states = B * H * N * D * (D + 1)  # the (B, H, N, F, Dv + 1) cumulative states
    # the largest tensor is O(N * (F + Dv + chunk)): phi(Q), phi(K), the intra-chunk product
    assert spy.largest_numel <= B * H * N * max(D + 1, L.CHUNK)
    assert spy.largest_numel * 4 < per_token_states


def test_attention_api_with_defaults():
    import attnbench

    case = small(mode="fwd", mask="causal", seq_q=12, seq_k=20)
    inputs = case.make_inputs()
    out = attnbench.attention(inputs.q, inputs.k, inputs.v, backend="linear", causal=True)
    assert rel(out, BACKEND.impl_reference(case, inputs).out) < TOLERANCE_OUT["float32"]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_streamed_elu_path_matches_one_shot_and_allocates_only_the_output(dtype):
    """Non-causal elu without autograd streams blocks of keys and queries through reused
    buffers: same numbers as the one-shot (autograd) form, no phi(K)/phi(Q)-sized tensors."""
    case = small(batch=2, heads_q=4, heads_kv=2, seq_q=53, seq_k=300, head_dim=8,
                 head_dim_v=8, dtype=dtype, mode="fwd")
    inputs = case.make_inputs()
    with torch.no_grad():
        spy = LargestTensor(skip_views=True)
        with spy:  # blocks of 8 query rows / 16 key rows, the last ones partial
            got = L.linear_attention(inputs.q, inputs.k, inputs.v, case, None, False, block=8)
        whole = L.linear_attention(inputs.q, inputs.k, inputs.v, case, None, False)
    q, k, v = (t.clone().requires_grad_(True) for t in (inputs.q, inputs.k, inputs.v))
    one_shot = L.linear_attention(q, k, v, case, None, False,
                                  explicit_backward=False).detach()  # the autograd path
    assert got.shape == one_shot.shape and got.dtype == one_shot.dtype == case.torch_dtype
    tol = 1e-6 if dtype == "float32" else 1e-2
    assert rel(got, one_shot) < tol and rel(whole, one_shot) < tol
    if dtype == "float32":  # (bf16 converts k to fp32 first: a k-sized copy)
        assert spy.largest_numel <= inputs.q.numel() < inputs.k.numel()  # the output, not phi(K)


def assert_explicit_equals_autograd(case, causal: bool, **kw):
    """Output and gradients of linear_attention with its explicit backward and with
    autograd on the formula agree to float64 rounding."""
    inputs = case.make_inputs()
    proj = L.favor_projection(case) if case.param("feature_map") == "favor" else None
    go = torch.randn(case.batch, case.heads_q, case.seq_q, case.head_dim_v,
                     dtype=torch.float64)
    grads = []
    for explicit in (True, False):
        qkv = [t.clone().requires_grad_(True) for t in (inputs.q, inputs.k, inputs.v)]
        out = L.linear_attention(*qkv, case, proj, causal, explicit_backward=explicit, **kw)
        grads.append((out.detach(), *torch.autograd.grad(out, qkv, go)))
    for name, a, b in zip(("out", "dq", "dk", "dv"), *grads):
        assert torch.allclose(a, b, rtol=1e-9, atol=1e-12), name


@pytest.mark.parametrize("feature_map", ["elu", "favor"])
@pytest.mark.parametrize("shape", [(4, 2, 37, 61), (2, 2, 50, 23), (3, 1, 40, 40)])
def test_explicit_non_causal_backward_equals_autograd(feature_map, shape):
    """The explicit backward (_linear_grad) against autograd on the same formula, float64:
    GQA, seq_q != seq_k, keys streamed in several blocks (block=7 rows), favor's shifts."""
    hq, hkv, nq, nk = shape
    case = small(heads_q=hq, heads_kv=hkv, seq_q=nq, seq_k=nk, feature_map=feature_map,
                 dtype="float64")
    assert_explicit_equals_autograd(case, causal=False, block=7)


@pytest.mark.parametrize("feature_map", ["elu", "favor"])
@pytest.mark.parametrize("shape, chunk", [((4, 2, 40), 5), ((3, 3, 35), 7), ((2, 1, 8), 8)])
def test_explicit_causal_backward_equals_autograd(feature_map, shape, chunk):
    """The explicit causal backward against autograd on the chunked formula, float64: GQA,
    several chunks (states flowing across them) and a single chunk."""
    hq, hkv, n = shape
    case = small(heads_q=hq, heads_kv=hkv, seq_q=n, seq_k=n, feature_map=feature_map,
                 mask="causal", dtype="float64")
    assert_explicit_equals_autograd(case, causal=True, chunk=chunk)


@pytest.mark.parametrize("feature_map", ["elu", "favor"])
def test_streamed_causal_path_matches_the_autograd_path(feature_map):
    """Causal without autograd (seq_q == seq_k, a multiple of the chunk) goes head by head
    through _causal_stream: the same numbers as the chunked autograd form, GQA included."""
    case = small(batch=2, heads_q=4, heads_kv=2, seq_q=96, seq_k=96, mask="causal",
                 feature_map=feature_map, mode="fwd")
    inputs = case.make_inputs()
    proj = L.favor_projection(case) if feature_map == "favor" else None
    proj_s = None if proj is None else L.scaled_projection(proj, case.softmax_scale,
                                                           torch.float32)
    with torch.no_grad():
        streamed = L.linear_attention(inputs.q, inputs.k, inputs.v, case, proj, True, chunk=16)
        direct = L._causal_stream(inputs.q, inputs.k, inputs.v, 2, proj_s,
                                  0.5 * case.softmax_scale, 16)
    q, k, v = (t.clone().requires_grad_(True) for t in (inputs.q, inputs.k, inputs.v))
    chunked = L.linear_attention(q, k, v, case, proj, True, chunk=16).detach()
    assert torch.equal(streamed, direct)
    assert rel(streamed, chunked) < 1e-6
    ref = BACKEND.impl_reference(case, inputs).out
    assert rel(streamed, ref) < TOLERANCE_OUT["float32"]


# The fused forwards (native/linear_attention.cpp): fp32, Dv (and FAVOR+'s m) % 16 == 0,
# non-causal or causal with seq_q == seq_k.
FUSED = {
    "gqa-cross-d40": small(mode="fwd", heads_q=6, heads_kv=2, seq_q=70, seq_k=131,
                           head_dim=40, head_dim_v=32),
    "few-queries": small(mode="fwd", seq_q=5, seq_k=300, head_dim=16, head_dim_v=16),
    "d64": small(mode="fwd", batch=1, seq_q=200, seq_k=200, head_dim=64, head_dim_v=64),
    # causal: chunks of 64 rows, the last one partial
    "causal-gqa-d40": small(mode="fwd", mask="causal", heads_q=6, heads_kv=2, seq_q=131,
                            seq_k=131, head_dim=40, head_dim_v=32),
    "causal-short": small(mode="fwd", mask="causal", seq_q=7, seq_k=7, head_dim=16,
                          head_dim_v=16),
    "causal-d64": small(mode="fwd", mask="causal", batch=1, seq_q=256, seq_k=256,
                        head_dim=64, head_dim_v=64),
    # FAVOR+: the projection by the kernel's tiles (m/16 panels), keys at a running shift
    "favor-gqa-cross-d40": small(mode="fwd", feature_map="favor", num_features=48, heads_q=6,
                                 heads_kv=2, seq_q=70, seq_k=131, head_dim=40, head_dim_v=32),
    "favor-d64": small(mode="fwd", feature_map="favor", num_features=256, batch=1, seq_q=200,
                       seq_k=200, head_dim=64, head_dim_v=64),
    "favor-causal-gqa": small(mode="fwd", feature_map="favor", mask="causal", num_features=32,
                              heads_q=4, heads_kv=2, seq_q=131, seq_k=131, head_dim=24,
                              head_dim_v=16),
    "favor-causal-d64": small(mode="fwd", feature_map="favor", mask="causal", num_features=256,
                              batch=1, seq_q=256, seq_k=256, head_dim=64, head_dim_v=64),
}


def fused_kernel_name(case) -> str:
    how = "chunked-prefix(C=64)" if case.mask == "causal" else "global-state"
    favor = case.param("feature_map") == "favor"
    feats = f"favor(m={case.param('num_features')})" if favor else "elu"
    backward = ",fused-backward" if case.needs_grad else ""
    return f"{feats},fused-{how}{backward},{_native.isa()}"  # and the build that ran


@needs_native
@pytest.mark.parametrize("mask", ["none", "causal"])
def test_outputs_past_the_stream_threshold_match_the_formula(mask):
    """An output larger than the kernel's ``stream_bytes`` is written with non-temporal
    stores (simd_tiles.h's scaled_store): the same values reach it."""
    case = small(mode="fwd", batch=1, heads_q=8, heads_kv=8, seq_q=2112, seq_k=2112,
                 head_dim=64, head_dim_v=64, mask=mask)
    module = _native.load(_linear_fused.KERNEL)[0]
    assert case.heads_q * case.seq_q * case.head_dim_v * 4 > module.stream_bytes
    inputs = case.make_inputs()
    prepared = BACKEND.prepare(case, inputs)
    assert prepared.extras["kernel"] == fused_kernel_name(case)
    got = prepared.outputs(prepared.fn())["out"]
    want = brute_force(case, inputs.q, inputs.k, inputs.v)  # (B, Hq, N, Dv) float64
    assert rel(got, want) < 1e-6, rel(got, want)


@needs_native
@pytest.mark.parametrize("name", list(FUSED))
def test_fused_forward_matches_own_reference_and_brute_force(name):
    case = FUSED[name]
    inputs = case.make_inputs()
    prepared = BACKEND.prepare(case, inputs)
    assert prepared.extras["kernel"] == fused_kernel_name(case)
    got = prepared.outputs(prepared.fn())["out"]
    assert got.dtype == torch.float32 and torch.isfinite(got).all()
    # FAVOR+'s exp amplifies the fp32 projection's rounding: the eager path reads 1.1e-6
    # on favor-d64, elu's both read about 1.4e-7
    tol = 4e-6 if case.param("feature_map") == "favor" else 1e-6
    assert rel(got, BACKEND.impl_reference(case, inputs).as_dict()["out"]) < tol
    assert rel(got, brute_force(case, inputs.q, inputs.k, inputs.v)) < tol


@needs_native
@pytest.mark.parametrize("feature_map", ["elu", "favor"])
@pytest.mark.parametrize("causal", [False, True])
def test_fused_forward_reads_strided_rows_in_place(feature_map, causal):
    """q, k, v as (B, N, H, D) storage seen as (B, H, N, D): rows H * D floats apart, read
    (and the next chunk's prefetched) where they lie; bitwise the contiguous inputs' result,
    over several chunks and a short last one."""
    B, H, N, D = 1, 3, 200, 32
    torch.manual_seed(3)
    q, k, v = (torch.randn(B, N, H, D).transpose(1, 2) for _ in range(3))  # (B, H, N, D)
    assert k.stride(2) == H * D
    panels, half = torch.empty(0), 0.0
    if feature_map == "favor":
        case = small(heads_q=H, heads_kv=H, seq_q=N, seq_k=N, head_dim=D, head_dim_v=D,
                     feature_map="favor", num_features=32, mode="fwd")
        panels = _linear_fused.pack_projection(
            L.scaled_projection(L.favor_projection(case), case.softmax_scale, torch.float32))
        half = case.softmax_scale / 2
    strided = _linear_fused.fused_forward(q, k, v, causal, panels, half)
    dense = _linear_fused.fused_forward(q.contiguous(), k.contiguous(), v.contiguous(), causal,
                                        panels, half)
    assert torch.isfinite(dense).all() and torch.equal(strided, dense)


@needs_native
@pytest.mark.parametrize("mode", ["fwd", "fwd_bwd"])
@pytest.mark.parametrize("mask", ["none", "causal"])
def test_fused_favor_rescales_when_later_keys_raise_the_shift(mask, mode):
    """Keys whose norms shrink along the sequence: their exponents W'k - |k'|^2 / 2 grow
    (from about -50 to a few), so every 64-key chunk raises FAVOR+'s running key shift and
    the sums over earlier keys are rescaled chunk after chunk (and, going backwards, the
    gradients the later chunks send to earlier keys); without the rescaling the first keys
    would weigh e^50 times too much. The result is the formula's all the same."""
    case = small(mode=mode, feature_map="favor", mask=mask, num_features=32, batch=1,
                 heads_q=2, heads_kv=2, seq_q=320, seq_k=320, head_dim=16, head_dim_v=16)
    inputs = case.make_inputs()
    growth = torch.linspace(6.0, 0.5, case.seq_k).view(1, 1, -1, 1)  # (1, 1, N, 1)
    inputs = Inputs(inputs.q, inputs.k * growth, inputs.v, inputs.grad_out)
    prepared = BACKEND.prepare(case, inputs)
    assert prepared.extras["kernel"] == fused_kernel_name(case)
    got = prepared.outputs(prepared.fn())
    q, k, v = (t.detach().double().requires_grad_(True) for t in (inputs.q, inputs.k, inputs.v))
    want = brute_force(case, q, k, v)  # (B, Hq, N, Dv), float64 with autograd
    assert torch.isfinite(got["out"]).all()
    assert rel(got["out"], want) < 1e-5
    if case.needs_grad:
        grads = torch.autograd.grad(want, (q, k, v), inputs.grad_out.double())
        for name, g in zip(("dq", "dk", "dv"), grads):
            assert torch.isfinite(got[name]).all() and rel(got[name], g) < 1e-5, name


# The fused forwards under autograd: the backward kernels (linear_backward and
# linear_causal_backward) from the states the forward kept.
FUSED_GRAD = {
    "gqa-cross": small(heads_q=6, heads_kv=2, seq_q=70, seq_k=131, head_dim=32,
                       head_dim_v=16),
    "d64": small(batch=1, seq_q=200, seq_k=200, head_dim=64, head_dim_v=64),
    "favor-gqa-cross": small(feature_map="favor", num_features=48, heads_q=6, heads_kv=2,
                             seq_q=70, seq_k=131, head_dim=32, head_dim_v=16),
    "favor-d64": small(feature_map="favor", num_features=256, batch=1, seq_q=200, seq_k=200,
                       head_dim=64, head_dim_v=64),
    # causal: the last chunk partial
    "causal-gqa": small(mask="causal", heads_q=6, heads_kv=2, seq_q=170, seq_k=170,
                        head_dim=32, head_dim_v=16),
    "causal-d64": small(mask="causal", batch=1, seq_q=256, seq_k=256, head_dim=64,
                        head_dim_v=64),
    "favor-causal-gqa": small(feature_map="favor", mask="causal", num_features=32, heads_q=4,
                              heads_kv=2, seq_q=150, seq_k=150, head_dim=16, head_dim_v=16),
    "favor-causal-d64": small(feature_map="favor", mask="causal", num_features=256, batch=1,
                              seq_q=256, seq_k=256, head_dim=64, head_dim_v=64),
    "bwd-only": small(mode="bwd", batch=1, seq_q=128, seq_k=128, head_dim=16, head_dim_v=32),
}


@needs_native
@pytest.mark.parametrize("name", list(FUSED_GRAD))
def test_fused_forward_and_backward_match_own_reference(name):
    case = FUSED_GRAD[name]
    inputs = case.make_inputs()
    prepared = BACKEND.prepare(case, inputs)
    assert prepared.extras["kernel"] == fused_kernel_name(case)
    got = prepared.outputs(prepared.fn())
    ref = BACKEND.impl_reference(case, inputs).as_dict()  # autograd on the float64 formula
    assert set(got) >= set(ref) and len(ref) >= 3
    tol = 4e-6 if case.param("feature_map") == "favor" else 1e-6
    for key, r in ref.items():
        assert torch.isfinite(got[key]).all(), key
        assert rel(got[key], r) < tol, (key, rel(got[key], r))


@needs_native
@pytest.mark.parametrize("kw, kernel", [
    (dict(head_dim_v=8), "elu,global-state"),  # Dv not a multiple of 16
    (dict(feature_map="favor"), "favor(m=24),global-state"),  # m not a multiple of 16
    (dict(feature_map="favor", num_features=32), "favor(m=32),fused-global-state"),
    (dict(mask="causal", seq_q=30), "elu,chunked-prefix(C=64)"),  # causal, seq_q != seq_k
    (dict(mode="fwd_bwd"), "elu,fused-global-state,fused-backward"),
    (dict(mode="fwd_bwd", head_dim=24), "elu,global-state"),  # backward: D % 16 != 0
    (dict(mode="fwd_bwd", mask="causal"), "elu,fused-chunked-prefix(C=64),fused-backward"),
    (dict(mode="fwd_bwd", mask="causal", seq_q=30), "elu,chunked-prefix(C=64)"),
    (dict(dtype="bfloat16"), "elu,global-state"),
])
def test_fused_forward_runs_only_where_it_applies(kw, kernel):
    case = small(**{"mode": "fwd", "head_dim": 16, "head_dim_v": 16, **kw})
    inputs = case.make_inputs()
    prepared = BACKEND.prepare(case, inputs)
    # where the kernels ran, the record names the build (instruction set) that ran them
    assert prepared.extras["kernel"] == (f"{kernel},{_native.isa()}" if "fused-" in kernel
                                         else kernel)
    check_against_reference(case)


@pytest.mark.parametrize("mode", ["fwd", "fwd_bwd"])
def test_fused_forward_switched_off_says_why(monkeypatch, mode):
    monkeypatch.setenv(_native.DISABLE_ENV, "0")
    monkeypatch.setattr(_native, "_loaded", {})
    case = FUSED["d64"].replace(mode=mode)
    prepared = BACKEND.prepare(case, case.make_inputs())
    assert prepared.extras["kernel"] == ("elu,global-state (fused kernel unavailable: "
                                         "ATTNBENCH_NATIVE=0 (eager torch ops))")
    check_against_reference(case)


@needs_native
def test_kernels_refuse_malformed_arguments_with_a_message():
    """The C++ entry points check what they are given (a wrong size is an error, not a read
    past the end of a tensor)."""
    module, _ = _native.load("linear_attention")
    q, k, v = (torch.randn(1, 2, 64, 16) for _ in range(3))
    out, dout = torch.randn(1, 2, 64, 16), torch.randn(1, 2, 64, 16)
    state, zsum, shift = torch.zeros(1, 2, 16, 16), torch.zeros(1, 2, 16), torch.zeros(1, 2)
    none = torch.empty(0)
    grads = [torch.empty_like(t) for t in (q, k, v)]
    with pytest.raises(RuntimeError, match="wrong size"):
        module.linear_backward(q, k, v, none, none, 0.0, out, dout, state, zsum, shift,
                               grads[0][:, :1], grads[1], grads[2], 0, 2)
    with pytest.raises(RuntimeError, match="state must be"):
        module.linear_backward(q, k, v, none, none, 0.0, out, dout, state[:, :1], zsum, shift,
                               *grads, 0, 2)
    with pytest.raises(RuntimeError, match="prefix must be"):
        module.linear_causal(q, k, v, none, 0.0, out, torch.zeros(3), torch.zeros(3),
                             torch.zeros(3), 0, 2)
    with pytest.raises(RuntimeError, match="proj must be"):
        module.linear_state(k, v, torch.zeros(2, 8, 16), 0.0, state, zsum, shift, 0, 2)
