"""``timeout_s`` bounds a pair's timed work only; its setup (the worker's start, inputs,
reference, prepare, compile) has its own bound, ``timing.setup_timeout_s``, and a
``timeout`` record says which bound ran out."""

from __future__ import annotations

import os

import pytest

from attnbench.core.case import Case
from attnbench.core.errors import BadInput
from attnbench.measure.budget import TimingBudget
from attnbench.measure.worker import IsolatedExecutor, WorkerConfig
from attnbench.runs.suite import parse_suite

CASE = Case(batch=1, heads_q=1, heads_kv=1, seq_q=16, seq_k=16, head_dim=8, head_dim_v=8)
SLOW_SETUP_S = 6  # fake_slow_setup's prepare: longer than the timed work's bound below
TIMED_BOUND_S = 3  # far more than the timed work of a 16-token case needs


def budget(setup_timeout_s: float = 600.0) -> TimingBudget:
    return TimingBudget(warmup_s=0.0, budget_s=0.002, min_reps=1, max_reps=2,
                        setup_timeout_s=setup_timeout_s)


@pytest.fixture(scope="module")
def executor():
    """One worker with the fake backends (the variables it inherits are set first)."""
    from conftest import TESTS

    saved = {k: os.environ.get(k) for k in ("ATTNBENCH_PLUGINS", "PYTHONPATH", "FAKE_SETUP_S")}
    os.environ.update(ATTNBENCH_PLUGINS="fake_backends", FAKE_SETUP_S=str(SLOW_SETUP_S),
                      PYTHONPATH=os.pathsep.join(filter(None, [str(TESTS),
                                                               saved["PYTHONPATH"]])))
    ex = IsolatedExecutor(config=WorkerConfig(1))
    yield ex
    ex.close()
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def test_a_setup_longer_than_timeout_s_is_not_a_timeout(executor):
    """The issue's case: a healthy pair whose setup took longer than timeout_s (a loaded
    machine, a compile) was recorded ``timeout``."""
    (rec,) = executor.run_group([(CASE, "fake_slow_setup")], budget(), TIMED_BOUND_S)
    assert rec.status == "ok", rec.reason
    assert rec.to_row()["setup_s"] >= SLOW_SETUP_S


def test_a_setup_past_its_bound_is_a_timeout_naming_setup(executor):
    (warm,) = executor.run_group([(CASE, "naive")], budget(), 600)  # the worker is up
    assert warm.status == "ok"
    (rec,) = executor.run_group([(CASE, "fake_setup_hang")], budget(setup_timeout_s=2), 600)
    assert rec.status == "timeout"
    assert rec.reason == ("setup (inputs, reference, prepare and compile) took "
                                  "longer than its 2 s limit (timing.setup_timeout_s); "
                                  "worker killed")


def test_a_hang_in_the_timed_work_is_a_timeout_naming_timeout_s(executor):
    (rec,) = executor.run_group([(CASE, "fake_hang")], budget(), TIMED_BOUND_S)
    assert rec.status == "timeout"
    assert rec.reason == (f"the timed work gave no result within the "
                                  f"{TIMED_BOUND_S} s limit (timeout_s); worker killed")


def test_a_worker_that_does_not_start_within_the_setup_bound_is_a_timeout():
    ex = IsolatedExecutor(config=WorkerConfig(1))
    try:  # no interpreter imports torch within a millisecond
        (rec,) = ex.run_group([(CASE, "naive")], budget(setup_timeout_s=0.001), 600)
    finally:
        ex.close()
    assert rec.status == "timeout"
    assert rec.reason.startswith("setup (the worker's start) took longer than its "
                                         "0.001 s limit (timing.setup_timeout_s)")
    assert ex.proc is None


SUITE = {"backends": ["naive"], "axes": {"seq_len": [16]}}


def test_the_setup_bound_is_a_timing_key(tmp_path):
    suite = parse_suite(SUITE | {"timing": {"setup_timeout_s": 30, "timeout_s": 5}},
                        tmp_path / "s.toml")
    assert (suite.timing.setup_timeout_s, suite.timeout_s) == (30, 5.0)
    assert parse_suite(SUITE, tmp_path / "s.toml").timing.setup_timeout_s == 600


@pytest.mark.parametrize("value", [0, -1, float("inf"), "600", True, 1e9])
def test_a_bad_setup_bound_is_refused_in_one_line(tmp_path, value):
    with pytest.raises(BadInput) as err:
        parse_suite(SUITE | {"timing": {"setup_timeout_s": value}}, tmp_path / "s.toml")
    assert "timing.setup_timeout_s" in str(err.value) and "\n" not in str(err.value)
