"""What a mask kind declares, the parsed mask, and the registry of kinds.

A kind is one small module (``masks/causal.py``, ``masks/window.py``...) that declares its
text form, its parameters, ``visible(q_idx, k_idx)`` (the geometry, once) and its count of
visible pairs. The reference, the work count and the backends' capabilities read those
declarations; none of them names a kind's geometry again.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

INF = math.inf
INT64_MAX = 2**63 - 1  # the largest integer a torch tensor (int64) holds
# Elements of one (rows, keys) slice when a count is made from the predicate.
_COUNT_SLICE = 2**22


@dataclass(frozen=True)
class MaskSpec:
    """A parsed mask: its kind's name and parameters. ``str()`` is its text in keys."""

    kind: str  # a registered kind's name: "none" | "causal" | "window" | "block_sparse" ...
    left: float = INF  # a band's keys behind the diagonal (banded kinds)
    right: float = INF  # a band's keys ahead of the diagonal (banded kinds)
    layout: str = ""  # a block layout's name (block_sparse)
    args: tuple = ()  # the parameters of any other kind, as its own module reads them

    @staticmethod
    def parse(text: str) -> MaskSpec:
        """The mask ``text`` names, by the first registered kind that reads it."""
        s = str(text).strip().lower()
        for kind in _KINDS.values():
            spec = kind.parse(s)
            if spec is not None:
                return spec
        raise ValueError(f"unknown mask {text!r}; allowed: {', '.join(forms())}")

    @property
    def declaration(self) -> MaskKind:
        return kind_of(self.kind)

    def __str__(self) -> str:
        return self.declaration.text(self)

    @property
    def is_banded(self) -> bool:
        """A band around the (bottom-right aligned) diagonal, ``left`` and ``right`` wide."""
        return self.declaration.banded

    @property
    def window(self) -> tuple[float, float] | None:
        return (self.left, self.right) if self.is_banded else None

    def clamped(self, seq_q: int, seq_k: int) -> MaskSpec:
        """This mask on ``seq_q`` x ``seq_k``, its parameters cut to what the lengths reach
        (the same visible pairs)."""
        return self.declaration.clamped(self, seq_q, seq_k)

    def visible(self, geom: Geometry, q_idx: torch.Tensor, k_idx: torch.Tensor
                ) -> torch.Tensor:
        return self.declaration.visible(self, geom, q_idx, k_idx)

    def pairs(self, geom: Geometry) -> int:
        return self.declaration.pairs(self, geom)

    @property
    def unmasked(self) -> bool:
        return self.declaration.unmasked(self)


@dataclass(frozen=True, eq=False)
class Geometry:
    """What a mask is laid over: the lengths, and for block masks their tiles, given as a
    (n_q_blocks, n_k_blocks) boolean ``layout`` or as the knobs that make it."""

    seq_q: int
    seq_k: int
    block_size: int = 64
    layout: torch.Tensor | None = None
    layout_knobs: tuple | None = None  # ``Case.layout_knobs`` items

    @property
    def offset(self) -> int:
        """Key index of the last query's diagonal minus the query's: bottom-right aligned."""
        return self.seq_k - self.seq_q


class MaskKind:
    """One mask kind's declaration. A subclass sets the class attributes and defines
    ``parse`` and ``visible``; the count falls back to counting ``visible``."""

    name: str = ""
    form: str = ""  # how a suite writes it, for error messages: "window(left,right)"
    banded: bool = False  # a band around the diagonal, ``left``/``right`` wide (caps read it)
    masks_nothing: bool = False  # every pair is visible: no mask tensor is built
    # A packed batch's documents and a paged cache's sequences may carry it; their readers
    # apply it within each document or context as causal or not, so only none and causal set it.
    per_document: bool = False

    def parse(self, text: str) -> MaskSpec | None:
        """The spec ``text`` (stripped, lower case) names, or None when it is not this
        kind's; a ValueError when it is this kind's with a parameter not allowed."""
        raise NotImplementedError

    def text(self, spec: MaskSpec) -> str:
        return self.name

    def clamped(self, spec: MaskSpec, seq_q: int, seq_k: int) -> MaskSpec:
        return spec

    def visible(self, spec: MaskSpec, geom: Geometry, q_idx: torch.Tensor,
                k_idx: torch.Tensor) -> torch.Tensor:
        """Boolean, broadcast of ``q_idx`` and ``k_idx``: query q_idx may see key k_idx."""
        raise NotImplementedError

    def unmasked(self, spec: MaskSpec) -> bool:
        """This mask lets every pair through on any lengths (a backend builds no mask)."""
        return self.masks_nothing

    def columns(self, spec: MaskSpec, geom: Geometry, row0: int, row1: int
                ) -> tuple[int, int]:
        """Keys [lo, hi), within [0, seq_k], outside which rows [row0, row1) see nothing
        (a cheaper reference, a narrower chunk)."""
        return 0, geom.seq_k

    def pairs(self, spec: MaskSpec, geom: Geometry) -> int:
        """Visible (query, key) pairs; this default counts ``visible`` slice by slice."""
        import torch

        rows = max(1, _COUNT_SLICE // max(geom.seq_k, 1))
        cols = torch.arange(geom.seq_k)[None, :]  # (1, Nk)
        total = 0
        for r0 in range(0, geom.seq_q, rows):
            q = torch.arange(r0, min(geom.seq_q, r0 + rows))[:, None]  # (R, 1)
            seen = self.visible(spec, geom, q, cols)
            total += int(seen.expand(q.shape[0], geom.seq_k).sum())
        return total


_KINDS: dict[str, MaskKind] = {}


def register(kind: type[MaskKind] | MaskKind) -> type[MaskKind] | MaskKind:
    """Declare a mask kind (a class decorator, or an instance); its name must be new."""
    decl = kind() if isinstance(kind, type) else kind
    if not decl.name or not decl.form:
        raise ValueError(f"mask kind {type(decl).__name__} declares no name or form")
    if decl.name in _KINDS:
        raise ValueError(f"mask kind {decl.name!r} is already declared")
    _KINDS[decl.name] = decl
    return kind


def unregister(name: str) -> None:
    """Forget a kind (a test's own): its masks no longer parse."""
    _KINDS.pop(name, None)


def kind_of(name: str) -> MaskKind:
    if name not in _KINDS:
        raise ValueError(f"unknown mask kind {name!r}; declared: {', '.join(_KINDS)}")
    return _KINDS[name]


def names() -> tuple[str, ...]:
    return tuple(_KINDS)


def forms() -> tuple[str, ...]:
    return tuple(k.form for k in _KINDS.values())


def per_document_names() -> tuple[str, ...]:
    """The kinds a packed batch or a paged cache allows (``MaskKind.per_document``)."""
    return tuple(name for name, kind in _KINDS.items() if kind.per_document)


def check_listing(listed: tuple[str, ...]) -> None:
    """A capability listing names declared kinds: a typo is an error at once."""
    unknown = [m for m in listed if m not in _KINDS]
    if unknown:
        raise ValueError(f"capabilities name mask kind {', '.join(map(repr, unknown))}; "
                         f"declared: {', '.join(_KINDS)}")
