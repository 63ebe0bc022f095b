"""A band around the bottom-right aligned diagonal, the geometry causal and window share.

As in FlashAttention: with ``off = seq_k - seq_q``, query ``i`` may see key ``j`` iff
``i + off - left <= j <= i + off + right``. Causal is ``left = inf, right = 0``.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

from attnbench.core.masks.kind import INF, Geometry, MaskKind, MaskSpec

if TYPE_CHECKING:
    import torch


def band_reach(seq_q: int, seq_k: int) -> tuple[int, int]:
    """(left, right): the farthest any key lies behind or ahead of its query's diagonal
    (bottom-right aligned), so a wider bound sees nothing more."""
    return max(seq_k - 1, 0), max(seq_q - 1, 0)


def clamp(left: float, right: float, seq_q: int, seq_k: int) -> tuple[float, float]:
    """A finite bound at or past what the sequences reach cut to that reach; inf stays."""
    reach_left, reach_right = band_reach(seq_q, seq_k)
    return (left if left == INF else min(left, reach_left),
            right if right == INF else min(right, reach_right))


def within(rel: torch.Tensor, left: float, right: float) -> torch.Tensor:
    """Boolean: the key offsets ``rel = j - (i + off)`` the band holds."""
    import torch

    ok = torch.ones_like(rel, dtype=torch.bool)
    # Out of place: flex traces this predicate as its mask_mod, which must not mutate.
    if left != INF:
        ok = ok & (rel >= -int(left))
    if right != INF:
        ok = ok & (rel <= int(right))
    return ok


def band_allowed(rows: torch.Tensor, cols: torch.Tensor, seq_q: int, seq_k: int,
                 left: float, right: float) -> torch.Tensor:
    """Boolean (len(rows), len(cols)): query row may see key column under a band mask."""
    left, right = clamp(left, right, seq_q, seq_k)
    rel = cols[None, :] - (rows[:, None] + (seq_k - seq_q))  # (R, C): j - (i + off)
    return within(rel, left, right)


def band_row_counts(seq_q: int, seq_k: int, left: float, right: float) -> torch.Tensor:
    """Number of visible keys for every query row under a band mask, (seq_q,) int64."""
    import torch

    left, right = clamp(left, right, seq_q, seq_k)
    off = seq_k - seq_q
    i = torch.arange(seq_q, dtype=torch.int64)
    lo = torch.zeros_like(i) if left == INF else (i + off - int(left)).clamp(min=0)
    hi = torch.full_like(i, seq_k - 1) if right == INF else (i + off + int(right)).clamp(
        max=seq_k - 1)
    return (hi - lo + 1).clamp(min=0)


@functools.lru_cache(maxsize=4096)
def band_pairs(seq_q: int, seq_k: int, left: float, right: float) -> int:
    """Visible pairs under a band mask, once per geometry (a plan asks for every case)."""
    return int(band_row_counts(seq_q, seq_k, left, right).sum())


class Band(MaskKind):
    """What causal and window share: the band's predicate, its count and its key range."""

    banded = True

    def visible(self, spec: MaskSpec, geom: Geometry, q_idx, k_idx):
        left, right = clamp(spec.left, spec.right, geom.seq_q, geom.seq_k)
        return within(k_idx - (q_idx + geom.offset), left, right)

    def unmasked(self, spec: MaskSpec) -> bool:
        return spec.left == INF and spec.right == INF

    def columns(self, spec: MaskSpec, geom: Geometry, row0: int, row1: int) -> tuple[int, int]:
        off, n = geom.offset, geom.seq_k
        lo = 0 if spec.left == INF else row0 + off - int(spec.left)
        hi = n if spec.right == INF else row1 - 1 + off + int(spec.right) + 1
        return max(0, min(n, lo)), max(0, min(n, hi))

    def pairs(self, spec: MaskSpec, geom: Geometry) -> int:
        return band_pairs(geom.seq_q, geom.seq_k, spec.left, spec.right)
