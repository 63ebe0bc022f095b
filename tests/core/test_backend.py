"""Work counted per backend (core/backend.py's work_flops) on each backend's own cases."""

from __future__ import annotations

import math

import pytest

from attnbench.core.case import Case
from attnbench.core.registry import all_backends


@pytest.mark.parametrize("name,case", [
    ("block_sparse", Case(seq_q=2048, seq_k=2048, head_dim=64, head_dim_v=64,
                          block_layout_name="bigbird", block_size=64)),
    ("linear", Case(seq_q=4096, seq_k=4096, head_dim=64, head_dim_v=64)),
    ("sliding_window", Case(seq_q=4096, seq_k=4096, mask="window(255,0)")),
    ("additive", Case(seq_q=512, seq_k=512)),
    ("sdpa", Case(seq_q=512, seq_k=512, mask="causal")),
])
def test_work_is_counted_per_backend(name, case):
    backend = all_backends()[name]
    work = backend.work_flops(case)
    assert work > 0 and math.isfinite(work)
    if name == "sdpa":
        assert work == case.flops
    if name == "linear":  # O(N) work: far below the dense count
        assert work < case.flops_dense / 10
    if name == "sliding_window":  # the band and its ragged edge, far below dense
        assert case.flops <= work < case.flops_dense / 4
    if name == "block_sparse":  # the layout's tiles of a dense case
        assert work < case.flops_dense / 2
