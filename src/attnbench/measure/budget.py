"""How long a pair is timed: the suite's ``[timing]`` table as data (``measure/timing.py``
spends it). Apart from the timing code so that a suite loads without torch."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

# How a GPU sample is taken (measure/timing_methods.py); a CPU times with perf_counter.
TIMING_METHODS = ("events", "cudagraph", "profiler")


@dataclass(frozen=True)
class TimingBudget:
    warmup_s: float = 0.05
    budget_s: float = 0.3  # per closure; interleaved rounds of n closures get n times this
    min_reps: int = 3
    max_reps: int = 100
    min_warmup: int = 1
    # CPU, interleaved rounds: before each timed call, untimed calls of the same closure for
    # at least this long (one at least). One call was not enough: a 2.4 ms call was still
    # 14-43% slow on its second call after 130 ms of other work or of sleep (scratch;
    # docs/design.md, Measuring).
    rewarm_s: float = 0.01
    target_rel: float = 0.05  # stop once the median's 95% interval is within this
    # a record whose samples scatter more than this (and twice the drift probe) is noisy
    noise_threshold: float = 0.05
    # a record whose own interval reaches farther than this from its median is flagged noisy
    # too, whatever the probe said (the samples show the unsteadiness directly)
    unsteady_rel: float = 0.25
    processes: int = 1  # fresh worker processes a group is timed in, samples pooled
    # a group the run's witnesses read as disturbed is timed again up to this many times
    # after the first pass, its least disturbed attempt kept (runs/retakes.py)
    retakes: int = 0
    slow_dtype_factor: float = 0.0  # > 0: skip dtypes whose matmul is that much slower
    check_determinism: bool = False  # run the checked call twice, record bit-identity
    method: str = "events"  # one of TIMING_METHODS
    # The bound on a pair's setup (worker start, inputs, reference, prepare, compile), apart
    # from the suite's timeout_s, which bounds the timed work alone: a slow setup on a loaded
    # machine is not a slow kernel.
    setup_timeout_s: float = 600.0

    def per_process(self) -> TimingBudget:
        """The share of the budget one of ``processes`` processes spends."""
        k = self.processes
        if k <= 1:
            return self
        return dataclasses.replace(self, budget_s=self.budget_s / k,
                                   min_reps=max(2, -(-self.min_reps // k)),
                                   max_reps=max(2, -(-self.max_reps // k)))
