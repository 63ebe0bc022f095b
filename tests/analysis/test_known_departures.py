"""What a run is known to have done to a record -- the probe in its rounds off the run's
level, or the noise flag on it -- is carried into every interval compared across runs, and
the between-run allowance is estimated from the records without it: a few disturbed
records neither read as a change nor hide a real change of the steady ones. Every sample
and probe reading is injected."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from attnbench.analysis import departures, paired_diff, rerun_agreement, run_diff
from attnbench.stats import noise, probe_shift, run_to_run
from attnbench.stats.intervals import Interval, median_interval

BACKENDS = ("a", "b", "c", "d")
SCATTER = np.tile([0.9, 1.1], 6)  # 20% IQR: flagged 'spread', reach under 'samples'
# a steady probe: its two halves' medians within either half's range (no 'probe' flag)
PROBE_JITTER = np.array([1.0, 1.002, 0.998, 1.001, 0.999, 1.0, 1.002, 0.998])


def _run(seed: int, probe=None, slow=None, scattered=(), groups: int = 8,
         rounds: int = 12) -> pd.DataFrame:
    """``groups`` problems timed in interleaved rounds of a..d; the probe read at
    ``probe[g]`` GFLOP/s (default 100) in group g's rounds; ``slow[(g, b)]`` multiplies a
    record's samples, ``scattered`` holds the (g, b) whose samples swing +-10% round to
    round (flagged noisy by their own spread)."""
    rng = np.random.default_rng(seed)
    rows = []
    for g in range(groups):
        shared = rng.lognormal(0, 0.005, rounds)  # (rounds,)
        readings = ((probe or {}).get(g, 100.0) * PROBE_JITTER).tolist()
        for i, b in enumerate(BACKENDS):
            s = (1 + g) * (1 + i) * (slow or {}).get((g, b), 1.0) * shared * \
                rng.lognormal(0, 0.003, rounds)
            if (g, b) in scattered:
                s = s * SCATTER
            iv = median_interval(s)
            rows.append({"key": f"k{g}", "backend": b, "status": "ok", "device": "cpu",
                         "pair_group": f"g{g}", "backend_hash": f"h-{b}",
                         "samples_ms": s.tolist(), "time_ms_median": iv.estimate,
                         "time_ms_ci_low": iv.low, "time_ms_ci_high": iv.high,
                         "time_ci_confidence": iv.confidence, "n_samples": rounds,
                         "probe_readings": readings,
                         "probe_gflops": float(np.median(readings))})
    return pd.DataFrame(rows)


def test_the_probes_excess_is_its_departure_when_beyond_its_ordinary_scatter():
    ordinary = run_to_run.allowance("cpu", "probe")
    assert probe_shift.excess([100.0] * 6, 100.0) == 0.0
    assert probe_shift.excess([95.0] * 6, 100.0) == 0.0  # within the probe's own scatter
    edge = 100 / math.exp(ordinary)
    assert probe_shift.excess([edge * 1.001] * 6, 100.0) == 0.0
    assert probe_shift.excess([edge * 0.999] * 6, 100.0) > ordinary
    assert probe_shift.excess([80.0] * 6, 100.0) == pytest.approx(math.log(100 / 80))
    assert probe_shift.excess([125.0] * 6, 100.0) == pytest.approx(math.log(1.25))
    assert probe_shift.excess([80.0] * 3, 100.0) == 0.0  # too few readings for a level
    assert probe_shift.excess([80.0] * 6, None) == 0.0


def test_unsteadiness_is_what_the_flags_measured():
    steady = {"samples_ms": [1.0, 1.001, 0.999, 1.0, 1.0, 1.0], "probe_readings": [100.0] * 6}
    assert noise.record_flags(steady, 0.25, 0.05) == []
    assert noise.unsteadiness([]) == 0.0
    wild = {"samples_ms": list(SCATTER), "probe_readings": [100.0] * 6}
    found = noise.record_flags(wild, 0.25, 0.05)
    assert [f.check for f in found] == ["spread"]
    assert found[0].measured == pytest.approx(noise.rel_spread(SCATTER))
    assert noise.unsteadiness(found) == pytest.approx(math.log1p(found[0].measured))
    assert noise.record_flags({"samples_ms": None}, 0.25, 0.05) == []


def test_across_runs_adds_known_departures_in_quadrature():
    iv = Interval(1.0, 1.0, 1.0, 0.95, 20, "order-statistics")
    plain = run_to_run.across_runs(iv, "cpu", "record")
    wide = run_to_run.across_runs(iv, "cpu", "record", 0.2, 0.1)
    assert math.log(wide.high) == pytest.approx(math.hypot(math.log(plain.high), 0.2, 0.1))
    assert run_to_run.across_runs(iv, "cpu", "record", 0.0) == plain


def test_departures_of_a_run_name_the_disturbed_records_only():
    run = _run(1, probe={0: 75.0}, scattered={(3, "b")})
    known = departures.known(run)
    assert known[("k0", "a")].machine == pytest.approx(math.log(100 / 75), rel=0.02)
    assert known[("k0", "a")].unsteadiness == 0.0
    assert known[("k3", "b")].unsteadiness > 0 and known[("k3", "b")].machine == 0.0
    assert sum(not d.none for d in known.values()) == 5  # group 0's four, and k3/b
    assert departures.run_probe_level(run) == pytest.approx(100.0, rel=0.01)


def test_a_record_timed_on_a_slowed_machine_keeps_an_interval_a_rerun_respects():
    base = _run(2)
    # group 0's rounds ran on a machine 25% slower (the probe saw it), every backend alike
    new = _run(3, probe={0: 80.0}, slow={(0, b): 1.25 for b in BACKENDS})
    intervals = [rerun_agreement.record_intervals(df) for df in (base, new)]
    bare, _ = rerun_agreement.count_disjoint(intervals, ["cpu", "cpu"], "record")
    assert bare.across == 4  # group 0, without what the probe saw
    known = [rerun_agreement.record_departures(df) for df in (base, new)]
    carried, pairs = rerun_agreement.count_disjoint(intervals, ["cpu", "cpu"], "record",
                                                    known)
    assert carried.across == 0 and carried.pairs == 32
    assert sum(clean for _, _, clean in pairs) == 28
    # ratios of the same rounds share the machine: nothing to carry, nothing disjoint
    got = rerun_agreement.agreement([("r1", base), ("r2", new)])
    assert got.ratios.across == 0
    assert got.undisturbed_record is not None


def test_a_scattered_partner_neither_moves_its_partners_nor_widens_the_allowance():
    base = _run(4, scattered={(0, "a"), (1, "a")})
    # the scattered records also landed 25% higher in the rerun: no change of code
    new = _run(5, scattered={(0, "a"), (1, "a")}, slow={(0, "a"): 1.25, (1, "a"): 1.25})
    changes = paired_diff.relative_changes(base, new)
    # b's reference in group 0 leaves the scattered a out: b did not move
    assert changes[("k0", "b")].partners == ("c", "d")
    assert changes[("k0", "b")].interval.estimate == pytest.approx(1.0, abs=0.02)
    j = run_diff.join_runs(base, new, "time_ms_median")
    assert run_diff.partners_between(changes, j, "cpu") == pytest.approx(
        run_to_run.two_runs("cpu", "ratio"))
    decided = run_diff.judge(base, new, "time_ms_median", 0.10).decided
    assert set(decided["change"]) <= {"unchanged", "cannot tell"}
    # a 1.2x slowdown of b is still found on every group
    slowed = rerun_agreement.planted(new, "b", 1.2)
    got = run_diff.judge(base, slowed, "time_ms_median", 0.10).decided
    assert (got[got["backend"] == "b"]["change"] == "worse").all()


def _pairs_only(df: pd.DataFrame) -> pd.DataFrame:
    """a and b alone, one partner each: every record is judged over the machine's move."""
    return df[df["backend"].isin(["a", "b"])].reset_index(drop=True)


