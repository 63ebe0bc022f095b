"""Declared metrics (core/metrics.py): headings, directions, the records doc."""

from __future__ import annotations


def test_headings_state_their_unit_once():
    from attnbench.core import metrics
    assert metrics.get("tflops").heading == \
        "Throughput (TFLOP/s of the work each backend performs)"
    assert metrics.get("time_ms_median").heading == "Median time (ms)"
