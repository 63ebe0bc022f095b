"""Block-sparse layouts: which (query block, key block) tiles are computed.

``local``   a band of blocks around the diagonal (``band`` blocks each side).
``bigbird`` the band, plus ``global_blocks`` global rows and columns, plus
            ``random_blocks`` seeded random key blocks per query-block row
            (a fixed number per row, so the cost stays O(N)); after Zaheer et al. 2020.
``explicit`` exactly the (query block, key block) pairs listed in the suite.
"""

from __future__ import annotations

import torch

LAYOUTS = ("local", "bigbird", "explicit")


def num_blocks(seq: int, block_size: int) -> int:
    return (seq + block_size - 1) // block_size


def block_extents(seq: int, block_size: int) -> torch.Tensor:
    """Length of each block along a sequence of ``seq`` (last block may be short), int64."""
    n = num_blocks(seq, block_size)
    ext = torch.full((n,), block_size, dtype=torch.int64)
    if n:
        ext[-1] = seq - (n - 1) * block_size
    return ext


def make_layout(name: str, seq_q: int, seq_k: int, block_size: int, *, band: int = 1,
                global_blocks: int = 1, random_blocks: int = 2, seed: int = 0,
                pairs: tuple[tuple[int, int], ...] = ()) -> torch.Tensor:
    """Boolean (n_q_blocks, n_k_blocks) layout; the diagonal is aligned bottom-right."""
    nqb, nkb = num_blocks(seq_q, block_size), num_blocks(seq_k, block_size)
    layout = torch.zeros(nqb, nkb, dtype=torch.bool)
    if name == "explicit":
        for qb, kb in pairs:
            if 0 <= qb < nqb and 0 <= kb < nkb:
                layout[qb, kb] = True
        return layout
    if name not in ("local", "bigbird"):
        raise ValueError(f"unknown block layout {name!r}; allowed: {', '.join(LAYOUTS)}")
    off = nkb - nqb
    qb = torch.arange(nqb)[:, None]
    kb = torch.arange(nkb)[None, :]
    layout |= (kb - (qb + off)).abs() <= band
    if name == "bigbird":
        g = min(global_blocks, nqb, nkb)
        layout[:, :g] = True
        layout[:g, :] = True
        gen = torch.Generator().manual_seed(seed * 7919 + 17)
        for row in range(nqb):
            free = (~layout[row]).nonzero().flatten()
            if len(free):
                pick = free[torch.randperm(len(free), generator=gen)[:random_blocks]]
                layout[row, pick] = True
    return layout
