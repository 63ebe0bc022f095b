#!/usr/bin/env python3
"""Registers, spills and shared memory of every triton_flash tuning candidate, for sm_90,
without a GPU.

Each candidate of each kernel (fwd, dkdv, dq) is compiled by Triton for Hopper
(``GPUTarget("cuda", 90, 32)``, ptxas included) with the specialisations a real launch on
the h200 suite gets (unit last-dim strides and a group of 1 as constants, other integers
divisible by 16), for each mask form (none, causal, window), dtype (bf16; fp32 with its
own half-size tiles) and head dim. Registers and spill bytes are read from the cubin with
Triton's own ``cuobjdump -res-usage``; shared memory from the compiled kernel's metadata.
A candidate that spills is slower than one that does not and is dropped from
``candidate_configs``; the table this prints is docs/gpu.md's.

Usage: python scripts/triton_resources.py [--head-dims 64,128] [--dtypes bf16,fp32]
       [--jobs N] [--markdown]
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import os
import re
import subprocess
import sys
import tempfile

MASKS = {"none": (False, False), "causal": (False, True), "window": (True, True)}
H100_SHARED_BYTES = 227 * 1024


def _signature(fn, ptr_dtype: str, consts: dict) -> tuple[dict, dict, dict]:
    """(signature, constexprs, attrs) as a launch on contiguous inputs specialises them."""
    sig, constexprs, attrs = {}, {}, {}
    for i, name in enumerate(fn.arg_names):
        if name in consts:
            sig[name] = "constexpr"
            constexprs[(i,)] = consts[name]
        elif name.isupper() and name not in ("H", "H_KV", "GROUP", "SEQ_Q", "SEQ_K", "LEFT",
                                               "RIGHT"):
            sig[name] = "*" + ("fp32" if name in ("LSE", "DELTA") else ptr_dtype)
            attrs[(i,)] = [["tt.divisibility", 16]]
        elif name.endswith("d") and name.startswith("s") or name == "GROUP":
            sig[name] = "constexpr"  # unit stride of the last dim; one kv head per q head
            constexprs[(i,)] = 1
        elif name.endswith("scale"):
            sig[name] = "fp32"
        else:
            sig[name] = "i32"
            if name not in ("LEFT", "RIGHT"):
                attrs[(i,)] = [["tt.divisibility", 16]]
    return sig, constexprs, attrs


def _resources(cubin: bytes) -> tuple[int, int]:
    """(registers, spill store bytes) of the one kernel in ``cubin``."""
    import triton

    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin",
                        "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        text = subprocess.run([tool, "-res-usage", f.name], capture_output=True, text=True,
                              check=True).stdout
    regs = re.search(r"REG:(\d+)", text)
    spill = re.search(r"STACK:(\d+)", text)
    return int(regs.group(1)) if regs else -1, int(spill.group(1)) if spill else -1


def compile_one(kernel: str, dtype: str, d: int, mask: str, index: int, cfg=None) -> dict:
    """Candidate ``index`` of ``kernel`` (or the Config ``cfg``, to try one out)."""
    os.environ.pop("TRITON_INTERPRET", None)
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from attnbench.implementations import _triton_flash_kernels as K

    fn = {"fwd": K._fwd_kernel, "dkdv": K._bwd_dkdv_kernel, "dq": K._bwd_dq_kernel}[kernel]
    elem = 4 if dtype == "fp32" else 2
    cfg = cfg or K.candidate_configs(kernel, d, d, elem)[index]
    has_left, has_right = MASKS[mask]
    consts = dict(HEAD_D=d, HEAD_DV=d, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
                  BLOCK_D=K.head_block(d), BLOCK_DV=K.head_block(d), HAS_LEFT=has_left,
                  HAS_RIGHT=has_right, DOT_PREC="tf32x3" if dtype == "fp32" else "tf32")
    sig, constexprs, attrs = _signature(fn, dtype, consts)
    row = {"kernel": kernel, "dtype": dtype, "d": d, "mask": mask, "config": str(cfg),
           "default": index == 0}
    try:
        ck = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=constexprs,
                                      attrs=attrs),
                            target=GPUTarget("cuda", 90, 32),
                            options={"num_warps": cfg.num_warps,
                                     "num_stages": cfg.num_stages})
    except Exception as exc:
        return row | {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"}
    regs, stack = _resources(ck.asm["cubin"])
    return row | {"registers": regs, "spill_bytes": stack, "shared_bytes": ck.metadata.shared,
                  "fits": ck.metadata.shared <= H100_SHARED_BYTES}


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
