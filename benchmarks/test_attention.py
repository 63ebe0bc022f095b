"""One pytest-benchmark benchmark per (case, backend) pair of the chosen suite (conftest.py)."""

from __future__ import annotations

import statistics
import time

import pytest
import torch

from attnbench.measure.execute import Candidate, open_job
from attnbench.measure.timing import l2_flush_buffer


def _rounds(fn, sync, timing, clock=time.perf_counter) -> int:
    """Rounds from the suite's budget: ``budget_s`` of calls, within [min_reps, max_reps],
    sized from warmed calls. A first call pays lazy initialisation (allocator, kernel
    selection, thread-pool start) and can read 10x slow, which would leave a benchmark with
    the minimum rounds: calls run until ``warmup_s`` has passed (at least two), then the
    median of three more sets the size of a round."""
    def once() -> float:
        t0 = clock()
        fn()
        sync()
        return clock() - t0

    start, warm = clock(), 0
    while warm < 2 or clock() - start < timing.warmup_s:
        once()
        warm += 1
    per_call = max(statistics.median(once() for _ in range(3)), 1e-6)
    return max(timing.min_reps, min(timing.max_reps, int(timing.budget_s / per_call)))


def test_attention(benchmark, pair, case_cache, suite_timing):
    case, backend = pair
    case_cache.keep_only([case])
    opened = open_job(case, backend, case_cache)  # setup and the float64 check: untimed
    if not isinstance(opened, Candidate):
        if opened.status in ("unsupported", "unavailable"):
            pytest.skip(f"{opened.status}: {opened.reason}")
        pytest.fail(f"{backend} {case.key}: {opened.status}: {opened.reason}", pytrace=False)
    record = opened.record
    if record.status != "ok":  # wrong: the output is beyond the dtype's tolerance
        pytest.fail(f"{backend} {case.key}: {record.status}: {record.reason}", pytrace=False)
    fn = opened.prepared.fn
    dev = torch.device(case.device)
    cuda = dev.type == "cuda"
    sync = (lambda: torch.cuda.synchronize(dev)) if cuda else (lambda: None)
    # as the harness times: L2 flushed before each call, outside the timed region
    flush = l2_flush_buffer(dev) if cuda else None

    def setup():
        if flush is not None:
            flush.zero_()
            sync()

    def call():
        fn()
        sync()  # the GPU's work ends inside the timed region

    benchmark.extra_info.update(
        key=case.key, backend=backend, work_flops=opened.backend.work_flops(case),
        min_bytes=case.bytes, err_impl_out_rel=record.metrics.get("err_impl_out_rel"),
        kernel=record.info.get("kernel"))
    benchmark.pedantic(call, setup=setup, rounds=_rounds(fn, sync, suite_timing),
                       warmup_rounds=1, iterations=1)
