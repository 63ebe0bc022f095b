"""Packed-batch pieces the varlen backends share: document ids, the block-diagonal mask,
the padded layout's gather indices and nested jagged tensors (``core/lengths.py`` draws the
documents; rows keep the case's (B, H, N, D) layout)."""

from __future__ import annotations

import torch

from attnbench.core import lengths


def rows_of(case) -> tuple[tuple[int, ...], ...]:
    return lengths.draw(case.lengths, case.batch, case.seq_q, case.seed)


def document_ids(case, device) -> torch.Tensor:
    """(B, N) int32: the index of each token's document within its row."""
    ids = [torch.repeat_interleave(torch.arange(len(row), dtype=torch.int32),
                                   torch.tensor(row)) for row in rows_of(case)]
    return torch.stack(ids).to(device)  # (B, N)


def document_allowed(case, device) -> torch.Tensor:
    """(B, 1, N, N) bool: query i sees key j iff both are in one document (and j <= i when
    causal): the block-diagonal mask over the packed rows."""
    doc = document_ids(case, device)  # (B, N)
    allowed = doc[:, :, None] == doc[:, None, :]  # (B, N, N)
    if case.mask == "causal":
        allowed &= torch.ones(case.seq_q, case.seq_q, dtype=torch.bool, device=device).tril()
    return allowed[:, None]


def flat_offsets(case) -> torch.Tensor:
    """(count + 1,) int64: where each document starts in the rows laid end to end (B*N)."""
    docs = [n for row in rows_of(case) for n in row]
    return torch.cat([torch.zeros(1, dtype=torch.int64),
                      torch.tensor(docs, dtype=torch.int64).cumsum(0)])


def tokens_major(t: torch.Tensor) -> torch.Tensor:
    """(B, H, N, D) -> (B*N, H, D), the packed token-major layout of varlen kernels."""
    B, H, N, D = t.shape
    return t.transpose(1, 2).reshape(B * N, H, D).contiguous()  # nested needs it dense


def from_tokens_major(t: torch.Tensor, batch: int) -> torch.Tensor:
    """(B*N, H, D) -> (B, H, N, D)."""
    T, H, D = t.shape
    return t.reshape(batch, T // batch, H, D).transpose(1, 2)
