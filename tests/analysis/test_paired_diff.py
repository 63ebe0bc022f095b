"""compare judges a record by its change over its unchanged partners timed in the same
rounds: the machine's move in those rounds divides out, even when it was not the run's
move. Every sample is injected."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from attnbench.analysis import paired_diff, run_diff
from attnbench.cli import main

BACKENDS = ("a", "b", "c", "d")


def _run(seed: int, group_moves=None, backend_factor=None, hashes=None, drift=0.15,
         groups: int = 8, rounds: int = 12, jitter: float = 0.02) -> pd.DataFrame:
    """``groups`` problems, each timed in ``rounds`` interleaved rounds of a, b, c and d; each
    round's machine speed (shared by the round's records) drawn with ``drift``; group g's
    records all moved by ``group_moves[g]`` (the machine slower for that problem only)."""
    rng = np.random.default_rng(seed)
    rows = []
    for g in range(groups):
        shared = rng.lognormal(0, drift, rounds) * (group_moves or {}).get(g, 1.0)
        for i, b in enumerate(BACKENDS):
            level = (1 + g) * (1 + i) * (backend_factor or {}).get(b, 1.0)
            s = level * shared * rng.lognormal(0, jitter, rounds)
            rows.append({"key": f"k{g}-{b}", "backend": b, "status": "ok", "device": "cpu",
                         "pair_group": f"g{g}", "backend_hash": (hashes or {}).get(b, f"h-{b}"),
                         "time_ms_median": float(np.median(s)), "samples_ms": s.tolist()})
    return pd.DataFrame(rows)


def _decide(base, new, partners: bool = True):
    j = run_diff.join_runs(base, new, "time_ms_median")
    move = run_diff.machine_move(j, "time_ms_median", 0.10)
    relative = run_diff.partner_changes(base, new) if partners else {}
    return run_diff.decide(j, "time_ms_median", 0.10, move, relative)


def test_a_move_of_one_problems_rounds_divides_out_over_its_partners():
    """Three problems' rounds ran 1.35x slower in the new run (the machine slowed only
    while they were timed): over the run's move, their records cannot be told (the move is
    not theirs, and it widens everyone's allowance); over their partners, they are
    unchanged."""
    moves = {g: 1.35 for g in range(3)}
    base, new = _run(1, drift=0.02), _run(2, moves, drift=0.02)
    by_machine = _decide(base, new, partners=False)
    moved = by_machine["key"].str[:2].isin(["k0", "k1", "k2"])
    assert (by_machine[moved]["change"] != "unchanged").all()
    decided = _decide(base, new)
    assert decided["vs_partners"].notna().all()
    assert not decided["change"].isin(["worse", "better"]).any()
    assert (decided["change"] == "unchanged").sum() >= 28


def test_a_change_of_one_backend_is_found_through_round_to_round_drift():
    """Rounds scatter by 15% (shared by the round's records): each record's own samples are
    too scattered to judge, its time over its partners' in the same rounds is not."""
    base = _run(3)
    new = _run(4, backend_factor={"a": 1.2}, hashes={"a": "changed"})
    decided = _decide(base, new)
    a = decided[decided["backend"] == "a"]
    assert (a["change"] == "worse").all()
    assert a["vs_partners"].between(1.15, 1.25).all()
    assert not decided[decided["backend"] != "a"]["change"].isin(["worse", "better"]).any()
    by_machine = _decide(base, new, partners=False)
    assert not (by_machine[by_machine["backend"] == "a"]["change"] == "worse").all()


def test_only_partners_whose_code_did_not_change_are_a_reference():
    base = _run(5)
    new = _run(6, backend_factor={"a": 1.2, "b": 1.2}, hashes={"a": "x", "b": "y"})
    changes = run_diff.partner_changes(base, new)
    assert all(changes[(f"k{g}-a", "a")].partners == ("c", "d") for g in range(8))
    three = _run(6, hashes={"a": "x", "b": "y", "c": "z"})  # a, b, c: d alone unchanged
    assert run_diff.partner_changes(base, three) == {}


def test_one_partner_cannot_say_which_of_the_two_moved():
    """Two backends a problem: a over b is b over a inverted, so a move of b would read as
    a change of a; it takes a second partner."""
    assert paired_diff.MIN_PARTNERS == 2
    base, new = _run(5), _run(6, backend_factor={"a": 1.5}, hashes={"a": "x"})
    base, new = (df[df["backend"].isin(["a", "b"])] for df in (base, new))
    assert run_diff.partner_changes(base, new) == {}


def test_rounds_that_do_not_line_up_give_no_partner_change():
    base, new = _run(7), _run(8)
    new["samples_ms"] = [s[:-1] if b == "b" else s
                         for s, b in zip(new["samples_ms"], new["backend"])]
    changes = run_diff.partner_changes(base, new)
    assert (("k0-a", "a") in changes) and changes[("k0-a", "a")].partners == ("c", "d")
    assert ("k0-b", "b") not in changes  # b's rounds no longer line up with a's or c's
    assert paired_diff.relative_changes(base, base.drop(columns=["pair_group"])) == {}


def test_relative_times_that_scatter_beyond_the_limit_cannot_tell():
    base = _run(9, jitter=0.4)
    new = _run(10, backend_factor={"a": 1.5}, hashes={"a": "changed"}, jitter=0.4)
    decided = _decide(base, new)
    assert decided["vs_partners"].notna().all()
    assert (decided["change"] == "cannot tell").all()


def test_the_between_run_allowance_is_at_least_two_runs_of_a_ratio():
    from attnbench.stats import run_to_run

    base, new = _run(11, drift=0.0, jitter=0.001), _run(12, drift=0.0, jitter=0.001)
    j = run_diff.join_runs(base, new, "time_ms_median")
    between = run_diff.partners_between(run_diff.partner_changes(base, new), j, "cpu")
    assert between == pytest.approx(run_to_run.two_runs("cpu", "ratio"))


def _write(path, df: pd.DataFrame) -> str:
    path.mkdir()
    rows = [{k: v for k, v in r.items()} | {"run_id": path.name} for r in
            df.to_dict("records")]
    (path / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (path / "meta.json").write_text(json.dumps({"run_id": path.name}))
    return str(path)


def test_compare_says_which_records_were_judged_over_their_partners(tmp_path, capsys):
    base = _write(tmp_path / "base", _run(3))
    new = _write(tmp_path / "new", _run(4, backend_factor={"a": 1.2}, hashes={"a": "x"}))
    assert main(["compare", base, new, "--fail-on-regression"]) == 1
    out = capsys.readouterr().out
    assert "vs_partners: 32 records judged by their change over their unchanged partners" in out
    assert out.count("REGRESSION a ") == 8 and "REGRESSION b" not in out
    assert main(["compare", base, new, "--absolute"]) == 0
    assert "vs_partners" not in capsys.readouterr().out


def test_partners_are_used_only_where_they_scatter_less_than_the_machines_move():
    """Runs whose rounds were not kept in step pair records badly: the unchanged records'
    changes over their partners scatter more than their ratios over the machine's move,
    and the machine's move judges every record instead."""
    from attnbench.stats import intervals

    base, new = _run(13, drift=0.0), _run(14, drift=0.0)
    j = run_diff.join_runs(base, new, "time_ms_median")
    move = run_diff.machine_move(j, "time_ms_median", 0.10)

    def changes(estimates):
        return {(r["key"], r["backend"]): paired_diff.Relative(
            intervals.Interval(e, e * 0.99, e * 1.01, 0.95, 12, "bootstrap"), ("p", "q"),
            (0.01, 0.01)) for (_, r), e in zip(j.iterrows(), estimates)}

    steady = changes([1.0] * len(j))
    kept, between, why = run_diff.partners_if_tighter(steady, j, move)
    assert kept == steady and why is None
    assert between == pytest.approx(run_diff.partners_between(steady, j, "cpu"))
    scattered = changes(np.exp(np.linspace(-0.4, 0.4, len(j))))
    kept, between, why = run_diff.partners_if_tighter(scattered, j, move)
    assert kept == {} and between is None
    assert why.startswith("partners not used: unchanged records' changes over "
                          "their partners scatter +-")
    assert run_diff.partners_if_tighter({}, j, move) == ({}, None, None)