def test_disturbed_references_neither_read_as_a_change_nor_hide_one():
    scattered = {(0, "a"), (1, "a")}
    base = _pairs_only(_run(6, scattered=scattered, groups=12))
    new = _pairs_only(_run(7, scattered=scattered, groups=12,
                           slow={(0, "a"): 1.25, (1, "a"): 1.25}))
    j = run_diff.judge(base, new, "time_ms_median", 0.10)
    assert not j.relative and j.move is not None
    # the allowance comes from the steady references, not the two that swung
    assert run_to_run.half_width(j.move.between, "cpu") == pytest.approx(
        run_to_run.two_runs("cpu"))
    a = j.decided[j.decided["backend"] == "a"]
    assert set(a["change"]) <= {"unchanged", "cannot tell"}
    assert (a[a["key"].isin(["k0", "k1"])]["change"] == "cannot tell").all()
    # a 1.2x slowdown of b is found on every case
    slowed = rerun_agreement.planted(new, "b", 1.2)
    got = run_diff.judge(base, slowed, "time_ms_median", 0.10).decided
    assert (got[got["backend"] == "b"]["change"] == "worse").all()


def test_a_known_departure_widens_the_verdict_over_the_machine():
    iv = Interval(1.2, 1.17, 1.23, 0.95, 12, "bootstrap")
    assert run_diff._sampled_verdict(iv, None, 0.10, True, "cpu")[0] == "worse"
    verdict, wide = run_diff._sampled_verdict(iv, None, 0.10, True, "cpu", known=0.25)
    assert verdict == "cannot tell" and wide.low < 1
