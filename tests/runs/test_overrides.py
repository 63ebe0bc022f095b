"""--backends narrowing a suite's sweeps (runs/overrides.py)."""

from __future__ import annotations

import pytest

from attnbench.core.errors import BadInput
from attnbench.runs.overrides import select


def _pairs(jobs):
    return {(case.mask, backend) for case, backend in jobs}


def test_backends_narrow_each_sweep_instead_of_replacing_it():
    suite, _, jobs = select("family", "sliding_window,sdpa", seq_len="1024,2048",
                            device="cpu")
    backends = {b for _, b in jobs}
    assert backends == {"sliding_window", "sdpa"}
    # sliding_window only where the suite lists it (window cases), sdpa never on them
    assert {m for m, b in _pairs(jobs) if b == "sliding_window"} == {"window(255,0)"}
    assert "window(255,0)" not in {m for m, b in _pairs(jobs) if b == "sdpa"}
    assert not any(m.startswith("block_sparse") for m, _ in _pairs(jobs))
    assert any("left out sweeps" in n and "sparse-layouts" in n for n in suite.notes)


def test_a_backend_no_sweep_lists_runs_only_on_cases_it_supports():
    from attnbench.core.registry import get_backend
    suite, _, jobs = select("family", "sliding_window,naive,additive", seq_len="1024",
                            device="cpu")
    assert not suite.notes or all("listed by no sweep" not in n for n in suite.notes)
    suite, _, jobs = select("quick", "linear,naive", device="cpu")
    assert {b for _, b in jobs} == {"linear", "naive"}
    assert all(not get_backend(b).not_supported_reasons(c) for c, b in jobs)
    assert any("linear is listed by no sweep" in n for n in suite.notes)
    unsupported = [c for c, b in select("quick", "naive", device="cpu")[2]
                   if get_backend("linear").not_supported_reasons(c)]
    assert len([1 for _, b in jobs if b == "linear"]) == \
        len(select("quick", "naive", device="cpu")[2]) - len(unsupported)


def test_backends_that_no_sweep_can_run_are_refused_with_one_line():
    with pytest.raises(BadInput, match="no sweep"):
        select("quick", "sliding_window", device="cpu")
