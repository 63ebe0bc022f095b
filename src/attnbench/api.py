"""The stable public Python API (docs/design.md): list_backends, attention, reference,
load_results."""

from __future__ import annotations

import warnings

import torch

from attnbench.core.backend import APPROXIMATE, Backend
from attnbench.core.case import Case, Inputs
from attnbench.core.dtypes import dtype_name
from attnbench.core.errors import NotSupported
from attnbench.core.masks import MaskSpec
from attnbench.core.reference import softmax_reference
from attnbench.core.registry import all_backends
from attnbench.runs.record_files import load_results  # noqa: F401  (re-exported)


def list_backends() -> list[dict]:
    """Every backend found, with whether it can run on this machine and why not."""
    out = []
    for name, b in sorted(all_backends().items()):
        ok, why = b.is_available()
        out.append({"name": name, "available": ok, "reason": why, "semantics": b.semantics,
                    "description": b.description})
    return out


def _mask_text(causal: bool, window) -> str:
    if window is not None:
        if causal:
            raise ValueError("give causal=True or window=(left, right), not both")
        left, right = window
        fmt = ["inf" if x is None or x == float("inf") else str(int(x)) for x in (left, right)]
        return f"window({fmt[0]},{fmt[1]})"
    return "causal" if causal else "none"


# Case fields a direct call may set by keyword; the rest come from the tensors.
KNOBS = tuple(f for f in Case.knob_fields() if f not in ("scale", "inputs"))  # inputs: given
_TENSOR_FIELDS = tuple(f for f in Case.CORE_FIELDS if f not in ("mask", "seed"))


class ApproximationWarning(UserWarning):
    """attention() ran an approximate backend: its result is not softmax attention."""


_warned_approximate: set[str] = set()


def _check_keywords(knobs: dict) -> None:
    """A misused keyword gets one line saying what is allowed (not a raw TypeError)."""
    for name in knobs:
        if name in KNOBS:
            continue
        if name == "mask":
            raise TypeError("attention() takes no 'mask' keyword: use causal=True or "
                            "window=(left, right); block-sparse layouts: "
                            "backend='block_sparse', block_layout_name='local'|'bigbird'")
        if name in _TENSOR_FIELDS:
            raise TypeError(f"attention() keyword {name!r}: it is read from the tensors "
                            f"(q (B, Hq, Nq, D), k (B, Hkv, Nk, D), v (B, Hkv, Nk, Dv))")
        raise TypeError(f"attention() got an unknown keyword {name!r}; allowed: causal, "
                        f"window, scale, {', '.join(KNOBS)}")


def _warn_if_approximate(impl: Backend, case: Case) -> None:
    if impl.semantics != APPROXIMATE or impl.name in _warned_approximate:
        return
    note = impl.approximation(case)
    if not note:  # the call's own mask is what the backend computes exactly
        return
    _warned_approximate.add(impl.name)
    warnings.warn(f"attnbench.attention(backend={impl.name!r}) approximates softmax "
                  f"attention here ({note}); its result is not exact", ApproximationWarning,
                  stacklevel=3)


def case_for(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
             window=None, scale: float | None = None, **knobs) -> Case:
    """The Case describing a direct call on these tensors (seed 0 for seeded parameters)."""
    _check_keywords(knobs)
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 4:
            raise ValueError(f"{name} must be 4-D (batch, heads, seq, dim), got shape "
                             f"{tuple(t.shape)}")
    B, Hq, Nq, D = q.shape
    Bk, Hkv, Nk, Dk = k.shape
    if (Bk, Hkv, Nk) != tuple(v.shape[:3]) or Bk != B or Dk != D:
        raise ValueError(f"incompatible shapes q {tuple(q.shape)}, k {tuple(k.shape)}, "
                         f"v {tuple(v.shape)}: need q (B,Hq,Nq,D), k (B,Hkv,Nk,D), "
                         f"v (B,Hkv,Nk,Dv)")
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"q, k, v dtypes differ: {q.dtype}, {k.dtype}, {v.dtype}")
    mode = "fwd_bwd" if any(t.requires_grad for t in (q, k, v)) else "fwd"
    device = str(q.device) if q.device.type == "cuda" else q.device.type
    return Case(batch=B, heads_q=Hq, heads_kv=Hkv, seq_q=Nq, seq_k=Nk, head_dim=D,
                head_dim_v=v.shape[-1], dtype=dtype_name(q.dtype), device=device,
                mask=_mask_text(causal, window), mode=mode, scale=scale, **knobs)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, backend: str = "sdpa", *,
              causal: bool = False, window=None, scale: float | None = None,
              **knobs) -> torch.Tensor:
    """Attention by the named backend; q (B, Hq, Nq, D), k (B, Hkv, Nk, D), v (B, Hkv, Nk, Dv).

    ``window=(left, right)`` is bottom-right aligned; extra keyword arguments set family
    knobs of the Case (e.g. ``feature_map="favor"``). Raises NotSupported with every reason.
    """
    impl: Backend | None = all_backends().get(backend)
    if impl is None:
        raise NotSupported(backend, [f"unknown backend; known: "
                                     f"{', '.join(sorted(all_backends()))}"])
    ok, why = impl.is_available()
    if not ok:
        raise NotSupported(backend, [why])
    case = case_for(q, k, v, causal=causal, window=window, scale=scale, **knobs)
    reasons = impl.not_supported_reasons(case)
    if reasons:
        raise NotSupported(backend, reasons)
    _warn_if_approximate(impl, case)
    return impl.build(case, Inputs(q, k, v))(q, k, v)


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
              window=None, scale: float | None = None) -> torch.Tensor:
    """Exact softmax attention in float64, chunked over query rows (memory O(chunk x Nk))."""
    mask = MaskSpec.parse(_mask_text(causal, window))
    return softmax_reference(q, k, v, mask, scale).out
