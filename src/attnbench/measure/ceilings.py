"""The device's own ceilings, measured at the start of each run.

A record's TFLOP/s and GB/s are reported as fractions of these, so numbers from a
laptop CPU and an H200 can sit in one table.
"""

from __future__ import annotations

import torch

from attnbench.core.dtypes import torch_dtype
from attnbench.measure.timing import TimingBudget, measure

_BUDGET = TimingBudget(warmup_s=0.05, budget_s=0.25, min_reps=3, max_reps=50)


# Square sizes tried, smallest first, each while its predicted call stays under MAX_CALL_S;
# the ceiling is the best rate of any. One size is not enough: on a CPU with AMX, bf16 ran
# at 0.49 TFLOP/s at 1024^3 and 0.90 at 2048^3, and records of a run whose ceiling came from
# 1024^3 read 111% of it; a CPU without native bf16 takes seconds a call at 1024^3, which
# the prediction from the smaller sizes keeps it from starting.
SIZES = {"cpu": (256, 512, 1024, 2048, 4096), "cuda": (2048, 4096, 8192)}
MAX_CALL_S = 0.3


def matmul_tflops(dtype: str, device: str, n: int | None = None) -> float:
    """Best-of-samples dense square matmul rate in TFLOP/s, the best over the sizes."""
    dev = torch.device(device)
    best = 0.0
    for size in ((n,) if n else SIZES.get(dev.type, SIZES["cpu"])):
        if best and 2 * size**3 / (best * 1e12) > MAX_CALL_S:
            break
        a = torch.randn(size, size, device=dev).to(torch_dtype(dtype))  # (size, size)
        b = torch.randn(size, size, device=dev).to(torch_dtype(dtype))
        t = measure(lambda a=a, b=b: torch.matmul(a, b), dev, _BUDGET)
        best = max(best, 2 * size**3 / (t.min_ms * 1e-3) / 1e12)
    return best


# Copy sizes (bytes of the source), smallest first. The largest is the device's streaming
# bandwidth (``copy_gbps``); the smaller ones are the roofs of working sets that stay in a
# cache: a decode step over a 4 MiB KV cache is read from L2 at more than the 128 MiB copy.
# Powers of two on CPU (L2 is MiBs, L3 tens to hundreds), powers of four on a GPU (L2 ~50 MB).
COPY_BYTES = {"cpu": tuple(2**p for p in range(20, 28)),  # 1 MiB .. 128 MiB
              "cuda": tuple(2**p for p in range(22, 31, 2)) + (2 * 2**30,)}  # 4 MiB .. 2 GiB


def copy_gbps(device: str, nbytes: int | None = None) -> float:
    """Best-of-samples device-to-device copy bandwidth (read + write) in GB/s."""
    dev = torch.device(device)
    nbytes = nbytes or COPY_BYTES.get(dev.type, COPY_BYTES["cpu"])[-1]
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=dev).fill_(1.0)
    dst = torch.empty_like(src)
    t = measure(lambda: dst.copy_(src), dev, _BUDGET)
    return 2 * nbytes / (t.min_ms * 1e-3) / 1e9


# A kernel of a narrower float type may compute in float32 (sdpa's CPU kernels do on hosts
# without native bf16, where torch's own bf16 matmul ran 110x slower than fp32: sdpa bf16
# read 35x that "ceiling"), so its roof is the faster of its dtype's matmul and float32's.
WIDER = {"bfloat16": "float32", "float16": "float32"}


def matmul_roof(ceilings: dict, dtype: str) -> float | None:
    """TFLOP/s a record of ``dtype`` can reach on the run's device: the best measured matmul
    rate among its dtype and the wider type it may compute in (``WIDER``)."""
    rates = ceilings.get("matmul_tflops") or {}
    values = [float(v) for v in (rates.get(dtype), rates.get(WIDER.get(dtype, dtype))) if v]
    return max(values) if values else None


def measure_ceilings(dtypes: list[str], device: str) -> dict:
    sizes = COPY_BYTES.get(torch.device(device).type, COPY_BYTES["cpu"])
    by_bytes = {str(n): copy_gbps(device, n) for n in sizes}
    wanted = set(dtypes) | {WIDER[d] for d in dtypes if d in WIDER}
    return {
        "matmul_tflops": {d: matmul_tflops(d, device) for d in sorted(wanted)},
        "copy_gbps": by_bytes[str(sizes[-1])],
        "copy_gbps_by_bytes": by_bytes,  # source bytes -> GB/s of its read + write
    }


def copy_ladder(ceilings: dict) -> list[tuple[int, float]]:
    """A run's measured copies as (source bytes, GB/s), smallest first; [] before the ladder."""
    return sorted((int(n), g) for n, g in (ceilings.get("copy_gbps_by_bytes") or {}).items())


def copy_roof(ceilings: dict, traffic_bytes: float) -> float | None:
    """The copy bandwidth that bounds a record moving ``traffic_bytes``: that of the largest
    measured copy whose traffic (source read + destination written) is no more than the
    record's, else the smallest copy's. A working set that fits a cache is held to that
    cache's roof, not to the streaming one. Runs recorded before the ladder: ``copy_gbps``."""
    ladder = copy_ladder(ceilings)
    if not ladder:
        return ceilings.get("copy_gbps")
    fitting = [g for n, g in ladder if 2 * n <= traffic_bytes]
    return fitting[-1] if fitting else ladder[0][1]
