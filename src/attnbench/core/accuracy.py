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
    return _typical(case, _magnitudes(inputs), case.batch, case.seq_q, case.seq_k,
                    case.visible_pairs)


def _magnitudes(inputs) -> tuple[float, float, float, float]:
    return tuple(_rms(t) for t in (inputs.q, inputs.k, inputs.v, inputs.grad_out))


def _typical(case, rms: tuple[float, float, float, float], batch: int, seq_q: int,
             seq_k: int, pairs: float) -> dict[str, float]:
    """``typical_norms`` of ``batch`` rows of ``seq_q`` queries and ``seq_k`` keys seeing
    ``pairs`` query-key pairs per row, with the case's heads, head dims and scale."""
    n = max(pairs / seq_q, 1.0)  # keys a query sees, on average
    m = max(pairs / seq_k, 1.0)  # queries that see a key
    g = case.group_size
    sq, sk, sv, sg = rms
    score_grad = case.softmax_scale * case.head_dim_v ** 0.5 * sg * sv  # scale * dO . v
    q_elems = batch * case.heads_q * seq_q
    k_elems = batch * case.heads_kv * seq_k
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


def document_columns(case, inputs, outputs: dict[str, torch.Tensor],
                     expected: dict[str, torch.Tensor]) -> dict:
    """A packed batch's errors document by document: per tensor, the worst document's
    relative L2 error (each document judged against its own norm, its floor that of a
    problem of its length) and where it is: ``err_doc_{t}_rel``, ``err_doc_{t}_len``
    (its tokens), ``err_doc_{t}_row`` and ``err_doc_{t}_doc`` (its index within the row).
    A backend wrong on a few short documents only is lost in the whole tensor's norm, not
    here. {} for a case without packed documents (a paged case's lengths are contexts)."""
    if not getattr(case, "lengths", "") or getattr(case, "page_size", 0):
        return {}
    from attnbench.core import lengths

    rows = lengths.draw(case.lengths, case.batch, case.seq_q, case.seed)
    rms = _magnitudes(inputs)
    causal = case.mask == "causal"
    worst: dict[str, tuple] = {}  # tensor -> (rel, tokens, row, doc)
    for b, row in enumerate(rows):
        start = 0
        for i, n in enumerate(row):
            s = slice(start, start + n)
            start += n
            pairs = n * (n + 1) / 2 if causal else n * n
            floor = _typical(case, rms, 1, n, n, pairs)
            for name in TENSORS:
                if name not in outputs or name not in expected:
                    continue
                # (Hq or Hkv, n, D): the document's slice of row b, every head
                _, rel = errors(outputs[name][b, :, s], expected[name][b, :, s],
                                FLOOR_FRACTION * floor[name])
                if name not in worst or _worse(rel, worst[name][0]):
                    worst[name] = (rel, n, b, i)
    cols = {}
    for name, (rel, n, b, i) in worst.items():
        cols |= {f"err_doc_{name}_rel": rel, f"err_doc_{name}_len": n,
                 f"err_doc_{name}_row": b, f"err_doc_{name}_doc": i}
    return cols


def _worse(a: float, b: float) -> bool:
    """Whether error ``a`` is worse than ``b``: larger, or NaN where ``b`` is not."""
    return (a != a and b == b) or a > b


def verdict(outputs: dict[str, torch.Tensor], impl_cols: dict[str, float], dtype: str
            ) -> str | None:
    """None when fine, else the one-line reason the record is ``wrong``: a tensor's error
    over the whole tensor, or (``document_columns`` in ``impl_cols``) its worst document's,
    above the dtype's tolerance."""
    for name in TENSORS:
        if name in outputs and not bool(torch.isfinite(outputs[name]).all()):
            return f"{name} contains NaN or Inf"
    for name in TENSORS:
        rel = impl_cols.get(f"err_impl_{name}_rel")
        if rel is not None and not rel <= tolerance(dtype, name):
            return (f"{name} relative L2 error {rel:.3g} above the {dtype} tolerance "
                    f"{tolerance(dtype, name):.0e}")
    for name in TENSORS:
        rel = impl_cols.get(f"err_doc_{name}_rel")
        if rel is not None and not rel <= tolerance(dtype, name):
            return (f"{name} relative L2 error {rel:.3g} on document "
                    f"{impl_cols[f'err_doc_{name}_doc']} of row "
                    f"{impl_cols[f'err_doc_{name}_row']} ({impl_cols[f'err_doc_{name}_len']} "
                    f"tokens) above the {dtype} tolerance {tolerance(dtype, name):.0e}")
    return None
