"""Compare two runs record by record: joined on (key, backend), new / base of a metric.

The metric's declaration says which direction is worse. With raw samples on both sides (the
time metrics), a change is decided by the one significance rule
(``stats.significance.decide``) on the bootstrap interval of the ratio of medians, widened
by the run-to-run component (``stats.run_to_run``: estimated from the unchanged records
when they exist, never below two runs' declared allowance for the device kind), so two
runs of the same code are not called worse or better. Records timed under an interpreter
(``timed_under``) or flagged unsteady by their own samples get ``cannot tell``.
Every verdict's interval is at the family level
(``significance.family_level``): compare draws one verdict per record at once, and at 95%
each a few of many unchanged records would be called by chance alone.
Four answers: ``worse`` / ``better`` (the interval excludes 1 and
the estimate is beyond the threshold), ``unchanged`` (the interval lies within the
threshold) and ``cannot tell`` (neither, or fewer than ``MIN_SAMPLES`` samples a side).
Without samples (memory, TFLOP/s), the threshold alone decides. A record that was ``ok``
and is not ``ok`` now broke.

A record timed in interleaved rounds with at least two partners whose code did not change
is judged by its change over them (``paired_diff``: the machine's move in those rounds
divides out, even a move the rest of the run did not share), widened by the run-to-run
allowance of a ratio (estimated from the unchanged records' changes over their partners,
never below two runs' declared ratio allowance). Every other record is judged against the
machine's move.

A record the run is known to have disturbed (``departures``: the probe in its rounds stood
off the run's level, or the noise flag flagged it) carries that departure on both sides in
quadrature on top of the allowance, which is estimated from the undisturbed records only:
a few disturbed records neither widen every steady record's interval until a real change
hides, nor read their own disturbance as a change.

The machine is separated from the code: when references were measured in both runs --
records of backends whose code did not change (``backend_hash``), else the drift probe --
their median ratio is the machine's move, and every record is judged by its ratio over
that move (a ratio of ratios), so a machine 1.3x slower does not read as a regression of
every backend. When both witnesses exist and disagree (more than ``WITNESS_GAP`` apart,
intervals disjoint), a record whose answer depends on which one is divided out gets
``cannot tell``. So does a record whose answer depends on which unchanged backend's move is
divided out, when the runs share one setup (``same_setup``: environment and commit, clean
trees) and some unchanged backends moved unlike the majority beyond the run-to-run
allowance (an uneven move: a machine whose memory bandwidth and compute moved by different
amounts cannot be divided out as one number). And so does a record judged by the machine's move
whose own rounds ran on a different machine: the drift probe read in them moved between the
runs beyond what it moves between two runs of one machine state, over the run's move
(``stats.probe_shift``), so a burst that slowed it unlike the rest of the run cannot be
told from a change of code. A record judged over its partners shares its rounds' machine
with them and only a burst's uneven share moves it, at most about as far as the probe moved:
the probe's move in its rounds is carried as a known departure instead.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from attnbench.analysis import departures, paired_diff
from attnbench.core import metrics
from attnbench.core.record import timed_under
from attnbench.measure.budget import TimingBudget
from attnbench.stats import intervals, probe_shift, run_to_run, significance

SAMPLED = {"time_ms_median"}  # metrics whose raw samples records keep (samples_ms)
MIN_REFERENCES = 6  # reference records the machine's move needs (a 95% interval of it)
WITNESS_GAP = 1.25  # the two witnesses of the machine's move disagree beyond this factor
MIN_UNEVEN = 3  # records an unchanged backend needs to witness an uneven move
UNSTEADY_REL = TimingBudget().unsteady_rel  # a change over partners scattered beyond this
CHANGES = ("worse", "better", "unchanged", "cannot tell", "broke", "fixed")
# Why a record is 'cannot tell' (the ``why`` column), in the words compare prints.
WHY = {
    "interpreter": "timed under an interpreter, no speed",
    "probe moved": "its rounds' drift probe moved unlike the run's, judged by the machine",
    "scattered": "its times over its partners scatter beyond unsteady_rel",
    "unsteady": "its own samples flagged unsteady",
    "witnesses": "the answer depends on which witness of the machine's move is divided out",
    "few samples": "fewer samples a side than the rule allows",
    "wide": "its interval across runs is too wide for either answer",
}


def join_runs(base: pd.DataFrame, new: pd.DataFrame, metric: str) -> pd.DataFrame:
    cols = ["key", "backend", "status", metric, "samples_ms", "backend_hash", "env_id",
            "probe_gflops", "probe_readings", "device", "timed_under", "kernel", "noisy",
            "noisy_by"]
    base, new = migrated_keys(base, new)
    # a column only one run has still gets its side's suffix: an older run lacks some
    cols = [c for c in cols if c in base.columns or c in new.columns]
    b = _with_departures(base.reindex(columns=cols), base)
    n = _with_departures(new.reindex(columns=cols), new)
    j = b.merge(n, on=["key", "backend"], how="outer", suffixes=("_base", "_new"))
    for side in ("base", "new"):
        if f"{metric}_{side}" not in j.columns:  # e.g. every record of that run failed
            j[f"{metric}_{side}"] = float("nan")
    j["ratio"] = j[f"{metric}_new"] / j[f"{metric}_base"]
    return j


def _with_departures(cols: pd.DataFrame, run: pd.DataFrame) -> pd.DataFrame:
    """``cols`` with each record's known departures in its run (``departures.known``):
    ``departure`` (machine and unsteadiness, log scale) and ``unsteadiness``."""
    known = departures.known(run)
    idents = list(zip(cols["key"], cols["backend"])) if not cols.empty else []
    none = departures.Departure()
    return cols.assign(
        departure=[known.get(i, none).total for i in idents],
        unsteadiness=[known.get(i, none).unsteadiness for i in idents])


def migrated_keys(base: pd.DataFrame, new: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The two runs with keys recorded before a backend's parameters left other backends'
    keys rewritten as that backend keys them now (``Case.identity_of``), where a record is
    unmatched on (key, backend) and its rewritten key is unique on its side: an old run then
    pairs with a new one record by record, and two old runs pair as they did."""
    if base.empty or new.empty or "key" not in base or "key" not in new:
        return base, new
    old = set(zip(base["key"], base["backend"]))
    now = set(zip(new["key"], new["backend"]))
    if old == now:
        return base, new
    return _rekeyed(base, now), _rekeyed(new, old)


