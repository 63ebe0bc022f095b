"""Timing by time budget: warm up, then repeat; keep every sample.

GPU: one pair of CUDA events per repetition, with the L2 cache flushed before each
(by writing a buffer larger than L2), so every repetition starts cold.
CPU: ``time.perf_counter`` around each call; the thread count is recorded in the run metadata.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch


@dataclass(frozen=True)
class TimingBudget:
    warmup_s: float = 0.05
    budget_s: float = 0.3
    min_reps: int = 3
    max_reps: int = 100
    min_warmup: int = 1


@dataclass
class Timing:
    samples_ms: list[float] = field(default_factory=list)

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


def _l2_flush_buffer(device: torch.device) -> torch.Tensor:
    props = torch.cuda.get_device_properties(device)
    l2 = getattr(props, "L2_cache_size", 0) or 64 * 2**20
    return torch.empty(int(2 * l2) // 4 + 1, dtype=torch.int32, device=device)


def measure(fn: Callable[[], object], device: torch.device | str,
            budget: TimingBudget = TimingBudget(), warm: bool = False) -> Timing:
    """Samples of ``fn`` by time budget. ``warm``: fn has just run once (e.g. the checked
    call), so the warm-up may stop at its time budget without a further forced call."""
    dev = torch.device(device)
    if warm:
        budget = dataclasses.replace(budget, min_warmup=0)
    if dev.type == "cuda":
        return _measure_cuda(fn, dev, budget)
    return _measure_cpu(fn, budget)


def _measure_cpu(fn, budget: TimingBudget) -> Timing:
    start = time.perf_counter()
    n = 0
    while n < budget.min_warmup or time.perf_counter() - start < budget.warmup_s:
        fn()
        n += 1
    timing = Timing()
    start = time.perf_counter()
    while len(timing.samples_ms) < budget.max_reps and (
            len(timing.samples_ms) < budget.min_reps
            or time.perf_counter() - start < budget.budget_s):
        t0 = time.perf_counter()
        fn()
        timing.samples_ms.append((time.perf_counter() - t0) * 1e3)
    return timing


def _measure_cuda(fn, dev: torch.device, budget: TimingBudget) -> Timing:
    flush = _l2_flush_buffer(dev)
    torch.cuda.synchronize(dev)
    start = time.perf_counter()
    n = 0
    while n < budget.min_warmup or time.perf_counter() - start < budget.warmup_s:
        fn()
        torch.cuda.synchronize(dev)
        n += 1
    reps = budget.max_reps
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(reps)]
    done = 0
    start = time.perf_counter()
    while done < reps and (done < budget.min_reps or time.perf_counter() - start < budget.budget_s):
        flush.zero_()  # evict L2 so every repetition starts cold
        begin, end = events[done]
        begin.record()
        fn()
        end.record()
        done += 1
        if done % 8 == 0:  # bound the queue so the host clock tracks the device
            torch.cuda.synchronize(dev)
    torch.cuda.synchronize(dev)
    return Timing([b.elapsed_time(e) for b, e in events[:done]])
