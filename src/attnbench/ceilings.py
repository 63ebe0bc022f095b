"""The device's own ceilings, measured at the start of each run.

A record's TFLOP/s and GB/s are reported as fractions of these, so numbers from a
laptop CPU and an H200 can sit in one table.
"""

from __future__ import annotations

import torch

from .dtypes import torch_dtype
from .timing import TimingBudget, measure

_BUDGET = TimingBudget(warmup_s=0.05, budget_s=0.25, min_reps=3, max_reps=50)


def matmul_tflops(dtype: str, device: str, n: int | None = None) -> float:
    """Best-of-samples dense square matmul rate in TFLOP/s."""
    dev = torch.device(device)
    n = n or (8192 if dev.type == "cuda" else 1024)
    a = torch.randn(n, n, device=dev).to(torch_dtype(dtype))
    b = torch.randn(n, n, device=dev).to(torch_dtype(dtype))
    t = measure(lambda: torch.matmul(a, b), dev, _BUDGET)
    return 2 * n**3 / (t.min_ms * 1e-3) / 1e12


def copy_gbps(device: str, nbytes: int | None = None) -> float:
    """Best-of-samples device-to-device copy bandwidth (read + write) in GB/s."""
    dev = torch.device(device)
    nbytes = nbytes or (2 * 2**30 if dev.type == "cuda" else 128 * 2**20)
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=dev).fill_(1.0)
    dst = torch.empty_like(src)
    t = measure(lambda: dst.copy_(src), dev, _BUDGET)
    return 2 * nbytes / (t.min_ms * 1e-3) / 1e9


def measure_ceilings(dtypes: list[str], device: str) -> dict:
    return {
        "matmul_tflops": {d: matmul_tflops(d, device) for d in sorted(set(dtypes))},
        "copy_gbps": copy_gbps(device),
    }
