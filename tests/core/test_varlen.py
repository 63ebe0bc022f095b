"""Packed variable-length batches: the lengths axis, the per-document float64 reference and
every varlen backend against it (flex through eager flex_attention, as
tests/implementations/test_flex.py)."""

from __future__ import annotations

import math

import pytest
import torch
from host_neutral import EagerFlex

from attnbench.core import lengths
from attnbench.core.case import Case
from attnbench.core.errors import BadInput
from attnbench.core.record import OPTIONAL_COLUMNS, Record
from attnbench.core.reference import case_reference, varlen_reference
from attnbench.core.registry import get_backend
from attnbench.measure.case_cache import CaseCache
from attnbench.measure.execute import Candidate, open_job
from attnbench.runs.suite import load_suite

# ---- the parser ------------------------------------------------------------------------


@pytest.mark.parametrize("text,canonical", [
    ("fixed(512)", "fixed(512)"), (" uniform( 1 , 9 ) ", "uniform(1,9)"),
    ("lognormal(256, 1.0)", "lognormal(256,1)"), ("lognormal(3.5,0)", "lognormal(3.5,0)"),
    ("text(torch)", "text(torch)")])
def test_parse_gives_the_canonical_form(text, canonical):
    assert str(lengths.parse(text)) == canonical
    assert Case(lengths=text).lengths == canonical


@pytest.mark.parametrize("text,says", [
    ("nope", "allowed: fixed(n)"), ("fixed", "allowed"), ("fixed(0)", "n must be >= 1"),
    ("fixed(2.5)", "n must be an integer"), ("fixed(1,2)", "fixed takes n"),
    ("uniform(5,2)", "lo must be <= hi"), ("uniform(0,4)", "lo must be >= 1"),
    ("lognormal(0,1)", "median must be >= 1"), ("lognormal(8,-1)", "sigma must be >= 0"),
    ("lognormal(8,nan)", "sigma must be >= 0"), ("text(1bad)", "importable package"),
    ("text()", "text takes package")])
def test_bad_lengths_are_one_line_errors(text, says):
    with pytest.raises(ValueError) as err:
        lengths.parse(text)
    assert says in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(ValueError):
        Case(lengths=text)


# ---- drawing and counting ------------------------------------------------------------------


@pytest.mark.parametrize("spec", ["fixed(7)", "uniform(1,40)", "lognormal(16,1.5)",
                                  "fixed(1)", "fixed(1000)"])
def test_draw_fills_every_row_exactly_and_is_fixed_by_the_seed(spec):
    rows = lengths.draw(spec, 3, 100, 5)
    assert len(rows) == 3
    assert all(sum(r) == 100 and min(r) >= 1 for r in rows)
    assert rows == lengths.draw(spec, 3, 100, 5)
    if spec.startswith(("uniform", "lognormal")):
        assert rows != lengths.draw(spec, 3, 100, 6)


def test_fixed_cuts_the_last_document_and_a_long_one_to_the_row():
    assert lengths.draw("fixed(30)", 2, 100, 0) == ((30, 30, 30, 10), (30, 30, 30, 10))
    assert lengths.draw("fixed(1000)", 1, 100, 0) == ((100,),)
    assert lengths.draw("uniform(3,3)", 1, 7, 0) == ((3, 3, 1),)


def test_summary_and_pairs_arithmetic():
    rows = ((1, 3), (4,))
    s = lengths.summary(rows)
    assert s == {"count": 3, "max": 4, "mean": 8 / 3, "padding_frac": 1 - 8 / 12}
    assert lengths.document_pairs(rows, causal=False) == 1 + 9 + 16
    assert lengths.document_pairs(rows, causal=True) == 1 + 6 + 10
    assert lengths.summary(((5, 5),))["padding_frac"] == 0.0


