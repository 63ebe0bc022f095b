"""Block-sparse layouts: which (query block, key block) tiles are computed.

Each named layout is one small predicate on block indices, ``mod(qb, kb) -> bool`` (in the
spirit of attention-gym's mask_mods, at tile granularity), evaluated once over the grid;
every backend and the float64 reference read the resulting (n_q_blocks, n_k_blocks) grid.
The diagonal is aligned bottom-right: with ``off = n_k_blocks - n_q_blocks``, query block
``qb`` sits over key block ``qb + off``. A visible tile is visible whole (all its pairs).

``local``      a band of blocks around the diagonal (``band`` blocks each side).
``bigbird``    the band, plus ``global_blocks`` global rows and columns, plus
               ``random_blocks`` seeded random key blocks per query-block row (a fixed
               number per row, so the cost stays O(N)); after Zaheer et al. 2020.
``longformer`` a sliding window of ``band`` blocks each side plus ``global_blocks``
               global blocks (the first ones) that see every key and are seen by every
               query: Longformer's pattern (Beltagy et al. 2020) at block granularity, as
               block-sparse kernels run it (BigBird without the random blocks).
``strided``    Sparse Transformer's strided pattern (Child et al. 2019, section 4.2) over
               blocks: query block ``qb`` sees the key blocks ``r = qb + off - kb`` back
               with ``0 <= r <= stride`` (the previous ``stride`` blocks) or ``r`` a
               multiple of ``stride``; never a later block. ``stride = 0`` means
               ``round(sqrt(n_k_blocks))``, the paper's ``l ~ sqrt(n)``, so a row sees about
               ``2 sqrt(n)`` blocks and the work is O(N sqrt N). Causal between blocks;
               inside the diagonal tile every pair is visible (block granularity).
``explicit``   exactly the (query block, key block) pairs listed in the suite.
"""

from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

LAYOUTS = ("local", "bigbird", "longformer", "strided", "explicit")


def num_blocks(seq: int, block_size: int) -> int:
    return (seq + block_size - 1) // block_size


def block_extents(seq: int, block_size: int) -> torch.Tensor:
    """Length of each block along a sequence of ``seq`` (last block may be short), int64."""
    import torch  # here, not at the top: a suite names layouts without loading torch

    n = num_blocks(seq, block_size)
    ext = torch.full((n,), block_size, dtype=torch.int64)
    if n:
        ext[-1] = seq - (n - 1) * block_size
    return ext


# ---- one predicate per layout: (qb, kb) int64 tensors (broadcast) -> bool tensor ----------

def band_mod(off: int, band: int):
    """Key blocks within ``band`` of the (bottom-right aligned) diagonal."""

    def band_blocks(qb, kb):
        return (kb - (qb + off)).abs() <= band

    return band_blocks


def longformer_mod(off: int, band: int, global_blocks: int):
    """Sliding window of ``band`` blocks each side, plus the first ``global_blocks`` query
    blocks (which see everything) and key blocks (which everyone sees)."""
    window = band_mod(off, band)

    def longformer(qb, kb):
        return window(qb, kb) | (qb < global_blocks) | (kb < global_blocks)

    return longformer


def strided_mod(off: int, stride: int):
    """Child et al.'s strided pattern over blocks: ``r = qb + off - kb`` blocks back, with
    ``0 <= r <= stride`` or ``r % stride == 0``."""

    def strided(qb, kb):
        back = qb + off - kb  # how many blocks the key block lies behind the diagonal
        return (back >= 0) & ((back <= stride) | (back % stride == 0))

    return strided


def default_stride(n_k_blocks: int) -> int:
    """Child et al.'s ``l ~ sqrt(n)``, in blocks."""
    return max(1, round(math.sqrt(n_k_blocks)))


def make_layout(name: str, seq_q: int, seq_k: int, block_size: int, *, band: int = 1,
                global_blocks: int = 1, random_blocks: int = 2, seed: int = 0,
                pairs: tuple[tuple[int, int], ...] = (), stride: int = 0) -> torch.Tensor:
    """Boolean (n_q_blocks, n_k_blocks) layout; the diagonal is aligned bottom-right. Made
    once per geometry (a plan asks for every case's), a fresh copy each call."""
    key = _key(name, seq_q, seq_k, block_size, band, global_blocks, random_blocks, seed,
               pairs, stride)
    return _cached_layout(*key).clone() if _small(key) else _layout(*key)


