"""compare on a machine that moved unevenly between two runs of one commit: memory-bound
backends slower by more than compute-bound ones. One number divided out would call the
memory-bound records changed; the unchanged backends that moved unlike the majority are
witnesses too, and a record whose answer depends on which move is divided out is
'cannot tell'. Every sample is injected."""

from __future__ import annotations

import numpy as np
import pandas as pd

from attnbench.analysis import run_diff
from attnbench.runs import environment

MEMORY_BOUND = ("mem_a", "mem_b")
COMPUTE_BOUND = ("cmp_c", "cmp_d", "cmp_e", "cmp_f")
SETUP = {"env_device_name": "AMD EPYC", "env_cpu_capability": "avx512", "env_torch": "2.13.0",
         "env_triton": "3.9.0", "env_git_commit": "abc123", "env_threads": 2}


def _run(seed: int, moves: dict[str, float], setup: dict | None = SETUP, hashes=None,
         cases: int = 8, n: int = 12) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    rows = []
    for b in MEMORY_BOUND + COMPUTE_BOUND:
        for i in range(cases):
            s = (1 + i) * moves.get(b, 1.0) * rng.lognormal(0, 0.02, n)
            rows.append({"key": f"k{i}", "backend": b, "status": "ok", "device": "cpu",
                         "backend_hash": (hashes or {}).get(b, f"h-{b}"),
                         "time_ms_median": float(np.median(s)), "samples_ms": list(s),
                         **(setup or {})})
    return pd.DataFrame(rows)


def _uneven() -> dict[str, float]:
    """Memory-bound backends 1.4x slower, compute-bound ones 1.1x."""
    return {b: 1.4 for b in MEMORY_BOUND} | {b: 1.1 for b in COMPUTE_BOUND}


def _decide(base, new):
    j = run_diff.join_runs(base, new, "time_ms_median")
    move = run_diff.machine_move(j, "time_ms_median", 0.10)
    return run_diff.decide(j, "time_ms_median", 0.10, move), move


def test_the_setup_fields_are_the_records_environment_fields():
    assert run_diff.SAME_SETUP == tuple(f"env_{k}" for k in environment.RECORD_FIELDS)
    assert set(SETUP) == set(run_diff.SAME_SETUP)


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
    """The same runs with nothing that says they share a commit and software (records from
    before those fields, or another commit): the dissenters may be a change outside the
    backends' hashed code, so they are not witnesses, and the old answer stands."""
    for base, new in ((_run(1, {}, setup=None), _run(2, _uneven(), setup=None)),
                      (_run(1, {}), _run(2, _uneven(), setup=SETUP | {"env_git_commit": "def"}))):
        decided, move = _decide(base, new)
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
