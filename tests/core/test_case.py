"""Case identity, FLOP counting by visible pairs, and deterministic inputs."""

import pytest
import torch

from attnbench.core.case import Case
from attnbench.core.masks import allowed_rows


def brute_pairs(case: Case) -> int:
    allowed = allowed_rows(case.mask_spec, 0, case.seq_q, case.seq_q, case.seq_k, "cpu",
                           case.block_layout, case.param("block_size"))
    return case.seq_q * case.seq_k if allowed is None else int(allowed.sum())


@pytest.mark.parametrize("mask", ["none", "causal", "window(5,2)", "window(0,0)",
                                  "block_sparse(local)", "block_sparse(bigbird)"])
@pytest.mark.parametrize("nq,nk", [(40, 40), (23, 57), (57, 23)])
def test_visible_pairs_match_the_mask(mask, nq, nk):
    case = Case(seq_q=nq, seq_k=nk, mask=mask, block_size=8)
    assert case.visible_pairs == brute_pairs(case)


def test_flops_count_visible_pairs():
    dense = Case(seq_q=1024, seq_k=1024, heads_q=8, head_dim=64)
    causal = dense.replace(mask="causal")
    assert dense.flops == 4 * 1 * 8 * 1024 * 1024 * 64
    assert causal.flops == 4 * 8 * (1024 * 1025 // 2) * 64  # about half
    window = dense.replace(mask="window(255,0)")
    assert window.flops / dense.flops == pytest.approx((1024 * 256 - 255 * 256 / 2) / 1024**2)
    assert window.flops_dense == dense.flops
    assert dense.replace(mode="bwd").flops == 2.5 * dense.flops
    assert dense.replace(mode="fwd_bwd").flops == 3.5 * dense.flops
    # d_v != d_k: QK^T costs D per pair, PV costs Dv per pair
    assert dense.replace(head_dim_v=32).flops == 2 * 8 * 1024 * 1024 * (64 + 32)


def test_block_sparse_flops_count_nonzero_blocks():
    case = Case(seq_q=8192, seq_k=8192, mask="block_sparse(bigbird)", block_size=64,
                block_band=3, block_global=2, block_random=4)
    layout = case.block_layout
    assert layout.shape == (128, 128)
    assert case.flops == case.flops_dense * layout.float().mean().item()
    assert 0.05 < case.density < 0.15  # "about 10% of blocks"
    # a fixed number of blocks per row keeps the cost linear in N
    row_counts = layout.sum(dim=1)[4:-4]
    assert row_counts.max() - row_counts.min() <= 2


def test_key_is_stable_and_names_non_default_knobs():
    a = Case(seq_q=128, seq_k=128, dtype="bf16", mask="causal")
    assert a.key == "b1-hq8-hkv8-q128-k128-d64-dv64-bfloat16-cpu-causal-fwd-s0"
    b = a.replace(block_size=32)
    assert b.key.endswith("-block_size=32") and b.key != a.key
    assert Case(mask="window(3, 1)").mask == "window(3,1)"


def test_inputs_are_deterministic_across_dtypes():
    case = Case(seq_q=16, seq_k=16, heads_q=2, heads_kv=1, head_dim=8, mode="fwd_bwd")
    a, b = case.make_inputs(), case.make_inputs()
    assert torch.equal(a.q, b.q) and torch.equal(a.grad_out, b.grad_out)
    assert a.k.shape == (1, 1, 16, 8)
    low = case.replace(dtype="bfloat16").make_inputs()
    assert torch.allclose(low.q.float(), a.q, atol=1e-2)
    assert case.replace(mode="fwd").make_inputs().grad_out is None
    assert not torch.equal(case.replace(seed=1).make_inputs().q, a.q)


@pytest.mark.parametrize("kwargs,message", [
    ({"heads_q": 6, "heads_kv": 4}, "multiple of heads_kv"),
    ({"seq_q": 0}, "positive"),
    ({"dtype": "float8"}, "allowed: float64"),
    ({"mask": "diagonal"}, "unknown mask"),
    ({"mode": "train"}, "unknown mode"),
    ({"mask": "block_sparse(random)"}, "unknown block layout"),
])
def test_invalid_cases_say_what_is_allowed(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Case(**kwargs)


def test_dtype_names_and_sizes_match_torch():
    # dtypes.py holds names and element sizes as data (a suite loads without torch): the
    # table must say what torch says.
    from attnbench.core.dtypes import DTYPES, dtype_name, element_size, torch_dtype

    for name, size in DTYPES.items():
        assert torch_dtype(name) == getattr(torch, name)
        assert element_size(name) == torch_dtype(name).itemsize == size
        assert dtype_name(torch_dtype(name)) == name
    assert element_size("bf16") == 2
