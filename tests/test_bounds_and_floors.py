"""Hostile bounds refused at load, window bounds cut to the sequences' reach, a plan's
per-pair work done once per case or geometry, the relative error's floor, and a block
layout that covers every tile recorded as exact."""

import textwrap

import pytest
import torch

from attnbench.cli import main
from attnbench.core import accuracy, block_layouts, masks
from attnbench.core.case import Case
from attnbench.core.masks import INT64_MAX, MaskSpec, allowed_rows
from attnbench.core.reference import case_reference
from attnbench.measure.case_cache import CaseCache
from attnbench.measure.execute import open_job

HUGE = "99999999999999999999999"  # beyond int64


def _suite(tmp_path, body: str):
    path = tmp_path / "s.toml"
    path.write_text(textwrap.dedent(body))
    return path


def _run(path, tmp_path, *extra):
    return main(["run", "--suite", str(path), "--out", str(tmp_path / "results"),
                 "--no-progress", "--device", "cpu", *extra])


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    return err


# ---- bounds ---------------------------------------------------------------------------


@pytest.mark.parametrize("dry", [True, False])
def test_window_bound_beyond_int64_is_one_line_exit_2(tmp_path, capsys, dry):
    path = _suite(tmp_path, f"""
        name = "w"
        backends = ["sdpa"]
        [axes]
        seq_len = 64
        mask = "window({HUGE},0)"
    """)
    assert _run(path, tmp_path, *(["--dry-run"] if dry else [])) == 2
    err = _one_error_line(capsys)
    assert str(path) in err and "axes.mask" in err and HUGE in err
    assert f"at most {INT64_MAX}" in err and "inf" in err
    assert not (tmp_path / "results").exists()  # nothing recorded


@pytest.mark.parametrize("key, value", [("seed", HUGE), ("batch", HUGE),
                                        ("block_pairs", f"[[0, {HUGE}]]")])
def test_integers_beyond_int64_are_refused_at_load(tmp_path, capsys, key, value):
    path = _suite(tmp_path, f"""
        name = "i"
        backends = ["sdpa"]
        [axes]
        seq_len = 64
        {key} = {value}
    """)
    assert _run(path, tmp_path, "--dry-run") == 2
    err = _one_error_line(capsys)
    assert f"axes.{key}" in err and "int64" in err and f"{INT64_MAX}" in err


def test_block_longer_than_every_length_is_refused(tmp_path, capsys):
    path = _suite(tmp_path, """
        name = "b"
        backends = ["block_sparse"]
        [axes]
        seq_len = [64, 128]
        mask = "block_sparse(bigbird)"
        block_size = [64, 256]
    """)
    assert _run(path, tmp_path, "--dry-run") == 2
    err = _one_error_line(capsys)
    assert "axes.block_size = 256" in err and "at most 128" in err
    # a block no longer than some length loads; a --seq-len below every block does not
    ok = _suite(tmp_path, """
        name = "b"
        backends = ["block_sparse"]
        [axes]
        seq_len = [64, 128]
        mask = "block_sparse(bigbird)"
        block_size = 128
    """)
    assert _run(ok, tmp_path, "--dry-run") == 0
    capsys.readouterr()
    assert _run(ok, tmp_path, "--dry-run", "--seq-len", "32") == 2
    assert "block_size = 128" in _one_error_line(capsys)


def test_window_past_the_sequence_is_cut_to_its_reach():
    wide = Case(seq_q=64, seq_k=64, mask="window(100000,0)")
    assert wide.mask == "window(100000,0)"  # the key says what the suite said
    assert (wide.mask_spec.left, wide.mask_spec.right) == (63, 0)
    causal = Case(seq_q=64, seq_k=64, mask="causal")
    assert wide.visible_pairs == causal.visible_pairs == 64 * 65 // 2
    assert torch.equal(allowed_rows(wide.mask_spec, 0, 64, 64, 64),
                       allowed_rows(causal.mask_spec, 0, 64, 64, 64))
    # the largest bound int64 holds: geometry on the reach, no overflow anywhere
    top = Case(seq_q=48, seq_k=80, mask=f"window({INT64_MAX},{INT64_MAX})")
    assert (top.mask_spec.left, top.mask_spec.right) == (79, 47)
    assert top.visible_pairs == 48 * 80
    # a bound exactly at the reach is kept as written
    at = MaskSpec.parse("window(79,47)").clamped(48, 80)
    assert (at.left, at.right) == (79, 47)


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


# ---- the relative error's floor -------------------------------------------------------


@pytest.mark.parametrize("mask", ["none", "causal"])
@pytest.mark.parametrize("backend", ["linear", "sdpa"])
def test_exact_zero_gradient_is_not_wrong(monkeypatch, mask, backend):
    """One query, one key: the output is v whatever q is, so the exact dq is 0."""
    monkeypatch.setenv("ATTNBENCH_NATIVE", "0")
    case = Case(batch=1, heads_q=1, heads_kv=1, seq_q=1, seq_k=1, head_dim=32,
                head_dim_v=32, mode="fwd_bwd", mask=mask)
    got = open_job(case, backend, CaseCache())
    record = getattr(got, "record", got)
    assert record.status == "ok", record.reason
    for tensor in ("out", "dq", "dk", "dv"):
        assert record.metrics[f"err_impl_{tensor}_rel"] < 1e-5


def test_floor_is_a_sixteenth_of_the_typical_norm_and_below_real_references():
    case = Case(batch=1, heads_q=2, heads_kv=2, seq_q=256, seq_k=256, head_dim=32,
                head_dim_v=32, mode="fwd_bwd", mask="causal")
    inputs = case.make_inputs()
    floor = accuracy.floors(case, inputs)
    typical = accuracy.typical_norms(case, inputs)
    ref = case_reference(case, inputs).as_dict()
    for name, t in ref.items():
        assert floor[name] == pytest.approx(typical[name] / 16)
        assert float(torch.linalg.vector_norm(t)) > floor[name]  # never applies here
    zero, small = torch.zeros(4, dtype=torch.float64), torch.full((4,), 1e-9)
    assert accuracy.errors(small, zero)[1] == float("inf")  # no floor: meaningless
    assert accuracy.errors(small, zero, 1.0)[1] == pytest.approx(2e-9)


# ---- a block layout that covers every tile ---------------------------------------------


def test_layout_covering_every_tile_is_exact(monkeypatch):
    monkeypatch.setenv("ATTNBENCH_NATIVE", "0")
    dense = Case(batch=1, heads_q=2, heads_kv=2, seq_q=256, seq_k=256, head_dim=32,
                 head_dim_v=32)  # bigbird over 4 blocks of 64: every tile
    got = open_job(dense, "block_sparse", CaseCache())
    record = getattr(got, "record", got)
    assert record.status == "ok", record.reason
    assert record.info["layout_density"] == 1.0 and record.info["semantics"] == "exact"
    sparse = dense.replace(seq_q=1024, seq_k=1024)
    got = open_job(sparse, "block_sparse", CaseCache())
    record = getattr(got, "record", got)
    assert 0 < record.info["layout_density"] < 1.0
    assert record.info["semantics"] == "approximate"
