"""Comparisons inferred from records and declared ones left out when a side never ran."""

from __future__ import annotations

from record_frames import records_frame


def test_inferred_comparison_pairs_only_records_of_the_same_case():
    from attnbench.analysis.comparisons import infer
    df = records_frame([
        {"backend": "sliding_window", "key": "win-1k", "mask": "window(255,0)", "seq_q": 1024},
        {"backend": "sdpa", "key": "win-1k", "mask": "window(255,0)", "seq_q": 1024},
        {"backend": "sdpa", "key": "dense-1k", "mask": "none", "seq_q": 1024},
        {"backend": "sliding_window", "key": "causal-1k", "mask": "causal", "seq_q": 1024,
         "status": "unsupported"},
    ])
    paired, *alone = infer(df)
    assert {paired.baseline, *paired.backends} == {"sdpa", "sliding_window"}
    assert set(paired.records(df)["key"]) == {"win-1k"}
    assert len(paired.pairs(df)) == 1
    assert {c.name for c in alone} == {"sdpa", "sliding_window"}
    assert all(c.baseline is None for c in alone)


def test_a_declared_comparison_missing_its_baseline_or_every_other_backend_is_left_out():
    """--backends sliding_window,sdpa on the family suite: 'window-vs-flex' would draw
    sliding_window against a flex that never ran (only 'no baseline' marks)."""
    from attnbench.analysis.comparisons import Comparison, plan
    df = records_frame([
        {"backend": "sliding_window", "key": "w", "mask": "window(255,0)", "seq_q": 1024},
        {"backend": "sdpa", "key": "c", "mask": "causal", "seq_q": 1024},
    ])
    declared = [Comparison("window-vs-flex", "flex", ("sliding_window",)),
                Comparison("dense", "sdpa", ("linear", "linformer")),
                Comparison("window-vs-causal", "sdpa", ("sliding_window",), pair="shape")]
    kept, notes = plan(df, declared)
    assert [c.name for c, _ in kept if c.declared] == ["window-vs-causal"]
    assert any("'window-vs-flex' has no record of flex" in n for n in notes)
    assert any("'dense' has no record of linear, linformer" in n for n in notes)
