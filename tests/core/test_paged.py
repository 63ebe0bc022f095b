"""The paged KV cache: the page table, the pool, and each paged backend against the
contiguous result for the same logical cache (flex through eager flex_attention)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from host_neutral import EagerFlex

from attnbench.core import paging
from attnbench.core.case import Case
from attnbench.core.errors import BadInput
from attnbench.core.record import OPTIONAL_COLUMNS, Record
from attnbench.core.reference import case_reference
from attnbench.core.registry import get_backend
from attnbench.implementations import _paged
from attnbench.measure.case_cache import CaseCache
from attnbench.measure.execute import Candidate, open_job
from attnbench.runs.suite import load_suite

OLD_RECORDS = Path(__file__).parents[1] / "fixtures" / "old_records" / "records.jsonl"


# ---- the page table ----------------------------------------------------------------------
CONTEXTS = [(1,), (37, 1, 64, 200), (16, 16), (5, 300, 129)]


@pytest.mark.parametrize("layout", paging.LAYOUTS)
@pytest.mark.parametrize("page_size", [1, 16, 64])
@pytest.mark.parametrize("context", CONTEXTS)
def test_every_logical_token_has_exactly_one_slot(layout, page_size, context):
    pt = paging.page_table(context, page_size, layout, seed=5)
    slots = [s for b in range(len(context)) for s in pt.slots(b)]
    assert len(slots) == sum(context) == len(set(slots))  # no two tokens share a slot
    assert all(0 <= s < pt.num_pages * page_size for s in slots)
    need = [-(-n // page_size) for n in context]
    assert pt.pages_used == sum(need)
    for b, row in enumerate(pt.table):  # -1 exactly past each sequence's last page
        assert all(p >= 0 for p in row[:need[b]]) and all(p == -1 for p in row[need[b]:])


def test_layouts_contiguous_shuffled_fragmented():
    context = (300, 130, 64)
    c = paging.page_table(context, 16, "contiguous", 1)
    s = paging.page_table(context, 16, "shuffled", 1)
    f = paging.page_table(context, 16, "fragmented", 1)
    owned = [[p for p in row if p >= 0] for row in c.table]
    assert [p for row in owned for p in row] == list(range(c.num_pages))  # in order
    assert c.num_pages == s.num_pages == 19 + 9 + 4
    shuffled = [[p for p in row if p >= 0] for row in s.table]
    assert [sorted(r) for r in shuffled] == owned and shuffled != owned  # the same runs
    assert f.num_pages == paging.POOL_SLACK * c.num_pages  # a pool larger than needed
    used = {p for row in f.table for p in row if p >= 0}
    assert max(used) >= c.num_pages  # the pool is used, beyond the pages a fresh one needs
    firsts = sorted((p, b) for b, row in enumerate(f.table) for p in row if p >= 0)
    assert len({b for _, b in firsts[:10]}) > 1  # sequences interleave over the pool
    assert paging.page_table(context, 16, "fragmented", 1) == f  # fixed by the seed
    assert paging.page_table(context, 16, "fragmented", 2) != f


def test_the_pool_holds_the_logical_cache_and_stale_values_elsewhere():
    case = Case(batch=3, heads_q=4, heads_kv=2, seq_q=1, seq_k=100, head_dim=8, head_dim_v=4,
                page_size=16, pages="fragmented", lengths="uniform(1,100)", seed=4)
    x = case.make_inputs()
    pc = paging.paged_cache(case, x.k, x.v)
    assert pc.k_pool.shape == (pc.pages.num_pages, 16, 2, 8)
    assert pc.v_pool.shape == (pc.pages.num_pages, 16, 2, 4)
    flat = pc.k_pool.reshape(-1, 2, 8)  # (slots, Hkv, D)
    for b, n in enumerate(paging.context_lengths(case)):
        assert torch.equal(flat[pc.pages.slots(b)], x.k[b, :, :n].transpose(0, 1))
    free = torch.ones(flat.shape[0], dtype=torch.bool)
    free[[s for b in range(3) for s in pc.pages.slots(b)]] = False
    assert 0 < int(free.sum()) and bool((flat[free] != 0).all())  # stale values, not zeros


def test_context_lengths_come_from_the_lengths_axis_or_the_whole_cache():
    assert paging.context_lengths(Case(batch=2, seq_q=1, seq_k=64, page_size=16)) == (64, 64)
    assert paging.context_lengths(Case(batch=2, seq_q=1, seq_k=64, page_size=16,
                                       lengths="fixed(37)")) == (37, 37)
    got = paging.context_lengths(Case(batch=8, seq_q=4, seq_k=64, page_size=16,
                                      lengths="uniform(1,100)"))
    assert all(4 <= n <= 64 for n in got) and len(set(got)) > 1  # at least seq_q


# ---- the backends against the contiguous result --------------------------------------------
def _judged(name):
    return EagerFlex() if name == "flex" else get_backend(name)


def _contiguous(case, x):
    """sdpa on each sequence's contiguous cache, its first context tokens."""
    outs = []
    for b, n in enumerate(paging.context_lengths(case)):
        outs.append(F.scaled_dot_product_attention(
            x.q[b:b + 1], x.k[b:b + 1, :, :n], x.v[b:b + 1, :, :n], scale=case.softmax_scale,
            enable_gqa=case.heads_q != case.heads_kv,
            attn_mask=None if case.mask == "none" else torch.ones(
                case.seq_q, n, dtype=torch.bool).tril(n - case.seq_q)))
    return torch.cat(outs)  # (B, Hq, Nq, Dv)