def _rekeyed(df: pd.DataFrame, other: set) -> pd.DataFrame:
    from attnbench.core.case import Case
    from attnbench.core.registry import all_backends

    known = all_backends()
    masks = df["mask"] if "mask" in df.columns else [""] * len(df)
    keys = []
    for key, mask, backend in zip(df["key"], masks, df["backend"]):
        b = known.get(backend)
        if (key, backend) in other or b is None:
            keys.append(key)
        else:
            keys.append(Case.identity_of(key, mask, lambda n, b=b, m=mask: b.reads_knob(n, m)))
    pairs = pd.Series(list(zip(keys, df["backend"])), index=df.index)
    clash = pairs.duplicated(keep=False) & (pd.Series(keys, index=df.index) != df["key"])
    return df.assign(key=[k if not c else old for k, c, old in zip(keys, clash, df["key"])])


def _samples(value) -> list[float]:
    return list(value) if isinstance(value, (list, tuple)) else []


def speed_ok(r) -> bool:
    """Whether both sides of a joined record are speeds: neither was timed under an
    interpreter or emulator (``timed_under``), which compare never calls worse or better."""
    return not any(timed_under({"timed_under": r.get(f"timed_under_{side}"),
                                "kernel": r.get(f"kernel_{side}")})
                   for side in ("base", "new"))


def unsteady(r) -> bool:
    """Whether either side's record was flagged noisy by its own samples (its interval
    reaches farther than the run's ``unsteady_rel``): a bootstrap of so few scattered samples
    is narrower than what a rerun moves it by, so compare calls no change on it."""
    return any(isinstance(v, str) and "samples" in v.split("+")
               and not _cleared(r.get(f"noisy_{side}"))
               for side, v in (("base", r.get("noisy_by_base")),
                               ("new", r.get("noisy_by_new"))))


def _cleared(noisy) -> bool:
    """Whether a record's ``noisy`` says it is not noisy: its ``noisy_by`` is then a reason
    left by its first process before the pooled samples were judged (older runs)."""
    return isinstance(noisy, (bool, np.bool_)) and not noisy


def known_departure(r, what: str = "departure") -> float:
    """A joined record's known departures on both sides (``departures``), in quadrature,
    log scale: ``departure`` for its own time, ``unsteadiness`` for its time over partners
    timed in the same rounds (their machine is its)."""
    values = [r.get(f"{what}_{side}") for side in ("base", "new")]
    return math.hypot(*(float(v) for v in values if v is not None and pd.notna(v)))


def _code_unchanged(r) -> bool:
    hb, hn = r.get("backend_hash_base"), r.get("backend_hash_new")
    return isinstance(hb, str) and isinstance(hn, str) and hb == hn