@pytest.mark.parametrize("mask,mode", [("none", "fwd"), ("causal", "fwd_bwd")])
def test_flops_count_within_document_pairs_only(mask, mode):
    case = Case(batch=2, heads_q=4, heads_kv=2, seq_q=64, seq_k=64, head_dim=16,
                head_dim_v=8, mask=mask, mode=mode, lengths="uniform(1,20)")
    rows = lengths.draw(case.lengths, 2, 64, 0)
    pairs = lengths.document_pairs(rows, causal=mask == "causal")
    factor = {"fwd": 1.0, "fwd_bwd": 3.5}[mode]
    assert case.flops == pytest.approx(2 * 4 * pairs * (16 + 8) * factor)
    assert case.flops_dense == pytest.approx(2 * 2 * 4 * 64 * 64 * (16 + 8) * factor)
    # the padded baseline counts the same work: its padding is work not done
    assert get_backend("sdpa_padded").work_flops(case) == case.flops


# ---- keys --------------------------------------------------------------------------------

# Keys of published records, with the fields they were made from.
OLD_KEYS = [
    ("b1-hq8-hkv8-q1024-k1024-d64-dv64-float32-cpu-window(255,0)-fwd-s0",
     {"mask": "window(255,0)"}),
    ("b1-hq8-hkv8-q1024-k1024-d64-dv64-float32-cpu-block_sparse(longformer)-fwd-s0-"
     "block_band=4", {"mask": "block_sparse(longformer)", "block_band": 4}),
    ("b1-hq12-hkv12-q512-k512-d32-dv32-float32-cpu-none-fwd-s0-block_size=32-linformer_k=64-"
     "inputs=sinks(1,5)", {"heads_q": 12, "heads_kv": 12, "seq_q": 512, "seq_k": 512,
                           "head_dim": 32, "head_dim_v": 32, "block_size": 32,
                           "linformer_k": 64, "inputs": "sinks(1,5)"}),
    ("b1-hq12-hkv12-q128-k128-d32-dv32-float32-cpu-none-fwd-s1-block_size=32-"
     "feature_map=favor-num_features=64-linformer_k=64-inputs=minilm(5)",
     {"heads_q": 12, "heads_kv": 12, "seq_q": 128, "seq_k": 128, "head_dim": 32,
      "head_dim_v": 32, "seed": 1, "block_size": 32, "feature_map": "favor",
      "num_features": 64, "linformer_k": 64, "inputs": "minilm(5)"}),
]


@pytest.mark.parametrize("key,fields", OLD_KEYS)
def test_old_keys_are_unchanged_without_lengths(key, fields):
    assert Case(**fields).key == key
    assert Case(**fields, lengths="").key == key


def test_a_packed_case_names_its_lengths_in_its_key_and_round_trips():
    case = Case(lengths="lognormal(256, 1)", mask="causal")
    assert case.key == ("b1-hq8-hkv8-q1024-k1024-d64-dv64-float32-cpu-causal-fwd-s0-"
                        "lengths=lognormal(256,1)")
    row = Record.new(case, "sdpa", "ok").to_row()
    assert Record.from_row(row).case == case
    old = {k: v for k, v in Record.new(Case(), "sdpa", "ok").to_row().items()
           if k != "lengths"}
    assert Record.from_row(old).case.key == Case().key  # rows written before the axis


# ---- the reference -----------------------------------------------------------------------


