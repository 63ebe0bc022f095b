"""Comparisons: a baseline and the backends set against it, declared as data in a suite.

A suite may carry ``[[comparison]]`` tables::

    [[comparison]]
    name = "window-vs-causal"          # letters, digits, '.', '_', '-': it names the plots
    text = "sliding_window (255,0) against causal sdpa"   # optional
    baseline = "sdpa"
    backends = ["sliding_window", "naive"]
    pair = "shape"                     # "case" (default): the same case key on both sides
    where = { dtype = "float32" }      # both sides
    baseline_where = { mask = "causal" }          # with pair = "shape" only
    backends_where = { mask = "window(255,0)" }

``pair = "case"`` pairs a backend's record with the baseline's record of the same case (and
run); ``pair = "shape"`` pairs records whose cases differ (a window against causal) but
share their shape, as ratio claims with ``numerator_where`` do (``claims.SHAPE``). The
report draws one panel set per comparison. Records no declared comparison selects are
compared as they ran: the backends that ran the same problems, set against the one that
shares problems with the most others (``infer``).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from attnbench.analysis.claim_checks import SHAPE
from attnbench.core.errors import BadInput
from attnbench.core.where import where_mask

if TYPE_CHECKING:  # pandas is imported by the methods that select records: a suite's
    import pandas as pd  # comparisons are checked at load without it

COMPARISON_KEYS = ("name", "text", "baseline", "backends", "pair", "where", "baseline_where",
                   "backends_where")
PAIRINGS = ("case", "shape")
NAME = re.compile(r"^[A-Za-z0-9._-]+$")


@dataclass(frozen=True)
class Comparison:
    name: str
    baseline: str | None  # None: backends that shared no problem with another
    backends: tuple[str, ...]
    pair: str = "case"
    where: dict = field(default_factory=dict)
    baseline_where: dict = field(default_factory=dict)
    backends_where: dict = field(default_factory=dict)
    text: str = ""
    suite: str = ""
    declared: bool = True
    # inferred ones: the (run_id, key) problems both sides ran; () = no restriction
    problems: frozenset = frozenset()

    @property
    def on(self) -> list[str]:
        """The columns two paired records share: the run, and the case key or its shape."""
        return ["run_id", *(SHAPE if self.pair == "shape" else ["problem"])]

    @property
    def slug(self) -> str:
        """What file names say: the suite and the comparison."""
        return slugify(f"{self.suite}-{self.name}" if self.suite else self.name)

    @property
    def title(self) -> str:
        if self.text:
            return self.text
        if self.baseline is None:
            return f"{', '.join(self.backends)} (no other backend ran the same problems)"
        return f"{', '.join(self.backends)} against {self.baseline}"

    def describe(self) -> str:
        """How the sides are selected and paired, in words."""
        if self.baseline is None:
            return "No baseline: no other backend ran these problems."
        sides = (f"baseline {self.baseline}{_where_text(self.where | self.baseline_where)}; "
                 f"set against it: {', '.join(self.backends)}"
                 f"{_where_text(self.where | self.backends_where)}")
        how = ("paired with the baseline's record of the same case in the same run"
               if self.pair == "case" else
               "paired with the baseline's record of the same shape (batch, heads, lengths, "
               "head dims, dtype, mode) in the same run, as ratio claims with per-side "
               "selections are")
        origin = "declared in the suite" if self.declared else \
            "not declared: inferred from the backends that ran the same problems"
        return f"{sides}; {how} ({origin})."

    def _in_scope(self, df: pd.DataFrame) -> pd.Series:
        """A declared comparison speaks for the runs of its own suite only; an inferred one
        for the problems its sides share."""
        import pandas as pd

        if self.declared and self.suite and "suite" in df.columns:
            return df["suite"] == self.suite
        if self.problems:
            return pd.Series([p in self.problems for p in zip(df["run_id"], df["key"])],
                             index=df.index, dtype=bool)
        return pd.Series(True, index=df.index)

    def baseline_records(self, df: pd.DataFrame) -> pd.DataFrame:
        if self.baseline is None:
            return df.iloc[0:0]
        keep = (df["backend"] == self.baseline) & where_mask(df, self.where | self.baseline_where)
        return df[keep & self._in_scope(df)]

    def backend_records(self, df: pd.DataFrame) -> pd.DataFrame:
        keep = df["backend"].isin(self.backends) & where_mask(df, self.where
                                                              | self.backends_where)
        return df[keep & self._in_scope(df)]

    def records(self, df: pd.DataFrame) -> pd.DataFrame:
        """Every record on either side, whatever its status."""
        import pandas as pd

        base = self.baseline_records(df)
        return pd.concat([base, self.backend_records(df).drop(base.index, errors="ignore")])

    def pairs(self, df: pd.DataFrame) -> list[tuple[dict, dict]]:
        """(baseline record, backend record) for every pair, whatever their statuses."""
        from attnbench.stats import ratios

        base, others = self.baseline_records(df), self.backend_records(df)
        if base.empty or others.empty:
            return []
        base, others = with_problem(base), with_problem(others)
        joined = ratios.join(base, others, self.on, list(df.columns))
        out = []
        for _, row in joined.iterrows():
            shared = {c: row[c] for c in self.on}
            out.append((ratios.side(row, "_a") | shared, ratios.side(row, "_b") | shared))
        return out


def with_problem(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` with a ``problem`` column (``Case.problem_of`` its keys): records of two
    backends pair on it, so a backend's own parameters never keep it from its baseline."""
    from attnbench.core.case import Case

    if "problem" in df.columns:
        return df
    keys = df["key"] if "key" in df.columns else [""] * len(df)
    masks = df["mask"] if "mask" in df.columns else [""] * len(df)
    return df.assign(problem=[Case.problem_of(k, m) for k, m in zip(keys, masks)])


