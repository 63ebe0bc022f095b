"""Reference lines the plots draw beside measurements, computed from a record's case fields:
the memory any backend needs (inputs and outputs), one materialized score matrix, and the
run's measured ceilings."""

from __future__ import annotations

from collections.abc import Mapping

from attnbench.core.dtypes import element_size
from attnbench.measure.ceilings import matmul_roof

BACKWARD = ("bwd", "fwd_bwd")


def _dims(r: Mapping) -> tuple[int, ...]:
    return tuple(int(r[k]) for k in ("batch", "heads_q", "heads_kv", "seq_q", "seq_k",
                                     "head_dim", "head_dim_v"))


def input_bytes(r: Mapping) -> float:
    """q, k, v (and grad_out in backward modes), as the case makes them."""
    b, hq, hkv, nq, nk, d, dv = _dims(r)
    n = b * hq * nq * d + b * hkv * nk * (d + dv)
    if r["mode"] in BACKWARD:
        n += b * hq * nq * dv
    return float(n * element_size(r["dtype"]))


def output_bytes(r: Mapping) -> float:
    """The output (and dq, dk, dv in backward modes): what every backend must allocate."""
    b, hq, hkv, nq, nk, d, dv = _dims(r)
    n = b * hq * nq * dv
    if r["mode"] in BACKWARD:
        n += b * hq * nq * d + b * hkv * nk * (d + dv)
    return float(n * element_size(r["dtype"]))


def memory_floor_bytes(r: Mapping) -> float:
    """Inputs plus outputs: no backend's footprint can be lower."""
    return input_bytes(r) + output_bytes(r)


def score_matrix_bytes(r: Mapping) -> float:
    """One (B, Hq, Nq, Nk) score matrix in the case's dtype: what materializing it costs."""
    b, hq, _, nq, nk, _, _ = _dims(r)
    return float(b * hq * nq * nk * element_size(r["dtype"]))


def footprint_bytes(r: Mapping) -> float | None:
    """A record's measured footprint: the inputs plus its peak above them."""
    peak = r.get("peak_mem_bytes")
    if peak is None or peak != peak:
        return None
    held = r.get("input_bytes")
    return float(peak) + float(held if held is not None and held == held else input_bytes(r))


def matmul_ceiling(meta: Mapping, dtype: str) -> float | None:
    """The run's matmul roof for the dtype, TFLOP/s (``ceilings.matmul_roof``)."""
    return matmul_roof(meta.get("ceilings") or {}, dtype)
