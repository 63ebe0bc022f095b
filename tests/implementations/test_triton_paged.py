"""triton_flash's paged decode kernel against the contiguous result, through the Triton
interpreter on CPU (``TRITON_INTERPRET=1``, set below at collection as in
tests/implementations/test_triton_flash.py) or compiled on CUDA when the variable is
explicitly ``0``."""

from __future__ import annotations

import os

ON_GPU = os.environ.get("TRITON_INTERPRET", "").strip() == "0"
if not ON_GPU:
    os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402
import torch  # noqa: E402

pytest.importorskip("triton")

from attnbench.core import paging  # noqa: E402
from attnbench.core.case import Case  # noqa: E402
from attnbench.core.reference import case_reference  # noqa: E402
from attnbench.core.registry import get_backend  # noqa: E402

DEVICE = "cuda" if ON_GPU else "cpu"

# (lengths, batch, seq_q, seq_k): one token of context, a length not a multiple of the page
# size, mixed lengths long enough to split over the keys, the whole cache
LENGTHS = [("fixed(1)", 2, 1, 40), ("fixed(37)", 2, 4, 40), ("uniform(1,300)", 3, 1, 300),
           ("", 2, 4, 130)]


@pytest.mark.parametrize("layout", paging.LAYOUTS)
@pytest.mark.parametrize("page_size", [16, 7])
@pytest.mark.parametrize("spec,batch,nq,nk", LENGTHS)
@pytest.mark.parametrize("mask", ["none", "causal"])
def test_paged_decode_matches_the_contiguous_result(layout, page_size, spec, batch, nq, nk,
                                                    mask):
    case = Case(batch=batch, heads_q=4, heads_kv=2, seq_q=nq, seq_k=nk, head_dim=16,
                head_dim_v=8, mask=mask, page_size=page_size, pages=layout, lengths=spec,
                seed=3, device=DEVICE)
    backend = get_backend("triton_flash")
    assert backend.not_supported_reasons(case) == []
    x = case.make_inputs()
    prepared = backend.prepare(case, x)
    out = prepared.outputs(prepared.fn())["out"]
    whole = case_reference(case.replace(page_size=0, pages="", lengths=""), x).out
    ref = case_reference(case, x).out
    assert out.shape == ref.shape
    assert float((out.double() - ref).norm() / ref.norm()) < 2e-6
    if spec:  # the context lengths matter: not the whole cache's answer
        assert float((out.double() - whole).abs().max()) > 1e-3
    assert prepared.extras["kernel"].startswith("triton_flash[paged] splits=")
    assert prepared.extras["pages_used"] <= prepared.extras["pages_pool"]


def test_long_contexts_split_over_the_keys():
    from attnbench.implementations import _triton_paged as TP

    assert TP.splits_for(3) == (1, 3)
    splits, per = TP.splits_for(1024)
    assert splits == TP.SPLITS_MAX and splits * per >= 1024
    assert TP.splits_for(20)[0] == 2


def test_a_split_that_sees_no_key_adds_nothing():
    """Splits past a short context's last page keep the floor max and a zero sum."""
    from attnbench.implementations import _triton_paged as TP

    o = torch.zeros(1, 1, 2, 16, 4)  # (B, Hkv, S, M, Dv)
    o[:, :, 0, 0] = 2.0
    ml = torch.zeros(1, 1, 2, 2, 16)  # (B, Hkv, S, 2, M)
    ml[:, :, 0, 0, 0], ml[:, :, 0, 1, 0] = 0.5, 4.0
    ml[:, :, 1, 0, 0], ml[:, :, 1, 1, 0] = TP.FLOOR, 0.0
    out = TP.combine(o, ml, 1, 1)
    assert torch.allclose(out, torch.full((1, 1, 1, 4), 0.5))
