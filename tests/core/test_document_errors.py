"""Errors against float64 taken document by document for packed batches
(core/accuracy.document_columns, in the run's checked call): the worst document is found
and named, and a backend wrong on one short document only is ``wrong`` even where the
whole tensor's error is under the tolerance."""

from __future__ import annotations

import pytest
import torch

from attnbench.core import accuracy, lengths
from attnbench.core.case import Case
from attnbench.core.dtypes import TOLERANCE_OUT
from attnbench.core.record import OPTIONAL_COLUMNS
from attnbench.core.reference import case_reference
from attnbench.implementations.naive import Naive
from attnbench.measure.correctness import check_here

# rows of 512 tokens in documents of 7 and a last one of a single token (512 = 73 * 7 + 1)
SPEC, SEQ = "fixed(7)", 512
BUG = 5e-4  # the relative error put on the one-token document: 5x the float32 tolerance


class ShortDocumentBug(Naive):
    """naive, with the last (one-token) document of row 1 scaled by 1 + BUG."""

    name = "naive_short_doc_bug"

    def build(self, case, inputs):
        f = super().build(case, inputs)

        def wrong_on_one_document(q, k, v):
            out = f(q, k, v).clone()  # (B, Hq, N, Dv)
            out[1, :, -1] *= 1 + BUG
            return out

        return wrong_on_one_document


def _case(mode: str = "fwd", mask: str = "none") -> Case:
    return Case(batch=2, heads_q=2, heads_kv=1, seq_q=SEQ, seq_k=SEQ, head_dim=16,
                head_dim_v=16, dtype="float32", mask=mask, mode=mode, lengths=SPEC)


def test_the_documents_are_as_the_test_needs():
    rows = lengths.draw(SPEC, 2, SEQ, 0)
    assert rows == ((7,) * 73 + (1,),) * 2


def test_a_backend_wrong_on_one_short_document_is_caught_and_named():
    rec = check_here(_case(), ShortDocumentBug())
    m, info = rec.metrics, rec.info
    # over the whole tensor the error is under the tolerance: the old check passed it
    assert m["err_impl_out_rel"] < TOLERANCE_OUT["float32"]
    assert m["err_doc_out_rel"] == pytest.approx(BUG, rel=1e-3)
    assert (info["err_doc_out_row"], info["err_doc_out_doc"], m["err_doc_out_len"]) == \
        (1, 73, 1)
    assert rec.status == "wrong"
    assert "on document 73 of row 1 (1 tokens)" in rec.reason


@pytest.mark.parametrize("mask", ["none", "causal"])
def test_a_right_backend_has_small_errors_on_every_document(mask):
    """fwd_bwd: a one-token document's dq and dk are exactly zero in float64, so its
    relative error stands on the floor of a problem of its size, not on 0."""
    rec = check_here(_case("fwd_bwd", mask), "naive")
    assert rec.status == "ok", rec.reason
    for t in ("out", "dq", "dk", "dv"):
        assert 0 <= rec.metrics[f"err_doc_{t}_rel"] < accuracy.tolerance("float32", t) / 10
        assert rec.metrics[f"err_doc_{t}_len"] in (1, 7)
    assert all(k in OPTIONAL_COLUMNS for k in rec.info if k.startswith("err_doc_"))


def test_the_worst_document_is_the_one_perturbed_most():
    case = _case()
    inputs = case.make_inputs()
    ref = case_reference(case, inputs).as_dict()
    out = ref["out"].clone()  # (B, Hq, N, Dv)
    out[0, :, 14:21] *= 1 + 1e-3  # row 0's third document
    out[1, :, 0:7] *= 1 + 1e-4  # row 1's first, less
    cols = accuracy.document_columns(case, inputs, {"out": out}, ref)
    assert (cols["err_doc_out_row"], cols["err_doc_out_doc"], cols["err_doc_out_len"]) == \
        (0, 2, 7)
    assert cols["err_doc_out_rel"] == pytest.approx(1e-3, rel=1e-6)
    out[1, :, -1] = float("nan")  # a NaN document is the worst of all
    cols = accuracy.document_columns(case, inputs, {"out": out}, ref)
    assert (cols["err_doc_out_row"], cols["err_doc_out_doc"]) == (1, 73)


def test_no_document_columns_without_packed_documents():
    dense = Case(batch=1, heads_q=2, heads_kv=2, seq_q=8, seq_k=8, head_dim=4, head_dim_v=4)
    paged = Case(batch=2, heads_q=2, heads_kv=1, seq_q=1, seq_k=32, head_dim=4,
                 head_dim_v=4, mask="causal", page_size=8, lengths="uniform(2,30)")
    for case in (dense, paged):
        inputs = case.make_inputs()
        ref = case_reference(case, inputs).as_dict()
        assert accuracy.document_columns(case, inputs, {"out": ref["out"]}, ref) == {}
    assert accuracy.verdict({"out": torch.zeros(1)}, {"err_impl_out_rel": 0.0}, "float32") \
        is None