def _where_text(where: dict) -> str:
    if not where:
        return ""
    parts = [f"{k} = {', '.join(map(str, v)) if isinstance(v, list) else v}"
             for k, v in where.items()]
    return f" ({'; '.join(parts)})"


def slugify(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-") or "comparison"


def validate_comparisons(raw, path, axes: Callable[[dict, str], dict],
                         backends: Callable[[object, str], list[str]]) -> list[Comparison]:
    """``[[comparison]]`` tables of a suite; ``axes`` and ``backends`` are the suite
    validator's checks of a where-table and of backend names. One-line BadInput on error."""
    if raw is None:
        return []

    def fail(key: str, value, problem: str):
        raise BadInput(f"{path}: {key} = {value!r}: {problem}")

    if not isinstance(raw, list):
        fail("comparison", raw, "must be a list of [[comparison]] tables")
    out: list[Comparison] = []
    for i, c in enumerate(raw):
        at = f"comparison[{i}]"
        if not isinstance(c, dict):
            fail(at, c, "must be a table")
        for k in c:
            if k not in COMPARISON_KEYS:
                fail(f"{at}.{k}", c[k], f"unknown key; allowed: {', '.join(COMPARISON_KEYS)}")
        name = c.get("name")
        if not isinstance(name, str) or not NAME.match(name):
            fail(f"{at}.name", name, "must be a name of letters, digits, '.', '_' and '-'")
        if any(o.name == name for o in out):
            fail(f"{at}.name", name, "already used by another comparison; names must differ")
        if not isinstance(c.get("text", ""), str):
            fail(f"{at}.text", c["text"], "must be a string")
        if not isinstance(c.get("baseline"), str):
            fail(f"{at}.baseline", c.get("baseline"), "must be one backend name")
        baseline = backends(c["baseline"], f"{at}.baseline")[0]
        if "backends" not in c:
            fail(f"{at}.backends", None, "must be a non-empty list of backend names")
        others = backends(c["backends"], f"{at}.backends")
        if baseline in others:
            fail(f"{at}.backends", others, f"lists the baseline {baseline!r}; allowed: the "
                                           f"backends set against it")
        pair = c.get("pair", "case")
        if pair not in PAIRINGS:
            fail(f"{at}.pair", pair, f"allowed: {', '.join(PAIRINGS)}")
        wheres = {}
        for k in ("where", "baseline_where", "backends_where"):
            if k in c and k != "where" and pair != "shape":
                fail(f"{at}.{k}", c[k], 'selects different cases per side; allowed only '
                                        'with pair = "shape"')
            wheres[k] = axes(c.get(k, {}), f"{at}.{k}.")
        out.append(Comparison(name, baseline, tuple(others), pair, wheres["where"],
                              wheres["baseline_where"], wheres["backends_where"],
                              c.get("text", "")))
    return out


def infer(df: pd.DataFrame, suite: str = "") -> list[Comparison]:
    """Comparisons for records that no declaration selected: backends that ran the same
    problems (same run and case key), set against the one sharing problems with the most
    others (then: more shared problems, listed first), on those shared problems only;
    repeated until no problem is shared. Records left over, of problems one backend ran
    alone, form one baseline-less comparison per backend."""
    import pandas as pd

    out = []
    remaining = df
    while not remaining.empty:
        order = list(dict.fromkeys(remaining["backend"]))
        problems = remaining.groupby(["run_id", "key"], sort=False)["backend"].agg(set)
        partners: dict[str, set] = {b: set() for b in order}
        count = {b: 0 for b in order}
        for backends in problems:
            for b in backends:
                partners[b] |= backends - {b}
                count[b] += len(backends) > 1
        baseline = max(order, key=lambda b: (len(partners[b]), count[b], -order.index(b)))
        others = tuple(b for b in order if b in partners[baseline])
        if not others:  # nothing shared any more: each backend on its own
            for b in order:
                mine = remaining[remaining["backend"] == b]
                out.append(Comparison(b, None, (b,), suite=suite, declared=False,
                                      problems=frozenset(zip(mine["run_id"], mine["key"]))))
            break
        shared = frozenset(p for p, backends in problems.items()
                           if baseline in backends and len(backends) > 1)
        name = f"{'-'.join(others) if len(others) <= 3 else 'all'}-vs-{baseline}"
        out.append(Comparison(name, baseline, others, suite=suite, declared=False,
                              problems=shared))
        done = [p in shared for p in zip(remaining["run_id"], remaining["key"])]
        remaining = remaining[~pd.Series(done, index=remaining.index, dtype=bool)]
    return out


def plan(df: pd.DataFrame, declared: list[Comparison], suite: str = ""
         ) -> tuple[list[tuple[Comparison, pd.DataFrame]], list[str]]:
    """Every comparison with its records: the declared ones that select records, then
    inferred ones for the records left over. Also notes on declared ones that select none."""
    import pandas as pd

    out, notes = [], []
    covered = pd.Series(False, index=df.index)
    for c in declared:
        recs = c.records(df)
        if recs.empty:
            notes.append(f"Declared comparison {c.name!r} selects no record of these runs.")
            continue
        present = set(recs["backend"])
        if c.baseline is not None and (c.baseline not in present
                                       or not present & (set(c.backends) - {c.baseline})):
            missing = (c.baseline if c.baseline not in present
                       else ", ".join(b for b in c.backends if b != c.baseline))
            notes.append(f"Declared comparison {c.name!r} has no record of {missing} in "
                         f"these runs: nothing to compare, left out.")
            continue
        covered |= df.index.isin(recs.index)
        out.append((c, recs))
    leftover = df[~covered]
    for c in infer(leftover, suite):
        out.append((c, c.records(leftover)))
    return out, notes