@dataclass(frozen=True)
class MachineMove:
    """How much slower (> 1) or faster the machine ran the same work in the new run:
    ``interval`` of the median ratio new / base over ``n`` references, from ``source``.
    ``between`` is the run-to-run half-width (log scale) the unchanged references show
    (None: none to estimate it from). ``other`` is the second witness when it disagrees
    with this one. ``uneven`` holds the moves of unchanged backends that moved unlike the
    majority (``uneven_moves``), each a witness too."""

    interval: intervals.Interval
    source: str  # "unchanged backends" or "drift probe"
    between: float | None = None
    other: MachineMove | None = None
    uneven: tuple[tuple[str, intervals.Interval], ...] = ()

    def witnesses(self) -> list[float]:
        """Every move a record's ratio is divided by to see whether its answer holds."""
        out = [self.interval.estimate] + [iv.estimate for _, iv in self.uneven]
        return out + ([self.other.interval.estimate] if self.other is not None else [])

    def describe(self) -> str:
        iv = self.interval
        conf = intervals.coverage_note(iv.confidence)
        text = (f"the machine moved {iv.estimate:.3g}x [{iv.low:.3g}, {iv.high:.3g}"
                f"{', ' + conf if conf else ''}] (new / base time, from {iv.n} records: "
                f"{self.source})")
        if self.other is not None:
            o = self.other.interval
            text += (f"; but the WITNESSES DISAGREE: {self.other.source} says {o.estimate:.3g}x "
                     f"[{o.low:.3g}, {o.high:.3g}], more than {WITNESS_GAP:g}x apart, so a "
                     f"record whose answer depends on which is divided out is 'cannot tell'")
        if self.uneven:
            moved = ", ".join(f"{b} {iv.estimate:.3g}x [{iv.low:.3g}, {iv.high:.3g}]"
                              for b, iv in self.uneven)
            text += (f"; but the machine MOVED UNEVENLY: unchanged {moved} moved unlike the "
                     f"majority, so a record whose answer depends on which move is divided out "
                     f"is 'cannot tell'")
        return text


def between_text(between: float | None, device=None) -> str:
    """'run-to-run allowance +-7% (two runs' declared allowance, cpu)' or '+-9% (from the
    unchanged records)'."""
    width = run_to_run.half_width(between, device)
    how = (f"two runs' declared allowance, {run_to_run.kind(device)}"
           if between is None or between <= run_to_run.two_runs(device)
           else "from the unchanged records")
    return f"run-to-run allowance +-{math.expm1(width):.0%} ({how})"


def run_device(df: pd.DataFrame):
    """The device a run's records were measured on (its first record's), None if unsaid."""
    if "device" not in df.columns or df["device"].dropna().empty:
        return None
    return str(df["device"].dropna().iloc[0])


def _joined_device(joined: pd.DataFrame):
    """The device the new side of joined records was measured on (None if unsaid)."""
    return next((d for d in joined.get("device_new", []) if isinstance(d, str)), None)


def partner_changes(base: pd.DataFrame, new: pd.DataFrame) -> dict:
    """Each record's change over its unchanged partners timed in the same rounds
    (``paired_diff.relative_changes``), keyed as ``join_runs`` keys them."""
    return paired_diff.relative_changes(*migrated_keys(base, new))


def _agreeing_backends(moves: dict[str, float], tolerance: float) -> list[str]:
    """The largest set of backends whose median moves agree within ``tolerance`` of one of
    them, when it is a strict majority; else [] (the references disagree: half the backends
    3x slower and half unchanged could be either a slower machine or a slower backend)."""
    best: list[str] = []
    for m in moves.values():
        near = [b for b, x in moves.items() if abs(math.log(x / m)) <= math.log1p(tolerance)]
        if len(near) > len(best):
            best = near
    return best if len(best) * 2 > len(moves) else []


def machine_move(joined: pd.DataFrame, metric: str, tolerance: float = 0.10,
                 same_setup: bool = False) -> MachineMove | None:
    """The machine's move between the runs, from references measured in both.

    First the backends whose code hash did not change (the same code on the same cases:
    what changed is the machine): each backend's median ratio, and when a strict majority
    of those backends agree (within ``tolerance``), the median ratio over their records.
    Else the drift probe each record carries (a fixed matmul: the machine itself). None
    with fewer than ``MIN_REFERENCES`` records of either, or references that disagree and
    no probe: the runs cannot separate machine from code. When both witnesses exist and
    disagree (``witnesses_disagree``), the probe rides along as ``other``. With
    ``same_setup`` (the runs' ``same_setup``), unchanged backends that moved unlike the
    majority ride along as ``uneven``."""
    if metric not in SAMPLED:
        return None
    both_ok = joined[(joined["status_base"] == "ok") & (joined["status_new"] == "ok")
                     & joined["ratio"].notna() & (joined["ratio"] > 0)]
    both_ok = both_ok[[speed_ok(r) for _, r in both_ok.iterrows()]] if not both_ok.empty \
        else both_ok
    probe = _probe_witness(both_ok)
    refs = both_ok[[_code_unchanged(r) for _, r in both_ok.iterrows()]] \
        if not both_ok.empty else both_ok
    if len(refs) >= MIN_REFERENCES:
        moves = {b: float(g["ratio"].median()) for b, g in refs.groupby("backend")}
        agree = _agreeing_backends(moves, tolerance)
        agreed = refs[refs["backend"].isin(agree)]
        ratios = agreed["ratio"].astype(float).tolist()
        if len(ratios) >= MIN_REFERENCES:
            between = _machine_between(agreed, run_probe_move(joined))
            majority = intervals.median_interval(ratios)
            uneven = uneven_moves(refs[~refs["backend"].isin(agree)], majority, between) \
                if same_setup else ()
            other = probe if probe is not None and witnesses_disagree(majority, probe.interval) \
                else None
            return MachineMove(majority, f"{len(agree)} of {len(moves)} unchanged backends "
                               "that agree", between, other, uneven)
    return probe


