"""Which backend for my shape: the fastest exact backend the recorded runs measured, within
its error tolerance, on the measured problem nearest to a shape the user gives.

Nearest, defined once here:

* **comparable**: a measured case with the same dtype, mask, mode, head dims (d, dv), GQA
  group (heads_q / heads_kv) and default scale as the shape, on the device type asked for
  (any device when the shape names none);
* **length distance**: ``max(|log2(nq / nq')|, |log2(nk / nk')|)``, in octaves: the
  farther of the two sequence lengths, in log space;
* **near**: a length distance of at most 1 (each length within a factor 2 of the shape's);
* **nearest**: per device type, among the near problems (run, case) where an exact backend
  ran ``ok``, the one with the smallest length distance, then the smallest
  ``|log2(b*hq / b'*hq')|`` (the parallel work), then the most recent run; the nearer
  problems where none did (e.g. a case keyed by a linear feature map, which only linear
  ran) are skipped and named. Backends are only compared inside one problem: one run, one
  case, timed in the same rounds where the suite paired them.

The winner is the fastest ``ok`` record (``ok`` means its error against float64 was within
the dtype's tolerance) of a backend that computes exact softmax attention; its margin is
the runner-up's time over its own with the 95% interval and significance from ``ratios``
(paired rounds when both were timed together). Records that are not ok are listed with
their reasons.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

import pandas as pd

from attnbench.core import record
from attnbench.core.backend import EXACT
from attnbench.core.case import Case
from attnbench.core.errors import BadInput
from attnbench.stats import intervals, ratios

SHAPE_KEYS = {"b": "batch", "hq": "heads_q", "hkv": "heads_kv", "n": "n", "nq": "seq_q",
              "nk": "seq_k", "d": "head_dim", "dv": "head_dim_v", "dtype": "dtype",
              "mask": "mask", "mode": "mode", "device": "device"}
INT_KEYS = ("b", "hq", "hkv", "n", "nq", "nk", "d", "dv")
NEAR_OCTAVES = 1.0  # near: each sequence length within a factor 2
SKIPPED_SHOWN = 5  # skipped problems named one by one; the rest are counted
EXAMPLE = "b=1,hq=32,hkv=8,n=8192,d=128,dtype=bfloat16,mask=causal"
_FIELDS = re.compile(r",(?![^()]*\))")  # commas outside parentheses: window(4095,0) is one


@dataclass(frozen=True)
class Shape:
    """The shape asked about: a Case (its device a placeholder) and the device type, if any."""

    case: Case
    device: str | None

    @property
    def group(self) -> int:
        return self.case.heads_q // self.case.heads_kv

    def describe(self) -> str:
        c = self.case
        n = f"n={c.seq_q}" if c.seq_q == c.seq_k else f"nq={c.seq_q},nk={c.seq_k}"
        dv = "" if c.head_dim_v == c.head_dim else f",dv={c.head_dim_v}"
        dev = f",device={self.device}" if self.device else ""
        return (f"b={c.batch},hq={c.heads_q},hkv={c.heads_kv},{n},d={c.head_dim}{dv},"
                f"dtype={c.dtype},mask={c.mask},mode={c.mode}{dev}")


def parse_shape(text: str) -> Shape:
    """``"b=1,hq=32,hkv=8,n=8192,d=128,dtype=bfloat16,mask=causal"`` -> Shape; BadInput (one
    line naming the value and what is allowed) otherwise. Needs hq, d and n (or nk); b=1,
    hkv=hq, nq=nk, dv=d, dtype=float32, mask=none, mode=fwd, any device by default."""
    def bad(problem: str):
        raise BadInput(f"--shape {text!r}: {problem}; e.g. --shape \"{EXAMPLE}\"")

    values: dict[str, str] = {}
    for item in _FIELDS.split(str(text).strip()):
        key, sep, value = (s.strip() for s in item.partition("="))
        if not sep or not key or not value:
            bad(f"{item.strip()!r} is not key=value")
        if key not in SHAPE_KEYS:
            bad(f"unknown key {key!r}; allowed: {', '.join(SHAPE_KEYS)}")
        if key in values:
            bad(f"{key} given twice")
        values[key] = value
    ints = {}
    for key in INT_KEYS:
        if key in values:
            try:
                ints[key] = int(values[key])
            except ValueError:
                bad(f"{key}={values[key]!r} must be a positive integer")
            if ints[key] <= 0:
                bad(f"{key}={values[key]} must be a positive integer")
    for key in ("hq", "d"):
        if key not in ints:
            bad(f"{key} is required")
    if "n" in ints and ({"nq", "nk"} & set(ints)):
        bad("give n or nq/nk, not both")
    if "n" not in ints and "nk" not in ints:
        bad("n (or nk) is required")
    nk = ints.get("n", ints.get("nk"))
    device = values.get("device")
    if device is not None and device not in ("cpu", "cuda"):
        bad(f"device={device!r}; allowed: cpu, cuda")
    try:
        case = Case(batch=ints.get("b", 1), heads_q=ints["hq"],
                    heads_kv=ints.get("hkv", ints["hq"]),
                    seq_q=ints.get("n", ints.get("nq", nk)), seq_k=nk, head_dim=ints["d"],
                    head_dim_v=ints.get("dv", ints["d"]), dtype=values.get("dtype", "float32"),
                    mask=values.get("mask", "none"), mode=values.get("mode", "fwd"))
    except ValueError as exc:
        bad(str(exc))
    return Shape(case, device)


# ---- choosing ---------------------------------------------------------------------------


def _log2_ratio(a, b) -> float:
    return abs(math.log2(float(a) / float(b)))


def length_distance(shape: Shape, row) -> float:
    """The farther of the two sequence lengths from the shape's, in octaves."""
    return max(_log2_ratio(shape.case.seq_q, row["seq_q"]),
               _log2_ratio(shape.case.seq_k, row["seq_k"]))


