"""Masks: one small module per kind declares it (masks/kind.py says what a kind declares).

The built-in kinds: ``none``, ``causal``, ``window(left,right)``, ``block_sparse(layout)``.
A new kind is one new module that subclasses ``MaskKind`` and calls ``register``; the
reference, the work count and the backends' capabilities then read it from the registry.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

# The built-in kinds register on import, in this order: the order of their forms in
# messages and the order a mask's text is tried.
# isort: off
from attnbench.core.masks import none  # noqa: F401
from attnbench.core.masks import causal  # noqa: F401
from attnbench.core.masks import window  # noqa: F401
from attnbench.core.masks import block_sparse  # noqa: F401
# isort: on
from attnbench.core.masks.band import band_allowed, band_pairs, band_reach, band_row_counts
from attnbench.core.masks.kind import (
    INF,
    INT64_MAX,
    Geometry,
    MaskKind,
    MaskSpec,
    check_listing,
    forms,
    kind_of,
    names,
    per_document_names,
    register,
    unregister,
)

if TYPE_CHECKING:
    import torch

BUILT_IN = names()  # the kinds that ship with attnbench
MASK_KINDS = forms()  # their text forms, for error messages

__all__ = [
    "BUILT_IN", "INF", "INT64_MAX", "MASK_KINDS", "Geometry", "MaskKind", "MaskSpec",
    "allowed_rows", "band_allowed", "band_pairs", "band_reach", "band_row_counts",
    "check_listing", "forms", "kind_of", "names", "per_document_names", "register", "unregister",
    "visible_pairs",
]


def allowed_rows(mask: MaskSpec, row0: int, row1: int, seq_q: int, seq_k: int,
                 device: torch.device | str = "cpu", layout: torch.Tensor | None = None,
                 block_size: int = 64) -> torch.Tensor | None:
    """Boolean (row1 - row0, seq_k) mask for query rows [row0, row1), from the kind's
    ``visible``; None when nothing is masked.

    ``layout`` is the (n_q_blocks, n_k_blocks) boolean block layout for block-sparse masks.
    """
    kind = mask.declaration
    if kind.masks_nothing:
        return None
    import torch  # in the functions that compute: parsing a mask needs no torch

    rows = torch.arange(row0, row1, device=device)[:, None]  # (R, 1)
    cols = torch.arange(seq_k, device=device)[None, :]  # (1, Nk)
    seen = kind.visible(mask, Geometry(seq_q, seq_k, block_size, layout), rows, cols)
    shape = (row1 - row0, seq_k)
    return seen if tuple(seen.shape) == shape else seen.expand(shape).clone()  # (R, Nk)


def visible_pairs(mask: MaskSpec, seq_q: int, seq_k: int, layout: torch.Tensor | None = None,
                  block_size: int = 64) -> int:
    """Number of (query, key) pairs the mask lets through."""
    return mask.pairs(Geometry(seq_q, seq_k, block_size, layout))