def _machine_between(agreed: pd.DataFrame, probe_move: float | None) -> float | None:
    """The between-run half-width the agreeing unchanged records show around the machine's
    move (``run_to_run.spread_from_replicates``), read from those that can get a verdict
    over it (``undecidable``) and carry no known departure (each record adds its own:
    ``known_departure``); failing ``MIN_REFERENCES`` of those, from the decidable ones,
    else from all."""
    decidable = agreed[[not undecidable(r, None, probe_move) for _, r in agreed.iterrows()]]
    steady = decidable[[known_departure(r) == 0 for _, r in decidable.iterrows()]]
    refs = next((x for x in (steady, decidable) if len(x) >= MIN_REFERENCES), agreed)
    own = [_sample_interval(r) for _, r in refs.iterrows()]
    return run_to_run.spread_from_replicates(refs["ratio"].astype(float).tolist(),
                                             [iv for iv in own if iv is not None])


def same_setup(base_meta: dict, new_meta: dict) -> bool:
    """Whether two runs were measured with one setup, so that an unchanged backend can only
    have been moved by the machine: the same environment id (device, software, threads,
    commit) from a clean tree on both sides. A dirty tree may hold an edit outside a
    backend's hashed code, and a run without a commit cannot say."""
    envs = [m.get("environment") or {} for m in (base_meta, new_meta)]
    ids = [m.get("environment_id") for m in (base_meta, new_meta)]
    return bool(ids[0]) and ids[0] == ids[1] and all(
        e.get("git_commit") and e.get("git_dirty") is False for e in envs)


def uneven_moves(dissent: pd.DataFrame, majority: intervals.Interval, between: float | None
                 ) -> tuple[tuple[str, intervals.Interval], ...]:
    """The moves of unchanged backends outside the agreeing majority that moved unlike it
    (of two runs of one setup, ``same_setup``: only the machine moved them): at least
    ``MIN_UNEVEN`` records, their median move farther from the majority's than the
    run-to-run allowance and its interval excluding the majority's move. Empty when the
    machine moved evenly."""
    if dissent.empty:
        return ()
    out = []
    for backend, g in dissent.groupby("backend"):
        ratios = g["ratio"].astype(float).tolist()
        if len(ratios) < MIN_UNEVEN:
            continue
        iv = intervals.median_interval(ratios)
        device = _joined_device(g)
        far = abs(math.log(iv.estimate / majority.estimate)) > run_to_run.half_width(
            between, device)
        if far and not iv.low <= majority.estimate <= iv.high:
            out.append((str(backend), iv))
    return tuple(out)


def _probe_witness(both_ok: pd.DataFrame) -> MachineMove | None:
    if not {"probe_gflops_base", "probe_gflops_new"} <= set(both_ok.columns):
        return None
    p = both_ok[both_ok["probe_gflops_base"].notna() & both_ok["probe_gflops_new"].notna()]
    slow = (p["probe_gflops_base"] / p["probe_gflops_new"]).tolist()  # time: rate inverted
    if len(slow) < MIN_REFERENCES:
        return None
    return MachineMove(intervals.median_interval(slow), "the drift probe")


def witnesses_disagree(a: intervals.Interval, b: intervals.Interval) -> bool:
    """Whether two estimates of the machine's move disagree: more than ``WITNESS_GAP``
    apart and their intervals disjoint."""
    far = abs(math.log(a.estimate / b.estimate)) > math.log(WITNESS_GAP)
    return far and (a.high < b.low or b.high < a.low)


def _sample_interval(r) -> intervals.Interval | None:
    """A joined record's within-run interval of new / base, from its samples."""
    a, b = _samples(r.get("samples_ms_base")), _samples(r.get("samples_ms_new"))
    return intervals.ratio_interval(b, a) if a and b else None


def _relative(iv: intervals.Interval, m: float) -> intervals.Interval:
    """A record's ratio over the machine's move: the interval divided by the move's median
    ``m``.

    The move's own interval is shown but not propagated: it is the median over many
    records, and its order-statistics interval spans the records that did change (a third
    of them changed 3x: its upper bound is 3), which would hide exactly those changes."""
    return intervals.Interval(iv.estimate / m, iv.low / m, iv.high / m, iv.confidence, iv.n,
                              iv.method + "/machine")


