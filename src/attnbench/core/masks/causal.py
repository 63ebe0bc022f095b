"""``causal``: a query sees its own key and every key before it, bottom-right aligned
(the band ``left = inf, right = 0``, masks/band.py)."""

from __future__ import annotations

from attnbench.core.masks.band import Band
from attnbench.core.masks.kind import INF, MaskSpec, register


@register
class Causal(Band):
    name = "causal"
    form = "causal"
    per_document = True

    def parse(self, text: str) -> MaskSpec | None:
        return MaskSpec("causal", INF, 0) if text == "causal" else None
