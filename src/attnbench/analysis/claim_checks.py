"""What a suite's ``[[claim]]`` tables may say, checked when the suite loads (one-line
``BadInput``), before any record exists: apart from ``claims.py``, which measures claims on
records (pandas, the statistics), so that a suite loads without those."""

from __future__ import annotations

import difflib
import math

from attnbench.core import metrics
from attnbench.core.case import Case
from attnbench.core.errors import BadInput, shown
from attnbench.core.where import values as where_values

CLAIM_KEYS = ("text", "source", "kind", "metric", "backend", "numerator", "denominator",
              "where", "numerator_where", "denominator_where", "expected", "scale", "unit",
              "rounds")
MAX_ROUNDS = 1000  # a claim's budget of paired rounds, at most
# A ratio whose two sides select different cases (e.g. a window against causal) joins on shape.
SHAPE = ["batch", "heads_q", "heads_kv", "seq_q", "seq_k", "head_dim", "head_dim_v", "dtype",
         "mode"]
KINDS = ("ratio", "value", "exponent")
WHERE_FIELDS = Case.columns() + ("seq_len",)


def validate_claims(raw, path) -> list[dict]:
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise BadInput(f"{path}: claim = {shown(raw)}: must be a list of [[claim]] tables")
    out = []
    for i, c in enumerate(raw):
        where = f"claim[{i}]"
        if not isinstance(c, dict):
            raise BadInput(f"{path}: {where} = {shown(c)}: must be a table")
        for k in c:
            if k not in CLAIM_KEYS:
                raise BadInput(f"{path}: {where}.{k} = {shown(c[k])}: unknown key; allowed: "
                               f"{', '.join(CLAIM_KEYS)}")
        kind = c.get("kind")
        if kind not in KINDS:
            raise BadInput(f"{path}: {where}.kind = {shown(kind)}: allowed: {', '.join(KINDS)}")
        need = {"ratio": ("numerator", "denominator"), "value": ("backend",),
                "exponent": ("backend",)}[kind]
        for k in ("text",) + need:
            if not isinstance(c.get(k), str):
                raise BadInput(f"{path}: {where}.{k} = {shown(c.get(k))}: must be a string")
        if "metric" in c and (not isinstance(c["metric"], str)
                              or c["metric"] not in metrics.BY_NAME):
            close = difflib.get_close_matches(str(c["metric"]), metrics.NAMES, n=4)
            raise BadInput(f"{path}: {where}.metric = {shown(c['metric'])}: not a declared "
                           f"metric; allowed: one of the {len(metrics.NAMES)} in "
                           f"core/metrics.py, e.g. {', '.join(close or metrics.NAMES[:4])}")
        scale = c.get("scale", 1.0)
        if (isinstance(scale, bool) or not isinstance(scale, (int, float))
                or not math.isfinite(scale) or scale == 0):
            raise BadInput(f"{path}: {where}.scale = {shown(scale)}: must be a finite nonzero "
                           f"number (the factor the metric is multiplied by)")
        for k in ("source", "unit"):
            if k in c and not isinstance(c[k], str):
                raise BadInput(f"{path}: {where}.{k} = {shown(c[k])}: must be a string")
        exp = c.get("expected")
        if exp is not None and not (isinstance(exp, list) and 1 <= len(exp) <= 2 and all(
                isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
                for x in exp)):
            raise BadInput(f"{path}: {where}.expected = {shown(exp)}: give [low, high] or [low]")
        for k in ("where", "numerator_where", "denominator_where"):
            if not isinstance(c.get(k, {}), dict):
                raise BadInput(f"{path}: {where}.{k} = {shown(c[k])}: must be a table")
            for field, value in c.get(k, {}).items():
                if field not in WHERE_FIELDS:
                    raise BadInput(f"{path}: {where}.{k}.{field}: unknown case field; "
                                   f"allowed: {', '.join(WHERE_FIELDS)}")
                if not all(isinstance(x, (str, int, float)) for x in where_values(value)):
                    raise BadInput(f"{path}: {where}.{k}.{field} = {shown(value)}: must be a "
                                   f"value or a list of values")
        if "rounds" in c:
            _check_rounds(c, f"{path}: {where}.rounds")
        out.append(dict(c))
    declared = {tuple(c["rounds"]) for c in out if "rounds" in c}
    if len(declared) > 1:
        raise BadInput(f"{path}: claim rounds = {' and '.join(map(str, map(list, declared)))}"
                       f": the claims of one suite share one set of looks (claims timed in "
                       f"one group need one stopping rule)")
    return out


def _check_rounds(claim: dict, where: str) -> None:
    rounds = claim["rounds"]
    if claim.get("kind") != "ratio" or not claim.get("expected") or \
            claim.get("metric", "time_ms_median") != "time_ms_median":
        raise BadInput(f"{where} = {shown(rounds)}: only a ratio claim of time_ms_median "
                       f"with an expected range can be decided by sequential rounds")
    if not (isinstance(rounds, list) and rounds and all(
            isinstance(x, int) and not isinstance(x, bool) for x in rounds)
            and rounds[0] >= 1 and rounds[-1] <= MAX_ROUNDS
            and all(b > a for a, b in zip(rounds, rounds[1:]))):
        raise BadInput(f"{where} = {shown(rounds)}: allowed: a list of increasing whole "
                       f"numbers of rounds (the looks), 1..{MAX_ROUNDS}, e.g. [8, 16, 24, 32]")
    from attnbench.stats import sequential  # numpy, scipy: only a claim with rounds needs it

    looks = sequential.Looks(tuple(rounds))
    if not looks.reachable():
        raise BadInput(f"{where} = {shown(rounds)}: {rounds[0]} rounds cannot reach the "
                       f"{looks.per_look_confidence:.2%} interval each of {len(rounds)} "
                       f"looks needs; allowed: a first look of more rounds, or fewer looks")