def work_distance(shape: Shape, row) -> float:
    c = shape.case
    return _log2_ratio(c.batch * c.heads_q, row["batch"] * row["heads_q"])


def comparable(df: pd.DataFrame, shape: Shape) -> pd.DataFrame:
    """The records whose case is comparable with the shape (see the module's docstring);
    records timed under an interpreter are no speed, so never a pick."""
    df = record.speed_records(df)
    c = shape.case
    keep = pd.Series(True, index=df.index)
    for col in ("dtype", "mask", "mode", "head_dim", "head_dim_v"):
        keep &= df[col] == getattr(c, col) if col in df.columns else False
    keep &= (df["heads_q"] // df["heads_kv"]) == shape.group
    if "scale" in df.columns:
        keep &= df["scale"].isna()
    if shape.device:
        keep &= df["device"].astype(str).str.split(":").str[0] == shape.device
    return df[keep]


def _semantics(df: pd.DataFrame) -> pd.Series:
    """What each record's backend computes: the record's own column, else the registry's."""
    from attnbench.core.registry import all_backends

    known = {n: b.semantics for n, b in all_backends().items()}
    by_name = df["backend"].map(known).fillna("unknown")
    if "semantics" not in df.columns:
        return by_name
    return df["semantics"].where(df["semantics"].notna(), by_name)


@dataclass
class Pick:
    """The answer on one device type: the problem measured and what ran on it."""

    device: str
    run_id: str
    problem: dict  # the measured case's fields
    distance: float  # length distance, octaves
    ranked: list[dict]  # ok exact records, fastest first
    margin: ratios.Difference | None  # runner-up over the winner
    not_ok: list[dict]  # records that are not ok (status, reason)
    inexact: list[str]  # ok records of backends that do not compute exact softmax
    # nearer problems (run id, case key) passed over: no exact backend ran ok there
    skipped: list[tuple[str, str]] = field(default_factory=list)


@dataclass
class Answer:
    shape: Shape
    picks: list[Pick] = field(default_factory=list)
    nearest_far: dict | None = None  # the nearest comparable problem when none is near
    far_distance: float | None = None


def recommend(shape: Shape, df: pd.DataFrame) -> Answer:
    answer = Answer(shape)
    if df.empty:
        return answer
    cand = comparable(df, shape)
    if cand.empty:
        return answer
    cand = cand.assign(
        _dist=cand.apply(lambda r: length_distance(shape, r), axis=1),
        _work=cand.apply(lambda r: work_distance(shape, r), axis=1),
        _when=cand["recorded_at"].astype(str) if "recorded_at" in cand else "",
        _dev=cand["device"].astype(str).str.split(":").str[0],
        _sem=_semantics(cand))
    near = cand[cand["_dist"] <= NEAR_OCTAVES]
    if near.empty:
        far = cand.sort_values(["_dist", "_work"]).iloc[0]
        answer.nearest_far, answer.far_distance = dict(far), float(far["_dist"])
        return answer
    for device, g in near.groupby("_dev", sort=True):
        g = g.assign(_exact_ok=(g["status"] == "ok") & g["time_ms_median"].notna()
                     & (g["_sem"] == EXACT))
        problems = g.groupby(["run_id", "key"], sort=False).agg(
            _dist=("_dist", "first"), _work=("_work", "first"), _when=("_when", "max"),
            _exact_ok=("_exact_ok", "any"))
        problems = problems.reset_index().sort_values(["_dist", "_work", "_when"],
                                                      ascending=[True, True, False])
        answered = problems[problems["_exact_ok"]]
        # the nearest where an exact backend ran ok; else the nearest, to say what ran there
        chosen = answered.index[0] if len(answered) else problems.index[0]
        before = problems.iloc[:problems.index.get_loc(chosen)]
        run_id, key = problems.loc[chosen, ["run_id", "key"]]
        recs = g[(g["run_id"] == run_id) & (g["key"] == key)]
        pick = _pick(str(device), str(run_id), recs)
        pick.skipped = [(str(r), str(k)) for r, k in zip(before["run_id"], before["key"])]
        answer.picks.append(pick)
    return answer


def _pick(device: str, run_id: str, recs: pd.DataFrame) -> Pick:
    ok = recs[(recs["status"] == "ok") & recs["time_ms_median"].notna()]
    exact = ok[ok["_sem"] == EXACT].sort_values("time_ms_median")
    ranked = [dict(r) for _, r in exact.iterrows()]
    margin = ratios.difference(ranked[1], ranked[0]) if len(ranked) > 1 else None
    not_ok = [dict(r) for _, r in recs[recs["status"] != "ok"].iterrows()]
    inexact = [f"{r['backend']} ({r['_sem']})" for _, r in ok[ok["_sem"] != EXACT].iterrows()]
    first = recs.iloc[0]
    problem = {c: first[c] for c in ("batch", "heads_q", "heads_kv", "seq_q", "seq_k",
                                     "head_dim", "head_dim_v", "dtype", "mask", "mode")}
    return Pick(device, run_id, problem, float(first["_dist"]), ranked, margin, not_ok, inexact)


# ---- words --------------------------------------------------------------------------------


def _problem_text(p: dict) -> str:
    n = f"n={p['seq_q']}" if p["seq_q"] == p["seq_k"] else f"nq={p['seq_q']},nk={p['seq_k']}"
    return f"b={p['batch']},hq={p['heads_q']},hkv={p['heads_kv']},{n},d={p['head_dim']}"


def measure_suite(shape: Shape) -> str:
    """A suite (TOML) that measures the shape with every exact backend registered."""
    from attnbench.core.registry import all_backends

    c = shape.case
    exact = sorted(n for n, b in all_backends().items() if b.semantics == EXACT)
    return "\n".join([
        'name = "shape"',
        f'description = "attnbench recommend: {shape.describe()}"',
        "backends = [" + ", ".join(f'"{b}"' for b in exact) + "]",
        "[axes]",
        f"batch = {c.batch}", f"heads_q = {c.heads_q}", f"heads_kv = {c.heads_kv}",
        f"seq_q = {c.seq_q}", f"seq_k = {c.seq_k}", f"head_dim = {c.head_dim}",
        f"head_dim_v = {c.head_dim_v}", f'dtype = "{c.dtype}"', f'mask = "{c.mask}"',
        f'mode = "{c.mode}"', ""])


def render(answer: Answer, where: str) -> str:
    shape = answer.shape
    lines = [f"shape: {shape.describe()}"]
    if not answer.picks:
        lines.append(f"no run in {where} holds a near shape: none with the same dtype, mask, "
                     f"mode, head dims and GQA group (heads_q/heads_kv = {shape.group})"
                     + (f" on {shape.device}" if shape.device else "")
                     + " and each sequence length within a factor 2")
        if answer.nearest_far is not None:
            p = answer.nearest_far
            lines.append(f"nearest comparable: {_problem_text(p)} in run {p['run_id']} "
                         f"({answer.far_distance:.2g} octaves away in length)")
        device = f" --device {shape.device}" if shape.device else ""
        lines += ["to measure it, write this suite and run it:",
                  "cat > shape.toml <<'EOF'", measure_suite(shape).rstrip(), "EOF",
                  f"attnbench run --suite shape.toml{device}"]
        return "\n".join(lines) + "\n"
    for pick in answer.picks:
        lines += [""] + _pick_lines(pick, shape)
    return "\n".join(lines) + "\n"


def _pick_lines(pick: Pick, shape: Shape) -> list[str]:
    p = pick.problem
    c = shape.case
    same = _problem_text(p) == _problem_text(c.to_dict())
    lengths = ("same lengths" if pick.distance == 0 else
               f"lengths {pick.distance:.2g} octaves from the shape's")
    work = ("" if p["batch"] * p["heads_q"] == c.batch * c.heads_q else
            f"; b*hq {p['batch'] * p['heads_q']} where the shape has {c.batch * c.heads_q}")
    where = "the shape itself" if same else f"{_problem_text(p)} ({lengths}{work})"
    out = [f"on {pick.device}: run {pick.run_id}, measured at {where}"]
    if pick.skipped:
        shown = [f"{k} (run {r})" for r, k in pick.skipped[:SKIPPED_SHOWN]]
        more = len(pick.skipped) - len(shown)
        out.append("  skipped as near or nearer, no exact backend ran ok there: "
                   + ", ".join(shown) + (f" and {more} more" if more > 0 else ""))
    if not pick.ranked:
        out.append("  no exact backend passed its error tolerance here")
    else:
        w = pick.ranked[0]
        low, high = w.get("time_ms_ci_low"), w.get("time_ms_ci_high")
        conf = w.get("time_ci_confidence")
        level = intervals.coverage_note(float(conf)) if conf is not None and pd.notna(conf) \
            else ""
        iv = (f" ({level or '95%'} interval {low:.4g}-{high:.4g})"
              if pd.notna(low) and pd.notna(high) else "")
        noisy = " ~noisy (the drift probe moved while it ran)" if w.get("noisy") is True else ""
        out.append(f"  fastest within tolerance: {w['backend']}  {w['time_ms_median']:.4g} ms"
                   f"{iv}{noisy}")
        if pick.margin is None:
            out.append("  runner-up: none (the only exact backend that passed)")
        else:
            r = pick.ranked[1]
            out.append(f"  margin over the runner-up {r['backend']} "
                       f"({r['time_ms_median']:.4g} ms): "
                       f"{ratios.format_ratio(pick.margin.interval)}, significant: "
                       f"{pick.margin.describe()}"
                       + ("" if pick.margin.significant else
                          f"; a tie on this evidence ({w['backend']} has the lower median)"))
        for o in pick.ranked[2:]:
            out.append(f"  then {o['backend']}: "
                       f"{ratios.format_ratio(ratios.difference(o, w).interval)} the winner's "
                       f"time")
    if pick.inexact:
        out.append(f"  not considered (not exact softmax): {', '.join(pick.inexact)}")
    for r in pick.not_ok:
        label = "failed its error tolerance" if r["status"] == "wrong" else r["status"]
        out.append(f"  {r['backend']}: {label}: {r.get('reason') or '-'}")
    return out
