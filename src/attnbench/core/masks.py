"""Mask specifications: parsing, dense slices for a block of query rows, visible-pair counts.

Causal and window masks are bottom-right aligned as in FlashAttention: with
``off = seq_k - seq_q``, query ``i`` may see key ``j`` iff
``i + off - left <= j <= i + off + right``. Causal is ``left = inf, right = 0``.
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from attnbench.core import block_layouts

if TYPE_CHECKING:
    import torch

INF = math.inf
INT64_MAX = 2**63 - 1  # the largest integer a torch tensor (int64) holds
MASK_KINDS = ("none", "causal", "window(left,right)", "block_sparse(layout)")
_WINDOW = re.compile(r"^window\(\s*(-?\d+|inf)\s*,\s*(-?\d+|inf)\s*\)$")
_BLOCK = re.compile(r"^block_sparse\(\s*([a-z_]+)\s*\)$")


@dataclass(frozen=True)
class MaskSpec:
    kind: str  # "none" | "causal" | "window" | "block_sparse"
    left: float = INF
    right: float = INF
    layout: str = ""

    @staticmethod
    def parse(text: str) -> MaskSpec:
        """Parse ``none``, ``causal``, ``window(L,R)`` or ``block_sparse(LAYOUT)``."""
        s = str(text).strip().lower()
        if s in ("none", "full", ""):
            return MaskSpec("none")
        if s == "causal":
            return MaskSpec("causal", INF, 0)
        m = _WINDOW.match(s)
        if m:
            left, right = (INF if g == "inf" else int(g) for g in m.groups())
            if left < 0 or right < 0:
                raise ValueError(f"window bounds must be >= 0, got {text!r}")
            for bound in (left, right):
                if bound != INF and bound > INT64_MAX:
                    raise ValueError(f"window bound beyond int64; allowed: at most "
                                     f"{INT64_MAX}, or inf for the whole side")
            return MaskSpec("window", left, right)
        m = _BLOCK.match(s)
        if m:
            layout = m.group(1)
            if layout not in block_layouts.LAYOUTS:
                raise ValueError(
                    f"unknown block layout {layout!r}; allowed: {', '.join(block_layouts.LAYOUTS)}"
                )
            return MaskSpec("block_sparse", layout=layout)
        raise ValueError(f"unknown mask {text!r}; allowed: {', '.join(MASK_KINDS)}")

    def __str__(self) -> str:
        if self.kind == "window":
            return f"window({_fmt(self.left)},{_fmt(self.right)})"
        if self.kind == "block_sparse":
            return f"block_sparse({self.layout})"
        return self.kind

    @property
    def is_banded(self) -> bool:
        """Causal or window: a band around the (bottom-right aligned) diagonal."""
        return self.kind in ("causal", "window")

    @property
    def window(self) -> tuple[float, float] | None:
        return (self.left, self.right) if self.is_banded else None

    def clamped(self, seq_q: int, seq_k: int) -> MaskSpec:
        """This mask on ``seq_q`` x ``seq_k``: a finite window bound at or past what the
        sequences can reach means the whole side, so it is cut to that reach (``seq_k - 1``
        keys back, ``seq_q - 1`` ahead); the same visible pairs, bounds any tensor holds."""
        if self.kind != "window":
            return self
        left, right = band_reach(seq_q, seq_k)
        return replace(self, left=self.left if self.left == INF else min(self.left, left),
                       right=self.right if self.right == INF else min(self.right, right))


def band_reach(seq_q: int, seq_k: int) -> tuple[int, int]:
    """(left, right): the farthest any key lies behind or ahead of its query's diagonal
    (bottom-right aligned), so a wider bound sees nothing more."""
    return max(seq_k - 1, 0), max(seq_q - 1, 0)


def _fmt(x: float) -> str:
    return "inf" if x == INF else str(int(x))


def band_allowed(rows: torch.Tensor, cols: torch.Tensor, seq_q: int, seq_k: int,
                 left: float, right: float) -> torch.Tensor:
    """Boolean (len(rows), len(cols)): query row may see key column under a band mask."""
    import torch  # in the functions that compute: parsing a mask needs no torch

    left, right = MaskSpec("window", left, right).clamped(seq_q, seq_k).window
    off = seq_k - seq_q
    rel = cols[None, :] - (rows[:, None] + off)  # (R, C): j - (i + off)
    ok = torch.ones_like(rel, dtype=torch.bool)
    if left != INF:
        ok &= rel >= -int(left)
    if right != INF:
        ok &= rel <= int(right)
    return ok


def allowed_rows(mask: MaskSpec, row0: int, row1: int, seq_q: int, seq_k: int,
                 device: torch.device | str = "cpu", layout: torch.Tensor | None = None,
                 block_size: int = 64) -> torch.Tensor | None:
    """Boolean (row1 - row0, seq_k) mask for query rows [row0, row1); None when nothing is masked.

    ``layout`` is the (n_q_blocks, n_k_blocks) boolean block layout for block-sparse masks.
    """
    if mask.kind == "none":
        return None
    import torch

    rows = torch.arange(row0, row1, device=device)
    cols = torch.arange(seq_k, device=device)
    if mask.is_banded:
        return band_allowed(rows, cols, seq_q, seq_k, mask.left, mask.right)
    if mask.kind == "block_sparse":
        if layout is None:
            raise ValueError("block_sparse mask needs its block layout")
        lay = layout.to(device)
        return lay[rows // block_size][:, cols // block_size]  # (R, Nk)
    raise ValueError(f"unknown mask kind {mask.kind!r}")


def band_row_counts(seq_q: int, seq_k: int, left: float, right: float) -> torch.Tensor:
    """Number of visible keys for every query row under a band mask, (seq_q,) int64."""
    import torch

    left, right = MaskSpec("window", left, right).clamped(seq_q, seq_k).window
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


def visible_pairs(mask: MaskSpec, seq_q: int, seq_k: int, layout: torch.Tensor | None = None,
                  block_size: int = 64) -> int:
    """Number of (query, key) pairs the mask lets through."""
    if mask.kind == "none":
        return seq_q * seq_k
    if mask.is_banded:
        return band_pairs(seq_q, seq_k, mask.left, mask.right)
    if mask.kind == "block_sparse":
        assert layout is not None
        return block_layouts.visible_pairs(layout, seq_q, seq_k, block_size)
    raise ValueError(f"unknown mask kind {mask.kind!r}")