# (lengths, batch, seq_q, seq_k): one token of context, a length not a multiple of any page
# size, a mix of lengths, the whole cache
LENGTHS = [("fixed(1)", 2, 1, 40), ("fixed(37)", 2, 4, 40), ("uniform(1,300)", 3, 1, 300),
           ("", 2, 4, 130)]


@pytest.mark.parametrize("name", ["naive", "sdpa", "flex"])
@pytest.mark.parametrize("layout", paging.LAYOUTS)
@pytest.mark.parametrize("page_size", [16, 64, 7])
@pytest.mark.parametrize("spec,batch,nq,nk", LENGTHS)
@pytest.mark.parametrize("mask", ["none", "causal"])
def test_paged_backends_match_the_contiguous_result(name, layout, page_size, spec, batch, nq,
                                                    nk, mask):
    case = Case(batch=batch, heads_q=4, heads_kv=2, seq_q=nq, seq_k=nk, head_dim=16,
                head_dim_v=8, mask=mask, page_size=page_size, pages=layout, lengths=spec,
                seed=3)
    backend = _judged(name)
    assert backend.not_supported_reasons(case) == []
    x = case.make_inputs()
    prepared = backend.prepare(case, x)
    out = prepared.outputs(prepared.fn())["out"]
    want = _contiguous(case, x)
    assert out.shape == want.shape
    assert torch.allclose(out, want, atol=2e-6, rtol=1e-5), float((out - want).abs().max())
    ref = case_reference(case, x).out
    assert float((out.double() - ref).norm() / ref.norm()) < 2e-6
    assert prepared.extras["pages_pool"] >= prepared.extras["pages_used"]


def test_a_paged_case_is_not_its_whole_cache():
    """Context lengths matter: reading the whole cache gives another answer."""
    case = Case(batch=2, heads_q=2, heads_kv=2, seq_q=1, seq_k=64, head_dim=8, head_dim_v=8,
                page_size=16, lengths="fixed(20)")
    x = case.make_inputs()
    whole = case_reference(case.replace(page_size=0, pages="", lengths=""), x).out
    assert (case_reference(case, x).out - whole).abs().max() > 0.05


# ---- counts, records, keys ---------------------------------------------------------------
def test_bytes_count_the_kv_actually_read():
    case = Case(batch=2, heads_q=8, heads_kv=2, seq_q=4, seq_k=256, head_dim=128,
                head_dim_v=64, page_size=64, pages="fragmented", lengths="fixed(100)")
    kv = 4 * 2 * 100 * 2 * (128 + 64)
    assert paging.kv_read_bytes(case) == kv
    assert case.bytes == kv + 4 * 2 * 8 * 4 * (128 + 64)  # + Q read, O written
    dense = case.replace(page_size=0, pages="", lengths="")
    assert dense.bytes > case.bytes
    assert case.visible_pairs == 4 * 100  # mask none: every query sees its context
    assert case.replace(mask="causal").visible_pairs == 4 * 100 - 6


def test_old_keys_are_unchanged():
    rows = [json.loads(line) for line in OLD_RECORDS.read_text().splitlines()[:5]]
    assert rows
    for row in rows:
        case = Record.from_row(row).case
        assert case.key == row["key"]
        assert case.replace(page_size=0, pages="").key == row["key"]


def test_paged_keys_name_the_page_size_and_layout_and_round_trip():
    case = Case(seq_q=1, page_size=16)
    assert case.pages == "contiguous"
    assert case.key == Case(seq_q=1, page_size=16, pages="contiguous").key
    assert case.key.endswith("-page_size=16-pages=contiguous")
    frag = case.replace(pages="fragmented", lengths="uniform(1,1024)")
    assert frag.key.endswith("-lengths=uniform(1,1024)-page_size=16-pages=fragmented")
    assert Record.from_row(Record.new(frag, "sdpa", "ok").to_row()).case == frag


def test_a_run_records_the_page_table_and_an_ok_status():
    case = Case(batch=2, heads_q=4, heads_kv=2, seq_q=1, seq_k=100, head_dim=16,
                head_dim_v=16, mask="causal", page_size=16, pages="fragmented",
                lengths="uniform(1,100)", seed=2)
    got = open_job(case, "sdpa", CaseCache())
    assert isinstance(got, Candidate) and got.record.status == "ok", got
    row = got.record.to_row()
    ctx = paging.context_lengths(case)
    assert row["context_max"] == max(ctx) and row["kv_read_bytes"] == paging.kv_read_bytes(case)
    assert row["pages_pool"] == 2 * row["pages_used"]
    assert len(row["page_table_hash"]) == 64
    assert all(k in OPTIONAL_COLUMNS for k in row
               if k.startswith(("context_", "pages_", "page_table")))
    assert row["err_impl_out_rel"] < 1e-5


