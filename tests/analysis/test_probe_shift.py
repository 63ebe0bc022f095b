"""A record whose own rounds saw a machine unlike the rest of the run (the drift probe read
in them moved between the runs beyond two runs of one state): judged by the machine's move
it is 'cannot tell'; judged over its partners it carries the probe's move as a known
departure, since a burst on a shared host slows a group's backends unevenly, by about as
much as it slowed the probe at most. Every sample and probe reading is injected."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from attnbench.analysis import run_diff
from attnbench.cli import main
from attnbench.stats import probe_shift, run_to_run

BACKENDS = ("a", "b", "c", "d")


def _readings(rng, level: float, n: int = 15, jitter: float = 0.02) -> list[float]:
    return (level * rng.lognormal(0, jitter, n)).tolist()


def _run(seed: int, probe_levels=None, uneven=None, backend_factor=None, hashes=None,
         groups: int = 8, rounds: int = 12) -> pd.DataFrame:
    """``groups`` problems timed in interleaved rounds of a..d, each with the probe read at
    ``probe_levels[g]`` GFLOP/s (default 100) in its rounds; ``uneven[g]`` slows backend
    'a' of group g by that factor (a burst that hits one backend harder than the others)."""
    rng = np.random.default_rng(seed)
    rows = []
    for g in range(groups):
        shared = rng.lognormal(0, 0.05, rounds)
        probe = _readings(rng, (probe_levels or {}).get(g, 100.0))
        for i, b in enumerate(BACKENDS):
            level = (1 + g) * (1 + i) * (backend_factor or {}).get(b, 1.0)
            if b == "a":
                level *= (uneven or {}).get(g, 1.0)
            s = level * shared * rng.lognormal(0, 0.01, rounds)
            rows.append({"key": f"k{g}", "backend": b, "status": "ok", "device": "cpu",
                         "pair_group": f"g{g}", "backend_hash": (hashes or {}).get(b, f"h-{b}"),
                         "time_ms_median": float(np.median(s)), "samples_ms": s.tolist(),
                         "probe_readings": probe, "probe_gflops": float(np.median(probe))})
    return pd.DataFrame(rows)


def _decide(base, new):
    return run_diff.judge(base, new, "time_ms_median", 0.10).decided


def test_the_shift_is_the_probes_move_beyond_two_runs_of_one_state():
    rng = np.random.default_rng(0)
    steady = _readings(rng, 100.0)
    assert probe_shift.time_ratio(steady, _readings(rng, 50.0)) == pytest.approx(2, rel=0.05)
    limit = probe_shift.limit("cpu")
    assert limit == pytest.approx(np.exp(run_to_run.two_runs("cpu", "probe")))
    moved = probe_shift.shift(steady, _readings(rng, 100 / (limit * 1.1)), device="cpu")
    assert moved is not None and moved.factor == pytest.approx(limit * 1.1, rel=0.03)
    assert moved.limit == limit
    assert probe_shift.shift(steady, _readings(rng, 100 / (limit * 0.9))) is None
    # read over the run's move: a record that moved with the whole run has not shifted
    assert probe_shift.shift(steady, _readings(rng, 50.0), run_move=2.0) is None
    # too few readings, or none: no verdict
    assert probe_shift.shift(steady[:3], _readings(rng, 50.0)) is None
    assert probe_shift.shift(steady, None) is None


def test_a_burst_that_scatters_the_probe_is_still_a_shift():
    """A burst makes the probe's readings scatter as well as drop; its median's move decides,
    not an interval that the burst itself widened."""
    calm = (100 * np.linspace(0.99, 1.01, 15)).tolist()
    burst = (70 * np.linspace(0.6, 1.4, 15)).tolist()
    assert probe_shift.shift(calm, burst) is not None


def test_an_uneven_burst_under_one_group_is_not_called_a_change():
    """In the new run group 0's rounds ran on a busier machine (probe 70 against 100) that
    slowed backend a 1.3x more than its partners: over its partners a reads 1.3x worse, but
    its probe moved 1.43x, which its interval carries, so it is 'cannot tell'. Without the
    probe readings the same records are called worse: the rule needs its witness."""
    base = _run(2)
    new = _run(3, probe_levels={0: 70.0}, uneven={0: 1.3})
    decided = _decide(base, new)
    g0 = decided[decided["key"] == "k0"]
    assert (g0["change"] == "cannot tell").all()
    assert g0["probe_shift"].notna().all()
    assert g0["probe_shift"].iloc[0] == pytest.approx(100 / 70, rel=0.05)
    rest = decided[decided["key"] != "k0"]
    assert rest["probe_shift"].isna().all()
    assert not rest["change"].isin(["worse", "better"]).any()
    blind = _decide(base.drop(columns="probe_readings"), new.drop(columns="probe_readings"))
    assert blind[(blind["key"] == "k0") & (blind["backend"] == "a")]["change"].iloc[0] == "worse"


def test_a_real_change_under_a_steady_probe_is_still_found():
    base = _run(4)
    new = _run(5, backend_factor={"a": 1.2}, hashes={"a": "changed"})
    decided = _decide(base, new)
    assert decided["probe_shift"].isna().all()
    assert (decided[decided["backend"] == "a"]["change"] == "worse").all()


def test_a_real_change_beyond_its_rounds_probe_move_is_still_found():
    """Group 0's probe moved 1.18x, beyond the limit: over the machine's move its records
    would be 'cannot tell', over partners they carry the move. Backend a, 1.5x slower by
    its code everywhere, is still found worse there; its partners, unchanged, are not
    called; and the carried move widens group 0's interval beyond the others'."""
    base = _run(4)
    new = _run(5, probe_levels={0: 100 / 1.18}, backend_factor={"a": 1.5},
               hashes={"a": "changed"})
    decided = _decide(base, new)
    g0 = decided[decided["key"] == "k0"]
    assert g0["probe_shift"].between(1.12, 1.24).all() and g0["vs_partners"].notna().all()
    assert g0[g0["backend"] == "a"]["change"].iloc[0] == "worse"
    assert not g0[g0["backend"] != "a"]["change"].isin(["worse", "better"]).any()
    width = np.log(decided["partners_high"] / decided["partners_low"])
    assert width[g0.index].min() > width.drop(g0.index).max()


def test_a_whole_run_on_a_slower_machine_shifts_only_partner_verdicts():
    """Every group's probe read 1.4x slower. Over the machine's move that is the run's move,
    not one record's: no shift. Over partners it is the machine under each record's rounds,
    which may slow its backends unevenly: carried, it leaves every record 'cannot tell'."""
    base = _run(6)
    new = _run(7, probe_levels={g: 100 / 1.4 for g in range(8)})
    j = run_diff.join_runs(base, new, "time_ms_median")
    by_machine = run_diff.decide(j, "time_ms_median", 0.10,
                                 run_diff.machine_move(j, "time_ms_median", 0.10))
    assert by_machine["probe_shift"].isna().all()
    assert not by_machine["change"].isin(["worse", "better"]).any()
    decided = _decide(base, new)
    assert decided["vs_partners"].notna().all()
    assert (decided["change"] == "cannot tell").all()
    assert decided["probe_shift"].between(1.35, 1.45).all()


def _write(path, df: pd.DataFrame) -> str:
    path.mkdir()
    rows = [dict(r) | {"run_id": path.name} for r in df.to_dict("records")]
    (path / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (path / "meta.json").write_text(json.dumps({"run_id": path.name}))
    return str(path)


def test_compare_says_which_records_carry_their_rounds_probe_move(tmp_path, capsys):
    base = _write(tmp_path / "base", _run(2))
    new = _write(tmp_path / "new", _run(3, probe_levels={0: 70.0}, uneven={0: 1.3}))
    assert main(["compare", base, new, "--fail-on-regression"]) == 0
    out = capsys.readouterr().out
    assert "probe_shift: 4 records judged over their partners" in out
    assert "known departure" in out and "records cannot tell" not in out
    assert "REGRESSION" not in out


def test_a_record_judged_by_the_machine_whose_rounds_moved_is_cannot_tell():
    """Without partners (no interleaved rounds) a record is judged by the machine's move;
    its rounds' probe moved 1.43x unlike the run's, so it is 'cannot tell', and only it."""
    base = _run(2).drop(columns="pair_group")
    new = _run(3, probe_levels={0: 70.0}, uneven={0: 1.3}).drop(columns="pair_group")
    decided = _decide(base, new)
    assert decided["vs_partners"].isna().all()
    g0 = decided[decided["key"] == "k0"]
    assert (g0["change"] == "cannot tell").all() and g0["probe_shift"].notna().all()
    assert decided[decided["key"] != "k0"]["probe_shift"].isna().all()
