"""The public API's answers to misuse: one line saying what is allowed, warnings that matter."""

from __future__ import annotations

import warnings

import pytest
import torch

import attnbench
from attnbench import api


def qkv(n=16, d=8):
    gen = torch.Generator().manual_seed(0)
    return tuple(torch.randn(1, 2, n, d, generator=gen) for _ in range(3))


@pytest.mark.parametrize("kwargs,expect", [
    ({"mask": "causal"}, "use causal=True or window=(left, right)"),
    ({"dtype": "float16"}, "read from the tensors"),
    ({"causl": True}, "unknown keyword 'causl'; allowed: causal, window, scale"),
])
def test_misused_keyword_is_one_line(kwargs, expect):
    with pytest.raises(TypeError) as info:
        attnbench.attention(*qkv(), backend="sdpa", **kwargs)
    message = str(info.value)
    assert expect in message and "\n" not in message


@pytest.fixture
def fresh_warnings(monkeypatch):
    monkeypatch.setattr(api, "_warned_approximate", set())


def test_approximate_backend_warns_once(fresh_warnings):
    q, k, v = qkv(n=128)  # 16 blocks of 8: bigbird keeps a few per row
    with pytest.warns(attnbench.ApproximationWarning, match="bigbird.*block_layout_name="):
        out = attnbench.attention(q, k, v, backend="block_sparse", block_size=8)
    exact = attnbench.reference(q, k, v)
    assert float((out.double() - exact).norm() / exact.norm()) > 1e-3  # really approximate
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        attnbench.attention(q, k, v, backend="block_sparse", block_size=8)  # once only


def test_exact_backends_do_not_warn(fresh_warnings):
    with warnings.catch_warnings():
        warnings.simplefilter("error", attnbench.ApproximationWarning)
        attnbench.attention(*qkv(), backend="sdpa", causal=True)
        attnbench.attention(*qkv(), backend="sliding_window", window=(3, 0))


def test_linear_warns_with_its_feature_map(fresh_warnings):
    with pytest.warns(attnbench.ApproximationWarning, match="feature map 'elu'"):
        attnbench.attention(*qkv(), backend="linear")