def _sampled_verdict(iv: intervals.Interval, move: MachineMove | None, threshold: float,
                     lower: bool, device=None, known: float = 0.0,
                     level: float = intervals.LEVEL) -> tuple[str, intervals.Interval]:
    """The verdict on one record's ratio interval new / base, widened by the run-to-run
    allowance and the record's ``known`` departures (``known_departure``) and rescaled to
    ``level`` (``significance.family_level``), returned, over the machine's move when given,
    by the one rule; 'cannot tell' when the two witnesses of the move disagree and the
    answer depends on which one is divided out."""
    wide = intervals.rescaled(run_to_run.widen(iv, math.hypot(run_to_run.half_width(
        move.between if move else None, device), known)), level)
    if move is None:
        return significance.decide(wide, threshold, lower), wide
    verdict = significance.decide(_relative(wide, move.interval.estimate), threshold, lower)
    if any(significance.decide(_relative(wide, m), threshold, lower) != verdict
           for m in move.witnesses()[1:]):
        verdict = significance.CANNOT_TELL
    return verdict, wide


def _partners_verdict(rel: paired_diff.Relative, between: float, threshold: float,
                      lower: bool, known: float = 0.0, level: float = intervals.LEVEL
                      ) -> tuple[str, intervals.Interval]:
    """The verdict on a record's change over its unchanged partners in the same rounds,
    widened by the run-to-run allowance of a ratio and the record's ``known`` departures
    (unsteadiness on both sides, ``rounds_shift``) and rescaled to ``level``; 'cannot tell'
    when either side's relative times scatter beyond ``UNSTEADY_REL`` (so few scattered
    rounds are no base for a verdict)."""
    wide = intervals.rescaled(run_to_run.widen(rel.interval, math.hypot(between, known)),
                              level)
    if _scattered(rel):
        return significance.CANNOT_TELL, wide
    return significance.decide(wide, threshold, lower), wide


def partners_between(relative: dict, joined: pd.DataFrame, device=None) -> float:
    """The between-run half-width (log scale) for changes over partners: what the unchanged
    records' relative changes show, never below two runs' declared ratio allowance. Only
    records that can get a verdict over partners (``undecidable``) and carry no known
    departure are read: one left 'cannot tell' for its own scatter, or disturbed in its
    rounds (``rounds_shift``), says nothing of how far the others move, and its scatter
    would hide their changes."""
    unchanged = set()
    for _, r in joined.iterrows():
        rel = relative.get((r["key"], r["backend"]))
        if _code_unchanged(r) and known_departure(r, "unsteadiness") == 0 \
                and not undecidable(r, rel) and rounds_shift(r, rel) == 0:
            unchanged.add((r["key"], r["backend"]))
    return run_to_run.half_width(paired_diff.unchanged_spread(relative, unchanged), device,
                                 "ratio")


def undecidable(r, rel: paired_diff.Relative | None = None, probe_move: float | None = None
                ) -> bool:
    """Whether a joined record is 'cannot tell' whatever its ratio: timed under an
    interpreter (``speed_ok``), its relative times (``rel``) or own samples (``unsteady``)
    scatter too far to judge, or, judged by the machine's move (no ``rel``), its rounds'
    probe moved over ``probe_move``, the run's (``probe_shift.shift``)."""
    if not speed_ok(r):
        return True
    if rel is not None:
        return _scattered(rel)
    return _shifted(r, None, probe_move) is not None or unsteady(r)


def rounds_shift(r, rel: paired_diff.Relative | None) -> float:
    """How far (log scale) the probe in a record's rounds moved between the runs, when the
    record is judged over its partners (``rel``) and the move is beyond the probe's limit
    (``probe_shift.shift``); else 0. A burst slows a record and its partners unevenly, by
    about as much as it slowed the probe at most, so the move is a known departure of the
    record's change over them."""
    shifted = _shifted(r, rel, None) if rel is not None else None
    return abs(math.log(shifted.factor)) if shifted is not None else 0.0


def _scattered(rel: paired_diff.Relative) -> bool:
    """Whether either side's relative times scatter beyond ``UNSTEADY_REL``."""
    return max(rel.reach) > UNSTEADY_REL


def _shifted(r, rel: paired_diff.Relative | None, probe_move: float | None
             ) -> probe_shift.Shift | None:
    # over partners the rounds' own machine matters; over the machine, its move beyond
    # the run's
    return probe_shift.shift(r.get("probe_readings_base"), r.get("probe_readings_new"),
                             1.0 if rel is not None else probe_move, r.get("device_new"))


