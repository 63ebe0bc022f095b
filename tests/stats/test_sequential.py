"""The sequential rule for claims, checked by simulation on injected per-round ratios: it
stops early when the truth is far from the bound, and its error rate stays at the level
when the truth sits on the bound (where uncorrected looks would inflate it)."""

from __future__ import annotations

import numpy as np
import pytest

from attnbench.stats import sequential
from attnbench.stats.intervals import median_interval
from attnbench.stats.significance import interval_verdict

LOOKS = sequential.Looks((8, 16, 24, 32))


def _streams(true_ratio: float, trials: int, seed: int = 0) -> np.ndarray:
    """Per-round ratios with a known median and 10% round-to-round noise."""
    rng = np.random.default_rng(seed)
    return true_ratio * rng.lognormal(0.0, 0.10, size=(trials, LOOKS.rounds[-1]))


def test_bonferroni_splits_alpha_over_the_looks():
    assert LOOKS.per_look_confidence == pytest.approx(1 - 0.05 / 4)
    assert LOOKS.reachable()  # 8 rounds can reach 98.75%
    assert not sequential.Looks((3, 6)).reachable()
    with pytest.raises(ValueError, match="must increase"):
        sequential.Looks((8, 8))


def test_far_from_the_bound_stops_at_the_first_look():
    for row in _streams(12.0, 50):
        d = sequential.decide(list(row), 8.0, None, LOOKS)
        assert (d.verdict, d.rounds) == ("holds", 8)
    for row in _streams(6.5, 50, seed=1):
        assert sequential.decide(list(row), 8.0, None, LOOKS).verdict == "does not hold"


def test_on_the_bound_the_error_rate_stays_within_alpha():
    """True ratio exactly 8 against a claim >= 8: 'holds' and 'does not hold' are both
    wrong calls (the interval should straddle 8). Over 4000 seeded streams the corrected
    rule errs at most alpha; looking at 95% at every look errs more often."""
    streams = _streams(8.0, 4000, seed=2)
    corrected = [sequential.decide(list(r), 8.0, None, LOOKS).verdict for r in streams]
    wrong = np.mean([v != "inconclusive" for v in corrected])
    assert wrong <= 0.05, wrong

    def naive(row) -> str:  # 95% at every look, stop at the first exclusion
        for n in LOOKS.rounds:
            v = interval_verdict(median_interval(row[:n], 0.95), 8.0, None)
            if v != "inconclusive":
                return v
        return v

    inflated = np.mean([naive(list(r)) != "inconclusive" for r in streams])
    assert inflated > wrong and inflated > 0.05, (inflated, wrong)


def test_a_short_stream_is_inconclusive_with_the_rounds_it_had():
    d = sequential.decide([9.0] * 5, 8.0, None, LOOKS)
    assert d.verdict == "inconclusive" and d.rounds == 5


def _closures(clock, ms_a, ms_b):
    """Two closures that 'take' the given milliseconds on the fake clock, in turn."""
    calls = {"a": 0, "b": 0}

    def make(name, values):
        def fn():
            clock.advance(values[calls[name] % len(values)] * 1e-3)
            calls[name] += 1
        return fn

    return [make("a", ms_a), make("b", ms_b)]


@pytest.mark.parametrize("ms_a,bound,verdict,rounds,stop", [
    ([3.0, 3.2, 2.9], 2.0, "holds", 8, "decided"),  # 3x against >= 2: the first look decides
    ([2.0, 2.3, 1.7], 2.0, "inconclusive", 32, "claim_budget"),  # on the bound: to the end
])
def test_interleaved_rounds_go_on_until_the_claim_is_decided(fake_clock, ms_a, bound, verdict,
                                                            rounds, stop):
    from attnbench.measure.timing import Sequential, TimingBudget, measure_interleaved

    rule = Sequential(LOOKS.rounds, sequential.ratio_decider([(0, 1, bound, None)], LOOKS))
    # without the rule, sampling would stop at 6 rounds (max_reps)
    budget = TimingBudget(warmup_s=0.0, budget_s=0.0, min_reps=3, max_reps=6, rewarm_s=0.0)
    # the untimed call before each timed one (CPU; one, with rewarm_s 0) also advances the
    # clock: every other value is timed, so the timed values cycle through the whole list
    a, b = measure_interleaved(_closures(fake_clock, ms_a, [1.0]), "cpu", budget,
                               sequential=rule)
    assert a.stop == b.stop == stop and len(a.samples_ms) == rounds
    ratios = [x / y for x, y in zip(a.samples_ms, b.samples_ms)]
    assert sequential.decide(ratios, bound, None, LOOKS).verdict == verdict