@pytest.mark.parametrize("name", ["xformers", "block_sparse", "sdpa_math", "sdpa_padded"])
def test_other_backends_refuse_a_paged_cache(name):
    reasons = get_backend(name).caps.reasons(Case(seq_q=1, page_size=16, pages="shuffled"))
    assert "page_size 16, pages shuffled: not yet implemented for a paged cache" in reasons


def test_paged_lengths_are_context_lengths_not_a_packed_batch():
    case = Case(seq_q=1, seq_k=64, page_size=16, lengths="fixed(8)")
    assert case.inputs_problem() is None  # no seq_q == seq_k needed
    assert get_backend("sdpa").not_supported_reasons(case) == []


# ---- bad input ---------------------------------------------------------------------------
@pytest.mark.parametrize("fields,says", [
    ({"pages": "shuffled"}, "pages 'shuffled' needs a page_size > 0"),
    ({"page_size": 16, "pages": "zigzag"}, "unknown pages 'zigzag'; allowed: contiguous, "),
    ({"page_size": -1}, "page_size must be an integer >= 0")])
def test_bad_paging_knobs_are_one_line_errors(fields, says):
    with pytest.raises(ValueError) as err:
        Case(**fields)
    assert says in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("fields,says", [
    ({"mode": "fwd_bwd"}, "mode fwd_bwd not allowed; allowed: fwd"),
    ({"mask": "window(3,0)"}, "allowed: none, causal"),
    ({"seq_q": 128}, "seq_q (128) must be <= seq_k (64)")])
def test_paged_shapes_are_decode_steps(fields, says):
    case = Case(**({"seq_q": 1, "seq_k": 64, "page_size": 16} | fields))
    assert says in case.inputs_problem()


SUITE = """
name = "t"
description = "d"
backends = ["sdpa"]
[axes]
seq_q = 1
seq_k = 64
{extra}
"""


@pytest.mark.parametrize("extra,says", [
    ('page_size = 16\npages = "zigzag"', "pages = 'zigzag': unknown page layout; allowed: "),
    ("page_size = -16", "page_size = -16: must be >= 0"),
    ('page_size = 16\nmode = "fwd_bwd"', "mode fwd_bwd not allowed"),
    ('pages = "shuffled"', "needs a page_size > 0")])
def test_a_suite_with_bad_paging_is_refused_in_one_line(extra, says, tmp_path):
    path = tmp_path / "t.toml"
    path.write_text(SUITE.format(extra=extra))
    with pytest.raises(BadInput) as err:
        load_suite(str(path))
    assert says in str(err.value) and "\n" not in str(err.value)


def test_the_paged_suite_loads_and_its_cases_are_paged():
    suite = load_suite("paged_decode")
    cases = [c for s in suite.sweeps for c in s.cases()]
    assert cases and all(c.inputs_problem() is None for c in cases)
    assert {c.pages for c in cases if c.page_size} == set(paging.LAYOUTS)
    assert {c.pages for c in cases if not c.page_size} == {""}  # the unpaged baseline


def test_physical_to_logical_inverts_the_block_table():
    case = Case(batch=3, heads_q=2, heads_kv=2, seq_q=1, seq_k=90, head_dim=4, head_dim_v=4,
                page_size=8, pages="fragmented", lengths="uniform(1,90)")
    x = case.make_inputs()
    pc = paging.paged_cache(case, x.k, x.v)
    p2l = _paged.physical_to_logical(pc)
    for b, row in enumerate(pc.pages.table):
        for logical, page in enumerate(row):
            if page >= 0:
                assert int(p2l[b, page]) == logical
    assert int((p2l >= 0).sum()) == pc.pages.pages_used


def test_the_gather_baseline_copies_into_one_workspace():
    """The timed gather allocates nothing: each call fills the buffer made at setup, so its
    time does not depend on whether the heap hands it fresh or reused pages."""
    case = Case(batch=2, heads_q=2, heads_kv=2, seq_q=1, seq_k=50, head_dim=4, head_dim_v=4,
                page_size=8, pages="fragmented", lengths="uniform(1,50)")
    x = case.make_inputs()
    pc = paging.paged_cache(case, x.k, x.v)
    g = _paged.gatherer(pc.k_pool, pc.block_table)
    first = g()
    assert g().data_ptr() == first.data_ptr()
    pages = pc.k_pool[pc.block_table.clamp(min=0).long()]  # (B, max_pages, ps, Hkv, D)
    assert torch.equal(first, pages.flatten(1, 2).transpose(1, 2))
    for b, n in enumerate(paging.context_lengths(case)):
        assert torch.equal(first[b, :, :n], x.k[b, :, :n])
