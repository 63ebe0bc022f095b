"""A paged KV cache: the page table beside the cache, as a serving engine keeps it.

A paged case (``page_size`` > 0) is a decode step: ``seq_q`` new tokens of each of ``batch``
sequences attend to that sequence's cache. The logical cache is the case's k, v
(B, Hkv, Nk, D); sequence b holds only its first ``context[b]`` tokens, its context length:
the first document each row of the ``lengths`` axis draws over ``seq_k`` tokens when the
case has one (the same distribution, one length per sequence), else ``seq_k``; at least
``seq_q`` (the new tokens are themselves in the cache) and at most ``seq_k``.

The physical cache is a pool of pages (num_pages, page_size, Hkv, D), the layout of vLLM's
and FlashAttention's paged KV, and a block table (B, max_pages): entry [b, p] is the pool
page holding sequence b's tokens p * page_size ... (p + 1) * page_size - 1, -1 past its
last page. Layouts (``pages``):

* ``contiguous``: each sequence's pages are consecutive pool pages in order, sequences one
  after the other (a fresh server);
* ``shuffled``: each sequence owns the same consecutive run of pages, in an order shuffled
  from the case seed (what other benchmarks call a random page table);
* ``fragmented``: pages of all sequences interleaved at random over a pool ``POOL_SLACK``
  times larger than the batch needs, as a long-running server leaves it after sequences of
  other lengths came and went (drawn from the case seed).

Pool slots no sequence owns (the rest of a last page, a fragmented pool's free pages) hold
other values drawn from the seed, stale data as in a server, so a backend that reads past a
context length or through a wrong entry gets a wrong answer, not a lucky zero. Building the
table needs no torch; building the pool does.
"""

from __future__ import annotations

import hashlib
import math
import random
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

LAYOUTS = ("contiguous", "shuffled", "fragmented")
POOL_SLACK = 2  # a fragmented pool holds this many times the pages its sequences need
MODES = ("fwd",)  # a decode step is inference
_GARBAGE_SEED = 2_000_003  # the free slots' stream, apart from q, k, v's


def check(page_size: int, pages: str) -> str:
    """The canonical layout name of a case's paging knobs; ValueError (one line) otherwise.
    ``pages`` defaults to contiguous when a page size is given."""
    if isinstance(page_size, bool) or not isinstance(page_size, int) or page_size < 0:
        raise ValueError(f"page_size must be an integer >= 0 (0: no paging), got {page_size!r}")
    if not page_size:
        if pages:
            raise ValueError(f"pages {pages!r} needs a page_size > 0")
        return ""
    pages = pages or "contiguous"
    if pages not in LAYOUTS:
        raise ValueError(f"unknown pages {pages!r}; allowed: {', '.join(LAYOUTS)}")
    return pages


def shape_problem(case) -> str | None:
    """Why a case cannot be a paged decode step (None when it can)."""
    where = f"page_size {case.page_size}, pages {case.pages}"
    if case.mode not in MODES:
        return f"{where}: mode {case.mode} not allowed; allowed: {', '.join(MODES)}"
    from attnbench.core.masks import per_document_names

    allowed = per_document_names()  # a decode step's masks (causal: bottom-right aligned)
    if str(case.mask).split("(")[0] not in allowed:
        return f"{where}: mask {case.mask} not allowed; allowed: {', '.join(allowed)}"
    if case.seq_q > case.seq_k:
        return f"{where}: seq_q ({case.seq_q}) must be <= seq_k ({case.seq_k}), the cache"
    return None


def context_lengths(case) -> tuple[int, ...]:
    """Per sequence, the tokens its cache holds (see the module docstring)."""
    if not case.lengths:
        return (case.seq_k,) * case.batch
    from attnbench.core import lengths

    rows = lengths.draw(case.lengths, case.batch, case.seq_k, case.seed)
    return tuple(max(case.seq_q, row[0]) for row in rows)


