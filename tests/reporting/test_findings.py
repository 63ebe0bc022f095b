"""Headlines of findings (reporting/findings.py)."""

from __future__ import annotations


def test_a_multi_run_headline_quotes_the_pooled_figure_not_the_best_run():
    import pandas as pd

    from attnbench.analysis.comparisons import Comparison
    from attnbench.reporting.findings import comparison_headline
    sp = pd.DataFrame([{"run_id": run, "backend": "fast", "seq_q": 1024, "seq_k": 1024,
                        "dtype": "float32", "mode": "fwd", "speedup": s, "speedup_low": s - .1,
                        "speedup_high": s + .1, "significant": True, "significance": ""}
                       for run, s in (("run-a", 2.0), ("run-b", 3.0))])
    line = comparison_headline(Comparison("c", "base", ("fast",)), sp)
    assert "run run-b" not in line and "3x [" not in line, line
    assert "pooled over 2 runs, Hartung-Knapp t quantile with 1 df" in line, line
    assert "per run 2-3x" in line, line
