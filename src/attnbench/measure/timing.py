"""Timing by time budget: warm up, then repeat; keep every sample.

GPU: one pair of CUDA events per repetition, with the L2 cache flushed before each
(by writing a buffer larger than L2), so every repetition starts cold.
CPU: ``time.perf_counter`` around each call; the thread count is recorded in the run metadata.

Sampling is adaptive: after ``min_reps`` it stops as soon as the 95% interval of the median
is within ``target_rel`` of the median (``stop = "precision"``), else when the time budget
(``"budget"``) or ``max_reps`` (``"max_reps"``) runs out. ``measure_interleaved`` times
several closures in rounds (A B C, A B C, ...) so that drift of the machine hits them alike;
sample ``i`` of every closure comes from round ``i``, and a drift probe runs between rounds.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from attnbench.measure import samplers as sampler_registry
from attnbench.measure import timing_methods
from attnbench.measure.budget import TimingBudget
from attnbench.stats.intervals import Interval, median_interval

# The CPU clock every timing here reads (seconds). A module attribute, so tests replace it
# with a fake clock that the timed closures advance: the statistics of sampling are then
# asserted exactly, whatever the machine's speed or load.
clock: Callable[[], float] = time.perf_counter


@dataclass
class Timing:
    samples_ms: list[float] = field(default_factory=list)
    stop: str = ""  # precision, budget or max_reps
    probe_readings: list[float] = field(default_factory=list)  # GFLOP/s between its rounds
    fields: dict = field(default_factory=dict)  # record fields of the method and samplers

    @property
    def interval(self) -> Interval:
        return median_interval(self.samples_ms)

    @property
    def median_ms(self) -> float:
        return statistics.median(self.samples_ms)

    @property
    def min_ms(self) -> float:
        return min(self.samples_ms)

    @property
    def iqr_ms(self) -> float:
        if len(self.samples_ms) < 2:
            return 0.0
        q = statistics.quantiles(self.samples_ms, n=4, method="inclusive")
        return q[2] - q[0]

    @property
    def cv(self) -> float:
        """Coefficient of variation (stdev / mean) of the samples."""
        if len(self.samples_ms) < 2:
            return 0.0
        return statistics.stdev(self.samples_ms) / statistics.fmean(self.samples_ms)


@dataclass(frozen=True)
class Sequential:
    """A claim's sequential rule over a group's rounds (``stats.sequential``): after each
    round in ``looks`` (increasing round counts; the last is the claim's budget),
    ``decided(samples)`` is asked with every closure's samples so far; rounds go on, past
    the usual precision or budget stop, until it says yes (``stop = "decided"``) or the
    last look is done (``"claim_budget"``). Looks are fixed in advance so the error rate
    can be split over them.

    A group timed in several processes carries the earlier processes' samples in
    ``prior`` (one round-aligned list per closure): looks count pooled rounds, and this
    process hands over at round ``until`` (a look; ``"claim_share"``) if still undecided."""

    looks: tuple[int, ...]
    decided: Callable[[list[list[float]]], bool]
    prior: tuple[tuple[float, ...], ...] = ()
    until: int | None = None

    def stop(self, rounds: int, timings: list[Timing]) -> str:
        done = min((len(p) for p in self.prior), default=0) + rounds
        if done in self.looks and self.decided(
                [list(p) + t.samples_ms for p, t in zip(self.prior or [()] * len(timings),
                                                         timings)]):
            return "decided"
        if done >= self.looks[-1]:
            return "claim_budget"
        return "claim_share" if self.until is not None and done >= self.until else ""


def measure(fn: Callable[[], object], device: torch.device | str,
            budget: TimingBudget = TimingBudget(), warm: bool = False) -> Timing:
    """Samples of ``fn`` by time budget. ``warm``: fn has just run once (e.g. the checked
    call), so the warm-up may stop at its time budget without a further forced call."""
    return measure_interleaved([fn], device, budget, warm=warm)[0]


def precise_enough(samples: list[float], budget: TimingBudget) -> bool:
    """Enough samples, and the median's 95% interval within ``target_rel`` of it."""
    if len(samples) < max(budget.min_reps, 6):  # fewer than 6 cannot reach 95%
        return False
    return median_interval(samples).half_width_rel <= budget.target_rel


def stop_reason(samples: list[float], budget: TimingBudget, elapsed_s: float,
                n_closures: int = 1) -> str:
    """Why sampling stops now ('' = go on)."""
    if len(samples) >= budget.max_reps:
        return "max_reps"
    if len(samples) < budget.min_reps:
        return ""
    if precise_enough(samples, budget):
        return "precision"
    if elapsed_s >= budget.budget_s * n_closures:
        return "budget"
    return ""


def _warm_up(fn, budget: TimingBudget, sync=lambda: None) -> None:
    start = clock()
    n = 0
    while n < budget.min_warmup or clock() - start < budget.warmup_s:
        fn()
        sync()
        n += 1


def _rewarm(fn, seconds: float) -> None:
    """Untimed calls of ``fn``: one, then more until ``seconds`` have passed since the first
    began, so that a timed call finds the machine as its own calls leave it."""
    start = clock()
    fn()
    while clock() - start < seconds:
        fn()


def _cpu_sample(fn, into: list[float]) -> None:
    t0 = clock()
    fn()
    into.append((clock() - t0) * 1e3)


def measure_interleaved(fns: list[Callable[[], object]], device: torch.device | str,
                        budget: TimingBudget = TimingBudget(), probe=None,
                        warm: bool = False, sequential: Sequential | None = None,
                        samplers: list | None = None,
                        copies: list[timing_methods.Copies | None] | None = None
                        ) -> list[Timing]:
    """Time closures in interleaved rounds: round i times each once, starting with closure
    i mod n, so sample i of every closure comes from the same moment of the machine. On CPU
    each timed call follows untimed calls of the same closure, at least one and for at
    least ``rewarm_s`` (the machine as a closure timed alone finds it, whatever its
    neighbour or the probe left); on a GPU L2 is flushed before each.
    All stop together: when every closure is precise enough, or the budget (``budget_s``
    per closure) or ``max_reps`` is spent; with ``sequential``, when its claim is decided or
    its budget of rounds spent instead. ``probe`` (a DriftProbe) is read between rounds.
    A GPU sample is taken by ``budget.method`` (timing_methods.py; ``copies``: per closure,
    how to copy its inputs for ``cudagraph``); a CPU sample by the wall clock, whatever the
    method. ``samplers`` (default: the registry's for
    the device, samplers.py) read the device around the rounds and after each timed call;
    their fields land in each Timing's ``fields``."""
    dev = torch.device(device)
    method = timing_methods.for_device(budget.method, dev, copies)  # before any call
    if warm:
        budget = dataclasses.replace(budget, min_warmup=0)
    cuda = method is not None
    sync = (lambda: timing_methods.cuda.synchronize(dev)) if cuda else (lambda: None)
    for i, fn in enumerate(fns):
        _warm_up(fn, budget, sync)
        if cuda:
            method.prepare(i, fn)  # a graph is captured here, outside the timed rounds
    timings = [Timing() for _ in fns]
    group = sampler_registry.Group(sampler_registry.for_device(dev) if samplers is None
                                   else samplers)
    group.begin()
    start = clock()
    stop = ""
    if probe is not None:
        probe.read()
    pairs = list(enumerate(zip(fns, timings)))
    rounds = 0
    probed = probe is not None  # the probe ran since the last timed call
    while not stop:
        # Each round starts one closure later, so none always runs first.
        start_at = rounds % len(pairs)
        rounds += 1
        for i, (fn, t) in pairs[start_at:] + pairs[:start_at]:
            if cuda:
                method.sample(i, fn, t.samples_ms)  # after flushing L2
            else:
                # On CPU nothing is flushed: a timed call would find the caches as the
                # closure before it left them (a kernel after a neighbour that streamed the
                # same K/V reads it from cache). An untimed call of the same closure first
                # gives every sample the state a closure timed alone sees; after a long
                # neighbour (or the probe) a short call stays slow for a few milliseconds,
                # so the untimed calls go on for ``rewarm_s``.
                if len(pairs) > 1 or probed:
                    _rewarm(fn, budget.rewarm_s)
                _cpu_sample(fn, t.samples_ms)
            group.per_call(i)
        if cuda:
            method.settle()
        probed = probe is not None and probe.maybe_read() is not None
        elapsed = clock() - start
        reasons = [stop_reason(t.samples_ms, budget, elapsed, len(fns)) for t in timings]
        if sequential is not None:
            stop = sequential.stop(rounds, timings)
        elif "max_reps" in reasons:
            stop = "max_reps"
        elif all(r == "precision" for r in reasons):
            stop = "precision"
        elif all(reasons) and elapsed >= budget.budget_s * len(fns):
            stop = "budget"
    readings = probe.readings_since(start) if probe is not None else []
    for t in timings:
        t.stop = stop
        t.probe_readings = readings
    for i, (t, more) in enumerate(zip(timings, group.end(timings))):
        t.fields = (method.fields(i) if cuda
                    else {"timing_method": timing_methods.WALLCLOCK}) | more
    return timings
