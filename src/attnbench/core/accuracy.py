"""Error metrics against float64 evaluations, and the tolerance verdict."""

from __future__ import annotations

import torch

from attnbench.core.dtypes import TOLERANCE_GRAD, TOLERANCE_OUT

TENSORS = ("out", "dq", "dk", "dv")


def errors(actual: torch.Tensor, expected: torch.Tensor) -> tuple[float, float]:
    """(max-abs, relative L2 = ||a - e|| / ||e||), computed in float64."""
    a = actual.detach().to(device=expected.device, dtype=torch.float64)
    diff = a - expected
    max_abs = float(diff.abs().max()) if diff.numel() else 0.0
    denom = float(torch.linalg.vector_norm(expected))
    num = float(torch.linalg.vector_norm(diff))
    rel = num / denom if denom > 0 else (0.0 if num == 0 else float("inf"))
    return max_abs, rel


def error_columns(prefix: str, outputs: dict[str, torch.Tensor],
                  expected: dict[str, torch.Tensor]) -> dict[str, float]:
    """Columns ``{prefix}_{tensor}_{maxabs|rel}`` for every tensor present in both."""
    cols = {}
    for name in TENSORS:
        if name in outputs and name in expected:
            max_abs, rel = errors(outputs[name], expected[name])
            cols[f"{prefix}_{name}_maxabs"] = max_abs
            cols[f"{prefix}_{name}_rel"] = rel
    return cols


def tolerance(dtype: str, tensor: str) -> float:
    return (TOLERANCE_OUT if tensor == "out" else TOLERANCE_GRAD)[dtype]


def verdict(outputs: dict[str, torch.Tensor], impl_cols: dict[str, float], dtype: str
            ) -> str | None:
    """None when fine, else the one-line reason the record is ``wrong``."""
    for name in TENSORS:
        if name in outputs and not bool(torch.isfinite(outputs[name]).all()):
            return f"{name} contains NaN or Inf"
    for name in TENSORS:
        rel = impl_cols.get(f"err_impl_{name}_rel")
        if rel is not None and not rel <= tolerance(dtype, name):
            return (f"{name} relative L2 error {rel:.3g} above the {dtype} tolerance "
                    f"{tolerance(dtype, name):.0e}")
    return None
