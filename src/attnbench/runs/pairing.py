"""Which jobs are timed together in interleaved rounds.

Jobs that run the same problem (``Case.problem``: the case key without backend
parameters, the row a ratio joins on) form a group, so block_sparse with its layout knobs
or linear with its feature map is timed in the same rounds as the exact backends it is
divided by, and compare can judge it over partners. A ratio claim whose sides
select different cases (a window against causal), and a comparison paired on shape, join
the two sides' groups when their shapes match (claims.SHAPE), so their ratios come from
paired rounds too. Groups keep the
order in which the suite lists their first job (sizes rising within a line).
``claim_rounds`` says which of a group's jobs are the sides of a claim decided by
sequential sampling (a claim with ``rounds``), for the worker's stopping rule.
"""

from __future__ import annotations

from attnbench.analysis.claims import SHAPE, side_matches
from attnbench.core.case import Case
from attnbench.core.where import case_matches
from attnbench.measure.claim_rounds import ClaimRounds

Job = tuple[Case, str]


def _shape(case: Case) -> tuple:
    return tuple(getattr(case, f) for f in SHAPE)


def _sides(claims, comparisons):
    """(is_numerator_side, is_denominator_side) predicates of every shape-joined pairing."""
    for claim in claims or []:
        if claim.get("kind") == "ratio" and ({"numerator_where", "denominator_where"}
                                              & set(claim)):
            yield (lambda c, b, cl=claim: side_matches(cl, "numerator", c, b),
                   lambda c, b, cl=claim: side_matches(cl, "denominator", c, b))
    for comp in comparisons or []:
        if comp.pair == "shape":
            yield (lambda c, b, k=comp: b == k.baseline
                   and case_matches(c, k.where | k.baseline_where),
                   lambda c, b, k=comp: b in k.backends
                   and case_matches(c, k.where | k.backends_where))


def job_groups(jobs: list[Job], claims: list[dict] | None = None,
               comparisons: list | None = None) -> list[list[Job]]:
    parent: dict[str, str] = {}

    def find(x: str) -> str:
        while parent.setdefault(x, x) != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    def union(a: str, b: str) -> None:
        parent[find(a)] = find(b)

    for case, _ in jobs:
        find(case.problem)
    for first, second in _sides(claims, comparisons):
        num = {_shape(c): c.problem for c, b in jobs if first(c, b)}
        for c, b in jobs:
            if second(c, b) and _shape(c) in num:
                union(c.problem, num[_shape(c)])
    groups: dict[str, list[Job]] = {}
    for job in jobs:
        groups.setdefault(find(job[0].problem), []).append(job)
    return list(groups.values())


def claim_rounds(jobs: list[Job], claims: list[dict] | None) -> ClaimRounds | None:
    """The sequential rule of the claims whose two sides are both among ``jobs`` (one
    pair per problem: joined on ``Case.problem`` as claims are, or on the shape for sided
    claims); None when none is. The suite's claims share one set of looks
    (``claims.validate_claims``)."""
    sides, looks = [], None
    for claim in claims or []:
        if claim.get("kind") != "ratio" or "rounds" not in claim:
            continue
        sided = bool({"numerator_where", "denominator_where"} & set(claim))
        join = _shape if sided else (lambda c: c.problem)
        num = {join(c): i for i, (c, b) in enumerate(jobs)
               if side_matches(claim, "numerator", c, b)}
        exp = claim["expected"]
        for i, (c, b) in enumerate(jobs):
            if side_matches(claim, "denominator", c, b) and join(c) in num:
                sides.append((num[join(c)], i, exp[0], exp[1] if len(exp) > 1 else None))
                looks = tuple(claim["rounds"])
    return ClaimRounds(looks, tuple(sides)) if sides else None