def partners_if_tighter(relative: dict, joined: pd.DataFrame, move: MachineMove | None
                        ) -> tuple[dict, float | None, str | None]:
    """The changes over partners when the unchanged records say they scatter less between
    the runs than ratios over the machine's move do (``partners_between`` against the
    machine's ``half_width``), else none, with why: runs whose rounds were not kept in step
    (old runs, adaptive stops per process) can pair records less well than the machine's
    move divides out. Both spreads are read from the unchanged records only. Returns the
    changes kept, their between-run half-width (``partners_between``; None when none are
    kept) and why none are kept."""
    if not relative:
        return {}, None, None
    device = _joined_device(joined)
    partners = partners_between(relative, joined, device)
    machine = run_to_run.half_width(move.between if move else None, device)
    if partners <= machine:
        return relative, partners, None
    why = (f"partners not used: unchanged records' changes over their partners scatter "
           f"+-{math.expm1(partners):.0%} between the runs, more than their ratios over the "
           f"machine's move (+-{math.expm1(machine):.0%})")
    return {}, None, why


def run_probe_move(joined: pd.DataFrame) -> float | None:
    """The run's move by the probe read in each record's rounds: the median of the records'
    probe time ratios new / base (``probe_shift.time_ratio``); None without any."""
    if "probe_readings_base" not in joined.columns or "probe_readings_new" not in joined:
        return None
    both = [t for a, b in zip(joined["probe_readings_base"], joined["probe_readings_new"])
            if (t := probe_shift.time_ratio(a, b)) is not None]
    return float(np.median(both)) if both else None


def sampled_count(joined: pd.DataFrame) -> int:
    """How many joined records get a verdict from their samples at once: ok on both
    sides, speeds (``speed_ok``), with samples on both: the ``m`` of the family level."""
    if joined.empty:
        return 0
    return sum(1 for _, r in joined.iterrows()
               if r.get("status_base") == "ok" and r.get("status_new") == "ok"
               and speed_ok(r) and _samples(r.get("samples_ms_base"))
               and _samples(r.get("samples_ms_new")))


def decide(joined: pd.DataFrame, metric: str, threshold: float,
           move: MachineMove | None = None, relative: dict | None = None,
           between: float | None = None) -> pd.DataFrame:
    """Adds ``change`` (worse/better/unchanged/cannot tell/broke/fixed/-), the ratio's
    interval widened by the run-to-run allowance (``ratio_low/high``), ``vs_machine`` (the
    ratio over the machine's move, when ``move`` is given), ``vs_partners`` (the change over
    the record's unchanged partners timed in the same rounds, from ``relative``:
    ``paired_diff.relative_changes``; it decides where it exists, ``vs_machine`` elsewhere)
    with its interval (``partners_low/high``), ``probe_shift`` (the factor by which the
    probe in the record's rounds moved beyond its limit: 'cannot tell' over the machine's
    move, a known departure over partners: ``rounds_shift``) and
    ``code_changed``, and for a 'cannot tell' record ``why`` (a ``WHY`` key). ``between``:
    the partners' between-run half-width when the caller has it (``partners_between``).
    The intervals a verdict reads (``partners_low/high`` where partners decide, else
    ``ratio_low/high``) are at the family level of the records judged from samples at once
    (``sampled_count``, ``significance.family_level``).
    """
    m = metrics.get(metric)
    lower = m.better == metrics.LOWER
    relative = relative if metric in SAMPLED and relative else {}
    if relative and between is None:
        between = partners_between(relative, joined, _joined_device(joined))
    probe_move = run_probe_move(joined) if metric in SAMPLED else None
    level = significance.family_level(sampled_count(joined)) if metric in SAMPLED \
        else intervals.LEVEL
    rows = []
    for _, r in joined.iterrows():
        out = {"change": "-", "ratio_low": None, "ratio_high": None, "vs_machine": None,
               "vs_partners": None, "partners_low": None, "partners_high": None,
               "probe_shift": None, "why": None}
        sb, sn = r.get("status_base"), r.get("status_new")
        if sb == "ok" and isinstance(sn, str) and sn != "ok":
            out["change"] = "broke"
        elif sn == "ok" and isinstance(sb, str) and sb != "ok":
            out["change"] = "fixed"
        elif sb == "ok" and sn == "ok" and pd.notna(r.get("ratio")):
            iv = _sample_interval(r) if metric in SAMPLED else None
            rel = relative.get((r["key"], r["backend"]))
            shifted = _shifted(r, rel, probe_move)
            if not speed_ok(r):
                out.update(change=significance.CANNOT_TELL, why="interpreter")
            elif iv is not None and shifted is not None and rel is None:
                raw = run_to_run.widen(iv, run_to_run.half_width(
                    move.between if move else None, r.get("device_new")))
                out.update(change=significance.CANNOT_TELL, probe_shift=shifted.factor,
                           why="probe moved",
                           ratio_low=raw.low, ratio_high=raw.high,
                           vs_machine=iv.estimate / move.interval.estimate if move else None)
            elif iv is not None and rel is not None:
                known = math.hypot(known_departure(r, "unsteadiness"), rounds_shift(r, rel))
                out["change"], wide = _partners_verdict(rel, between, threshold, lower, known,
                                                        level)
                out["probe_shift"] = shifted.factor if shifted is not None else None
                raw = run_to_run.widen(iv, run_to_run.half_width(
                    move.between if move else None, r.get("device_new")))
                out.update(ratio_low=raw.low, ratio_high=raw.high, vs_partners=wide.estimate,
                           partners_low=wide.low, partners_high=wide.high,
                           why="scattered" if _scattered(rel) else _why(wide))
                if move is not None:
                    out["vs_machine"] = iv.estimate / move.interval.estimate
            elif iv is not None and unsteady(r):
                out.update(change=significance.CANNOT_TELL, why="unsteady")
            elif iv is not None:
                device = r.get("device_new", r.get("device_base"))
                out["change"], wide = _sampled_verdict(iv, move, threshold, lower, device,
                                                       known_departure(r), level)
                alone = significance.decide(
                    _relative(wide, move.interval.estimate) if move else wide, threshold,
                    lower)
                out.update(ratio_low=wide.low, ratio_high=wide.high,
                           why="witnesses" if alone != significance.CANNOT_TELL else _why(wide))
                if move is not None:
                    out["vs_machine"] = wide.estimate / move.interval.estimate
            elif m.worse(r["ratio"], threshold):
                out["change"] = "worse"
            elif m.worse(1 / r["ratio"], threshold) if r["ratio"] else False:
                out["change"] = "better"
            else:
                out["change"] = "unchanged"
        if out["change"] != significance.CANNOT_TELL:
            out["why"] = None
        hb, hn = r.get("backend_hash_base"), r.get("backend_hash_new")
        out["code_changed"] = isinstance(hb, str) and isinstance(hn, str) and hb != hn
        rows.append(out)
    return pd.concat([joined.reset_index(drop=True), pd.DataFrame(rows)], axis=1)


