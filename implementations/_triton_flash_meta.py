"""triton_flash's launch configurations and compiled-kernel metadata, for its records.

``triton_config``: per kernel (fwd, and dkdv and dq in backward modes) the configuration that
ran: block sizes, warps, stages.

``triton_compiled``: per kernel, registers per thread, spill bytes and shared memory, from
one of two sources (``triton_compiled_source`` says which):

- ``gpu binary``: on a GPU, the compiled kernel that ran, found in Triton's JIT cache by its
  constants and configuration; registers and spills as the driver loaded it.
- ``sm_90 compile without a GPU``: under the Triton interpreter (CPU) nothing is compiled, so
  the kernels are compiled for Hopper (``triton.compile`` with ``GPUTarget("cuda", 90, 32)``)
  in a fresh process without the interpreter, with the configuration a GPU would run untuned
  (the first candidate); ``ptxas -v`` (shipped with Triton) reports registers and spills.
  That costs seconds (a process, about a second per kernel; Triton caches compiles on disk),
  so it runs only when a record is profiled (``attnbench profile``, ``run --profile``).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import json
import os
import re
import subprocess
import sys
import tempfile

import torch

TRITON_DTYPES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}
SM90 = 90


def config_columns(K, names: list[str], q, k, v, plan) -> dict:
    """``triton_config``: {kernel: {block_m, block_n, num_warps, num_stages}} that ran."""
    out = {}
    for name in names:
        cfg = K.config_for(name, q, k, v, plan)
        out[name] = {"block_m": cfg.block_m, "block_n": cfg.block_n,
                     "num_warps": cfg.num_warps, "num_stages": cfg.num_stages}
    return {"triton_config": out}


# Integer arguments a launch on contiguous inputs without GQA specialises to the constant 1
# (Triton turns an argument equal to 1 into a constant): last-dim strides and the group.
UNIT_ARGS = re.compile(r"^s_?[a-z]+d$|^GROUP$")  # sqd, skd, ..., s_dkd, s_dvd; GROUP
UNALIGNED_ARGS = ("LEFT", "RIGHT")  # band offsets: any integer, no divisibility assumed


def launch_signature(fn, consts: dict, pointer_dtype: str, pointers,
                     fp32_pointers, i32_pointers=()) -> tuple[dict, dict, dict]:
    """(signature, constexprs, attrs) of a kernel as a launch on contiguous inputs of the
    h200 suite's shapes specialises it: pointers (Q, K, ... in the inputs' dtype; the
    log-sum-exp and delta in fp32; a packed batch's block list in int32) and other integers
    divisible by 16, unit strides and a group of 1 constant, the scales fp32."""
    sig, constexprs, attrs = {}, {}, {}
    for i, arg in enumerate(fn.arg_names):
        if arg in consts or UNIT_ARGS.match(arg):
            sig[arg] = "constexpr"
            constexprs[(i,)] = consts.get(arg, 1)
        elif arg in pointers or arg in fp32_pointers or arg in i32_pointers:
            sig[arg] = "*" + ("fp32" if arg in fp32_pointers else
                              "i32" if arg in i32_pointers else pointer_dtype)
            attrs[(i,)] = [["tt.divisibility", 16]]
        elif arg.endswith("scale"):
            sig[arg] = "fp32"
        else:
            sig[arg] = "i32"
            if arg not in UNALIGNED_ARGS:
                attrs[(i,)] = [["tt.divisibility", 16]]
    return sig, constexprs, attrs


PTXAS_LINE = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, "
                        r"(\d+) bytes spill loads")
REGISTERS = re.compile(r"Used (\d+) registers")


def ptxas_usage(ptx: str, arch: int = SM90) -> dict:
    """Registers and spills of a PTX module as ``ptxas -v`` reports them."""
    from triton.backends.nvidia.compiler import get_ptxas

    with tempfile.NamedTemporaryFile("w", suffix=".ptx") as src:
        src.write(ptx)
        src.flush()
        proc = subprocess.run([get_ptxas(arch).path, "-v", f"--gpu-name=sm_{arch}a", src.name,
                               "-o", "/dev/null"], capture_output=True, text=True, timeout=300)
    text = proc.stdout + proc.stderr
    regs, spills = REGISTERS.search(text), PTXAS_LINE.search(text)
    if proc.returncode or not regs or not spills:
        raise RuntimeError(f"ptxas -v: {text.strip()[-200:]}")
    return {"registers": int(regs.group(1)), "stack_bytes": int(spills.group(1)),
            "spill_store_bytes": int(spills.group(2)), "spill_load_bytes": int(spills.group(3))}


def compile_sm90(K, kernel: str, d: int, dv: int, dtype: torch.dtype, plan, cfg=None) -> dict:
    """Compile one kernel for sm_90 without a GPU, with ``cfg`` (default: the configuration a
    GPU runs untuned, the first candidate). ``K`` must be the kernel module in compiled mode
    (see ``sm90_metadata``). scripts/triton_resources.py compiles every candidate with it."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    cfg = cfg or K.candidate_configs(kernel, d, dv, dtype.itemsize)[0]
    fn = K.KERNELS[kernel]
    consts = K.launch_constants(d, dv, plan, cfg, dtype)
    sig, constexprs, attrs = launch_signature(fn, consts, TRITON_DTYPES[dtype], K.POINTERS,
                                              K.FP32_POINTERS, getattr(K, "I32_POINTERS", ()))
    ck = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=constexprs, attrs=attrs),
                        target=GPUTarget("cuda", SM90, 32),
                        options={"num_warps": cfg.num_warps, "num_stages": cfg.num_stages})
    usage = ptxas_usage(ck.asm["ptx"])
    return {"config": str(cfg), "registers": usage["registers"],
            "spill_bytes": usage["spill_store_bytes"], "shared_bytes": ck.metadata.shared,
            "num_warps": cfg.num_warps, "num_stages": cfg.num_stages}