def _direct(q, k, v, rows, causal, scale):
    """Attention of each document written out, one query at a time (float64)."""
    B, Hq, N, _ = q.shape
    group = Hq // k.shape[1]
    out = torch.zeros(B, Hq, N, v.shape[-1], dtype=torch.float64)
    for b, row in enumerate(rows):
        start = 0
        for n in row:
            for h in range(Hq):
                for i in range(start, start + n):
                    last = i + 1 if causal else start + n
                    s = (k[b, h // group, start:last].double() @ q[b, h, i].double()) * scale
                    p = torch.softmax(s, dim=0)
                    out[b, h, i] = p @ v[b, h // group, start:last].double()
            start += n
    return out


@pytest.mark.parametrize("causal", [False, True])
def test_reference_is_attention_within_each_document(causal):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, 12, 5, generator=g), torch.randn(2, 2, 12, 5, generator=g),
               torch.randn(2, 2, 12, 3, generator=g))
    rows = ((1, 4, 7), (12,))
    ref = varlen_reference(q, k, v, rows, causal, scale=0.3)
    assert torch.allclose(ref.out, _direct(q, k, v, rows, causal, 0.3), atol=1e-12)
    with pytest.raises(ValueError, match="hold 11 tokens"):
        varlen_reference(q, k, v, ((1, 4, 6), (12,)), causal)


# ---- the backends against it -------------------------------------------------------------

# (lengths, batch, seq): documents of 1 token, multiples of flex's 128-token blocks and not,
# one document spanning each row, a skewed draw.
LENGTHS = [("fixed(1)", 1, 9), ("uniform(1,3)", 2, 17), ("fixed(128)", 1, 256),
           ("fixed(100)", 2, 256), ("fixed(300)", 2, 300), ("lognormal(20,1.2)", 2, 160)]
SHAPES = [(4, 4, 16, 16), (4, 2, 16, 8)]  # (Hq, Hkv, D, Dv): MHA, and GQA with Dv != D


def _case(spec, batch, seq, shape, mask, mode):
    hq, hkv, d, dv = shape
    return Case(batch=batch, heads_q=hq, heads_kv=hkv, seq_q=seq, seq_k=seq, head_dim=d,
                head_dim_v=dv, mask=mask, mode=mode, lengths=spec, seed=3)


def _judged(name):
    return EagerFlex() if name == "flex" else get_backend(name)


def _check(name, case, tol=2e-5):
    backend = _judged(name)
    reasons = backend.not_supported_reasons(case)
    if reasons:
        return reasons
    inputs = case.make_inputs()
    prepared = backend.prepare(case, inputs)
    outputs = prepared.outputs(prepared.fn())
    ref = case_reference(case, inputs).as_dict()
    assert set(outputs) == set(ref)
    for t, got in outputs.items():
        assert got.shape == ref[t].shape, t
        rel = float((got.double() - ref[t]).norm() / ref[t].norm())
        assert rel < tol, (name, t, rel)
    assert prepared.extras["lengths_count"] == sum(
        len(r) for r in lengths.draw(case.lengths, case.batch, case.seq_q, case.seed))
    return []


@pytest.mark.parametrize("name", ["naive", "sdpa", "sdpa_padded", "flex"])
@pytest.mark.parametrize("mask", ["none", "causal"])
@pytest.mark.parametrize("spec,batch,seq", LENGTHS)
@pytest.mark.parametrize("shape", SHAPES, ids=["mha", "gqa"])
def test_forward_matches_the_per_document_reference(name, mask, spec, batch, seq, shape):
    case = _case(spec, batch, seq, shape, mask, "fwd")
    reasons = _check(name, case)
    # sdpa over nested tensors may refuse a causal mask: then it says why, naming the torch
    assert not reasons or (name == "sdpa" and mask == "causal"
                           and reasons[0].startswith("sdpa over nested jagged tensors"))


@pytest.mark.parametrize("name", ["naive", "sdpa", "sdpa_padded"])
@pytest.mark.parametrize("mask", ["none", "causal"])
@pytest.mark.parametrize("spec,batch,seq", [LENGTHS[1], LENGTHS[3], LENGTHS[5]])
def test_gradients_match_the_per_document_reference(name, mask, spec, batch, seq):
    case = _case(spec, batch, seq, SHAPES[1], mask, "fwd_bwd")
    reasons = _check(name, case)
    assert not reasons or (name == "sdpa" and mask == "causal")


def test_a_nested_refusal_is_the_probe_s_own_reason():
    reasons = get_backend("sdpa").not_supported_reasons(
        _case("fixed(4)", 1, 8, SHAPES[0], "causal", "fwd"))
    for r in reasons:  # torch 2.13 refuses nested causal; a later torch may not
        assert r.startswith("sdpa over nested jagged tensors (torch ") and "causal" in r


def test_block_diagonal_masks_differ_from_the_dense_case():
    """A packed case is not its dense shape: the documents matter."""
    case = _case("fixed(4)", 1, 16, SHAPES[0], "none", "fwd")
    inputs = case.make_inputs()
    packed = case_reference(case, inputs).out
    dense = case_reference(case.replace(lengths=""), inputs).out
    assert (packed - dense).abs().max() > 0.1


# ---- capabilities, records, suites -------------------------------------------------------


@pytest.mark.parametrize("name", ["linear", "block_sparse"])
def test_other_backends_refuse_packed_batches(name):
    case = Case(lengths="fixed(64)")
    reasons = get_backend(name).caps.reasons(case)
    assert "lengths fixed(64): not yet implemented for packed batches" in reasons


def test_sdpa_padded_needs_a_packed_batch_and_packed_cases_need_self_attention():
    assert get_backend("sdpa_padded").not_supported_reasons(Case())
    assert "seq_q == seq_k" in Case(seq_q=8, seq_k=16, lengths="fixed(4)").inputs_problem()
    assert "allowed: none, causal" in Case(mask="window(3,0)",
                                           lengths="fixed(4)").inputs_problem()
    assert Case(lengths="fixed(4)", mask="causal").inputs_problem() is None


def test_a_run_records_the_summary_and_an_ok_status():
    case = _case("lognormal(20,1.2)", 2, 160, SHAPES[1], "causal", "fwd")
    got = open_job(case, "sdpa_padded", CaseCache())
    assert isinstance(got, Candidate) and got.record.status == "ok", got
    row = got.record.to_row()
    s = lengths.summary(lengths.draw(case.lengths, 2, 160, 3))
    assert row["lengths_count"] == s["count"] and row["lengths_max"] == s["max"]
    assert row["lengths_mean"] == s["mean"]
    assert row["lengths_padding_frac"] == s["padding_frac"] > 0
    assert len(row["lengths_hash"]) == 64
    assert all(k in OPTIONAL_COLUMNS for k in row if k.startswith("lengths_"))
    assert row["err_impl_out_rel"] < 1e-5


def test_text_lengths_unavailable_names_the_install_command(monkeypatch):
    from attnbench.core import pretrained

    monkeypatch.setattr(pretrained, "unavailable_reason", lambda: "the weights are missing")
    why = get_backend("naive").not_supported_reasons(Case(lengths="text(torch)"))
    assert why == ["lengths text(torch): the weights are missing"]
    assert "no installed package" in lengths.unavailable_reason("text(no_such_package_x)")
    # the plan's estimate still has a count: the dense bound
    assert Case(lengths="text(no_such_package_x)").visible_pairs == 1024 * 1024


@pytest.mark.skipif(lengths.unavailable_reason("text(torch)") is not None,
                    reason="text(torch) needs tokenizers and the MiniLM package")
def test_text_lengths_are_real_documents_with_their_source_and_hash():
    docs, source, digest = lengths.text_lengths("torch")
    assert len(docs) > 50 and min(docs) >= 3  # [CLS] text [SEP]
    assert "module docstrings" in source and digest[:16] in source
    case = Case(batch=2, seq_q=512, seq_k=512, lengths="text(torch)")
    rows = lengths.draw(case.lengths, 2, 512, 0)
    assert all(sum(r) == 512 for r in rows)
    assert all(n in docs or n == r[-1] or n == 512 for r in rows for n in r)
    cols = lengths.record_columns(case)
    assert cols["lengths_source"] == source and not math.isnan(cols["lengths_padding_frac"])


SUITE = """
name = "t"
description = "d"
backends = ["sdpa_padded"]
[axes]
seq_len = 64
mask = "{mask}"
lengths = {lengths}
"""


@pytest.mark.parametrize("lengths_value,mask,says", [
    ('"lognormal(0,1)"', "none", "lengths = 'lognormal(0,1)'"),
    ("3", "none", "lengths = 3: must be a string"),
    ('"fixed(8)"', "window(3,0)", "allowed: none, causal")])
def test_a_suite_with_bad_lengths_is_refused_in_one_line(lengths_value, mask, says, tmp_path):
    path = tmp_path / "t.toml"
    path.write_text(SUITE.format(mask=mask, lengths=lengths_value))
    with pytest.raises(BadInput) as err:
        load_suite(str(path))
    assert says in str(err.value) and "\n" not in str(err.value)


def test_a_suite_s_lengths_reach_its_cases(tmp_path):
    path = tmp_path / "t.toml"
    path.write_text(SUITE.format(mask="causal", lengths='["", "fixed(8)", "uniform(1, 9)"]'))
    suite = load_suite(str(path))
    cases = [c for s in suite.sweeps for c in s.cases()]
    assert [c.lengths for c in cases] == ["", "fixed(8)", "uniform(1,9)"]  # "": dense
