"""Small misbehaving backends that make every record status reachable in tests.

Loaded through ATTNBENCH_PLUGINS=fake_backends (tests/ is on sys.path under pytest,
and the isolated worker inherits both the path and the variable).
"""

from __future__ import annotations

import os
import signal
import sys
import time

import torch

from attnbench.core.backend import Backend, Capabilities
from attnbench.core.errors import NotSupported
from attnbench.core.heads import repeat_kv


def _exact(case):
    def f(q, k, v):
        k, v = repeat_kv(k, case.group_size), repeat_kv(v, case.group_size)
        p = torch.softmax(q @ k.transpose(-1, -2) * case.softmax_scale, dim=-1)
        return p @ v

    return f


class Fake(Backend):
    caps = Capabilities(masks=("none",))

    def build(self, case, inputs):
        return _exact(case)


class OomAbove(Fake):
    """Raises MemoryError (as an allocator would) for seq_q above a threshold."""

    name = "fake_oom"

    def build(self, case, inputs):
        if case.seq_q > 32:
            raise MemoryError(f"pretend allocation of {case.seq_q ** 2} elements failed")
        return _exact(case)


class Raises(Fake):
    name = "fake_error"

    def build(self, case, inputs):
        def f(q, k, v):
            raise RuntimeError("kernel launch failed: invalid configuration\nsecond line")

        return f


class Crashes(Fake):
    name = "fake_crash"

    def build(self, case, inputs):
        os.kill(os.getpid(), signal.SIGSEGV)


class Hangs(Fake):
    """Hangs in its timed calls: the first call (the checked one, in setup) returns."""

    name = "fake_hang"

    def build(self, case, inputs):
        exact, calls = _exact(case), []

        def f(q, k, v):
            calls.append(1)
            if len(calls) > 1:
                time.sleep(3600)
            return exact(q, k, v)

        return f


class HangsInSetup(Fake):
    """Its prepare never ends: setup, not the timed work, runs past its bound."""

    name = "fake_setup_hang"

    def build(self, case, inputs):
        time.sleep(3600)


class SlowSetup(Fake):
    """Exact attention after a prepare of FAKE_SETUP_S seconds (default 5): a setup longer
    than the timed work's bound, which must not count against it."""

    name = "fake_slow_setup"

    def build(self, case, inputs):
        time.sleep(float(os.environ.get("FAKE_SETUP_S", "5")))
        return _exact(case)


class Nan(Fake):
    name = "fake_nan"

    def build(self, case, inputs):
        return lambda q, k, v: torch.full_like(q, float("nan"))


class SlightlyWrong(Fake):
    name = "fake_wrong"

    def build(self, case, inputs):
        exact = _exact(case)
        return lambda q, k, v: exact(q, k, v) * 1.01


class Missing(Fake):
    name = "fake_missing"
    caps = Capabilities(masks=("none",), requires=("attnbench_no_such_module",))


class Refuses(Fake):
    """Capabilities say yes; the library refuses at setup (like a pinned SDPA kernel)."""

    name = "fake_refuses"

    def build(self, case, inputs):
        raise NotSupported(self.name, ["library refused: head_dim must be a multiple of 8"])