@functools.lru_cache(maxsize=256)
def sm90_metadata(module: str, names: tuple[str, ...], d: int, dv: int, dtype: str,
                  plan: tuple) -> dict:
    """``compile_sm90`` for each kernel, in a fresh process without the interpreter: under
    ``TRITON_INTERPRET=1`` every ``triton.jit`` function of this process, Triton's own
    library included, is an interpreted one that cannot be compiled."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # Triton 3.9's default, said explicitly
    args = json.dumps({"module": module, "names": names, "d": d, "dv": dv, "dtype": dtype,
                       "plan": plan})
    proc = subprocess.run([sys.executable, "-m", __name__, args], env=env, capture_output=True,
                          text=True, timeout=600)
    if proc.returncode:
        lines = [x for x in proc.stderr.strip().splitlines() if x.strip()]
        raise RuntimeError(lines[-1] if lines else f"exit code {proc.returncode}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def from_binary(K, kernel: str, q, k, v, plan) -> dict | None:
    """The compiled kernel that ran on the GPU (Triton's JIT cache), or None if not found."""
    cfg = K.config_for(kernel, q, k, v, plan)
    consts = K.launch_constants(q.shape[-1], v.shape[-1], plan, cfg, q.dtype)
    fn = K.KERNELS[kernel]
    for kernel_cache, *_ in list(getattr(fn, "device_caches", {}).values()):
        for ck in list(kernel_cache.values()):
            md = ck.metadata
            given = {fn.arg_names[key[0]]: value for key, value in ck.src.constants.items()
                     if isinstance(key, tuple) and len(key) == 1}
            if (md.num_warps, md.num_stages) != (cfg.num_warps, cfg.num_stages):
                continue
            if any(given.get(name) != value for name, value in consts.items()):
                continue
            ck._init_handles()  # loads the binary: the driver reports registers and spills
            return {"config": str(cfg), "registers": int(ck.n_regs),
                    "spill_bytes": int(ck.n_spills), "shared_bytes": int(md.shared),
                    "num_warps": cfg.num_warps, "num_stages": cfg.num_stages}
    return None


def compiled_columns(K, names: list[str], q, k, v, plan) -> dict:
    """``triton_compiled`` and ``triton_compiled_source`` (see the module's docstring)."""
    if not K.INTERPRET and q.device.type == "cuda":
        found = {n: from_binary(K, n, q, k, v, plan) for n in names}
        found = {n: m for n, m in found.items() if m}
        return {"triton_compiled": found, "triton_compiled_source": "gpu binary"} if found \
            else {"triton_compiled_source": "gpu binary not found in Triton's JIT cache"}
    try:
        meta = sm90_metadata(K.__name__, tuple(names), q.shape[-1], v.shape[-1],
                             str(q.dtype).removeprefix("torch."), dataclasses.astuple(plan))
    except Exception as exc:  # no NVIDIA backend or ptxas: say so, do not fail the record
        return {"triton_compiled_source": f"sm_90 compile failed: {type(exc).__name__}: "
                                          f"{str(exc).strip()[:200]}"}
    return {"triton_compiled": meta,
            "triton_compiled_source": "sm_90 compile without a GPU (interpreter ran; the "
                                      "untuned GPU configuration compiled)"}


def _main(args: dict) -> None:
    K = importlib.import_module(args["module"])
    assert not K.INTERPRET, "compile for sm_90 with the interpreter switched off"
    plan = K.Plan(*args["plan"])
    dtype = getattr(torch, args["dtype"])
    out = {n: compile_sm90(K, n, args["d"], args["dv"], dtype, plan) for n in args["names"]}
    print(json.dumps(out))


if __name__ == "__main__":
    _main(json.loads(sys.argv[1]))
