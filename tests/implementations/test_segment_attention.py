"""The fused segment kernels (sliding_window's and block_sparse's fp32 CPU forward and
backward): their geometry against the masks' own definition, outputs and gradients against
float64, their refusals, and the eager fallback when they are switched off."""

import math

import pytest
import torch
from kernel_paths import needs_native

from attnbench.core.case import Case
from attnbench.core.masks import MaskSpec, allowed_rows
from attnbench.core.reference import case_reference
from attnbench.implementations import _native
from attnbench.implementations import _segment_attention as segments
from attnbench.implementations.block_sparse import BlockSparse, case_layout
from attnbench.implementations.sliding_window import SlidingWindow

needs_kernel = needs_native


def covered(plan: segments.SegmentPlan) -> tuple[torch.Tensor, torch.Tensor]:
    """(seq_q, seq_k) booleans: keys each row computes a score for, and keys it may see."""
    computed = torch.zeros(plan.seq_q, plan.seq_k, dtype=torch.bool)
    for b in range(plan.n_blocks):
        r0, r1 = b * plan.block, min(plan.seq_q, (b + 1) * plan.block)
        for s in range(int(plan.ptr[b]), int(plan.ptr[b + 1])):
            a = int(plan.start[s])
            assert not computed[r0:r1, a:a + int(plan.length[s])].any(), "segments overlap"
            computed[r0:r1, a:a + int(plan.length[s])] = True
    rows = torch.arange(plan.seq_q)[:, None]
    cols = torch.arange(plan.seq_k)[None, :]
    band = (cols >= rows + plan.lo_off) & (cols <= rows + plan.hi_off)
    return computed, computed & band


WINDOWS = [(77, 77, 5, 3, 32), (37, 90, 5, 0, 16), (90, 37, 5, 2, 32), (64, 64, 0, 0, 32),
           (50, 70, 69, 49, 32), (300, 300, 255, 0, 64), (40, 40, 0, 9, 64)]


@pytest.mark.parametrize("nq,nk,left,right,block", WINDOWS)
def test_window_segments_see_exactly_the_window(nq, nk, left, right, block):
    plan = segments.window_segments(nq, nk, left, right, block)
    computed, seen = covered(plan)
    spec = MaskSpec.parse(f"window({left},{right})")
    assert torch.equal(seen, allowed_rows(spec, 0, nq, nq, nk))
    assert plan.computed_pairs() == int(computed.sum())
    assert (plan.length > 0).all()


@pytest.mark.parametrize("mask,knobs", [
    ("block_sparse(bigbird)", {}), ("block_sparse(local)", {"block_band": 2}),
    ("block_sparse(strided)", {}),
    ("block_sparse(explicit)", {"block_pairs": ((0, 0), (0, 1), (0, 3), (2, 1), (3, 3))})])
@pytest.mark.parametrize("nq,nk", [(100, 100), (45, 130), (130, 45)])
def test_layout_segments_see_exactly_the_layout(mask, knobs, nq, nk):
    case = Case(seq_q=nq, seq_k=nk, mask=mask, block_size=16, **knobs)
    layout = case_layout(case)
    plan = segments.layout_segments(layout, nq, nk, 16)
    computed, seen = covered(plan)
    expected = allowed_rows(case.mask_spec, 0, nq, nq, nk, layout=layout, block_size=16)
    assert torch.equal(seen, expected) and torch.equal(computed, expected)
    # consecutive visible tiles are one segment: fewer calls than tiles wherever a run exists
    assert plan.start.numel() <= int(layout.sum())
    assert plan.computed_pairs() == int(computed.sum())


def rel(a, b):
    b = b.double()
    return float((a.double() - b).norm() / b.norm().clamp_min(1e-30))


CASES = [
    pytest.param("sliding_window", dict(seq_q=77, seq_k=77, mask="window(5,3)"), id="win-odd"),
    pytest.param("sliding_window", dict(seq_q=90, seq_k=37, mask="window(5,2)"),
                 id="win-empty-rows"),
    pytest.param("sliding_window", dict(seq_q=37, seq_k=90, mask="window(5,0)", heads_q=6,
                                        heads_kv=2, head_dim_v=24), id="win-gqa-dv"),
    pytest.param("sliding_window", dict(seq_q=300, seq_k=300, mask="window(255,0)"),
                 id="win-255"),
    pytest.param("block_sparse", dict(seq_q=100, seq_k=100, mask="block_sparse(bigbird)",
                                      heads_q=4, heads_kv=2), id="bs-bigbird-gqa"),
    pytest.param("block_sparse", dict(seq_q=75, seq_k=75, mask="block_sparse(explicit)",
                                      block_pairs=((0, 0), (0, 3), (1, 1), (2, 0), (4, 4))),
                 id="bs-empty-rows"),
    pytest.param("block_sparse", dict(seq_q=45, seq_k=130, mask="block_sparse(bigbird)",
                                      head_dim_v=8), id="bs-cross"),
    pytest.param("block_sparse", dict(seq_q=200, seq_k=200, mask="none",
                                      block_layout_name="bigbird"), id="bs-on-dense-case"),
    # tiles off the 16-key panels (regions of one block overlap), D not a multiple of 16
    pytest.param("block_sparse", dict(seq_q=130, seq_k=130, mask="block_sparse(strided)",
                                      block_size=24, head_dim=24, head_dim_v=32),
                 id="bs-tiles-off-panels"),
    pytest.param("sliding_window", dict(seq_q=130, seq_k=141, mask="window(40,3)",
                                        head_dim=40, head_dim_v=48), id="win-d40-dv48"),
]
BACKENDS = {"sliding_window": SlidingWindow(), "block_sparse": BlockSparse()}