class FakeClock:
    """A clock that moves only when told: the drifting backends advance it by exactly the
    time their call "takes", so the timer reads exact durations on any machine, under any
    load. ``install()`` makes it the timer's clock (``measure.timing.clock``) and Drift's."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds

    def install(self) -> FakeClock:
        from attnbench.measure import timing

        timing.clock = self
        Drift.clock = self
        Drift.restart()
        return self


class Drift:
    """A machine that slows down over time by a known factor: ``factor()`` steps up by 0.5
    every 100 ms from ``restart()`` (or the module's import, in a fresh worker). A drifting
    call lasts ``units`` x 2 ms x factor: on a FakeClock by advancing it that much, on the
    real clock by busy-waiting to a deadline."""

    step_s = 0.1
    per_step = 0.5
    unit_ms = 2.0
    clock = time.perf_counter
    t0 = time.perf_counter()

    @classmethod
    def restart(cls) -> None:
        cls.t0 = cls.clock()

    @classmethod
    def factor(cls) -> float:
        return 1.0 + cls.per_step * int((cls.clock() - cls.t0) / cls.step_s)

    @classmethod
    def hold(cls, units: float, start: float) -> None:
        deadline = start + units * cls.unit_ms * 1e-3 * cls.factor()
        if isinstance(cls.clock, FakeClock):
            cls.clock.advance(max(0.0, deadline - cls.clock()))
            return
        while cls.clock() < deadline:
            pass


# A worker process started by a test that set this variable times on a fake clock too.
if os.environ.get("ATTNBENCH_FAKE_CLOCK"):
    FakeClock().install()


class Drifting(Fake):
    """Exact attention that takes ``units`` drifting milliseconds, with a deterministic
    +-``wobble`` alternating from timed call to timed call: two of these have a true median
    time ratio of units_a / units_b at every moment, whatever the drift."""

    units = 1.0
    wobble = 0.0

    def build(self, case, inputs):
        exact = _exact(case)
        memo = {"calls": 0}

        def f(q, k, v):
            start = Drift.clock()
            if "out" not in memo:  # computed once: later calls are pure (drifting) waiting,
                memo["out"] = exact(q, k, v)  # with no torch threads to compete with
            memo["calls"] += 1
            # flips every second call: in interleaved rounds on CPU an untimed call of the
            # same closure precedes each timed one, so the timed calls alternate
            sign = 1 if (memo["calls"] // 2) % 2 else -1
            Drift.hold(self.units * (1 + sign * self.wobble), start)
            return memo["out"]

        return f


class DriftingSlow(Drifting):
    name = "fake_drift_slow"
    units = 2.0
    wobble = 0.05  # per-round ratios alternate 1.9 and 2.1 around the true 2


class DriftingFast(Drifting):
    name = "fake_drift_fast"
    units = 1.0


class Aborts(Fake):
    """Says something on stderr, then aborts (SIGABRT): the record quotes what it said."""

    name = "fake_abort"

    def build(self, case, inputs):
        print("fake_abort: giving up on purpose", file=sys.stderr, flush=True)
        os.abort()


class WrongShape(Fake):
    name = "fake_shape"

    def build(self, case, inputs):
        exact = _exact(case)
        return lambda q, k, v: exact(q, k, v)[..., :-1]


class Chatty(Fake):
    """Prints on stdout and stderr at every call: none of it may reach the run's output."""

    name = "fake_chatty"

    def build(self, case, inputs):
        exact = _exact(case)

        def f(q, k, v):
            print("fake_chatty: stdout noise", flush=True)
            print("fake_chatty: stderr noise", file=sys.stderr, flush=True)
            return exact(q, k, v)

        return f


class ChangesState(Fake):
    """Changes torch's process-wide settings in setup and leaves them changed."""

    name = "fake_state"

    def build(self, case, inputs):
        torch.set_num_threads(1)
        torch.set_default_dtype(torch.float64)
        torch.use_deterministic_algorithms(True)
        return _exact(case)


class ChecksState(Fake):
    """Refuses to run (unsupported) under settings another backend left behind."""

    name = "fake_state_check"

    def build(self, case, inputs):
        problems = []
        if torch.get_default_dtype() != torch.float32:
            problems.append(f"default dtype {torch.get_default_dtype()}")
        if torch.are_deterministic_algorithms_enabled():
            problems.append("deterministic algorithms on")
        expect = os.environ.get("FAKE_EXPECT_THREADS")  # the run's thread count
        if expect and torch.get_num_threads() != int(expect):
            problems.append(f"{torch.get_num_threads()} threads")
        if problems:
            raise NotSupported(self.name, ["leaked state: " + ", ".join(problems)])
        return _exact(case)


class Hog(Fake):
    """Allocates seq_q x 32 MiB on top of the case (16 -> 512 MiB, 256 -> 8 GiB)."""

    name = "fake_hog"

    def build(self, case, inputs):
        ballast = torch.ones(case.seq_q * 2**25, dtype=torch.uint8)
        exact = _exact(case)
        return lambda q, k, v: exact(q, k, v) + 0 * ballast[0]


class LosesContext(Fake):
    """Fails as a kernel with an illegal memory access does on a GPU (the context is gone)."""

    name = "fake_context_lost"

    def build(self, case, inputs):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")


class Jitters(Fake):
    """Right to 1e-7, but never twice the same bits (like an atomics-based reduction)."""

    name = "fake_jitter"

    def build(self, case, inputs):
        exact = _exact(case)
        return lambda q, k, v: exact(q, k, v) + 1e-6 * torch.randn(q.shape[:-1] + v.shape[-1:])


class Sleeps(Fake):
    """Exact attention plus a sleep of FAKE_SLEEP_MS milliseconds (default 0): a planted
    slowdown for regression gates (pytest-benchmark's --benchmark-compare-fail)."""

    name = "fake_sleep"

    def build(self, case, inputs):
        exact = _exact(case)
        pause = float(os.environ.get("FAKE_SLEEP_MS", "0")) * 1e-3

        def f(q, k, v):
            if pause:
                time.sleep(pause)
            return exact(q, k, v)

        return f


class Logged(Fake):
    """Exact attention that logs, per call, whether torch's profiler was on (CALLS)."""

    name = "fake_logged"
    CALLS: list[bool] = []

    def build(self, case, inputs):
        exact = _exact(case)

        def f(q, k, v):
            Logged.CALLS.append(torch.autograd.profiler._is_profiler_enabled)
            return exact(q, k, v)

        return f


class KillsItsRank(Fake):
    """Exact attention, except in the torchrun rank named by FAKE_KILL_RANK: there the
    process SIGKILLs itself when it sets up its second case (with --no-isolate that is the
    rank itself, after its first group's records are written)."""

    name = "fake_kill_rank"
    seen: set = set()

    def build(self, case, inputs):
        if os.environ.get("RANK") is not None and (
                os.environ.get("RANK") == os.environ.get("FAKE_KILL_RANK")):
            self.seen.add(case.key)
            if len(self.seen) >= 2:
                os.kill(os.getpid(), signal.SIGKILL)
        return _exact(case)



class AddsABatch(Fake):
    """Returns its output with an extra leading axis: (1, B, Hq, Nq, Dv) broadcasts against
    the reference, so only a shape check tells it is wrong."""

    name = "fake_shape_unsqueeze"

    def build(self, case, inputs):
        exact = _exact(case)
        return lambda q, k, v: exact(q, k, v).unsqueeze(0)


class DoublesTheBatch(Fake):
    """Returns two copies of its output along the batch axis (2B rows, right values)."""

    name = "fake_shape_cat"

    def build(self, case, inputs):
        exact = _exact(case)

        def f(q, k, v):
            out = exact(q, k, v)
            return torch.cat([out, out], 0)

        return f


class SetExtras(Fake):
    """Exact attention whose prepare() reports a kernel that JSON cannot hold (a set):
    picklable, so it reaches the runner, which must not stop the sweep on it."""

    name = "fake_extras_set"

    def prepare(self, case, inputs):
        prepared = super().prepare(case, inputs)
        prepared.extras["kernel"] = {1, 2}
        return prepared


BACKENDS = [Sleeps(), Logged(), KillsItsRank(), LosesContext(), Jitters(), OomAbove(), Raises(),
            Crashes(), Hangs(), Nan(), SlightlyWrong(), Missing(), Refuses(), DriftingSlow(),
            DriftingFast(), Aborts(), WrongShape(), Chatty(), ChangesState(), ChecksState(), Hog(),
            AddsABatch(), DoublesTheBatch(), SetExtras(), HangsInSetup(), SlowSetup()]
