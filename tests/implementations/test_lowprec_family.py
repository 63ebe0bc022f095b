"""FlashAttention's low-precision criterion for sliding_window and block_sparse, fp16 and bf16.

Against the float64 reference, the backend's max-abs error on out, dq, dk and dv must be at
most twice that of the same computation done eagerly in the same dtype (scores, masked
softmax, P @ V and autograd, all in fp16/bf16: FlashAttention's ``attention_ref(...,
upcast=False)``), plus a small absolute slack, as in FlashAttention's tests. Shapes are the
odd ones of FlashAttention's and xformers' suites: ragged lengths, head dims that are not a
power of two, GQA, and block sizes that do not divide the lengths.
"""

import math

import pytest
import torch

from attnbench.core.case import Case
from attnbench.core.masks import allowed_rows
from attnbench.core.reference import case_reference
from attnbench.implementations.block_sparse import BlockSparse
from attnbench.implementations.sliding_window import SlidingWindow

NAMES = ("out", "dq", "dk", "dv")
FACTOR = 2.0  # FlashAttention: error <= 2 x the eager same-dtype error ...
SLACK = 1e-5  # ... + 1e-5
SEEDS = range(8)


def eager(case: Case, inputs) -> dict[str, torch.Tensor]:
    """Plain attention in the case's dtype, gradients by autograd (upcast=False)."""
    q, k, v = (t.detach().requires_grad_(True) for t in (inputs.q, inputs.k, inputs.v))
    G = case.group_size
    kk, vv = k.repeat_interleave(G, dim=1), v.repeat_interleave(G, dim=1)  # (B, Hq, Nk, D)
    s = (q @ kk.transpose(-1, -2)) * case.softmax_scale  # (B, Hq, Nq, Nk)
    allowed = allowed_rows(case.mask_spec, 0, case.seq_q, case.seq_q, case.seq_k,
                           layout=case.block_layout,
                           block_size=case.param("block_size"))  # (Nq, Nk)
    seen = allowed.any(dim=-1, keepdim=True)  # (Nq, 1) rows that see a key
    s = s.masked_fill(~allowed, -math.inf).masked_fill(~seen, 0)
    p = torch.softmax(s, dim=-1).masked_fill(~seen, 0)  # empty rows output 0
    out = p @ vv  # (B, Hq, Nq, Dv)
    grads = torch.autograd.grad(out, (q, k, v), inputs.grad_out)
    return dict(zip(NAMES, (out.detach(), *grads)))


def max_errors(backend, case: Case) -> dict[str, tuple[float, float]]:
    """name -> (backend's, eager's) max-abs error against the float64 reference."""
    assert backend.not_supported_reasons(case) == []
    inputs = case.make_inputs()
    prepared = backend.prepare(case, inputs)
    got = prepared.outputs(prepared.fn())
    base = eager(case, inputs)
    ref = case_reference(case, inputs).as_dict()
    out = {}
    for name in NAMES:
        assert got[name].dtype == case.torch_dtype and got[name].shape == ref[name].shape
        out[name] = tuple(float((x[name].double() - ref[name]).abs().max())
                          for x in (got, base))
    return out


def check(backend, case: Case):
    """The criterion on every seed: it compares maxima, so one draw per shape says little."""
    failures = []
    for seed in SEEDS:
        errors = max_errors(backend, case.replace(seed=seed))
        bad = {n: (b, e) for n, (b, e) in errors.items() if not b <= FACTOR * e + SLACK}
        if bad:
            failures.append(f"seed {seed}: (backend, eager) max-abs errors {bad}")
    assert not failures, f"{case.key}\n" + "\n".join(failures)


DTYPES = ["bfloat16", "float16"]

# (seq_q, seq_k, left, right, heads_q, heads_kv, head_dim)
WINDOW_SHAPES = [
    pytest.param(113, 203, 17, 5, 1, 1, 40, id="113x203-w17,5-d40"),
    pytest.param(1, 239, 64, 64, 2, 2, 59, id="1x239-w64,64-d59"),
    pytest.param(256, 255, 202, 0, 1, 1, 64, id="256x255-w202,0-d64"),
    pytest.param(239, 1, 64, 64, 2, 2, 111, id="239x1-w64,64-d111"),
    pytest.param(128, 217, 0, 0, 4, 2, 111, id="128x217-w0,0-gqa-d111"),
    pytest.param(217, 128, 64, 64, 6, 2, 59, id="217x128-w64,64-gqa-d59"),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("nq,nk,left,right,hq,hkv,d", WINDOW_SHAPES)
def test_sliding_window(nq, nk, left, right, hq, hkv, d, dtype):
    check(SlidingWindow(), Case(batch=1, heads_q=hq, heads_kv=hkv, seq_q=nq, seq_k=nk,
                                head_dim=d, head_dim_v=d, mask=f"window({left},{right})",
                                dtype=dtype, mode="fwd_bwd"))


def every_block(nq, nk, block):
    """Explicit pairs covering every (query block, key block) tile."""
    return tuple((i, j) for i in range(-(-nq // block)) for j in range(-(-nk // block)))


# (seq_q, seq_k, layout, block_size, heads_q, heads_kv, head_dim)
BLOCK_SHAPES = [
    pytest.param(113, 203, "local", 32, 1, 1, 40, id="113x203-local-b32-d40"),
    pytest.param(256, 255, "explicit", 48, 1, 1, 64, id="256x255-all-b48-d64"),
    pytest.param(1, 239, "bigbird", 32, 2, 2, 59, id="1x239-bigbird-b32-d59"),
    pytest.param(239, 1, "local", 32, 2, 2, 111, id="239x1-local-b32-d111"),
    pytest.param(128, 217, "bigbird", 24, 4, 2, 111, id="128x217-bigbird-b24-gqa-d111"),
    pytest.param(217, 217, "explicit", 40, 6, 2, 64, id="217x217-all-b40-gqa-d64"),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("nq,nk,layout,block,hq,hkv,d", BLOCK_SHAPES)
def test_block_sparse(nq, nk, layout, block, hq, hkv, d, dtype):
    pairs = every_block(nq, nk, block) if layout == "explicit" else ()
    check(BlockSparse(), Case(batch=1, heads_q=hq, heads_kv=hkv, seq_q=nq, seq_k=nk,
                              head_dim=d, head_dim_v=d, mask=f"block_sparse({layout})",
                              dtype=dtype, mode="fwd_bwd", block_size=block,
                              block_pairs=pairs))
