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


def test_backends_with_their_own_parameters_share_the_problems_rounds():
    """block_sparse's layout knobs and linear's feature map are in their keys, not in the
    problem: they are timed with the exact backends of the same problem, so that compare
    can judge them over partners."""
    from attnbench.runs.pairing import job_groups
    from attnbench.runs.suite import load_suite

    suite = load_suite("family", sorted(all_backends()))
    groups = job_groups(suite.jobs(), suite.claims, suite.comparisons)
    for n in (1024, 2048, 4096, 8192):
        (group,) = [g for g in groups if any(c.seq_q == n and c.mask == "none"
                                             and c.mode == "fwd" and b == "sdpa" for c, b in g)]
        names = [b for _, b in group]
        assert {"sdpa", "linear", "linformer", "block_sparse"} <= set(names)
        assert len({c.problem for c, _ in group}) == 1
        (sparse_key,) = {c.key for c, b in group if b == "block_sparse"}
        assert sparse_key not in {c.key for c, b in group if b == "sdpa"}
    (bwd,) = [g for g in groups if any(c.seq_q == 8192 and c.mode == "fwd_bwd"
                                       and b == "block_sparse" for c, b in g)]
    assert sorted(b for _, b in bwd) == ["block_sparse", "linear"]


def test_a_sequential_claim_joins_its_sides_on_the_problem():
    from attnbench.core.case import Case
    from attnbench.runs.pairing import claim_rounds

    sdpa = Case(seq_q=512, seq_k=512, device="cpu")
    sparse = sdpa.replace(block_size=64, block_band=2)  # backend knobs: another key
    assert sdpa.key != sparse.key and sdpa.problem == sparse.problem
    claim = {"kind": "ratio", "numerator": "sdpa", "denominator": "block_sparse",
             "expected": [2], "rounds": [6, 12]}
    rule = claim_rounds([(sdpa, "sdpa"), (sparse, "block_sparse")], [claim])
    assert rule is not None and rule.sides == ((0, 1, 2, None),)
