"""Error metrics against float64 evaluations, and the tolerance verdict."""

from __future__ import annotations

import torch

from attnbench.core.dtypes import TOLERANCE_GRAD, TOLERANCE_OUT

TENSORS = ("out", "dq", "dk", "dv")


# The relative error's floor, as a share of the norm random inputs of the case's magnitudes
# give: a reference far below that (an exact zero gradient) is judged on that scale instead.
FLOOR_FRACTION = 1 / 16


def errors(actual: torch.Tensor, expected: torch.Tensor, floor: float = 0.0
           ) -> tuple[float, float]:
    """(max-abs, relative L2 = ||a - e|| / max(||e||, floor)), computed in float64."""
    a = actual.detach().to(device=expected.device, dtype=torch.float64)
    diff = a - expected
    max_abs = float(diff.abs().max()) if diff.numel() else 0.0
    denom = max(float(torch.linalg.vector_norm(expected)), floor)
    num = float(torch.linalg.vector_norm(diff))
    rel = num / denom if denom > 0 else (0.0 if num == 0 else float("inf"))
    return max_abs, rel


def _rms(t: torch.Tensor | None) -> float:
    if t is None or not t.numel():
        return 0.0
    return float(torch.linalg.vector_norm(t.detach().to(torch.float64))) / t.numel() ** 0.5


def typical_norms(case, inputs) -> dict[str, float]:
    """The norm each output would have for random inputs of these inputs' magnitudes under
    uniform attention over the visible keys (the smallest a softmax average gives): out is
    an average of n values, a gradient a sum over the m queries (keys) seen at weight 1/n."""
    n = max(case.visible_pairs / case.seq_q, 1.0)  # keys a query sees, on average
    m = max(case.visible_pairs / case.seq_k, 1.0)  # queries that see a key
    g = case.group_size
    sq, sk, sv, sg = (_rms(t) for t in (inputs.q, inputs.k, inputs.v, inputs.grad_out))
    score_grad = case.softmax_scale * case.head_dim_v ** 0.5 * sg * sv  # scale * dO . v
    q_elems = case.batch * case.heads_q * case.seq_q
    k_elems = case.batch * case.heads_kv * case.seq_k
    return {
        "out": sv * (q_elems * case.head_dim_v / n) ** 0.5,
        "dq": score_grad * sk * (q_elems * case.head_dim / n) ** 0.5,
        "dk": score_grad * sq * (k_elems * case.head_dim * g * m) ** 0.5 / n,
        "dv": sg * (k_elems * case.head_dim_v * g * m) ** 0.5 / n,
    }


def floors(case, inputs) -> dict[str, float]:
    """The floor of each tensor's relative error: FLOOR_FRACTION of its typical norm."""
    return {k: FLOOR_FRACTION * v for k, v in typical_norms(case, inputs).items()}


def error_columns(prefix: str, outputs: dict[str, torch.Tensor],
                  expected: dict[str, torch.Tensor], floor: dict[str, float] | None = None
                  ) -> dict[str, float]:
    """Columns ``{prefix}_{tensor}_{maxabs|rel}`` for every tensor present in both, the
    relative errors with ``floor`` (``floors``) under their denominators."""
    cols = {}
    for name in TENSORS:
        if name in outputs and name in expected:
            max_abs, rel = errors(outputs[name], expected[name], (floor or {}).get(name, 0.0))
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
