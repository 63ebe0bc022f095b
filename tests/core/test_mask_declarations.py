"""Masks as declarations: each kind's count agrees with its own predicate, the built-in
kinds keep their texts and keys, and a kind declared by a test (not by core) reaches the
float64 reference, the work count and a backend that takes any mask, while a backend that
lists its kinds reports it not supported."""

from __future__ import annotations

import math
import re

import pytest
import torch
from mask_toys import TOYS, Prefix, definition, registered_toys

from attnbench.core import masks
from attnbench.core.backend import Capabilities
from attnbench.core.case import Case
from attnbench.core.masks import Geometry, MaskSpec, allowed_rows
from attnbench.core.reference import case_reference
from attnbench.implementations.naive import Naive
from attnbench.implementations.sdpa import Sdpa
from attnbench.implementations.sparsemax import Sparsemax

GEOMETRIES = [(40, 40), (23, 57), (57, 23), (1, 9), (9, 1)]


def counted(spec: MaskSpec, geom: Geometry) -> int:
    """Pairs the predicate lets through, over the whole (seq_q, seq_k) grid."""
    q = torch.arange(geom.seq_q)[:, None]
    k = torch.arange(geom.seq_k)[None, :]
    seen = spec.visible(geom, q, k)
    return int(seen.expand(geom.seq_q, geom.seq_k).sum())


@pytest.mark.parametrize("text", ["none", "causal", "window(5,2)", "window(0,0)",
                                  "window(inf,3)", "window(4,inf)", "block_sparse(local)",
                                  "block_sparse(bigbird)", "block_sparse(strided)"])
@pytest.mark.parametrize("nq,nk", GEOMETRIES)
def test_each_built_in_count_is_what_its_predicate_sees(text, nq, nk):
    case = Case(seq_q=nq, seq_k=nk, mask=text, block_size=8)
    spec = case.mask_spec
    by_knobs = case.mask_geometry
    by_layout = Geometry(nq, nk, 8, case.block_layout)
    assert spec.pairs(by_knobs) == counted(spec, by_layout) == case.visible_pairs
    assert spec.pairs(by_layout) == case.visible_pairs


@pytest.mark.parametrize("text", ["causal", "window(5,2)", "window(0,0)", "window(inf,3)"])
@pytest.mark.parametrize("nq,nk", GEOMETRIES)
def test_band_predicate_is_the_bottom_right_band(text, nq, nk):
    spec = MaskSpec.parse(text)
    left, right = spec.window
    i, j = torch.arange(nq)[:, None], torch.arange(nk)[None, :]
    d = j - (i + nk - nq)  # key offset from the query's bottom-right aligned diagonal
    want = (d >= -left) & (d <= right)
    assert torch.equal(allowed_rows(spec, 0, nq, nq, nk), want)


def test_built_in_kinds_keep_their_names_forms_and_texts():
    assert masks.BUILT_IN == ("none", "causal", "window", "block_sparse")
    assert masks.MASK_KINDS == ("none", "causal", "window(left,right)",
                                "block_sparse(layout)")
    texts = {"": "none", "full": "none", " None ": "none", "causal": "causal",
             "window(3, 1)": "window(3,1)", "WINDOW(inf,0)": "window(inf,0)",
             "block_sparse( bigbird )": "block_sparse(bigbird)"}
    assert {t: str(MaskSpec.parse(t)) for t in texts} == texts
    assert Case(seq_q=128, seq_k=128, mask="window(3,1)").key == \
        "b1-hq8-hkv8-q128-k128-d64-dv64-float32-cpu-window(3,1)-fwd-s0"
    assert MaskSpec.parse("causal") == MaskSpec("causal", math.inf, 0)
    assert MaskSpec.parse("window(9,2)").clamped(4, 6) == MaskSpec("window", 5, 2)


@pytest.mark.parametrize("text,why", [
    ("window(-1,0)", "window bounds must be >= 0"),
    ("block_sparse(nope)", "unknown block layout 'nope'"),
    ("diagonal", "allowed: none, causal, window(left,right), block_sparse(layout)"),
])
def test_a_mask_not_allowed_says_why(text, why):
    with pytest.raises(ValueError, match=re.escape(why)):
        MaskSpec.parse(text)


