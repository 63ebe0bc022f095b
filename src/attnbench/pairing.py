"""Which jobs are timed together in interleaved rounds.

Backends that run the same problem (one case key) form a group. A ratio claim whose sides
select different cases (a window against causal) joins the two sides' groups when their
shapes match (claims.SHAPE), so its ratio comes from paired rounds too. Groups keep the
order in which the suite lists their first job (sizes rising within a line).
"""

from __future__ import annotations

from .case import Case
from .claims import SHAPE, side_matches

Job = tuple[Case, str]


def _shape(case: Case) -> tuple:
    return tuple(getattr(case, f) for f in SHAPE)


def job_groups(jobs: list[Job], claims: list[dict] | None = None) -> list[list[Job]]:
    parent: dict[str, str] = {}

    def find(x: str) -> str:
        while parent.setdefault(x, x) != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    def union(a: str, b: str) -> None:
        parent[find(a)] = find(b)

    for case, _ in jobs:
        find(case.key)
    for claim in claims or []:
        if claim.get("kind") != "ratio" or not ({"numerator_where", "denominator_where"}
                                                & set(claim)):
            continue
        num = {_shape(c): c.key for c, b in jobs if side_matches(claim, "numerator", c, b)}
        for c, b in jobs:
            if side_matches(claim, "denominator", c, b) and _shape(c) in num:
                union(c.key, num[_shape(c)])
    groups: dict[str, list[Job]] = {}
    for job in jobs:
        groups.setdefault(find(job[0].key), []).append(job)
    return list(groups.values())
