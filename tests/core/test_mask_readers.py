"""Readers of the mask declarations: flex builds its mask_mod from any kind's ``visible``
(a kind declared by a test runs there, against the float64 reference), additive narrows
its chunks to the key range the kind declares, and packed batches and paged caches allow
the kinds that declare ``per_document``, refusing others with the same message."""

from __future__ import annotations

import pytest
import torch
from host_neutral import EagerFlex
from mask_toys import TOYS, definition, registered_toys
from torch.nn.attention.flex_attention import create_mask

from attnbench.core import lengths, masks, paging
from attnbench.core.case import Case
from attnbench.core.dtypes import TOLERANCE_OUT
from attnbench.core.masks import MaskKind, MaskSpec, allowed_rows
from attnbench.core.reference import case_reference
from attnbench.core.registry import get_backend
from attnbench.implementations.additive import key_range
from attnbench.implementations.flex import Flex, mask_mod_for

GEOMETRIES = [(16, 16), (10, 23), (23, 10), (1, 9), (9, 1)]


@pytest.fixture
def toy_kinds():
    with registered_toys():
        yield


# ---- flex ---------------------------------------------------------------------------------


@pytest.mark.parametrize("text", TOYS)
@pytest.mark.parametrize("nq,nk", GEOMETRIES)
def test_flex_mask_mod_of_a_declared_kind_is_its_definition(toy_kinds, text, nq, nk):
    case = Case(seq_q=nq, seq_k=nk, mask=text)
    got = create_mask(mask_mod_for(case, "cpu"), 1, 1, nq, nk, device="cpu")[0, 0]  # (Nq, Nk)
    assert torch.equal(got, definition(text, nq, nk))


@pytest.mark.parametrize("text", TOYS)
@pytest.mark.parametrize("nq,nk", [(33, 33), (20, 37), (37, 20)])
def test_flex_runs_a_declared_kind_against_the_reference(toy_kinds, text, nq, nk):
    case = Case(batch=2, heads_q=4, heads_kv=2, seq_q=nq, seq_k=nk, head_dim=16,
                head_dim_v=8, mask=text, seed=5)
    assert Flex.caps.reasons(case) == []
    inputs = case.make_inputs()
    out = EagerFlex().build(case, inputs)(inputs.q, inputs.k, inputs.v)  # (B, Hq, Nq, Dv)
    ref = case_reference(case, inputs).out
    assert out.shape == ref.shape and torch.isfinite(out).all()
    seen = definition(text, nq, nk).any(dim=1)  # (Nq,) rows that see some key
    assert torch.equal(out[:, :, ~seen], torch.zeros_like(out[:, :, ~seen]))
    rel = float((out.double() - ref).norm() / ref.norm())
    assert rel < TOLERANCE_OUT[case.dtype], rel


def test_flex_builds_no_mask_where_a_kind_masks_nothing(toy_kinds):
    assert mask_mod_for(Case(mask="window(inf,inf)"), "cpu") is None
    assert MaskSpec.parse("window(inf,inf)").unmasked
    assert not MaskSpec.parse("window(inf,0)").unmasked
    assert not MaskSpec.parse("keys(4)").unmasked
    assert mask_mod_for(Case(mask="keys(4)"), "cpu") is not None


@pytest.mark.slow
def test_compiled_flex_runs_a_declared_kind(toy_kinds):
    """The mask_mod read from ``visible`` also traces into the compiled kernel."""
    case = Case(batch=1, heads_q=2, heads_kv=2, seq_q=40, seq_k=40, head_dim=16,
                head_dim_v=16, mask="prefix(5)", seed=2)
    backend = get_backend("flex")
    if backend.not_supported_reasons(case):
        pytest.skip("; ".join(backend.not_supported_reasons(case)))
    inputs = case.make_inputs()
    prepared = backend.prepare(case, inputs)
    out = prepared.outputs(prepared.fn())["out"]
    ref = case_reference(case, inputs).out
    assert out.shape == ref.shape and torch.isfinite(out).all()


# ---- additive -----------------------------------------------------------------------------

BUILT_IN = ["none", "causal", "window(5,2)", "window(0,0)", "window(inf,3)", "window(4,inf)",
            "window(inf,inf)", "block_sparse(local)", "block_sparse(bigbird)"]


@pytest.mark.parametrize("text", BUILT_IN)
@pytest.mark.parametrize("nq,nk", GEOMETRIES + [(40, 40), (57, 23)])
def test_additive_key_range_is_the_declared_one(text, nq, nk):
    case = Case(seq_q=nq, seq_k=nk, mask=text, block_size=8)
    spec, geom = case.mask_spec, case.mask_geometry
    for r0, r1 in [(0, nq), (0, 1), (nq // 3, max(nq // 3 + 1, nq // 2)), (nq - 1, nq)]:
        c0, c1 = key_range(spec, r0, r1, nq, nk)
        assert (c0, c1) == spec.declaration.columns(spec, geom, r0, r1)
        assert 0 <= c0 <= nk and 0 <= c1 <= nk
        seen = allowed_rows(spec, r0, r1, nq, nk, "cpu", case.block_layout, 8)
        cols = torch.ones(r1 - r0, nk, dtype=torch.bool) if seen is None else seen
        keys = cols.any(dim=0).nonzero().flatten()  # keys some row of the slice sees
        if not spec.is_banded:
            assert (c0, c1) == (0, nk)
        elif len(keys):  # a band's range is tight: its first and last seen key
            assert (c0, c1) == (int(keys[0]), int(keys[-1]) + 1)
        else:
            assert c1 <= c0


# ---- packed batches and paged caches ------------------------------------------------------


class DocCausal(MaskKind):
    """A kind that declares itself allowed per document (the fact is what is read)."""

    name = "doccausal"
    form = "doccausal"
    per_document = True

    def parse(self, text):
        return MaskSpec("doccausal") if text == "doccausal" else None

    def visible(self, spec, geom, q_idx, k_idx):
        return k_idx <= q_idx + geom.offset


def test_built_in_kinds_allowed_per_document_are_none_and_causal():
    assert masks.per_document_names() == ("none", "causal")
    assert [masks.kind_of(n).per_document for n in masks.BUILT_IN] == [True, True, False,
                                                                          False]


@pytest.mark.parametrize("mask", ["window(3,0)", "block_sparse(local)", "prefix(3)"])
def test_lengths_and_paging_refuse_a_kind_without_the_fact(toy_kinds, mask):
    packed = Case(seq_q=32, seq_k=32, lengths="fixed(8)", mask=mask)
    assert packed.inputs_problem() == (f"lengths fixed(8): mask {mask} not allowed; "
                                       f"allowed: none, causal")
    paged = Case(seq_q=1, seq_k=64, page_size=16, mask=mask)
    assert paged.inputs_problem() == (f"page_size 16, pages contiguous: mask {mask} not "
                                      f"allowed; allowed: none, causal")


def test_lengths_and_paging_allow_a_kind_that_declares_the_fact():
    with registered_toys(DocCausal):
        assert lengths.shape_problem("fixed(8)", 32, 32, "doccausal") is None
        assert paging.shape_problem(Case(seq_q=1, seq_k=64, page_size=16,
                                         mask="doccausal")) is None
        assert lengths.shape_problem("fixed(8)", 32, 32, "keys(2)") == (
            "lengths fixed(8): mask keys(2) not allowed; allowed: none, causal, doccausal")
    for mask in ("none", "causal"):
        assert lengths.shape_problem("fixed(8)", 32, 32, mask) is None
