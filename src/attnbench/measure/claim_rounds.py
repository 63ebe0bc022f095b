"""What a job group carries to the worker when it holds the two sides of a claim decided
by sequential sampling (a suite's ``[[claim]]`` with ``rounds``): the looks and each
claim's sides and bounds, by job index. The worker turns it into a ``timing.Sequential``
over the jobs that got as far as timing.

A group timed in ``processes`` fresh workers spreads the looks over them: process ``i``
hands over at its share of the looks (``share_end``) unless the claim is decided first,
and no further process runs once it is decided or its budget is spent. Looks count pooled
rounds, so the rule sees one stream of rounds whatever the number of processes.
"""

from __future__ import annotations

from dataclasses import dataclass

from attnbench.measure.timing import Sequential
from attnbench.stats import sequential

# How the rounds of a claim's pair ended (the records' ``claim_stop``).
FINAL_STOPS = ("decided", "claim_budget")


@dataclass(frozen=True)
class ClaimRounds:
    looks: tuple[int, ...]
    # (numerator job index, denominator job index, low, high) for each claim's pair
    sides: tuple[tuple[int, int, float | None, float | None], ...]

    def processes(self, wanted: int) -> int:
        """Processes the group is timed in: at most one per look."""
        return max(1, min(wanted, len(self.looks)))

    def share_end(self, process: int, wanted: int) -> int:
        """The look at which process ``process`` (0-based) of ``wanted`` hands over."""
        k, p = len(self.looks), self.processes(wanted)
        return self.looks[min(k, -(-(process + 1) * k // p)) - 1]

    def rule(self, timed: list[int], prior: list[list[float]] | None, until: int
             ) -> Sequential | None:
        """The rule over the closures actually timed (``timed``: their job indices); None
        when no claim has both sides among them."""
        at = {job: i for i, job in enumerate(timed)}
        claims = [(at[n], at[d], lo, hi) for n, d, lo, hi in self.sides
                  if n in at and d in at]
        if not claims:
            return None
        decider = sequential.ratio_decider(claims, sequential.Looks(self.looks))
        pooled = tuple(tuple(prior[job]) for job in timed) if prior else ()
        return Sequential(self.looks, decider, pooled, until)
