"""The typed record (core/record.py): one constructor, rows that round-trip."""

from __future__ import annotations

import pytest

from attnbench.core.case import Case
from attnbench.core.record import Record


def test_every_record_is_built_by_one_constructor_and_round_trips():
    case = Case(seq_q=8, seq_k=8, head_dim=4, head_dim_v=4, feature_map="favor",
                block_pairs=((0, 1),))
    rec = Record.new(case, "linear", "crashed", "worker process killed by signal SIGSEGV",
                     time_ms_median=1.5, kernel="x")
    assert rec.metrics == {"time_ms_median": 1.5} and rec.info == {"kernel": "x"}
    back = Record.from_row(rec.to_row())
    assert back == rec
    with pytest.raises(ValueError, match="allowed: ok, unavailable"):
        Record.new(case, "linear", "exploded")