@needs_kernel
@pytest.mark.parametrize("name,kw", CASES)
def test_fused_forward_matches_float64(name, kw):
    backend = BACKENDS[name]
    case = Case(batch=2, seed=5, **{"head_dim": 16, "head_dim_v": 16, "block_size": 16, **kw})
    inputs = case.make_inputs()
    prepared = backend.prepare(case, inputs)
    assert prepared.extras["kernel"].startswith("fused-segments"), prepared.extras["kernel"]
    got = prepared.outputs(prepared.fn())["out"]
    ref = (backend.impl_reference(case, inputs) or case_reference(case, inputs)).as_dict()
    assert got.dtype == torch.float32 and torch.isfinite(got).all()
    assert rel(got, ref["out"]) < 1e-6, rel(got, ref["out"])


@needs_kernel
@pytest.mark.parametrize("name,mask", [("sliding_window", "window(63,0)"),
                                       ("block_sparse", "block_sparse(bigbird)")])
def test_outputs_past_the_stream_threshold_match_float64(name, mask):
    """An output larger than the kernel's ``stream_bytes`` is written with non-temporal
    stores (simd_tiles.h's scaled_store): the same values reach it."""
    backend = BACKENDS[name]
    case = Case(heads_q=8, heads_kv=8, seq_q=2112, seq_k=2112, head_dim=64, head_dim_v=64,
                mask=mask, block_size=64)
    assert case.heads_q * case.seq_q * case.head_dim_v * 4 > segments_module().stream_bytes
    inputs = case.make_inputs()
    prepared = backend.prepare(case, inputs)
    assert prepared.extras["kernel"].startswith("fused-segments"), prepared.extras["kernel"]
    got = prepared.outputs(prepared.fn())["out"]
    ref = (backend.impl_reference(case, inputs) or case_reference(case, inputs)).as_dict()
    assert rel(got, ref["out"]) < 1e-6, rel(got, ref["out"])


def segments_module():
    return _native.load(segments.KERNEL)[0]


@needs_kernel
def test_fused_forward_reads_strided_inputs():
    backend = BACKENDS["sliding_window"]
    case = Case(batch=1, heads_q=2, heads_kv=2, seq_q=70, seq_k=70, head_dim=16,
                head_dim_v=16, mask="window(9,4)")
    inputs = case.make_inputs()
    f = backend.build(case, inputs)
    # (B, N, H, D) storage seen as (B, H, N, D): rows of one head are H*D apart
    q, k, v = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (inputs.q, inputs.k,
                                                                          inputs.v))
    assert not q.is_contiguous()
    with torch.no_grad():
        assert torch.equal(f(q, k, v), f(inputs.q, inputs.k, inputs.v))


@needs_kernel
def test_scores_sum_over_d_in_two_halves():
    """A score is two fp32 chains over d (each half of D), then their sum (simd_tiles.h,
    score_half): key 0's score 2^24 + 1 + 1 (d = 0, 16, 17 of D = 32) keeps both ones,
    which one chain rounds away (2^24 + 1 rounds to 2^24, twice). Key 1 scores 2^24, so
    key 0 takes e^2 / (1 + e^2) of the weight, not half."""
    n, d = 16, 32
    q = torch.ones(1, 1, n, d)  # (B, H, N, D)
    k = torch.zeros(1, 1, n, d)
    k[0, 0, 0, 0], k[0, 0, 0, 16], k[0, 0, 0, 17] = 2.0**24, 1.0, 1.0
    k[0, 0, 1, 0] = 2.0**24
    v = torch.zeros(1, 1, n, 16)
    v[0, 0, 0, 0] = 1.0
    plan = segments.window_segments(n, n, n, n, 16)
    out = segments.fused_forward(q, k, v, plan, 1.0)
    expected = math.exp(2) / (1 + math.exp(2))
    assert torch.allclose(out[0, 0, :, 0], torch.full((n,), expected), rtol=1e-5), out[0, 0, :, 0]


@needs_kernel
def test_kernel_refuses_segments_outside_the_keys():
    q = torch.randn(1, 1, 8, 4)
    kv = torch.randn(1, 1, 10, 4)
    good = segments.window_segments(8, 10, 2, 0, 4)
    bad = segments.SegmentPlan(8, 10, 4, good.ptr, good.start + 5, good.length, good.lo_off,
                               good.hi_off)
    with pytest.raises(RuntimeError, match="outside the keys"):
        segments.fused_forward(q, kv, kv, bad, 0.5)
    short = segments.SegmentPlan(8, 10, 4, good.ptr[:-1], good.start[:1], good.length[:1],
                                 good.lo_off, good.hi_off)
    with pytest.raises(RuntimeError, match="seg_ptr"):
        segments.fused_forward(q, kv, kv, short, 0.5)