def _why(wide: intervals.Interval) -> str:
    """Why an interval that reached no verdict reached none (a ``WHY`` key)."""
    return "few samples" if significance.why_not(wide) else "wide"


def why_counts(decided: pd.DataFrame) -> dict[str, int]:
    """How many 'cannot tell' records each reason (``WHY``) left so, most first."""
    if "why" not in decided.columns:
        return {}
    counts = decided.loc[decided["change"] == significance.CANNOT_TELL, "why"].value_counts()
    return {str(k): int(v) for k, v in counts.items()}


@dataclass(frozen=True)
class Judged:
    """Two runs judged record by record (``judge``): the decided table and what decided."""

    decided: pd.DataFrame
    joined: pd.DataFrame
    move: MachineMove | None
    relative: dict  # (key, backend) -> paired_diff.Relative, where partners decided
    partners_between: float | None  # their between-run half-width (log), when used
    not_partners: str | None  # why partners were not used, when they were not
    judged: int = 0  # records judged from their samples at once (``sampled_count``)

    @property
    def level(self) -> float:
        """The level of every verdict's interval (``significance.family_level``)."""
        return significance.family_level(self.judged)


def judge(base: pd.DataFrame, new: pd.DataFrame, metric: str, threshold: float,
          same_setup: bool = False, absolute: bool = False) -> Judged:
    """compare's answer for every record of two runs: joined, the machine's move, the
    changes over partners where they are the tighter reference, and ``decide``;
    ``absolute`` judges raw ratios (no machine, no partners)."""
    joined = join_runs(base, new, metric)
    move = None if absolute else machine_move(joined, metric, threshold, same_setup)
    relative, between, why = ({}, None, None) if absolute else partners_if_tighter(
        partner_changes(base, new), joined, move)
    return Judged(decide(joined, metric, threshold, move, relative, between), joined, move,
                  relative, between, why,
                  sampled_count(joined) if metric in SAMPLED else 0)


def regressions(decided: pd.DataFrame) -> pd.DataFrame:
    """Significant regressions beyond the threshold, and ok records that broke."""
    return decided[decided["change"].isin(["worse", "broke"])]


def change_counts(decided: pd.DataFrame) -> dict[str, int]:
    """How many joined records got each answer (every answer listed, zeros included)."""
    counts = decided["change"].value_counts()
    return {c: int(counts.get(c, 0)) for c in CHANGES}


def ratio_text(r) -> str:
    """'ratio 3.1' or, with no ratio (a side failed), ''."""
    value = r.get("ratio")
    return f", ratio {value:.3g}" if value is not None and math.isfinite(value) else ""


def matmul_ceilings(meta: dict) -> dict:
    """A run's matmul ceiling per dtype, TFLOP/s, measured at its start ({} if none)."""
    return (meta.get("ceilings") or {}).get("matmul_tflops") or {}


def probe_rate(meta: dict) -> float | None:
    """A run's drift probe median, GFLOP/s (None if it ran no probe)."""
    return (meta.get("probe") or {}).get("gflops_median")


