"""Line names: only the knobs their backends read (reporting/lines.py)."""

from __future__ import annotations

from record_frames import records_frame


def test_lines_are_named_only_by_knobs_their_backends_read():
    from attnbench.reporting import lines
    df = records_frame([
        {"backend": "sdpa", "key": "a", "mask": "none", "seq_q": 1024, "block_random": 6},
        {"backend": "linear", "key": "b", "mask": "none", "seq_q": 1024,
         "feature_map": "favor"},
        {"backend": "linear", "key": "c", "mask": "none", "seq_q": 1024},
    ])
    names = ["backend", "feature_map", "block_random", "additive_dim"]
    assert lines.shown(df, names) == ["backend", "feature_map"]
    # a knob nobody reads still names lines that could not be told apart without it
    two_sdpa = records_frame([
        {"backend": "sdpa", "key": "a", "mask": "none", "seq_q": 1024, "block_random": 6},
        {"backend": "sdpa", "key": "b", "mask": "none", "seq_q": 1024},
    ])
    assert lines.shown(two_sdpa, names) == ["backend", "block_random"]
