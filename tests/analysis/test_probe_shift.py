"""compare answers 'cannot tell' for a record whose own rounds saw a machine unlike the rest
of the run (the drift probe read in them moved between the runs unlike the run's move): a
burst on a shared host slows a group's backends unevenly, which its partners cannot divide
out. Every sample and probe reading is injected."""

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


def test_the_shift_is_read_over_the_runs_own_move_beyond_jitter_and_two_runs():
    rng = np.random.default_rng(0)
    steady = _readings(rng, 100.0)
    assert probe_shift.time_ratio(steady, _readings(rng, 50.0)) == pytest.approx(2, rel=0.05)
    # the whole run slowed 2x: a record that slowed 2x with it has not shifted
    assert probe_shift.shift(steady, _readings(rng, 50.0), run_move=2.0) is None
    moved = probe_shift.shift(steady, _readings(rng, 70.0), run_move=1.0, device="cpu")
    assert moved is not None and moved.factor == pytest.approx(100 / 70, rel=0.05)
    assert moved.limit > np.exp(run_to_run.two_runs("cpu"))
    # within two runs' allowance: no shift; too few readings: no verdict
    assert probe_shift.shift(steady, _readings(rng, 97.0), run_move=1.0) is None
    assert probe_shift.shift(steady[:3], _readings(rng, 50.0), run_move=1.0) is None
    assert probe_shift.shift(steady, None, run_move=1.0) is None


def test_a_jittery_probe_needs_a_larger_move():
    """The same 1.18x move of the probe's median: beyond the limit when its readings are
    tight, within it when they scatter +-30% (its median's own interval is wide)."""
    def readings(level, spread):
        return (level * np.linspace(1 - spread, 1 + spread, 15)).tolist()

    assert probe_shift.shift(readings(100, 0.3), readings(85, 0.3), run_move=1.0) is None
    calm = probe_shift.shift(readings(100, 0.01), readings(85, 0.01), run_move=1.0)
    assert calm is not None and calm.factor == pytest.approx(100 / 85)


def test_an_uneven_burst_under_one_group_is_not_called_a_change():
    """In the new run group 0's rounds ran on a busier machine (probe 70 against 100) that
    slowed backend a 1.3x more than its partners: over its partners a reads 1.3x worse, but
    its probe says the machine under it differed, so it is 'cannot tell'. Without the probe
    readings the same records are called worse: the rule needs its witness."""
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


def test_a_whole_run_on_a_slower_machine_is_no_shift():
    """Every group's probe read 1.4x slower: that is the run's move, not one record's."""
    base = _run(6)
    new = _run(7, probe_levels={g: 100 / 1.4 for g in range(8)})
    decided = _decide(base, new)
    assert decided["probe_shift"].isna().all()
    assert not decided["change"].isin(["worse", "better"]).any()


def _write(path, df: pd.DataFrame) -> str:
    path.mkdir()
    rows = [dict(r) | {"run_id": path.name} for r in df.to_dict("records")]
    (path / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (path / "meta.json").write_text(json.dumps({"run_id": path.name}))
    return str(path)


def test_compare_says_which_records_the_probe_left_undecided(tmp_path, capsys):
    base = _write(tmp_path / "base", _run(2))
    new = _write(tmp_path / "new", _run(3, probe_levels={0: 70.0}, uneven={0: 1.3}))
    assert main(["compare", base, new, "--fail-on-regression"]) == 0
    out = capsys.readouterr().out
    assert "probe_shift: 4 records cannot tell" in out
    assert "REGRESSION" not in out
