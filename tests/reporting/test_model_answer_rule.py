"""reporting/model_report.job_answer names a winner by the one significance rule
(``stats.significance.decide``): an interval that excludes 1 from too few samples names
none."""

from __future__ import annotations

from attnbench.reporting.model_report import job_answer


def rows(samples: dict[str, list[float]]) -> list[dict]:
    out = []
    for backend, ms in samples.items():
        for level in ("model", "kernel"):
            out.append({"model": "tiny", "size": "s", "batch": 1, "seq_len": 16,
                        "dtype": "float32", "device": "cpu", "mode": "fwd", "level": level,
                        "backend": backend, "status": "ok", "semantics": "exact",
                        "samples_ms": ms, "time_ms_median": sorted(ms)[len(ms) // 2]})
    return out


def test_three_samples_a_side_name_no_winner_however_far_apart():
    answer = job_answer(rows({"sdpa": [2.0, 2.1, 2.2], "naive": [1.0, 1.1, 1.05]}))
    assert "no exact backend differs from sdpa" in answer


def test_enough_samples_name_the_winner_and_the_loser():
    fast = job_answer(rows({"sdpa": [2.0 + i / 100 for i in range(8)],
                            "naive": [1.0 + i / 100 for i in range(8)]}))
    assert "naive fastest" in fast
    slow = job_answer(rows({"sdpa": [1.0 + i / 100 for i in range(8)],
                            "naive": [2.0 + i / 100 for i in range(8)]}))
    assert "sdpa fastest; the next exact backend, naive" in slow
