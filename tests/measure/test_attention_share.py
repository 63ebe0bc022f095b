"""measure/model_step.attention_share: passes of the step timed by the one timing loop, the
attention calls inside each marked by AttentionClock on the loop's clock (a fake clock)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from attnbench.measure import hf_adapter, model_step, timing


@pytest.fixture
def fake_step(monkeypatch):
    """A step of 10 ms of which 4 ms are inside attention, on a fake clock."""
    now = [0.0]
    monkeypatch.setattr(timing, "clock", lambda: now[0])
    attn = SimpleNamespace(clock=None)
    monkeypatch.setattr(hf_adapter, "adapter", lambda name: attn)
    calls = []

    def step():
        calls.append(1)
        now[0] += 0.003
        attn.clock.start()
        now[0] += 0.004
        attn.clock.stop()
        now[0] += 0.003

    monkeypatch.setattr(model_step, "step_closure", lambda built, backend, s: step)
    built = SimpleNamespace(model=torch.nn.Linear(1, 1))
    return built, calls


def test_each_pass_is_one_timed_call_of_the_loop(fake_step):
    built, calls = fake_step
    cols = model_step.attention_share(built, "sdpa", "fwd", passes=6)
    assert cols["attn_share_samples"] == pytest.approx([0.4] * 6)
    assert cols["attn_share"] == pytest.approx(0.4)
    assert len(calls) == 6  # no warm-up: the step was timed just before


def test_the_passes_ask_the_loop_for_events_without_samplers(fake_step, monkeypatch):
    """On a GPU: CUDA events after the L2 flush, never a graph (the clock synchronises)."""
    built, _ = fake_step
    seen = {}
    real = timing.measure_interleaved

    def spy(fns, device, budget, samplers=None, **kw):
        seen.update(method=budget.method, reps=(budget.min_reps, budget.max_reps),
                    warmup=(budget.min_warmup, budget.warmup_s), samplers=samplers)
        return real(fns, device, budget, samplers=samplers, **kw)

    monkeypatch.setattr(model_step, "measure_interleaved", spy)
    model_step.attention_share(built, "sdpa", "train", passes=4)
    assert seen == {"method": "events", "reps": (4, 4), "warmup": (0, 0.0), "samplers": []}


def test_eager_has_no_share(fake_step):
    built, calls = fake_step
    assert "attn_share" not in model_step.attention_share(built, "eager", "fwd", passes=3)
    assert calls == []
