"""A run's plan (runs/plan.py): estimates from earlier runs, bounds of sequential claims."""

from __future__ import annotations

import textwrap

import pytest

from attnbench.core import block_layouts, masks
from attnbench.runs.overrides import select


def _earlier_run(results, suite, jobs, seconds, ms=1.0, environment=None):
    import dataclasses
    import json

    from attnbench.core.record import Record
    run = results / "2026-01-01-earlier"
    run.mkdir(parents=True)
    meta = {"suite": suite.name, "started": "2026-01-01T00:00:00+00:00",
            "ended": f"2026-01-01T00:{seconds // 60:02d}:{seconds % 60:02d}+00:00",
            "timing": dataclasses.asdict(suite.timing), "invocation": {"device": "cpu"},
            "ceilings": {"matmul_tflops": {"float32": 0.25}}}
    if environment:
        meta["environment"] = environment
    (run / "meta.json").write_text(json.dumps(meta))
    with open(run / "records.jsonl", "w") as fh:
        for case, backend in jobs:
            row = Record.new(case, backend, "ok", time_ms_median=ms, flops=case.flops).to_row()
            fh.write(json.dumps(row | {"run_id": run.name, "suite": suite.name}) + "\n")
    return run


def test_dry_run_estimate_comes_from_an_earlier_run_of_the_suite(tmp_path):
    from attnbench.runs.plan import make_plan
    suite, device, jobs = select("quick", device="cpu")
    _earlier_run(tmp_path, suite, jobs, seconds=100)
    plan = make_plan(suite, jobs, device, history=tmp_path)
    assert plan.estimate_s == pytest.approx(100, rel=0.01)  # the same pairs: its own time
    assert "from run 2026-01-01-earlier: 1.7 min measured" in plan.summary()
    half = [j for j in jobs if j[1] == "naive"]
    assert make_plan(suite, half, device, history=tmp_path).estimate_s == \
        pytest.approx(50, rel=0.05)


def test_dry_run_estimate_from_another_machine_scales_by_the_matmul_rates(tmp_path,
                                                                         monkeypatch):
    """An earlier run on another machine: its times scaled by its fp32 matmul rate over this
    machine's (injected here, never measured in a test)."""
    from attnbench.runs import plan as plan_module
    suite, device, jobs = select("quick", device="cpu")
    _earlier_run(tmp_path, suite, jobs, seconds=100,
                 environment={"device_name": "a faster CPU", "cpu_capability": "avx512",
                              "threads": 2})
    monkeypatch.setattr(plan_module, "_matmul_rate", lambda device: 0.125e12)  # half of 0.25
    plan = plan_module.make_plan(suite, jobs, device, history=tmp_path)
    assert plan.estimate_s == pytest.approx(200, rel=0.01)
    assert "measured on a faster CPU: its times scaled x2.00" in plan.summary()


def test_dry_run_of_sequential_claims_says_the_longest_the_run_may_take(tmp_path):
    """family_goals' claims take 12, 24 or 36 rounds as the data decide: one earlier run
    (decided at 12) read 2.0 min, the next three 3.0-3.7. The estimate names the bound."""
    from attnbench.runs.plan import claim_round_budget, make_plan
    suite, device, jobs = select("family_goals", device="cpu")
    rounds = claim_round_budget(suite, jobs)
    sides = {(c.mask, b) for c, b in jobs if (c.key, b) in rounds}
    assert {("window(255,0)", "sliding_window"), ("causal", "sdpa"), ("none", "linear"),
            ("none", "block_sparse"), ("none", "sdpa")} <= sides
    assert set(rounds.values()) == {36}
    _earlier_run(tmp_path, suite, jobs, seconds=120, ms=50.0)
    plan = make_plan(suite, jobs, device, history=tmp_path)
    assert plan.most_s > 1.05 * plan.estimate_s
    assert f"up to {plan.most_s / 60:.1f} min if every sequential claim takes all its " \
           f"rounds" in plan.summary()
    # a suite without sequential claims gives one figure
    quick, _, quick_jobs = select("quick", device="cpu")
    assert claim_round_budget(quick, quick_jobs) == {}
    _earlier_run(tmp_path / "q", quick, quick_jobs, seconds=60)
    plain = make_plan(quick, quick_jobs, device, history=tmp_path / "q")
    assert plain.most_s == plain.estimate_s and "up to" not in plain.summary()


def _suite(tmp_path, body: str):
    path = tmp_path / "s.toml"
    path.write_text(textwrap.dedent(body))
    return path


# ---- the plan: work per case or per geometry, not per pair -----------------------------
PLAN_SUITE = """
    name = "plan10k"
    backends = ["sdpa", "naive", "additive", "block_sparse", "sliding_window"]
    [axes]
    seq_len = [256, 512, 1024, 2048]
    mask = ["none", "causal", "window(64,0)", "block_sparse(longformer)"]
    head_dim = [32, 64]
    mode = ["fwd", "fwd_bwd"]
    dtype = ["float32", "float64"]
    batch = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16]
"""


def _counting(monkeypatch, module, name, counts):
    original = getattr(module, name)

    def counted(*args, **kwargs):
        counts[name] = counts.get(name, 0) + 1
        return original(*args, **kwargs)

    monkeypatch.setattr(module, name, counted)


def test_plan_of_10000_pairs_asks_once_per_pair_and_per_geometry(tmp_path, monkeypatch):
    from attnbench.core.backend import Backend
    from attnbench.implementations import additive
    from attnbench.runs import plan as plan_mod
    from attnbench.runs.suite import load_suite

    monkeypatch.setattr(plan_mod, "_matmul_rate", lambda device: 1e11)  # no measuring
    block_layouts._cached_layout.cache_clear()
    block_layouts._cached_pairs.cache_clear()
    masks.band_pairs.cache_clear()
    counts: dict[str, int] = {}
    _counting(monkeypatch, Backend, "not_supported_reasons", counts)
    _counting(monkeypatch, block_layouts, "longformer_mod", counts)
    _counting(monkeypatch, masks.band, "band_row_counts", counts)  # where the band counts
    _counting(monkeypatch, additive, "key_range", counts)
    suite = load_suite(str(_suite(tmp_path, PLAN_SUITE)))
    jobs = plan_mod.expand(suite, "cpu", force=False)
    assert len(jobs) == 10240
    plan = plan_mod.make_plan(suite, jobs, "cpu", history=tmp_path / "none", measure=True)
    assert plan.pairs == 10240 and plan.estimate_s > 0
    assert counts["not_supported_reasons"] == len(jobs)  # once per pair, whatever the passes
    assert counts["longformer_mod"] <= 4  # one layout per length
    assert counts.get("band_row_counts", 0) <= 8  # one count per (length, band)
    assert counts.get("key_range", 0) == 0  # additive's chunks are not listed to plan
