"""The one significance rule: a ratio's 95% interval decides, nothing else.

Every conclusion that two measurements differ -- a winner's margin, a speedup called
significant, ``compare``'s worse/better, the pytest-benchmark gate -- is ``decide`` of the
ratio's interval (paired per-round ratios when both sides were timed in the same rounds,
else a bootstrap of the ratio of medians):

* ``worse`` / ``better``: the interval excludes 1 and the estimate is beyond the threshold
  (``> 1 + threshold`` or ``< 1 - threshold``); the metric's direction says which is worse;
* ``unchanged``: the whole interval lies within ``[1 - threshold, 1 + threshold]``;
* ``cannot tell``: neither, or fewer than ``MIN_SAMPLES`` samples a side, or an interval
  covering less than 95%. Never read as "unchanged".

A claim's range is checked on the same terms (``interval_verdict``): the whole interval
inside the range holds, wholly outside does not, and too few samples decide nothing.

Many verdicts drawn at once (``compare`` answers for every record of two runs) are drawn at
``family_level``: at 95% each, 71 unchanged records would see about 3.5 of them called by
chance alone, so each interval is widened to the level at which the whole set expects at
most ``FALSE_CALLS`` false calls (Bonferroni on the per-family error rate).

No rank test: with 3 samples a side Mann-Whitney cannot go below p = 0.10, so it either
never calls a change or, with a looser alpha, calls them from samples that cannot carry a
95% statement (docs/design.md, Statistics).
"""

from __future__ import annotations

import math

from attnbench.stats.intervals import (
    DOES_NOT_HOLD,
    HOLDS,
    INCONCLUSIVE,
    LEVEL,
    Interval,
    short_of_level,
)

# Fewer samples than this a side: no order-statistics interval of a median reaches 95%
# (the range of 5 samples covers 94%), so no verdict is drawn from them.
MIN_SAMPLES = 6
WORSE, BETTER, UNCHANGED, CANNOT_TELL = "worse", "better", "unchanged", "cannot tell"
RULE = ("a difference is called only when the ratio's 95% interval (paired rounds, else a "
        "bootstrap of the ratio of medians) excludes 1, from at least "
        f"{MIN_SAMPLES} samples a side")


FALSE_CALLS = 1.0  # the false calls one set of verdicts drawn at once may expect, at most


def family_level(m: int, false_calls: float = FALSE_CALLS) -> float:
    """The per-verdict level at which ``m`` verdicts drawn at once expect at most
    ``false_calls`` false ones: ``1 - false_calls / m`` (each verdict's two-sided error
    rate times ``m``), never below ``LEVEL``."""
    return max(LEVEL, 1 - false_calls / m) if m > 0 else LEVEL


def family_text(m: int, level: float) -> str:
    """'at 98.6%, so that its 71 verdicts expect at most 1 false call' (or 'at 95%')."""
    if level <= LEVEL:
        return f"at {LEVEL:.0%}"
    return (f"at {level:.1%}, so that its {m} verdicts expect at most {FALSE_CALLS:g} false "
            f"call{'s' if FALSE_CALLS != 1 else ''}")


# Intervals whose ``n`` counts timing samples (a side's, or paired rounds); a pooled
# interval's ``n`` counts runs and its quantile already allows for how few they are.
SAMPLED_METHODS = ("order-statistics", "paired-order-statistics", "bootstrap")


def enough(iv: Interval, level: float = LEVEL) -> bool:
    """Whether an interval may carry a verdict: at least ``MIN_SAMPLES`` samples a side when
    it comes from samples, its coverage at ``level``, finite bounds."""
    few = iv.method.split("/")[0] in SAMPLED_METHODS and iv.n < MIN_SAMPLES
    return (not few and not short_of_level(iv.confidence, level)
            and all(map(math.isfinite, (iv.low, iv.high))))


def decide(iv: Interval, threshold: float = 0.0, lower_is_better: bool = True) -> str:
    """The verdict on a ratio new / base (or a / b) from its interval: worse, better,
    unchanged or cannot tell (see the module). ``threshold`` 0 asks only whether the two
    differ; ``lower_is_better`` is the metric's direction (times: True)."""
    if threshold < 0:
        raise ValueError(f"threshold must be >= 0, got {threshold}")
    if iv.method == "point" or not enough(iv):
        return CANNOT_TELL
    up = iv.low > 1 and iv.estimate > 1 + threshold
    down = iv.high < 1 and iv.estimate < 1 - threshold
    if up or down:
        return WORSE if up == lower_is_better else BETTER
    if threshold > 0 and iv.low >= 1 - threshold and iv.high <= 1 + threshold:
        return UNCHANGED
    return CANNOT_TELL


def differs(iv: Interval) -> bool:
    """Whether the two sides of a ratio differ: ``decide`` with no threshold calls a
    change (the interval excludes 1, with enough samples)."""
    return decide(iv) in (WORSE, BETTER)


def why_not(iv: Interval) -> str:
    """Why an interval carries no verdict, in a few words ('' when it may)."""
    if iv.method == "point":
        return "no samples"
    if iv.n < MIN_SAMPLES:
        return f"fewer than {MIN_SAMPLES} samples a side"
    if short_of_level(iv.confidence):
        return f"interval covers {iv.confidence:.0%}"
    return ""


def interval_verdict(interval: Interval, low: float | None, high: float | None,
                     level: float = LEVEL) -> str:
    """Checks the claim "the measured value lies in [low, high]" (``None``: unbounded).

    ``"holds"`` when the whole interval is inside the bounds, ``"does not hold"`` when it is
    wholly outside (entirely below ``low`` or entirely above ``high``), else
    ``"inconclusive"`` -- as also for an interval that may carry no verdict (``enough``:
    fewer than ``MIN_SAMPLES`` samples, or coverage below ``level``; an exact point value
    has coverage 1).
    """
    if not enough(interval, level):
        return INCONCLUSIVE
    lo_ok = low is None or interval.low >= low
    hi_ok = high is None or interval.high <= high
    if lo_ok and hi_ok:
        return HOLDS
    if (low is not None and interval.high < low) or (high is not None and interval.low > high):
        return DOES_NOT_HOLD
    return INCONCLUSIVE

