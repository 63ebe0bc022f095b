"""Timing groups (runs/pairing.py): shape-paired comparisons and sided claims timed together."""

from __future__ import annotations

from attnbench.core.registry import all_backends


def test_shape_paired_comparisons_and_sided_claims_are_timed_together():
    from attnbench.runs.pairing import job_groups
    from attnbench.runs.suite import load_suite

    suite = load_suite("family", sorted(all_backends()))
    groups = job_groups(suite.jobs(), suite.claims, suite.comparisons)
    for n in (1024, 2048, 4096, 8192):  # the window-vs-causal comparison, at every N
        (group,) = [g for g in groups if any(c.seq_q == n and c.mask == "causal"
                                             and b == "sdpa" for c, b in g)]
        peers = {("window(255,0)", "flex")} if n == 8192 else set()  # window-vs-flex
        if n >= 4096:  # linear-forms' causal elu forward is the same case as sdpa's
            peers |= {("causal", "linear")}
        assert {(c.mask, b) for c, b in group} == {
            ("causal", "sdpa"), ("window(255,0)", "sliding_window"),
            ("window(255,0)", "naive")} | peers
    assert sum(len(g) for g in groups) == len(suite.jobs())
