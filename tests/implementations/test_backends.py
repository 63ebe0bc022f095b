"""Every registered backend, parametrized from its own capability data over the devices
present (the CPU always, CUDA when there is one), against float64 through the correctness
harness (attnbench.measure.correctness): in this process on the CPU, in the run's worker on
a GPU, where a CUDA fault must cost one case.

A backend that cannot run here must say why (unavailable, or unsupported with reasons);
one that runs must match the float64 evaluation of what it claims to compute.
"""

import math

import pytest
import torch
from host_neutral import judged_backend

import attnbench
from attnbench.core.accuracy import TENSORS
from attnbench.core.backend import EXACT
from attnbench.core.case import Case, Inputs
from attnbench.core.registry import all_backends
from attnbench.measure import correctness

BACKENDS = sorted(all_backends())
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
MASK_EXAMPLES = {"none": "none", "causal": "causal", "window": "window(3,2)",
                 "block_sparse": "block_sparse(bigbird)"}


def small_case(backend, mask_kind: str, mode: str, device: str = "cpu") -> Case:
    caps = backend.caps
    return Case(batch=1, heads_q=4, heads_kv=2 if caps.gqa else 4, seq_q=9,
                seq_k=13 if caps.cross_attention else 9, head_dim=16,
                head_dim_v=8 if caps.dv_differs else 16, dtype="float32", device=device,
                mask=MASK_EXAMPLES[mask_kind], mode=mode, block_size=4, seed=5)


def grid():
    for name in BACKENDS:
        b = all_backends()[name]
        for device in (d for d in DEVICES if d in b.caps.devices):
            for kind in b.caps.masks:
                for mode in ("fwd", "fwd_bwd"):
                    if mode in b.caps.modes and kind in MASK_EXAMPLES:
                        yield pytest.param(name, device, kind, mode,
                                           id=f"{name}-{device}-{kind}-{mode}")


@pytest.mark.parametrize("name", BACKENDS)
def test_availability_is_explained(name):
    ok, why = all_backends()[name].is_available()
    assert ok or (why and "\n" not in why)


@pytest.mark.parametrize("name,device,kind,mode", list(grid()))
def test_backend_matches_its_float64_function(name, device, kind, mode):
    backend = judged_backend(name, device)
    ok, why = backend.is_available()
    if not ok:
        pytest.skip(f"unavailable: {why}")
    case = small_case(backend, kind, mode, device)
    reasons = backend.not_supported_reasons(case)
    if reasons:
        assert all(r and "\n" not in r for r in reasons)
        pytest.skip("; ".join(reasons))
    if device == "cpu":  # in this process: fast, and the host-neutral stand-ins apply
        row = correctness.record_row(correctness.check_here(case, backend))
    else:
        row = correctness.check_cases(name, [case])[0]
    if row["ok"] is None:
        pytest.skip(f"{row['status']}: {row['error']}")
    assert row["ok"] is True, row
    tensors = ("out",) if mode == "fwd" else TENSORS
    assert all(f"err_impl_{t}_rel" in row for t in tensors), row  # every tensor was judged
    if device == "cpu":  # well within the tolerance where no TF32 or fused kernels differ
        for t in tensors:
            assert row[f"err_impl_{t}_rel"] < (2e-5 if t == "out" else 2e-4), row


# ---- golden examples from the seed articles, for every exact backend ----------------------

def exact_backends():
    return [n for n in BACKENDS if all_backends()[n].semantics == EXACT]


def run_exact(name, q, k, v):
    backend = judged_backend(name)
    ok, why = backend.is_available()
    if not ok:
        pytest.skip(f"unavailable: {why}")
    n = max(q.shape[2], k.shape[2])
    for kw in ({}, {"window": (n, n)}):  # a window wider than the sequence is no mask at all
        case = attnbench.case_for(q, k, v, **kw)
        if not backend.not_supported_reasons(case):
            return backend.build(case, Inputs(q, k, v))(q, k, v)
    pytest.skip("; ".join(backend.not_supported_reasons(attnbench.case_for(q, k, v))))


@pytest.mark.parametrize("name", exact_backends())
def test_golden_three_tokens(name):
    # "Transformers and Attention 13" section 7: X = [[1,0],[0,1],[1,1]], W = I, d_k = 2.
    x = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])[None, None]
    out = run_exact(name, x, x, x)[0, 0].double()
    expected = torch.tensor([[0.802, 0.599], [0.599, 0.802], [0.752, 0.752]],
                            dtype=torch.float64)
    assert torch.allclose(out, expected, atol=1.5e-3)


@pytest.mark.parametrize("name", exact_backends())
def test_golden_three_scores(name):
    # "From Bit to AGI, ch. 5": scores 2.0, 5.0, 1.0 with d_k = 2 -> weights [0.102, 0.848, 0.050]
    # (the article's table prints 0.06 / 0.87 / ..., which disagrees with its own text).
    q = torch.tensor([[1.0, 0.0]])[None, None]
    k = torch.tensor([[2.0, 0.0], [5.0, 0.0], [1.0, 0.0]])[None, None]
    v = torch.eye(3)[None, None]  # V = I makes the output row equal to the weights
    weights = run_exact(name, q, k, v)[0, 0, 0].double()
    assert torch.allclose(weights, torch.tensor([0.102, 0.848, 0.050], dtype=torch.float64),
                          atol=1e-3)
    exact = torch.softmax(torch.tensor([2.0, 5.0, 1.0], dtype=torch.float64) / math.sqrt(2), 0)
    assert torch.allclose(weights, exact, atol=1e-6)


@pytest.mark.parametrize("name", exact_backends())
def test_golden_two_tokens_with_projections(name):
    # "What Are Q, K and V in Attention?" section 3: X (2, 4) and W_q, W_k, W_v (4, 3).
    # The article's Q row 2 reads [2.30, 2.60, 2.90]; the formula gives [1.58, 1.84, 2.10]
    # (see docs/errata.md).
    x = torch.tensor([[0.1, 0.2, 0.3, 0.4], [0.5, 0.6, 0.7, 0.8]], dtype=torch.float64)
    base = torch.tensor([[0.1, 0.2, 0.3], [0.4, 0.5, 0.6], [0.7, 0.8, 0.9], [1.0, 1.1, 1.2]],
                        dtype=torch.float64)
    wq, wk, wv = base, base + 0.1, base + 0.2
    q, k, v = x @ wq, x @ wk, x @ wv
    assert torch.allclose(q, torch.tensor([[0.70, 0.80, 0.90], [1.58, 1.84, 2.10]],
                                          dtype=torch.float64), atol=1e-12)
    assert torch.allclose(k, torch.tensor([[0.80, 0.90, 1.00], [1.84, 2.10, 2.36]],
                                          dtype=torch.float64), atol=1e-12)
    assert torch.allclose(v, torch.tensor([[0.90, 1.00, 1.10], [2.10, 2.36, 2.62]],
                                          dtype=torch.float64), atol=1e-12)
    scores = q @ k.T / math.sqrt(3)
    expected = torch.softmax(scores, dim=-1) @ v  # (2, 3)
    out = run_exact(name, *(t.float()[None, None] for t in (q, k, v)))[0, 0].double()
    assert torch.allclose(out, expected, atol=2e-5)
