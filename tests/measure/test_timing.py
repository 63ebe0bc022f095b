"""The timing loop (measure/timing.py): interleaved rounds, and recovery after a long
neighbour or the probe."""

from __future__ import annotations

import pytest

from attnbench.measure.timing import TimingBudget


def test_interleaved_rounds_on_cpu_time_a_call_that_follows_its_own_untimed_call():
    from attnbench.measure.timing import measure_interleaved

    calls = []
    fns = [lambda i=i: calls.append(i) for i in range(3)]
    timings = measure_interleaved(fns, "cpu", TimingBudget(warmup_s=0.0, budget_s=0.0,
                                                           min_reps=3, max_reps=3, rewarm_s=0.0))
    assert all(len(t.samples_ms) == 3 for t in timings)
    # after the warm-up calls: rounds start one closure later, each closure called twice in a
    # row (the untimed call, then the timed one)
    assert calls[-18:] == [0, 0, 1, 1, 2, 2, 1, 1, 2, 2, 0, 0, 2, 2, 0, 0, 1, 1]


class _Recovering:
    """A fake CPU that is slow right after a neighbour: a closure's call takes ``ms``, plus
    half of it more until ``recover_ms`` of its own calls have run since another closure
    (or the probe) last ran. The harness must time such a closure at ``ms``."""

    def __init__(self, clock, recover_ms: float = 8.0):
        self.clock, self.recover_ms = clock, recover_ms
        self.last, self.own_ms = None, 0.0
        self.log: list[tuple[str, float]] = []

    def closure(self, name: str, ms: float):
        def call():
            if self.last != name:
                self.last, self.own_ms = name, 0.0
            took = ms * (1.5 if self.own_ms < self.recover_ms else 1.0)
            self.clock.advance(took / 1e3)
            self.own_ms += took
            self.log.append((name, took))
        return call


@pytest.mark.parametrize("rewarm_s,short_ms,short_calls", [
    # one untimed call: warm-up 1 + 4 rounds x (untimed + timed); every sample after the
    # long neighbour is slow (round 3 starts with short, right after its own timed call)
    (0.0, [3.0, 3.0, 2.0, 3.0], 9),
    # 10 ms of untimed calls: 3 + 3 + 3 + 2 ms after the long neighbour (4 calls), 5 x 2 ms
    # in round 3: 1 + 5 + 5 + 6 + 5
    (0.01, [2.0] * 4, 22),
])
def test_a_short_call_after_a_long_neighbour_is_timed_once_it_has_recovered(
        fake_clock, rewarm_s, short_ms, short_calls):
    """After a 50 ms neighbour a 2 ms call is half as slow again for 8 ms of its own calls
    (the Xeon host's linear 4K beside sdpa, docs/design.md): one untimed call leaves every
    sample slow; untimed calls for ``rewarm_s`` time it as it runs alone."""
    from attnbench.measure.timing import measure_interleaved

    cpu = _Recovering(fake_clock)
    fns = [cpu.closure("short", 2.0), cpu.closure("long", 50.0)]
    budget = TimingBudget(warmup_s=0.0, budget_s=0.0, min_reps=4, max_reps=4,
                          rewarm_s=rewarm_s)
    short, long = measure_interleaved(fns, "cpu", budget)
    assert short.samples_ms == pytest.approx(short_ms)
    # a long call recovers within its own untimed call
    assert long.samples_ms == pytest.approx([50.0] * 4)
    assert sum(who == "short" for who, _ in cpu.log) == short_calls


class _FakeProbe:
    """The drift probe's interface: each reading is a 20 ms neighbour on the recovering
    CPU, read after every round."""

    def __init__(self, cpu):
        self.cpu, self.readings = cpu, []

    def read(self):
        self.cpu.closure("probe", 20.0)()
        self.readings.append((self.cpu.clock(), 100.0))
        return 100.0

    def maybe_read(self):
        return self.read()

    def readings_since(self, start):
        return [r for t, r in self.readings if t >= start]


def test_a_single_closure_recovers_from_the_probe_before_it_is_timed(fake_clock):
    from attnbench.measure.timing import measure_interleaved

    cpu = _Recovering(fake_clock)
    budget = TimingBudget(warmup_s=0.0, budget_s=0.0, min_reps=3, max_reps=3)
    (only,) = measure_interleaved([cpu.closure("only", 2.0)], "cpu", budget,
                                  probe=_FakeProbe(cpu))
    assert only.samples_ms == pytest.approx([2.0] * 3)
    assert len(only.probe_readings) == 4  # before the rounds and after each
