"""Claims (analysis/claims.py): a rate claim carries the time interval through the inverse."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize("samples, verdict", [
    ([10.0, 10.1, 9.9, 10.05, 9.95, 10.0, 10.02, 9.98], "holds"),  # 60% +- 1%
    ([8.0, 12.0, 9.0, 11.5, 10.0, 13.0, 8.5, 12.5], "inconclusive"),  # straddles 50%
    ([13.0, 13.1, 12.9, 13.05, 12.95, 13.0, 13.02, 12.98], "does not hold"),  # 46%
])
def test_a_rate_claim_carries_the_time_interval_through_the_inverse(samples, verdict):
    """frac_matmul = work / median time / roof: a claim on it gets the median time's
    interval, inverted (a slow sample lowers the rate), not a point that always decides."""
    import statistics

    import pandas as pd

    from attnbench.analysis.claims import claims_table, measure_claim
    from attnbench.stats import intervals
    median = statistics.median(samples)
    frac = 0.6 * 10.0 / median  # 60% of the roof at 10 ms
    row = {"backend": "sliding_window", "status": "ok", "seq_q": 4096, "seq_k": 4096,
           "mask": "window(255,0)", "key": "k", "time_ms_median": median,
           "frac_matmul": frac, "samples_ms": samples}
    claim = {"text": "t", "kind": "value", "backend": "sliding_window",
             "metric": "frac_matmul", "where": {"seq_len": [4096]}, "expected": [0.5]}
    (iv,), _ = measure_claim(pd.DataFrame([row]), claim, across=False)
    time = intervals.median_interval(samples)
    assert iv.estimate == pytest.approx(frac)
    assert iv.low == pytest.approx(frac * time.estimate / time.high)
    assert iv.high == pytest.approx(frac * time.estimate / time.low)
    assert iv.low < frac < iv.high
    assert claims_table(pd.DataFrame([row]), [claim])["verdict"][0] == verdict
