#!/usr/bin/env python3
"""Registers, spills and shared memory of every triton_flash tuning candidate, for sm_90,
without a GPU.

Each candidate of each kernel (fwd, dkdv, dq) is compiled by Triton for Hopper
(``GPUTarget("cuda", 90, 32)``, ptxas included) with the specialisations a real launch on
the h200 suite gets (unit last-dim strides and a group of 1 as constants, other integers
divisible by 16), for each mask form (none, causal, window), dtype (bf16; fp32 with its
own half-size tiles) and head dim, by the same function that fills the records'
``triton_compiled`` columns without a GPU (``_triton_flash_meta.compile_sm90``): registers
and spill bytes from ``ptxas -v``, shared memory from the compiled kernel's metadata.
A candidate that spills is slower than one that does not and is dropped from
``candidate_configs``; the table this prints is docs/gpu.md's.

Usage: python scripts/triton_resources.py [--head-dims 64,128] [--dtypes bf16,fp32]
       [--jobs N] [--markdown]
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import os
import sys

MASKS = {"none": (False, False), "causal": (False, True), "window": (True, True)}
H100_SHARED_BYTES = 227 * 1024
DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


def compile_one(kernel: str, dtype: str, d: int, mask: str, index: int, cfg=None) -> dict:
    """Candidate ``index`` of ``kernel`` (or the Config ``cfg``, to try one out), compiled as
    the records' sm_90 metadata is (``_triton_flash_meta.compile_sm90``)."""
    os.environ.pop("TRITON_INTERPRET", None)
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # as sm90_metadata says it
    import torch

    from attnbench.implementations import _triton_flash_kernels as K
    from attnbench.implementations import _triton_flash_meta as M

    torch_dtype = getattr(torch, DTYPES[dtype])
    cfg = cfg or K.candidate_configs(kernel, d, d, torch_dtype.itemsize)[index]
    has_left, has_right = MASKS[mask]
    plan = K.Plan(scale=1.0, has_left=has_left, has_right=has_right)
    row = {"kernel": kernel, "dtype": dtype, "d": d, "mask": mask, "config": str(cfg),
           "default": index == 0}
    try:
        meta = M.compile_sm90(K, kernel, d, d, torch_dtype, plan, cfg)
    except Exception as exc:
        return row | {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"}
    return row | {"registers": meta["registers"], "spill_bytes": meta["spill_bytes"],
                  "shared_bytes": meta["shared_bytes"],
                  "fits": meta["shared_bytes"] <= H100_SHARED_BYTES}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--head-dims", default="64,128")
    ap.add_argument("--dtypes", default="bf16,fp32")
    ap.add_argument("--masks", default=",".join(MASKS))
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args(argv)
    os.environ.pop("TRITON_INTERPRET", None)
    from attnbench.implementations import _triton_flash_kernels as K

    tasks = []
    for dtype in args.dtypes.split(","):
        for d in (int(x) for x in args.head_dims.split(",")):
            for kernel in ("fwd", "dkdv", "dq"):
                n = len(K.candidate_configs(kernel, d, d, 4 if dtype == "fp32" else 2))
                tasks += [(kernel, dtype, d, m, i) for m in args.masks.split(",")
                          for i in range(n)]
    with cf.ProcessPoolExecutor(args.jobs) as pool:
        rows = list(pool.map(compile_one, *zip(*tasks)))
    head = "| kernel | dtype | d | mask | config | registers | spill bytes | shared KiB |"
    print(head + "\n" + "|---" * 8 + "|")
    for r in rows:
        cfg = r["config"] + (" (default)" if r["default"] else "")
        if "error" in r:
            print(f"| {r['kernel']} | {r['dtype']} | {r['d']} | {r['mask']} | {cfg} | "
                  f"compile failed: {r['error']} | | |")
            continue
        spill = f"**{r['spill_bytes']}**" if r["spill_bytes"] else "0"
        print(f"| {r['kernel']} | {r['dtype']} | {r['d']} | {r['mask']} | {cfg} | "
              f"{r['registers']} | {spill} | {r['shared_bytes'] / 1024:.0f} |")
    spilling = [r for r in rows if r.get("spill_bytes", 0) > 0]
    print(f"\n{len(rows)} compiled, {len(spilling)} spill, "
          f"{sum('error' in r for r in rows)} failed", file=sys.stderr)
    return 1 if spilling or any("error" in r for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
