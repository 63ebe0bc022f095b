"""compare on a machine that moved unevenly between two runs of one commit: memory-bound
backends slower by more than compute-bound ones. One number divided out would call the
memory-bound records changed; the unchanged backends that moved unlike the majority are
witnesses too, and a record whose answer depends on which move is divided out is
'cannot tell'. Every sample is injected."""

from __future__ import annotations

import numpy as np
import pandas as pd

from attnbench.analysis import run_diff

MEMORY_BOUND = ("mem_a", "mem_b")
COMPUTE_BOUND = ("cmp_c", "cmp_d", "cmp_e", "cmp_f")
META = {"environment_id": "e1", "environment": {"git_commit": "abc123", "git_dirty": False}}


def _run(seed: int, moves: dict[str, float], hashes=None, cases: int = 8, n: int = 12
         ) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    rows = []
    for b in MEMORY_BOUND + COMPUTE_BOUND:
        for i in range(cases):
            s = (1 + i) * moves.get(b, 1.0) * rng.lognormal(0, 0.02, n)
            rows.append({"key": f"k{i}", "backend": b, "status": "ok", "device": "cpu",
                         "backend_hash": (hashes or {}).get(b, f"h-{b}"),
                         "time_ms_median": float(np.median(s)), "samples_ms": list(s)})
    return pd.DataFrame(rows)


def _uneven() -> dict[str, float]:
    """Memory-bound backends 1.4x slower, compute-bound ones 1.1x."""
    return {b: 1.4 for b in MEMORY_BOUND} | {b: 1.1 for b in COMPUTE_BOUND}


def _decide(base, new, same_setup: bool = True):
    j = run_diff.join_runs(base, new, "time_ms_median")
    move = run_diff.machine_move(j, "time_ms_median", 0.10, same_setup)
    return run_diff.decide(j, "time_ms_median", 0.10, move), move


def test_one_setup_is_one_environment_id_from_clean_trees():
    assert run_diff.same_setup(META, META)
    other = {**META, "environment_id": "e2"}  # another commit, torch, device or threads
    dirty = {**META, "environment": {"git_commit": "abc123", "git_dirty": True}}
    no_git = {**META, "environment": {"git_commit": None, "git_dirty": None}}
    assert not any(run_diff.same_setup(META, m) for m in (other, dirty, no_git))
    assert not run_diff.same_setup({}, {})


def test_an_uneven_move_of_one_commit_calls_no_unchanged_record_changed():
    decided, move = _decide(_run(1, {}), _run(2, _uneven()))
    assert abs(move.interval.estimate - 1.1) < 0.03  # the majority: compute-bound
    assert [b for b, _ in move.uneven] == list(MEMORY_BOUND)
    assert all(abs(iv.estimate - 1.4) < 0.05 for _, iv in move.uneven)
    assert "MOVED UNEVENLY" in move.describe() and "mem_a 1.4" in move.describe()
    assert not decided["change"].isin(["worse", "better"]).any()
    mem = decided[decided["backend"].isin(MEMORY_BOUND)]
    assert (mem["change"] == "cannot tell").all()


def test_one_number_divided_out_would_call_the_memory_bound_records_worse():
    """The same runs not known to share one setup (another commit, a dirty tree: the
    dissenters may be an edit outside the backends' hashed code): they are no witnesses,
    and the old answer stands."""
    decided, move = _decide(_run(1, {}), _run(2, _uneven()), same_setup=False)
    assert move.uneven == ()
    mem = decided[decided["backend"].isin(MEMORY_BOUND)]
    assert (mem["change"] == "worse").all()


def test_a_large_code_change_is_still_found_on_an_uneven_machine():
    moves = _uneven() | {"cmp_c": 1.1 * 2.0}
    decided, move = _decide(_run(1, {}), _run(2, moves, hashes={"cmp_c": "changed"}))
    assert [b for b, _ in move.uneven] == list(MEMORY_BOUND)
    changed = decided[decided["backend"] == "cmp_c"]
    assert (changed["change"] == "worse").all()
    assert not decided[decided["backend"] != "cmp_c"]["change"].isin(["worse", "better"]).any()


def test_a_change_the_uneven_move_could_explain_is_cannot_tell():
    """cmp_c 1.2x slower on a machine that slowed memory-bound code 1.27x beyond the
    majority: over the majority's move it is worse, over mem_a's it is not."""
    moves = _uneven() | {"cmp_c": 1.1 * 1.2}
    decided, _ = _decide(_run(1, {}), _run(2, moves, hashes={"cmp_c": "changed"}))
    assert (decided[decided["backend"] == "cmp_c"]["change"] == "cannot tell").all()


def test_an_even_move_has_no_uneven_witness_and_finds_a_planted_change():
    even = {b: 1.1 for b in MEMORY_BOUND + COMPUTE_BOUND}
    decided, move = _decide(_run(1, {}), _run(2, even | {"cmp_c": 1.1 * 1.2},
                                                 hashes={"cmp_c": "changed"}))
    assert move.uneven == () and "UNEVENLY" not in move.describe()
    assert (decided[decided["backend"] == "cmp_c"]["change"] == "worse").all()
    assert not decided[decided["backend"] != "cmp_c"]["change"].isin(["worse", "better"]).any()


def test_a_dissenter_needs_enough_records_and_an_interval_clear_of_the_majority():
    base, new = _run(1, {}, cases=2), _run(2, _uneven(), cases=2)
    j = run_diff.join_runs(base, new, "time_ms_median")
    majority = run_diff.machine_move(
        run_diff.join_runs(_run(1, {}), _run(2, _uneven()), "time_ms_median"),
        "time_ms_median").interval
    dissent = j[j["backend"].isin(MEMORY_BOUND)]
    assert run_diff.uneven_moves(dissent, majority, None) == ()  # 2 records a backend
    close = _run(2, {b: 1.12 for b in MEMORY_BOUND})
    j = run_diff.join_runs(_run(1, {}), close, "time_ms_median")
    near = run_diff.uneven_moves(j[j["backend"].isin(MEMORY_BOUND)], majority, None)
    assert near == ()  # within the run-to-run allowance of the majority's 1.1x
