"""Dtype names, parsing and per-dtype error tolerances.

Names are data here, without torch: a suite is loaded and its size checked before torch is
imported (``attnbench run`` refuses a plan of millions of pairs in a fraction of a second).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

# name -> bytes per element; each name is also the torch.dtype's attribute (torch.float32)
DTYPES: dict[str, int] = {"float64": 8, "float32": 4, "float16": 2, "bfloat16": 2}
ALIASES = {"fp64": "float64", "fp32": "float32", "fp16": "float16", "bf16": "bfloat16",
           "half": "float16", "float": "float32", "double": "float64"}

# Relative-L2 tolerances against the float64 evaluation. The output tolerance
# is a few units of the dtype's rounding (fp32 has 2^-24, fp16 2^-11, bf16 2^-8),
# gradients get more room since they chain two more matmuls and a softmax Jacobian.
TOLERANCE_OUT = {"float64": 1e-9, "float32": 1e-4, "float16": 1e-2, "bfloat16": 4e-2}
TOLERANCE_GRAD = {"float64": 1e-8, "float32": 1e-3, "float16": 3e-2, "bfloat16": 8e-2}


def canonical_dtype(name: str) -> str:
    """Return the canonical dtype name, or raise ValueError listing what is allowed."""
    key = ALIASES.get(name, name)
    if key not in DTYPES:
        raise ValueError(f"unknown dtype {name!r}; allowed: {', '.join(DTYPES)}")
    return key


def torch_dtype(name: str) -> torch.dtype:
    import torch

    return getattr(torch, canonical_dtype(name))


def dtype_name(dtype: torch.dtype) -> str:
    import torch

    for name in DTYPES:
        if getattr(torch, name) == dtype:
            return name
    raise ValueError(f"unsupported dtype {dtype}; allowed: {', '.join(DTYPES)}")


def element_size(name: str) -> int:
    return DTYPES[canonical_dtype(name)]
