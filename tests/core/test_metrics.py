"""Declared metrics (core/metrics.py): headings, directions, the records doc."""

from __future__ import annotations

from pathlib import Path

import pytest

from attnbench.core import metrics


def test_headings_state_their_unit_once():
    from attnbench.core import metrics
    assert metrics.get("tflops").heading == \
        "Throughput (TFLOP/s of the work each backend performs)"
    assert metrics.get("time_ms_median").heading == "Median time (ms)"


ROOT = Path(__file__).resolve().parents[2]


def test_records_doc_lists_every_declared_metric():
    doc = (ROOT / "docs" / "records.md").read_text()
    assert metrics.markdown_table() in doc, "regenerate: python -m attnbench.core.metrics"


def test_compare_direction_comes_from_the_declarations():
    assert metrics.get("time_ms_median").worse(1.2, 0.1)
    assert metrics.get("tflops").worse(0.8, 0.1) and not metrics.get("tflops").worse(1.2, 0.1)
    assert metrics.get("peak_mem_bytes").worse(1.2, 0.1)
    with pytest.raises(KeyError, match="not a declared metric"):
        metrics.get("energy_j")
