"""``none``: every query sees every key."""

from __future__ import annotations

from attnbench.core.masks.kind import Geometry, MaskKind, MaskSpec, register


@register
class NoMask(MaskKind):
    name = "none"
    form = "none"
    masks_nothing = True
    per_document = True

    def parse(self, text: str) -> MaskSpec | None:
        return MaskSpec("none") if text in ("none", "full", "") else None

    def visible(self, spec: MaskSpec, geom: Geometry, q_idx, k_idx):
        return (q_idx >= 0) & (k_idx >= 0)

    def pairs(self, spec: MaskSpec, geom: Geometry) -> int:
        return geom.seq_q * geom.seq_k
