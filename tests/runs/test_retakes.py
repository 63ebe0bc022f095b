"""A group the run's witnesses read as disturbed is timed again after the first pass and its
least disturbed attempt kept, by the witnesses alone. Rows, samples and probe readings are
injected; the runner's wiring runs fake backends on a fake clock."""

from __future__ import annotations

import math

import numpy as np
import pytest

from attnbench.analysis import departures
from attnbench.core.registry import all_backends
from attnbench.measure.budget import TimingBudget
from attnbench.runs import retakes

ONE = TimingBudget(retakes=1)


def _rows(group: str, probe: float = 100.0, time: float = 1.0, seed: int = 0,
          status: str = "ok", wild: bool = False) -> list[dict]:
    """Two records timed in one group's rounds, the probe read at ``probe`` GFLOP/s in them;
    ``wild``: the first record's samples scatter 40% (its own interval flags it)."""
    rng = np.random.default_rng(seed)
    readings = (probe * rng.lognormal(0, 0.01, 12)).tolist()
    rows = []
    for i, backend in enumerate(("a", "b")):
        s = time * (1 + i) * rng.lognormal(0, 0.01, 12)
        if wild and i == 0:
            s = s * np.tile([0.6, 1.0, 1.4], 4)
        rows.append({"key": group, "backend": backend, "status": status if i else "ok",
                     "device": "cpu", "samples_ms": s.tolist(), "probe_readings": readings,
                     "probe_gflops": float(np.median(readings)), "pair_group": group})
    return rows


def _first_pass(**disturbed) -> list[tuple[str, list[dict]]]:
    """Six groups at probe 100; ``disturbed[g]``: _rows keywords for group g."""
    return [(g, _rows(g, seed=i, **disturbed.get(g, {})))
            for i, g in enumerate(("g0", "g1", "g2", "g3", "g4", "g5"))]


def test_the_disturbance_is_the_groups_largest_known_departure():
    level = 100.0
    calm, slowed = _rows("g", 100.0), _rows("g", 70.0)
    assert retakes.disturbance(calm, level, ONE) == 0
    expect = departures.of_record(slowed[0], level, ONE).total
    assert retakes.disturbance(slowed, level, ONE) == pytest.approx(expect)
    assert expect == pytest.approx(math.log(100 / 70), rel=0.05)
    assert retakes.disturbance(_rows("g", wild=True), level, ONE) > 0
    # an attempt that did not time a record the first one did is never preferred
    failed = _rows("g", status="error")
    assert retakes.disturbance(failed, level, ONE, retakes.timed(calm)) == math.inf
    assert retakes.timed(failed) == {("g", "a")}


def test_a_disturbed_group_is_timed_again_and_the_calmer_attempt_kept():
    first = _first_pass(g2={"probe": 70.0})
    asked = []

    def again(jobs):
        asked.append(jobs)
        return _rows(jobs, 100.0, seed=9)

    out = list(retakes.retaken(first, again, ONE))
    assert asked == ["g2"] and len(out) == 1
    kept = out[0]
    assert [r["key"] for r in kept] == ["g2", "g2"]
    assert all(r["retake_kept"] == 1 for r in kept)
    first_score, second_score = kept[0]["retake_disturbance"]
    assert first_score == pytest.approx(math.log(100 / 70), rel=0.05) and second_score == 0
    assert kept[0]["samples_ms"] == _rows("g2", 100.0, seed=9)[0]["samples_ms"]


def test_the_choice_reads_the_witnesses_never_the_speed():
    """The retake ran 2x faster but on a machine further off (probe 60): the first attempt
    is kept, and both attempts' disturbance are on the record."""
    first = _first_pass(g1={"probe": 80.0})
    out = list(retakes.retaken(first, lambda jobs: _rows(jobs, 60.0, time=0.5), ONE))
    kept = out[0]
    assert all(r["retake_kept"] == 0 for r in kept)
    assert kept[0]["samples_ms"] == first[1][1][0]["samples_ms"]
    low, high = kept[0]["retake_disturbance"]
    assert 0 < low < high


