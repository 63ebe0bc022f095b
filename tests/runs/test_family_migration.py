"""Backend parameters out of the shared case: the family suite gives block_sparse's layout
and linear's feature map to those backends only, records of different backends pair on the
problem (``Case.problem_of``, which reads keys written before this too), and on a published
family run the rewritten suite gives the comparisons and claim verdicts the old one gave.

The fixture is one published family run's records with the columns no comparison or claim
reads left out; ``expected.json`` is what the old suite (block knobs in every backend's key,
joins on the whole key) gave on it."""

import dataclasses
import json
from pathlib import Path

import pytest
import tomllib

from attnbench.analysis import comparisons
from attnbench.analysis.claims import claims_table
from attnbench.core.case import Case
from attnbench.reporting.findings import speedups
from attnbench.runs.record_files import load_results
from attnbench.runs.suite import load_suite

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "family-migration"
FAMILY = ROOT / "suites" / "family.toml"


def _speedup(r):
    value = r.get("speedup")
    return None if value is None or value != value else round(float(value), 6)


def outcome(suite, df) -> dict:
    """Every claim's verdict and measured text; every comparison's pairs and speedups."""
    # within-run intervals: what the old suite gave (the across-runs widening is apart)
    claims = [[r["claim"], r["verdict"], r["measured (95% interval)"]]
              for _, r in claims_table(df, suite.claims, across=False).iterrows()]
    declared = [dataclasses.replace(c, suite=suite.name) for c in suite.comparisons]
    comps = {}
    for c, _ in comparisons.plan(df, declared, suite.name)[0]:
        sp = speedups(c, df)
        comps[c.name] = sorted([r["backend"], int(r["seq_q"]), r["mask"], r["mode"],
                                r["baseline_status"], _speedup(r)]
                               for _, r in sp.iterrows()) if not sp.empty else []
    return {"claims": claims, "comparisons": comps}


def test_the_rewritten_family_suite_reads_a_published_run_as_the_old_one_did():
    suite = load_suite(str(FAMILY))
    got = outcome(suite, load_results(FIXTURE / "records.jsonl"))
    expected = json.loads((FIXTURE / "expected.json").read_text())
    assert got["claims"] == expected["claims"]
    assert got["comparisons"] == expected["comparisons"]
    verdicts = [c[1] for c in got["claims"]]
    assert verdicts.count("holds") == 20 and verdicts.count("does not hold") == 2


def test_linear_and_linformer_sweeps_give_no_block_fields():
    data = tomllib.loads(FAMILY.read_text())
    for sweep in data["sweep"]:
        if {"linear", "linformer"} & set(sweep["backends"]):
            assert not [k for k in sweep["axes"] if k.startswith("block_")], sweep["name"]


def test_only_block_sparse_records_carry_its_layout_and_all_share_the_problem():
    suite = load_suite(str(FAMILY))
    dense = [(c, b) for c, b in suite.jobs() if c.mask == "none" and c.mode == "fwd"
             and c.seq_q == 8192 and c.param("additive_dim") == 0
             and c.param("feature_map") == "elu"]
    keys = {b: c.key for c, b in dense}
    assert set(keys) == {"sdpa", "linear", "linformer", "block_sparse"}
    assert all("block_" not in keys[b] for b in ("sdpa", "linear", "linformer"))
    assert "block_band=2" in keys["block_sparse"] and "block_random=6" in keys["block_sparse"]
    assert len({c.problem for c, _ in dense}) == 1
    assert {c.problem for c, _ in dense} == {keys["sdpa"]}


@pytest.mark.parametrize("key, mask, problem", [
    # recorded when every knob was in every backend's key
    ("b1-hq8-hkv8-q8192-k8192-d64-dv64-float32-cpu-none-fwd-s0-block_band=2-block_random=6",
     "none", "b1-hq8-hkv8-q8192-k8192-d64-dv64-float32-cpu-none-fwd-s0"),
    ("b1-hq8-hkv8-q4096-k4096-d64-dv64-float32-cpu-none-fwd-s0-additive_dim=64", "none",
     "b1-hq8-hkv8-q4096-k4096-d64-dv64-float32-cpu-none-fwd-s0"),
    # a block_sparse mask's geometry is the problem's; the layout name is not
    ("b1-hq8-hkv8-q2048-k2048-d64-dv64-float32-cpu-block_sparse(longformer)-fwd-s0-"
     "block_band=4-block_layout_name=local", "block_sparse(longformer)",
     "b1-hq8-hkv8-q2048-k2048-d64-dv64-float32-cpu-block_sparse(longformer)-fwd-s0-"
     "block_band=4"),
    # problem knobs stay, a negative value included; a plugin's params go
    ("b1-hq2-hkv2-q32-k32-d8-dv8-float32-cpu-window(-1,2)-fwd-s0-feature_map=favor-scale=-1.0"
     "-inputs=lowrank(4)-params=chunks=4", "window(-1,2)",
     "b1-hq2-hkv2-q32-k32-d8-dv8-float32-cpu-window(-1,2)-fwd-s0-scale=-1.0-inputs=lowrank(4)"),
])
def test_the_problem_of_a_key(key, mask, problem):
    assert Case.problem_of(key, mask) == problem


def test_the_problem_of_a_case_is_its_key_without_backend_parameters():
    case = Case(seq_q=64, seq_k=64, feature_map="favor", block_band=3, linformer_k=16,
                params="chunks=2", scale=0.5)
    plain = Case(seq_q=64, seq_k=64, scale=0.5)
    assert case.problem == plain.key == plain.problem
    sparse = Case(seq_q=256, seq_k=256, mask="block_sparse(local)", block_band=3,
                  feature_map="favor")
    assert sparse.problem == Case(seq_q=256, seq_k=256, mask="block_sparse(local)",
                                  block_band=3).key


def test_compare_pairs_a_published_run_with_one_of_the_rewritten_suite():
    from attnbench.analysis import run_diff

    old = load_results(FIXTURE / "records.jsonl")
    shape = ("backend", "seq_q", "mask", "mode", "feature_map", "additive_dim")
    now = {tuple(c.to_dict()[f] if f != "backend" else b for f in shape): c.key
           for c, b in load_suite(str(FAMILY)).jobs()}
    new = old.assign(key=[now[tuple(r[f] for f in shape)] for _, r in old.iterrows()])
    # sdpa (4 sizes), linear (5 + 2 fwd_bwd) and linformer (5) lost the block knobs
    assert (new["key"] != old["key"]).sum() == 16
    joined = run_diff.join_runs(old, new, "time_ms_median")
    assert len(joined) == len(old)
    assert joined["status_base"].notna().all() and joined["status_new"].notna().all()
    assert (joined["ratio"].dropna() == 1.0).all()
    # two old runs pair exactly as before
    assert len(run_diff.join_runs(old, old, "time_ms_median")) == len(old)
