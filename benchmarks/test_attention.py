"""One pytest-benchmark benchmark per (case, backend) pair of the chosen suite (conftest.py)."""

from __future__ import annotations

import pytest

from attnbench.measure import execute
from attnbench.measure.execute import Candidate, open_job
from attnbench.measure.timing import TimingBudget, measure_interleaved


def samples_ms(opened: Candidate, timing: TimingBudget) -> tuple[list[float], str]:
    """The pair's samples (ms) and why sampling stopped, from the run's timing loop under the
    suite's budget: the same warm-up, stopping rule, timing method and L2 flush as a record
    of ``attnbench run`` (the checked call just before counts as warm)."""
    t = measure_interleaved([opened.prepared.fn], opened.record.case.device, timing,
                            warm=True, copies=[execute._copies(opened)])[0]
    return t.samples_ms, t.stop


def record_rounds(benchmark, samples: list[float]) -> None:
    """The loop's samples as pytest-benchmark's rounds (in seconds), which it then saves,
    compares and prints as its own; the fixture counts as used."""
    benchmark._mode = "attnbench's timing loop"
    if not samples:  # --benchmark-disable: the checked call was the test
        return
    stats = benchmark._make_stats(1)
    for ms in samples:
        stats.update(ms * 1e-3)


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
    benchmark.extra_info.update(
        key=case.key, backend=backend, work_flops=opened.backend.work_flops(case),
        min_bytes=case.bytes, err_impl_out_rel=record.metrics.get("err_impl_out_rel"),
        kernel=record.info.get("kernel"), timing_method=suite_timing.method)
    samples, stop = ([], "disabled") if benchmark.disabled else samples_ms(opened, suite_timing)
    benchmark.extra_info["sampling_stop"] = stop
    record_rounds(benchmark, samples)
