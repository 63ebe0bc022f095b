"""Headlines of findings (reporting/findings.py)."""

from __future__ import annotations


def _runs(*speedups):
    import pandas as pd
    return pd.DataFrame([{"run_id": run, "backend": "fast", "seq_q": 1024, "seq_k": 1024,
                        "dtype": "float32", "mode": "fwd", "speedup": s, "speedup_low": s - .1,
                        "speedup_high": s + .1, "significant": True, "significance": ""}
                        for run, s in zip(("run-a", "run-b", "run-c"), speedups)])


def test_a_multi_run_headline_quotes_the_pooled_figure_not_the_best_run():
    from attnbench.analysis.comparisons import Comparison
    from attnbench.reporting.findings import comparison_headline
    line = comparison_headline(Comparison("c", "base", ("fast",)), _runs(2.0, 3.0))
    assert "run run-b" not in line and "3x [" not in line, line
    assert "pooled over 2 runs, Hartung-Knapp t quantile with 1 df" in line, line
    assert "per run 2-3x" in line, line


def test_the_index_headline_of_several_runs_quotes_the_pooled_figure():
    from attnbench.analysis.comparisons import Comparison
    from attnbench.reporting.answers import short_headline
    from attnbench.reporting.findings import headline_pick
    sp = _runs(2.8, 2.9, 3.1)
    backend, x, significant, _ = headline_pick(sp)
    assert backend == "fast" and significant and 2.8 < x < 3.1  # pooled, not run-c's 3.1x
    line = short_headline([(Comparison("c", "base", ("fast",)), None, sp)], None)
    assert line == f"fast {x:.3g}x faster than base at N=1K" and "3.1x" not in line
