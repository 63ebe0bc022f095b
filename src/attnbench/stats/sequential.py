"""Claims decided by sequential sampling: look at the paired rounds a few times, stop as
soon as the interval excludes the claim's bound, and keep the error rate at the level.

Looking after every round and stopping at the first 95% interval that excludes a bound
would inflate the chance of a wrong verdict far above 5% (each look is another chance for
noise to cross). The rule here fixes the looks in advance (``Looks.rounds``, e.g. 8, 16,
24, 32 rounds) and spends the error over them with Bonferroni: each look's interval is at
confidence ``1 - alpha / k`` for ``k`` looks, so the chance that *any* look excludes a
bound the true value does not exclude is at most ``alpha`` (a union bound; conservative,
and it needs no assumption on how the looks correlate). The test suite checks this by
simulation on injected rounds whose true ratio sits exactly on the bound.
"""

from __future__ import annotations

from dataclasses import dataclass

from attnbench.stats.intervals import (
    DOES_NOT_HOLD,
    HOLDS,
    INCONCLUSIVE,
    LEVEL,
    Interval,
    median_interval,
    median_ranks,
)
from attnbench.stats.significance import interval_verdict


@dataclass(frozen=True)
class Looks:
    """The rounds after which a claim's interval is looked at (increasing; the last is the
    claim's budget), and the overall error ``alpha`` spent over them."""

    rounds: tuple[int, ...]
    alpha: float = 1 - LEVEL

    def __post_init__(self):
        r = self.rounds
        if not r or any(b <= a for a, b in zip(r, r[1:])) or r[0] < 1:
            raise ValueError(f"looks: rounds must increase from >= 1, got {list(r)}")
        if not 0 < self.alpha < 1:
            raise ValueError(f"looks: alpha must be in (0, 1), got {self.alpha}")

    @property
    def per_look_confidence(self) -> float:
        """Bonferroni: alpha split evenly over the looks."""
        return 1 - self.alpha / len(self.rounds)

    def reachable(self) -> bool:
        """Whether the first look has rounds enough for its interval to reach the per-look
        confidence (else that look can never decide)."""
        return median_ranks(self.rounds[0], self.per_look_confidence)[2] >= \
            self.per_look_confidence - 1e-12


@dataclass(frozen=True)
class Decision:
    verdict: str  # holds / does not hold / inconclusive
    rounds: int  # rounds used (the look that decided, or the budget)
    interval: Interval  # at the per-look confidence


def look(ratios: list[float], low: float | None, high: float | None, looks: Looks) -> str:
    """The verdict one look gives on the per-round ratios so far ('inconclusive': go on)."""
    iv = median_interval(ratios, looks.per_look_confidence)
    return interval_verdict(iv, low, high, level=looks.per_look_confidence)


def decide(ratios: list[float], low: float | None, high: float | None, looks: Looks
           ) -> Decision:
    """Replays the sequential rule on a stream of per-round ratios: the first look whose
    interval excludes a bound decides; else the verdict at the last look available."""
    used = 0
    for n in looks.rounds:
        if n > len(ratios):
            break
        used = n
        verdict = look(ratios[:n], low, high, looks)
        if verdict != INCONCLUSIVE:
            return Decision(verdict, n, median_interval(ratios[:n], looks.per_look_confidence))
    if used == 0:
        return Decision(INCONCLUSIVE, len(ratios), median_interval(ratios or [1.0]))
    return Decision(INCONCLUSIVE, used, median_interval(ratios[:used],
                                                        looks.per_look_confidence))


def ratio_decider(claims: list[tuple[int, int, float | None, float | None]], looks: Looks):
    """For ``measure.timing.Sequential``: given the group's samples (one list per closure,
    round-aligned), whether every claim (numerator index, denominator index, low, high) is
    decided at this look."""
    def decided(samples: list[list[float]]) -> bool:
        for num, den, low, high in claims:
            ratios = [a / b for a, b in zip(samples[num], samples[den])]
            if look(ratios, low, high, looks) == INCONCLUSIVE:
                return False
        return True

    return decided


__all__ = ["ratio_decider", "Looks", "Decision", "look", "decide", "HOLDS", "DOES_NOT_HOLD",
           "INCONCLUSIVE"]