def test_a_retake_that_fails_a_record_is_not_kept_and_steady_groups_are_left():
    first = _first_pass(g3={"wild": True})
    out = list(retakes.retaken(first, lambda jobs: _rows(jobs, status="error"), ONE))
    assert len(out) == 1 and all(r["retake_kept"] == 0 for r in out[0])
    assert out[0][0]["retake_disturbance"][1] is None  # inf: it did not time record b
    # no retakes asked, or none disturbed: nothing is timed again
    never = lambda jobs: pytest.fail("timed again")  # noqa: E731
    assert list(retakes.retaken(first, never, TimingBudget(retakes=0))) == []
    assert list(retakes.retaken(_first_pass(), never, ONE)) == []


def test_up_to_retakes_attempts_stop_at_an_undisturbed_one():
    first = _first_pass(g0={"probe": 70.0})
    probes = iter([75.0, 100.0, 100.0])
    asked = []

    def again(jobs):
        asked.append(jobs)
        return _rows(jobs, next(probes), seed=len(asked))

    kept = list(retakes.retaken(first, again, TimingBudget(retakes=3)))[0]
    assert asked == ["g0", "g0"]  # the second retake was undisturbed: no third
    assert kept[0]["retake_kept"] == 2 and len(kept[0]["retake_disturbance"]) == 3


def test_the_run_level_is_the_median_of_ok_records_probe_rates():
    groups = [("g", _rows("g", p)) for p in (90.0, 100.0, 110.0)]
    assert retakes.run_level(rows for _, rows in groups) == pytest.approx(100, rel=0.02)
    assert retakes.run_level([[{"status": "ok"}]]) is None


def test_a_suite_may_ask_for_retakes_within_bounds(write_suite):
    from attnbench.core.errors import BadInput
    from attnbench.runs.suite import load_suite

    base = ('name = "r"\nbackends = ["naive"]\n[timing]\nretakes = {}\n'
            "[axes]\nheads_q = 1\nhead_dim = 4\nseq_len = 8\n")
    assert load_suite(str(write_suite(base.format(1))), ["naive"]).timing.retakes == 1
    assert load_suite(str(write_suite(base.format(0))), ["naive"]).timing.retakes == 0
    for bad in ("4", "-1", "1.5"):
        with pytest.raises(BadInput, match="timing.retakes"):
            load_suite(str(write_suite(base.format(bad))), ["naive"])


def test_the_run_appends_the_kept_attempt_which_supersedes(fake_clock, write_suite, tmp_path,
                                                           monkeypatch):
    """Wiring: the first attempt of the one group reads as disturbed, the retake does not;
    the records file holds both attempts, and the run's records are the retake's, marked."""
    from attnbench.runs.record_files import RECORDS, read_records
    from attnbench.runs.runner import RunOptions, run_suite
    from attnbench.runs.suite import load_suite

    scores = iter([0.3, 0.0])
    monkeypatch.setattr(retakes, "disturbance", lambda rows, level, budget, needed=None:
                        next(scores))
    path = write_suite('name = "p"\nbackends = ["fake_drift_slow", "fake_drift_fast"]\n'
                       "[timing]\nwarmup_s = 0.0\nrewarm_s = 0.0\nbudget_s = 0.02\n"
                       "min_reps = 6\nmax_reps = 6\nretakes = 1\ntimeout_s = 60\n"
                       "[axes]\nheads_q = 1\nhead_dim = 4\nseq_len = 8\n")
    suite = load_suite(str(path), sorted(all_backends()))
    run = run_suite(suite, "cpu", RunOptions(out=tmp_path, run_id="r", progress=False,
                                             measure_ceilings=False, isolate=False))
    lines = (run / RECORDS).read_text().splitlines()
    assert len(lines) == 4
    rows = read_records(run)
    assert len(rows) == 2 and all(r["retake_kept"] == 1 for r in rows)
    assert all(r["retake_disturbance"] == [0.3, 0.0] for r in rows)
