"""measure/correctness.py: backends on small cases against float64, each case in the run's
worker (a wrong backend is reported wrong, a crashing or hanging one costs its case alone),
and the Triton autotune's timer on the shared timing loop (a fake clock)."""

from __future__ import annotations

import pytest

from attnbench.core.case import Case
from attnbench.measure import correctness, timing


def tiny(seq: int = 8, **kw) -> Case:
    return Case(batch=1, heads_q=2, heads_kv=2, seq_q=seq, seq_k=seq, head_dim=8, head_dim_v=8,
                dtype="float32", device="cpu", mask="none", mode=kw.pop("mode", "fwd"), seed=1,
                **kw)


def test_in_process_check_passes_an_exact_backend_and_fails_a_wrong_one(fake_backends):
    good = correctness.record_row(correctness.check_here(tiny(mode="fwd_bwd"), "naive"))
    assert good["ok"] is True and good["status"] == "ok"
    assert {f"err_impl_{t}_rel" for t in ("out", "dq", "dk", "dv")} <= set(good)
    bad = correctness.record_row(correctness.check_here(tiny(), "fake_wrong"))
    assert bad["ok"] is False and bad["status"] == "wrong"
    assert "above the float32 tolerance" in bad["error"]
    assert not bad.get("cuda_fault")
    missing = correctness.record_row(correctness.check_here(tiny(), "fake_missing"))
    assert missing["ok"] is None and "attnbench_no_such_module" in missing["error"]


def test_a_wrong_backend_is_reported_wrong_by_the_worker(fake_backends):
    rows = correctness.check_cases("fake_wrong", [tiny(8), tiny(12)])
    assert [r["status"] for r in rows] == ["wrong", "wrong"]
    assert [r["ok"] for r in rows] == [False, False]
    assert rows[0]["err_impl_out_rel"] == pytest.approx(0.01, rel=1e-3)  # it scales by 1.01


def test_a_crash_costs_one_case(fake_backends):
    pairs = [(tiny(), "naive"), (tiny(), "fake_crash"), (tiny(12), "naive")]
    rows = correctness.check_jobs(pairs, jobs=2)
    assert [r["task"] for r in rows] == [0, 1, 2]
    assert [r["ok"] for r in rows] == [True, False, True], rows
    assert rows[1]["crashed"] and "SIGSEGV" in rows[1]["error"]


@pytest.mark.slow
def test_a_hang_costs_one_case(fake_backends):
    # a check makes one untimed call: the hang must be in the setup it runs, not in timing
    pairs = [(tiny(), "fake_setup_hang"), (tiny(12), "naive")]
    rows = correctness.check_jobs(pairs, jobs=1, timeout_s=15)
    assert [r["ok"] for r in rows] == [False, True], rows
    assert rows[0]["crashed"] and "did not finish in time" in rows[0]["error"]


def test_a_cuda_fault_retires_its_process():
    """An injected CUDA fault fails its task; the next task runs in a fresh process (an
    injected fault would fail every later task of its own)."""
    tasks = [correctness.Task(_ok, (i,), f"t{i}") for i in range(4)]
    rows: list[dict] = []
    stats = correctness.run_tasks(tasks, 1, rows.extend, {1: "cuda"})
    by_task = {r["task"]: r for r in rows}
    assert by_task[1]["ok"] is False and by_task[1]["cuda_fault"]
    assert [by_task[i]["ok"] for i in (0, 2, 3)] == [True, True, True]
    assert stats == {"crashed": 0, "retired": 1}
    assert len({by_task[i]["pid"] for i in (0, 2, 3)}) == 2  # before and after the fault


def _ok(i):
    import os

    return [{"check": f"t{i}", "tensor": "-", "ok": True, "pid": os.getpid()}]


def test_a_record_of_a_lost_cuda_context_is_a_cuda_fault():
    rec = correctness.check_here(tiny(), "no_such_backend")
    assert correctness.record_row(rec)["ok"] is None  # unavailable: no fault
    rec.update(status="error", reason="RuntimeError: CUDA error: an illegal memory access")
    assert correctness.record_row(rec)["cuda_fault"] is True


# ---- the Triton autotune's timer is the timing loop -----------------------------------------

def test_autotune_timer_is_the_shared_timing_loop(monkeypatch):
    """On a fake clock each call of the timed closure takes a known time: the timer's answer
    is the median of exactly ``reps`` timed calls after one warm-up call, as
    ``timing.measure_interleaved`` takes them."""
    K = pytest.importorskip("attnbench.implementations._triton_flash_kernels")
    now = [0.0]
    monkeypatch.setattr(timing, "clock", lambda: now[0])
    durations_ms = iter([50.0, 3.0, 1.0, 2.0, 9.0, 4.0])  # the first: the warm-up call
    calls = []

    def fn():
        calls.append(1)
        now[0] += next(durations_ms) * 1e-3

    assert K._bench_ms(fn, reps=5, device="cpu") == pytest.approx(3.0)
    assert len(calls) == 6


def test_autotune_timer_asks_the_loop_for_events_without_samplers(monkeypatch):
    """On a GPU the candidates are timed by the events method (its L2 flush before each call)."""
    K = pytest.importorskip("attnbench.implementations._triton_flash_kernels")
    seen = {}

    def spy(fns, device, budget, samplers=None, **kw):
        seen.update(device=device, method=budget.method, reps=(budget.min_reps, budget.max_reps),
                    samplers=samplers)
        return [timing.Timing(samples_ms=[2.0, 1.0, 3.0])]

    monkeypatch.setattr(timing, "measure_interleaved", spy)
    assert K._bench_ms(lambda: None) == 2.0
    assert seen == {"device": "cuda", "method": "events", "reps": (10, 10), "samplers": []}