def ceiling_move(base_meta: dict, new_meta: dict) -> list[str]:
    """The matmul ceilings measured at the start of each run, per dtype: 'float32 0.52 ->
    0.41 TFLOP/s (1.27x slower)'; information beside the machine's move."""
    a, b = matmul_ceilings(base_meta), matmul_ceilings(new_meta)
    out = []
    for dtype in sorted(set(a) & set(b)):
        if a[dtype] and b[dtype]:
            out.append(f"{dtype} {a[dtype]:.3g} -> {b[dtype]:.3g} TFLOP/s "
                       f"({a[dtype] / b[dtype]:.3g}x the time)")
    return out


def probe_move(base_meta: dict, new_meta: dict) -> str | None:
    """The drift probe's median rate in each run, as a time factor."""
    a, b = probe_rate(base_meta), probe_rate(new_meta)
    if not a or not b:
        return None
    return f"drift probe {a:.3g} -> {b:.3g} GFLOP/s ({a / b:.3g}x the time)"


def environment_difference(base_meta: dict, new_meta: dict) -> list[str]:
    """The environment fields that differ between two runs, as 'field: a -> b'."""
    a, b = base_meta.get("environment", {}), new_meta.get("environment", {})
    skip = {"hostname", "device_state"}  # device_state: device_state_difference says it
    return [f"{k}: {a.get(k)} -> {b.get(k)}" for k in sorted(set(a) | set(b))
            if k not in skip and a.get(k) != b.get(k)]


def _clock(meta: dict, df: pd.DataFrame, column: str, at_start: str) -> float | None:
    """A run's clock: the median over its records, else the reading at its start."""
    if column in df.columns and df[column].notna().any():
        return float(df[column].dropna().median())
    value = ((meta.get("environment") or {}).get("device_state") or {}).get(
        "at_start", {}).get(at_start)
    return float(value) if isinstance(value, (int, float)) else None


def _timing_methods(df: pd.DataFrame) -> pd.Series:
    """Each timed record's timing method, by (key, backend). A record written before the
    column was timed by events on a GPU and by the wall clock on a CPU (the only ways then)."""
    if not {"key", "backend", "time_ms_median"} <= set(df.columns):
        return pd.Series(dtype=object)
    timed = df[df["time_ms_median"].notna()].drop_duplicates(["key", "backend"], keep="last")
    said = (timed["timing_method"] if "timing_method" in timed.columns
            else pd.Series(None, index=timed.index, dtype=object))
    if "device" in timed.columns:
        implied = timed["device"].map(lambda d: None if not isinstance(d, str) else
                                      "events" if d.startswith("cuda") else "wallclock")
        said = said.where(said.notna(), implied)
    said.index = pd.MultiIndex.from_frame(timed[["key", "backend"]])
    return said.dropna()


def timing_method_difference(base: pd.DataFrame, new: pd.DataFrame) -> list[str]:
    """The records timed in both runs whose samples were taken differently (events against
    cudagraph, say): a difference in how, named before any verdict on the code."""
    a, b = _timing_methods(base), _timing_methods(new)
    both = a.index.intersection(b.index)
    moved = [(a[i], b[i]) for i in both if a[i] != b[i]]
    if not moved:
        return []
    counts = pd.Series([f"{x} -> {y}" for x, y in moved]).value_counts()
    return [f"timing method differs on {len(moved)} of {len(both)} records timed in both ("
            + ", ".join(f"{change}: {n}" for change, n in sorted(counts.items()))
            + "): their times were taken differently, a cause beside the code"]


def device_state_difference(base_meta: dict, new_meta: dict, base: pd.DataFrame,
                            new: pd.DataFrame) -> list[str]:
    """What the device's state says between two runs, before any verdict on the code: how
    the samples were taken (timing_method_difference), a clock that differs by more than
    CLOCK_DROP_REL, and records measured throttled."""
    from attnbench.core.record import is_throttled
    from attnbench.measure.device_state import CLOCK_DROP_REL

    out = timing_method_difference(base, new)
    for what, column, at_start in (("GPU SM clock", "gpu_sm_mhz", "gpu_sm_mhz"),
                                   ("CPU frequency", "cpu_mhz_begin", "cpu_mhz")):
        a, b = (_clock(m, d, column, at_start) for m, d in ((base_meta, base), (new_meta, new)))
        if a and b and abs(b - a) / max(a, b) > CLOCK_DROP_REL:
            out.append(f"{what} {a:.0f} -> {b:.0f} MHz ({a / b:.3g}x the time at a "
                       f"clock-bound rate): a cause beside the code")
    counts = [int(d["throttled"].map(is_throttled).sum()) if "throttled" in d.columns else 0
              for d in (base, new)]
    if any(counts):
        out.append(f"records measured throttled: {counts[0]} of {len(base)} -> {counts[1]} of "
                   f"{len(new)}")
    return out


__all__ = ["MachineMove", "machine_move", "decide", "judge", "Judged", "regressions",
           "change_counts", "join_runs", "environment_difference", "ceiling_move", "probe_move",
           "device_state_difference", "timing_method_difference"]
