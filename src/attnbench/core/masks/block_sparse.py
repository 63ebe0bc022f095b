"""``block_sparse(layout)``: a query sees a key when their tiles' cell of a block layout
(core/block_layouts.py) is set."""

from __future__ import annotations

import re

from attnbench.core import block_layouts
from attnbench.core.masks.kind import Geometry, MaskKind, MaskSpec, register

_BLOCK = re.compile(r"^block_sparse\(\s*([a-z_]+)\s*\)$")


def _layout(spec: MaskSpec, geom: Geometry):
    """The (n_q_blocks, n_k_blocks) boolean layout: given, or made from its knobs."""
    if geom.layout is not None:
        return geom.layout
    if geom.layout_knobs is None:
        raise ValueError("block_sparse mask needs its block layout")
    return block_layouts.make_layout(spec.layout, geom.seq_q, geom.seq_k, geom.block_size,
                                     **dict(geom.layout_knobs))


@register
class BlockSparse(MaskKind):
    name = "block_sparse"
    form = "block_sparse(layout)"

    def parse(self, text: str) -> MaskSpec | None:
        m = _BLOCK.match(text)
        if not m:
            return None
        layout = m.group(1)
        if layout not in block_layouts.LAYOUTS:
            raise ValueError(
                f"unknown block layout {layout!r}; allowed: {', '.join(block_layouts.LAYOUTS)}"
            )
        return MaskSpec("block_sparse", layout=layout)

    def text(self, spec: MaskSpec) -> str:
        return f"block_sparse({spec.layout})"

    def visible(self, spec: MaskSpec, geom: Geometry, q_idx, k_idx):
        lay = _layout(spec, geom).to(q_idx.device)  # (n_qb, n_kb)
        return lay[q_idx // geom.block_size, k_idx // geom.block_size]

    def pairs(self, spec: MaskSpec, geom: Geometry) -> int:
        """Counted from the tiles' extents (the last ones may be short), once per geometry
        when the layout is given by its knobs."""
        if geom.layout is None and geom.layout_knobs is not None:
            return block_layouts.layout_pairs(spec.layout, geom.seq_q, geom.seq_k,
                                              geom.block_size, **dict(geom.layout_knobs))
        return block_layouts.visible_pairs(_layout(spec, geom), geom.seq_q, geom.seq_k,
                                           geom.block_size)
