"""The built-in backends' parameters, each declared once (core/params.py's ``Param``): the
backends that read one reference its declaration here (``Backend.params``), and a case
holds their values in its ``params`` beside any plugin's.

They are declared in core, not in each backend's module, because their names and defaults
are part of every key written since they were case fields: a key writes one only when it
differs from its default, in the order of ``BUILT_IN`` (core/case.py). Torch-free, so a
suite loads and keys its cases without importing a backend."""

from __future__ import annotations

from attnbench.core.block_layouts import LAYOUTS
from attnbench.core.params import Param

FEATURE_MAPS = ("elu", "favor")

# A block layout's geometry: the problem's on a block_sparse(...) mask (core/masks/), a
# parameter of block_sparse on a dense case.
BLOCK = {
    "block_size": Param(int, 64, minimum=1, doc="tokens per tile side"),
    "block_band": Param(int, 1, minimum=0, doc="layout band, in blocks"),
    "block_global": Param(int, 1, minimum=0, doc="global blocks"),
    "block_random": Param(int, 2, minimum=0, doc="random blocks per row"),
    "block_pairs": Param(tuple, (), doc="explicit layout's (q, k) blocks"),
    "block_stride": Param(int, 0, minimum=0, doc="strided layout; 0: sqrt"),
}
BLOCK_SPARSE = BLOCK | {
    "block_layout_name": Param(str, "bigbird", choices=LAYOUTS,
                               doc="layout on a dense (mask none) case"),
}
LINEAR = {
    "feature_map": Param(str, "elu", choices=FEATURE_MAPS, doc="phi: elu+1 or FAVOR+"),
    "num_features": Param(int, 256, minimum=1, doc="FAVOR+ random features m"),
}
ADDITIVE = {
    "additive_dim": Param(int, 0, minimum=0, doc="d_a; 0 means head_dim"),
    "memory_budget_mb": Param(int, 256, minimum=1, doc="tanh terms' budget, MiB"),
}
LINFORMER = {
    "linformer_k": Param(int, 256, minimum=1, doc="rows K and V are projected to"),
}

# Every built-in parameter, in the order a key writes them (the order they had as fields).
BUILT_IN: dict[str, Param] = BLOCK_SPARSE | LINEAR | {
    "additive_dim": ADDITIVE["additive_dim"], **LINFORMER,
    "memory_budget_mb": ADDITIVE["memory_budget_mb"]}
