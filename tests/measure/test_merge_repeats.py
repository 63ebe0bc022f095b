"""Samples of one group timed again in fresh processes are pooled, and every column the
pooled samples decide is decided again: a flag the first process alone raised does not
outlive the pooling. Injected samples only."""

from __future__ import annotations

import pandas as pd

from attnbench.analysis import run_diff
from attnbench.core.case import Case
from attnbench.core.record import Record
from attnbench.measure.budget import TimingBudget
from attnbench.measure.execute import merge_repeats, timing_columns

CASE = Case(batch=1, heads_q=1, heads_kv=1, seq_q=16, seq_k=16, head_dim=8, head_dim_v=8)
PROBE = [100.0, 100.2, 99.8, 100.1, 99.9, 100.0]


def _record(samples: list[float]) -> Record:
    cols = timing_columns(CASE, 1e6, samples, "budget", PROBE, TimingBudget())
    return Record.new(CASE, "naive", "ok", pair_group="g", **cols)


def test_a_flag_of_the_first_process_alone_is_decided_again_on_the_pooled_samples():
    wild = [1.0, 1.6, 0.7, 1.3, 0.8, 1.5, 0.9, 1.2]
    first = _record(wild)
    assert first.to_row()["noisy_by"] == "spread+samples" and first.to_row()["noisy"] is True
    steady = [[1.0 + 0.001 * i for i in range(8)] for _ in range(6)]
    merged = merge_repeats([first], [[_record(s)] for s in steady], TimingBudget())[0]
    row = merged.to_row()
    assert row["processes"] == 7 and row["n_samples"] == 56
    assert row["noisy"] is False and "noisy_by" not in row


def test_a_flag_the_pooled_samples_raise_is_kept():
    first = _record([1.0 + 0.001 * i for i in range(8)])
    assert "noisy_by" not in first.to_row()
    wild = [1.0, 1.6, 0.7, 1.3, 0.8, 1.5, 0.9, 1.2]
    row = merge_repeats([first], [[_record(wild)]], TimingBudget())[0].to_row()
    assert row["noisy"] is True and "spread" in row["noisy_by"]


def test_compare_reads_no_stale_reason_of_a_record_the_pooled_samples_cleared():
    stale = pd.Series({"noisy_by_base": "samples", "noisy_base": False,
                       "noisy_by_new": None, "noisy_new": False})
    assert not run_diff.unsteady(stale)
    assert run_diff.unsteady(pd.Series({"noisy_by_base": "samples", "noisy_base": True}))
    older = pd.Series({"noisy_by_base": "samples", "noisy_by_new": None})  # no noisy column
    assert run_diff.unsteady(older)
