"""Errors against the reference (core/accuracy.py): an exact zero gradient is not wrong,
and the relative error's floor."""

import pytest
import torch

from attnbench.core import accuracy
from attnbench.core.case import Case
from attnbench.core.reference import case_reference
from attnbench.measure.case_cache import CaseCache
from attnbench.measure.execute import open_job


# ---- the relative error's floor -------------------------------------------------------
@pytest.mark.parametrize("mask", ["none", "causal"])
@pytest.mark.parametrize("backend", ["linear", "sdpa"])
def test_exact_zero_gradient_is_not_wrong(monkeypatch, mask, backend):
    """One query, one key: the output is v whatever q is, so the exact dq is 0."""
    monkeypatch.setenv("ATTNBENCH_NATIVE", "0")
    case = Case(batch=1, heads_q=1, heads_kv=1, seq_q=1, seq_k=1, head_dim=32,
                head_dim_v=32, mode="fwd_bwd", mask=mask)
    got = open_job(case, backend, CaseCache())
    record = getattr(got, "record", got)
    assert record.status == "ok", record.reason
    for tensor in ("out", "dq", "dk", "dv"):
        assert record.metrics[f"err_impl_{tensor}_rel"] < 1e-5


def test_floor_is_a_sixteenth_of_the_typical_norm_and_below_real_references():
    case = Case(batch=1, heads_q=2, heads_kv=2, seq_q=256, seq_k=256, head_dim=32,
                head_dim_v=32, mode="fwd_bwd", mask="causal")
    inputs = case.make_inputs()
    floor = accuracy.floors(case, inputs)
    typical = accuracy.typical_norms(case, inputs)
    ref = case_reference(case, inputs).as_dict()
    for name, t in ref.items():
        assert floor[name] == pytest.approx(typical[name] / 16)
        assert float(torch.linalg.vector_norm(t)) > floor[name]  # never applies here
    zero, small = torch.zeros(4, dtype=torch.float64), torch.full((4,), 1e-9)
    assert accuracy.errors(small, zero)[1] == float("inf")  # no floor: meaningless
    assert accuracy.errors(small, zero, 1.0)[1] == pytest.approx(2e-9)