@needs_kernel
@pytest.mark.parametrize("mode", ["fwd_bwd", "bwd"])
@pytest.mark.parametrize("name,kw", CASES)
def test_fused_backward_matches_float64(name, kw, mode):
    """Under autograd the kernel's backward runs where both head dims are multiples of 16
    (the others keep the eager path, and say so); every gradient against float64."""
    backend = BACKENDS[name]
    case = Case(batch=2, seed=5, mode=mode,
                **{"head_dim": 16, "head_dim_v": 16, "block_size": 16, **kw})
    inputs = case.make_inputs()
    prepared = backend.prepare(case, inputs)
    fits = case.head_dim % 16 == 0 and case.head_dim_v % 16 == 0
    kernel = prepared.extras["kernel"]
    assert kernel.startswith("fused-segments") == fits, kernel
    assert ("fused-backward" in kernel) == fits, kernel
    got = prepared.outputs(prepared.fn())
    ref = (backend.impl_reference(case, inputs) or case_reference(case, inputs)).as_dict()
    assert set(got) >= {"dq", "dk", "dv"}
    for key in ("dq", "dk", "dv"):
        assert torch.isfinite(got[key]).all(), key
        assert rel(got[key], ref[key]) < 1e-6, (key, rel(got[key], ref[key]))


@needs_kernel
def test_fused_backward_is_deterministic_and_saves_no_probabilities():
    """Each K/V head's dk and dv have one writer, in a fixed order: two calls agree to the
    bit. Autograd keeps q, k, v and two floats a row, not the O(N * W) probabilities."""
    case = Case(batch=1, heads_q=4, heads_kv=2, seq_q=300, seq_k=300, head_dim=32,
                head_dim_v=16, mask="window(40,7)", mode="fwd_bwd")
    inputs = case.make_inputs()
    f = BACKENDS["sliding_window"].build(case, inputs)
    grads = []
    for _ in range(2):
        q, k, v = (t.detach().requires_grad_() for t in (inputs.q, inputs.k, inputs.v))
        out = f(q, k, v)
        saved = [t for t in out.grad_fn.saved_tensors]
        out.backward(inputs.grad_out)
        grads.append((q.grad, k.grad, v.grad))
    assert all(torch.equal(a, b) for a, b in zip(*grads))
    extra = sum(t.numel() for t in saved) - sum(t.numel() for t in (q, k, v))
    assert extra == 2 * case.heads_q * case.seq_q, extra


@needs_kernel
def test_backward_kernel_refuses_head_dims_off_its_tiles():
    q = torch.randn(1, 1, 8, 24)
    kv = torch.randn(1, 1, 8, 24)
    plan = segments.window_segments(8, 8, 2, 0, 4)
    stats = torch.zeros(1, 1, 8, 2)
    grads = [torch.empty_like(q), torch.empty_like(kv), torch.empty_like(kv)]
    with pytest.raises(RuntimeError, match="multiples of 16"):
        segments_module().segment_attention_backward(
            q, kv, kv, q, stats, *grads, plan.ptr, plan.start, plan.length, plan.block,
            plan.lo_off, plan.hi_off, 0.5, 0, 1)


def test_switched_off_it_says_so_and_runs_eager(monkeypatch):
    monkeypatch.setenv(_native.DISABLE_ENV, "0")
    monkeypatch.setattr(_native, "_loaded", {})
    ok, reason = segments.kernel_status()
    assert not ok and "ATTNBENCH_NATIVE=0" in reason
    case = Case(seq_q=64, seq_k=64, head_dim=16, head_dim_v=16, mask="window(7,0)")
    inputs = case.make_inputs()
    prepared = BACKENDS["sliding_window"].prepare(case, inputs)
    assert prepared.extras["kernel"].startswith("eager(Bq=16) (fused kernel unavailable")
    out = prepared.outputs(prepared.fn())["out"]
    assert rel(out, case_reference(case, inputs).as_dict()["out"]) < 1e-6
    # its work is the eager blocks' (16-row blocks, 16 + 7 keys each), not the fused plan's
    assert BACKENDS["sliding_window"].work_flops(case) == 2 * 8 * 64 * 23 * 32


def test_code_hash_follows_the_kernel_sources(tmp_path, monkeypatch):
    assert {p.name for p in SlidingWindow.code_files} >= {"segment_attention.cpp",
                                                          "simd_tiles.h"}
    src = tmp_path / "kernel.cpp"
    src.write_text("one")
    monkeypatch.setattr(SlidingWindow, "code_files", (src,))
    before = SlidingWindow().code_hash()
    src.write_text("two")
    assert SlidingWindow().code_hash() != before
