"""Executing a case (measure/execute.py): paired rounds against drift and adaptive
sampling, on a fake clock."""

from __future__ import annotations

from attnbench.core.case import Case
from attnbench.measure.execute import CaseCache, execute, execute_group
from attnbench.measure.timing import TimingBudget
from attnbench.stats import intervals

# Enough rounds for a tight interval; target_rel 0 so sampling never stops early.
# rewarm_s 0: one untimed call before each timed one, which the drifting fakes' wobble
# counts on (it flips every second call).
DRIFT_BUDGET = TimingBudget(warmup_s=0.0, budget_s=0.3, min_reps=12, max_reps=40,
                            min_warmup=1, target_rel=0.0, rewarm_s=0.0)


def test_paired_rounds_recover_the_true_ratio_under_drift(fake_clock):
    """The machine slows down ~1.5x per 100 ms (of a fake clock the calls advance, so the
    numbers are exact under any load). Timed one after the other, the slow backend (2 units)
    sees a faster machine than the fast one (1 unit) and the ratio reads far below 2; timed
    in interleaved rounds, the paired interval contains 2."""
    from fake_backends import Drift

    case = Case(batch=1, heads_q=1, heads_kv=1, seq_q=8, seq_k=8, head_dim=4, head_dim_v=4)
    cache = CaseCache()
    Drift.restart()
    slow = execute(case, "fake_drift_slow", DRIFT_BUDGET, cache)
    fast = execute(case, "fake_drift_fast", DRIFT_BUDGET, cache)
    sequential = intervals.ratio_interval(slow.info["samples_ms"], fast.info["samples_ms"])
    assert not sequential.contains(2.0), sequential

    Drift.restart()
    slow, fast = execute_group([(case, "fake_drift_slow"), (case, "fake_drift_fast")],
                               DRIFT_BUDGET, cache)
    assert slow.status == fast.status == "ok"
    assert slow.info["pair_group"] == fast.info["pair_group"]
    a, b = slow.info["samples_ms"], fast.info["samples_ms"]
    assert len(a) == len(b) >= 12
    paired = intervals.paired_ratio_interval(a, b)
    assert paired.contains(2.0), paired
    assert paired.half_width_rel < 0.15  # and an informative one (the wobble is +-5%)
    assert max(a) / min(a) > 2  # the drift really was there during the paired rounds


def test_adaptive_sampling_stops_when_precise(fake_clock, monkeypatch):
    from fake_backends import Drift

    monkeypatch.setattr(Drift, "per_step", 0.0)  # a steady machine, +-5% call to call
    monkeypatch.setattr(Drift, "unit_ms", 2.0)
    case = Case(batch=1, heads_q=1, heads_kv=1, seq_q=8, seq_k=8, head_dim=4, head_dim_v=4)
    budget = TimingBudget(warmup_s=0.0, budget_s=5.0, min_reps=3, max_reps=200,
                          target_rel=0.06)
    rec = execute(case, "fake_drift_slow", budget, CaseCache())
    assert rec.info["sampling_stop"] == "precision"
    # 3.8 and 4.2 ms, two of each in turn: from n = 6 (the first count whose interval can
    # cover 95%) the interval is [3.8, 4.2]; the median sits at 4.0 (within 6%) at n = 8
    assert rec.metrics["n_samples"] == 8
    assert sorted({round(x, 9) for x in rec.info["samples_ms"]}) == [3.8, 4.2]
    low, high, med = (rec.metrics[k] for k in ("time_ms_ci_low", "time_ms_ci_high",
                                               "time_ms_median"))
    assert low <= med <= high and max(high - med, med - low) <= 0.06 * med