def layout_pairs(name: str, seq_q: int, seq_k: int, block_size: int, *, band: int = 1,
                 global_blocks: int = 1, random_blocks: int = 2, seed: int = 0,
                 pairs: tuple[tuple[int, int], ...] = (), stride: int = 0) -> int:
    """``visible_pairs`` of that layout, counted once per geometry."""
    key = _key(name, seq_q, seq_k, block_size, band, global_blocks, random_blocks, seed,
               pairs, stride)
    if not _small(key):
        return visible_pairs(_layout(*key), seq_q, seq_k, block_size)
    return _cached_pairs(key)


def _key(name, seq_q, seq_k, block_size, band, global_blocks, random_blocks, seed, pairs,
         stride) -> tuple:
    """Only the knobs the layout reads: cases that differ elsewhere share one layout."""
    randomized = name == "bigbird"
    return (name, seq_q, seq_k, block_size,
            band if name in ("local", "bigbird", "longformer") else 0,
            global_blocks if name in ("bigbird", "longformer") else 0,
            random_blocks if randomized else 0, seed if randomized else 0,
            tuple(map(tuple, pairs)) if name == "explicit" else (),
            stride if name == "strided" else 0)


def _small(key: tuple) -> bool:
    return num_blocks(key[1], key[3]) * num_blocks(key[2], key[3]) <= CACHED_TILES


CACHED_TILES = 2**20  # the cache keeps 64 layouts of at most this many tiles (bytes each)


def _layout(name: str, seq_q: int, seq_k: int, block_size: int, band: int,
            global_blocks: int, random_blocks: int, seed: int,
            pairs: tuple[tuple[int, int], ...], stride: int) -> torch.Tensor:
    import torch

    nqb, nkb = num_blocks(seq_q, block_size), num_blocks(seq_k, block_size)
    if name == "explicit":
        layout = torch.zeros(nqb, nkb, dtype=torch.bool)
        for qb, kb in pairs:
            if 0 <= qb < nqb and 0 <= kb < nkb:
                layout[qb, kb] = True
        return layout
    off = nkb - nqb
    mods = {
        "local": lambda: band_mod(off, band),
        "bigbird": lambda: longformer_mod(off, band, global_blocks),
        "longformer": lambda: longformer_mod(off, band, global_blocks),
        "strided": lambda: strided_mod(off, stride or default_stride(nkb)),
    }
    if name not in mods:
        raise ValueError(f"unknown block layout {name!r}; allowed: {', '.join(LAYOUTS)}")
    qb = torch.arange(nqb)[:, None]  # (nqb, 1)
    kb = torch.arange(nkb)[None, :]  # (1, nkb)
    layout = mods[name]()(qb, kb).expand(nqb, nkb).clone()  # (nqb, nkb)
    if name == "bigbird":  # Longformer's pattern plus seeded random key blocks per row
        gen = torch.Generator().manual_seed(seed * 7919 + 17)
        for row in range(nqb):
            free = (~layout[row]).nonzero().flatten()
            if len(free):
                pick = free[torch.randperm(len(free), generator=gen)[:random_blocks]]
                layout[row, pick] = True
    return layout


_cached_layout = functools.lru_cache(maxsize=64)(_layout)


@functools.lru_cache(maxsize=1024)
def _cached_pairs(key: tuple) -> int:
    return visible_pairs(_cached_layout(*key), key[1], key[2], key[3])


def visible_pairs(layout: torch.Tensor, seq_q: int, seq_k: int, block_size: int) -> int:
    """(query, key) pairs the tiles of ``layout`` hold (the last blocks may be short)."""
    import torch

    rows = block_extents(seq_q, block_size)  # (nqb,)
    cols = block_extents(seq_k, block_size)  # (nkb,)
    return int((layout.to(torch.int64) * rows[:, None] * cols[None, :]).sum())