def test_capabilities_naming_an_undeclared_kind_fail_at_once():
    with pytest.raises(ValueError, match="mask kind 'windw'"):
        Capabilities(masks=("none", "windw"))
    assert Capabilities(masks=("none",), any_mask=True).reasons(Case(mask="window(2,0)")) == []


# ---- a kind declared outside core ------------------------------------------------------


@pytest.fixture
def toy_kinds():
    with registered_toys():
        yield


def brute_reference(q, k, v, allowed, scale):
    """Float64 masked softmax attention with the whole score matrix."""
    s = (q.double() @ k.double().transpose(-1, -2)) * scale  # (B, H, Nq, Nk)
    s = s.masked_fill(~allowed, -math.inf)
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)  # a row that sees nothing gives zeros
    return p @ v.double()  # (B, H, Nq, Dv)


@pytest.mark.parametrize("text", TOYS)
@pytest.mark.parametrize("nq,nk", GEOMETRIES)
def test_a_declared_kind_counts_its_pairs(toy_kinds, text, nq, nk):
    case = Case(seq_q=nq, seq_k=nk, mask=text)
    want = definition(text, nq, nk)
    assert case.mask == text and case.key.endswith(f"-{text}-fwd-s0")
    assert case.visible_pairs == int(want.sum()) == counted(case.mask_spec, case.mask_geometry)
    assert case.flops == 2.0 * case.heads_q * int(want.sum()) * (64 + 64)
    assert torch.equal(allowed_rows(case.mask_spec, 0, nq, nq, nk), want)
    r0, r1 = min(nq, 2), min(nq, 5)  # a slice of rows, as the reference asks for them
    assert torch.equal(allowed_rows(case.mask_spec, r0, r1, nq, nk), want[r0:r1])


@pytest.mark.parametrize("text", TOYS)
@pytest.mark.parametrize("nq,nk", [(33, 33), (20, 37), (37, 20)])
def test_a_declared_kind_reaches_the_reference_and_backends(toy_kinds, text, nq, nk):
    case = Case(batch=2, heads_q=4, heads_kv=2, seq_q=nq, seq_k=nk, head_dim=16,
                head_dim_v=8, dtype="float64", mask=text, mode="fwd_bwd", seed=3)
    inputs = case.make_inputs()
    ref = case_reference(case, inputs)
    allowed = definition(text, nq, nk)
    kv = [t.repeat_interleave(2, dim=1) for t in (inputs.k, inputs.v)]  # (B, Hq, Nk, .)
    want = brute_reference(inputs.q, *kv, allowed, case.softmax_scale)
    torch.testing.assert_close(ref.out, want, rtol=1e-12, atol=1e-12)
    assert ref.dq is not None and torch.isfinite(ref.dq).all()
    for backend in (Naive(), Sdpa()):
        assert backend.not_supported_reasons(case) == []
        out = backend.build(case, inputs)(inputs.q, inputs.k, inputs.v)
        torch.testing.assert_close(out.double(), ref.out, rtol=1e-10, atol=1e-10)


def test_a_backend_listing_its_kinds_reports_a_new_one_not_supported(toy_kinds):
    case = Case(seq_q=16, seq_k=16, mask="prefix(3)")
    assert Sparsemax().not_supported_reasons(case) == [
        "mask prefix(3) not supported (supports none, causal, window, block_sparse)"]
    assert Capabilities().reasons(case) == [
        "mask prefix(3) not supported (supports none, causal, window)"]


def test_a_kind_is_declared_once_and_forgotten_when_unregistered(toy_kinds):
    with pytest.raises(ValueError, match="'prefix' is already declared"):
        masks.register(Prefix)
    with pytest.raises(ValueError, match="'causal' is already declared"):
        masks.register(type("Again", (Prefix,), {"name": "causal"}))
    assert "prefix(n)" in masks.forms()
    masks.unregister("prefix")
    with pytest.raises(ValueError, match=r"unknown mask 'prefix\(3\)'"):
        Case(mask="prefix(3)")
    assert "prefix(n)" not in masks.forms()
