"""Paged-cache pieces the paged backends share: the pool built at setup, the gather through
the block table, and the mask of each sequence's context (``core/paging.py`` lays out the
pool and the table)."""

from __future__ import annotations

import torch

from attnbench.core import paging


def setup(case, inputs) -> paging.PagedCache:
    """The case's pool and block table, built from its logical cache outside timing."""
    return paging.paged_cache(case, inputs.k, inputs.v)


def gather(pool: torch.Tensor, block_table: torch.Tensor) -> torch.Tensor:
    """pool (P, page_size, Hkv, D) read through block_table (B, max_pages) as a logical
    cache (B, Hkv, max_pages * page_size, D); entries past a sequence's last page read pool
    page 0, and ``context_allowed`` masks them out."""
    return gatherer(pool, block_table)()


def gatherer(pool: torch.Tensor, block_table: torch.Tensor):
    """``gather`` as a call that copies into a workspace allocated once, here, as a server
    keeps one: the timed call then reads and writes the cache without allocating it (a
    fresh buffer of a whole cache per call is faulted in or reused as the heap happens to
    lie, which would decide its time)."""
    B, width = block_table.shape
    _, ps, H, D = pool.shape
    index = block_table.clamp(min=0).long().flatten()  # (B * max_pages,)
    buf = torch.empty(B * width, ps, H, D, dtype=pool.dtype, device=pool.device)
    view = buf.view(B, width * ps, H, D).transpose(1, 2)  # (B, Hkv, max_pages * ps, D)

    def gather_into():
        torch.index_select(pool, 0, index, out=buf)  # (B * max_pages, ps, Hkv, D)
        return view

    return gather_into


def context_allowed(context: torch.Tensor, seq_q: int, seq_k: int, causal: bool
                    ) -> torch.Tensor:
    """(B, 1, Nq, Nk) bool: query i of sequence b sees key j iff j < context[b] (and j <=
    i + context[b] - Nq when causal: the new tokens are the context's last)."""
    ctx = context.long()[:, None, None, None]  # (B, 1, 1, 1)
    i = torch.arange(seq_q, device=context.device)[:, None]  # (Nq, 1)
    j = torch.arange(seq_k, device=context.device)[None, :]  # (1, Nk)
    allowed = j < ctx  # (B, 1, 1, Nk)
    if causal:
        allowed = allowed & (j <= i + ctx - seq_q)  # (B, 1, Nq, Nk)
    return allowed.expand(-1, 1, seq_q, seq_k)


def physical_to_logical(pc: paging.PagedCache) -> torch.Tensor:
    """(B, P) int32: the logical page of sequence b that pool page p holds, -1 where b does
    not own p (the inverse of the block table, what a mask over the pool reads)."""
    B, width = pc.block_table.shape
    out = torch.full((B, pc.pages.num_pages), -1, dtype=torch.int32,
                     device=pc.block_table.device)
    logical = torch.arange(width, dtype=torch.int32, device=out.device).expand(B, -1)
    owned = pc.block_table >= 0  # (B, max_pages)
    rows = torch.arange(B, device=out.device)[:, None].expand(-1, width)
    out[rows[owned], pc.block_table[owned].long()] = logical[owned]
    return out