@dataclass(frozen=True)
class PageTable:
    page_size: int
    context: tuple[int, ...]  # (B,) tokens per sequence
    table: tuple[tuple[int, ...], ...]  # (B, max_pages) pool page per logical page, -1 past
    num_pages: int  # pages in the pool

    @property
    def max_pages(self) -> int:
        return len(self.table[0])

    @property
    def pages_used(self) -> int:
        return sum(p >= 0 for row in self.table for p in row)

    def slots(self, b: int) -> list[int]:
        """Pool slots (page * page_size + offset) of sequence b's tokens, in logical order."""
        ps = self.page_size
        return [self.table[b][t // ps] * ps + t % ps for t in range(self.context[b])]


def page_table(context, page_size: int, layout: str, seed: int) -> PageTable:
    """The block table of sequences holding ``context`` tokens each, laid out as ``layout``."""
    layout = check(page_size, layout)
    need = [math.ceil(n / page_size) for n in context]  # pages per sequence
    total, width = sum(need), max(need)
    rng = random.Random(seed)
    if layout == "fragmented":
        num_pages = POOL_SLACK * total
        order = rng.sample(range(num_pages), total)  # distinct pool pages, in random order
    else:
        num_pages = total
        order, start = [], 0
        for n in need:
            run = list(range(start, start + n))
            if layout == "shuffled":
                rng.shuffle(run)
            order += run
            start += n
    table, i = [], 0
    for n in need:
        table.append(tuple(order[i:i + n]) + (-1,) * (width - n))
        i += n
    return PageTable(page_size, tuple(context), tuple(table), num_pages)


def case_page_table(case) -> PageTable:
    return page_table(context_lengths(case), case.page_size, case.pages, case.seed)


@dataclass(frozen=True)
class PagedCache:
    k_pool: torch.Tensor  # (num_pages, page_size, Hkv, D)
    v_pool: torch.Tensor  # (num_pages, page_size, Hkv, Dv)
    block_table: torch.Tensor  # (B, max_pages) int32, -1 past a sequence's last page
    context: torch.Tensor  # (B,) int32 tokens per sequence
    pages: PageTable


def build_pool(cache: torch.Tensor, pt: PageTable, seed: int) -> torch.Tensor:
    """The pool (num_pages, page_size, Hkv, D) holding ``cache`` (B, Hkv, Nk, D) as ``pt``
    lays it out; free slots hold other values drawn from ``seed``."""
    import torch

    B, H, _, D = cache.shape
    gen = torch.Generator(device="cpu").manual_seed(seed + _GARBAGE_SEED)
    pool = torch.randn(pt.num_pages * pt.page_size, H, D, generator=gen)  # (slots, Hkv, D)
    pool = pool.to(device=cache.device, dtype=cache.dtype)
    for b in range(B):
        slots = torch.tensor(pt.slots(b), dtype=torch.long, device=cache.device)  # (ctx_b,)
        pool[slots] = cache[b, :, :pt.context[b]].transpose(0, 1)  # (ctx_b, Hkv, D)
    return pool.reshape(pt.num_pages, pt.page_size, H, D)


def paged_cache(case, k: torch.Tensor, v: torch.Tensor) -> PagedCache:
    """The case's paged cache of its logical k (B, Hkv, Nk, D) and v (B, Hkv, Nk, Dv)."""
    import torch

    pt = case_page_table(case)
    device = k.device
    return PagedCache(build_pool(k, pt, case.seed), build_pool(v, pt, case.seed + 1),
                      torch.tensor(pt.table, dtype=torch.int32, device=device),
                      torch.tensor(pt.context, dtype=torch.int32, device=device), pt)


# ---- counts -------------------------------------------------------------------------------
def visible_pairs_per_sequence(case) -> float:
    """Query-key pairs of the decode step, per sequence (their mean over the batch)."""
    from attnbench.core.lengths import LengthsUnavailable
    from attnbench.core.masks import MaskSpec, visible_pairs

    try:
        context = context_lengths(case)
    except LengthsUnavailable:  # such a case runs no backend; only a plan's estimate reads it
        context = (case.seq_k,) * case.batch
    spec = MaskSpec.parse(case.mask)
    return sum(visible_pairs(spec.clamped(case.seq_q, n), case.seq_q, n)
               for n in context) / case.batch


def kv_read_bytes(case) -> float:
    """KV bytes a decode step reads: each sequence's context, K and V, once per KV head."""
    from attnbench.core.dtypes import element_size
    from attnbench.core.lengths import LengthsUnavailable

    try:
        tokens = sum(context_lengths(case))
    except LengthsUnavailable:
        tokens = case.batch * case.seq_k
    return element_size(case.dtype) * tokens * case.heads_kv * (case.head_dim
                                                                 + case.head_dim_v)


def record_columns(case) -> dict:
    """What a paged case's records say about its cache (``core/record.py``)."""
    from attnbench.core.lengths import summary

    pt = case_page_table(case)
    cols = {f"context_{k}": v for k, v in summary([pt.context]).items() if k != "count"}
    cols["pages_used"] = pt.pages_used
    cols["pages_pool"] = pt.num_pages
    cols["kv_read_bytes"] = kv_read_bytes(case)
    cols["page_table_hash"] = hashlib.sha256(
        ";".join(",".join(map(str, r)) for r in pt.table).encode()).hexdigest()
    return cols
