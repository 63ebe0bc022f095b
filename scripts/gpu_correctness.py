#!/usr/bin/env python3
"""triton_flash on a CUDA GPU: forward and backward against the float64 reference.

Two parts, spread over worker processes (Triton compiles on the CPU, one kernel at a time per
process, so compiling in parallel is what keeps this short):

* ``shapes``: a grid of awkward shapes (ragged lengths, cross-attention, GQA/MQA, padded head
  dimensions, d_v != d, windows, a single query row) in fp32, bf16 and fp16, with the default
  launch configuration;
* ``configs``: every tuning candidate of every kernel, for the head dims, dtypes and masks of
  suites/h200.toml, on a shape that specialises like the suite's (so the compiled kernels land
  in Triton's on-disk cache and the suite's tuning does not compile again).

Criteria: fp32 relative L2 <= a tenth of the suite's fp32 tolerance (the kernels multiply
fp32 as three TF32 products); bf16/fp16
FlashAttention's: max-abs error <= 2 x that of naive PyTorch in the same dtype + 1e-3 x max|ref|,
and relative L2 within the suite's dtype tolerance. Writes a JSON of every check; exit code 1
if any check failed, 2 without a GPU.

Usage: python scripts/gpu_correctness.py [--out FILE.json] [--jobs N] [--parts shapes,configs]
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import multiprocessing as mp
import os
import sys
import time
import traceback

# (batch, heads_q, heads_kv, seq_q, seq_k, d, d_v, mask)
SHAPES = [
    (2, 8, 8, 1024, 1024, 128, 128, "none"),
    (2, 8, 8, 1024, 1024, 128, 128, "causal"),
    (1, 8, 2, 1000, 1537, 64, 64, "causal"),  # cross, GQA, ragged
    (1, 8, 8, 1537, 1000, 64, 64, "causal"),  # seq_q > seq_k: empty rows
    (1, 4, 4, 777, 777, 96, 96, "window(100,20)"),
    (1, 4, 1, 513, 2048, 40, 40, "window(64,0)"),  # MQA
    (1, 4, 4, 300, 300, 256, 256, "causal"),
    (1, 4, 4, 257, 311, 80, 112, "none"),  # d_v != d
    (1, 2, 2, 1, 4096, 128, 128, "causal"),  # one query row
    (1, 16, 16, 4096, 4096, 128, 128, "window(1023,0)"),
]
SHAPE_DTYPES = ["bfloat16", "float16"]
# fp32 compiles slowly (large tiles of 3xTF32 products): a subset with every code path.
FP32_SHAPES = [SHAPES[i] for i in (2, 4, 5, 7)]

# Combos of suites/h200.toml: (dtype, d, mask). Shape (1, 16, 16, 1024, 1024) specialises like
# every case of the suite (lengths and heads divisible by 16, one kv head per q head).
CONFIG_COMBOS = [(dt, d, m) for dt in ("bfloat16", "float16") for d in (64, 128)
                 for m in ("none", "causal")]
CONFIG_COMBOS += [("bfloat16", 128, "window(4095,0)"), ("float16", 128, "window(4095,0)")]


def _errors(got, ref):
    import torch

    a = got.detach().to(torch.float64)
    diff = a - ref
    den = float(ref.norm())
    return float(diff.abs().max()), float(diff.norm()) / den if den > 0 else float(diff.norm())


def _check(label, dtype, got, naive, ref, results):
    from attnbench.dtypes import TOLERANCE_GRAD, TOLERANCE_OUT

    for name, expected in ref.items():
        t = got[name]
        finite = bool(t.isfinite().all())
        mx, rel = _errors(t, expected)
        if dtype == "float32":  # 3xTF32 products: a tenth of the suite's fp32 tolerance
            tol = (TOLERANCE_OUT if name == "out" else TOLERANCE_GRAD)[dtype] / 10
            ok = finite and rel <= tol
            bound = f"rel<={tol:g}"
        else:
            nmx, nrel = _errors(naive[name], expected)
            tol = (TOLERANCE_OUT if name == "out" else TOLERANCE_GRAD)[dtype]
            slack = 1e-3 * float(expected.abs().max())
            ok = finite and mx <= 2 * nmx + slack and rel <= tol
            bound = f"maxabs<=2*{nmx:.2e}+{slack:.1e}, rel<={tol:g}"
        results.append({"check": label, "tensor": name, "ok": ok, "maxabs": mx, "rel": rel,
                        "bound": bound})


DEVICE = os.environ.get("ATTNBENCH_CHECK_DEVICE", "cuda")  # "cpu" only for --smoke


def _inputs(shape, dtype, seed=0):
    from attnbench.case import Case

    B, Hq, Hk, Nq, Nk, D, Dv, mask = shape
    case = Case(batch=B, heads_q=Hq, heads_kv=Hk, seq_q=Nq, seq_k=Nk, head_dim=D, head_dim_v=Dv,
                dtype=dtype, device=DEVICE, mask=mask, mode="fwd_bwd", seed=seed)
    return case, case.make_inputs()


def _grads(fn, inputs):
    q, k, v = (t.detach().clone().requires_grad_(True) for t in (inputs.q, inputs.k, inputs.v))
    out = fn(q, k, v)
    dq, dk, dv = __import__("torch").autograd.grad(out, (q, k, v), inputs.grad_out)
    return {"out": out.detach(), "dq": dq, "dk": dk, "dv": dv}


def run_shape(shape, dtype):
    import torch

    from attnbench.implementations import triton_flash
    from attnbench.reference import case_reference
    from attnbench.registry import get_backend

    K = triton_flash.kernels()
    results = []
    case, inputs = _inputs(shape, dtype)
    reasons = get_backend("triton_flash").not_supported_reasons(case)
    if reasons:
        return [{"check": f"shape {dtype} {case.key}", "tensor": "-", "ok": None,
                 "error": "; ".join(reasons)}]
    plan = K.make_plan(case.softmax_scale, case.mask_spec.window)
    got = _grads(lambda q, k, v: K.attention(q, k, v, plan), inputs)
    naive = None
    if dtype != "float32":
        naive = _grads(get_backend("naive").build(case, inputs), inputs)
    ref = case_reference(case, inputs).as_dict()
    label = f"shape {dtype} {case.key}"
    _check(label, dtype, got, naive, ref, results)
    del got, naive, ref
    if DEVICE == "cuda":
        torch.cuda.empty_cache()
    return results


def run_configs(dtype, d, mask):
    """Every candidate config of fwd, dkdv and dq on one suite-like shape."""
    import torch

    from attnbench.implementations import triton_flash
    from attnbench.reference import case_reference
    from attnbench.registry import get_backend

    K = triton_flash.kernels()
    results = []
    n = 64 if DEVICE == "cpu" else 1024
    case, inputs = _inputs((1, 2 if DEVICE == "cpu" else 16, 2 if DEVICE == "cpu" else 16, n, n,
                            d, d, mask), dtype)
    plan = K.make_plan(case.softmax_scale, case.mask_spec.window)
    q, k, v, go = inputs.q, inputs.k, inputs.v, inputs.grad_out
    ref = case_reference(case, inputs).as_dict()
    naive = _grads(get_backend("naive").build(case, inputs), inputs)
    o, lse = K.forward(q, k, v, plan)
    default = K.backward(q, k, v, o, lse, go, plan)
    base = {"out": o, "dq": default[0], "dk": default[1], "dv": default[2]}
    for kernel in ("fwd", "dkdv", "dq"):
        for cfg in K.candidate_configs(kernel, d, d)[: 1 if DEVICE == "cpu" else None]:
            label = f"config {kernel} {cfg} {dtype} d{d} {mask}"
            try:
                got = dict(base)
                if kernel == "fwd":
                    got["out"], _ = K.forward(q, k, v, plan, cfg)
                    names = ("out",)
                else:
                    delta = K._delta(o, go)
                    if kernel == "dkdv":
                        dk, dv = torch.empty_like(k), torch.empty_like(v)
                        K._launch_dkdv(q, k, v, go, dk, dv, lse, delta, plan, cfg)
                        got["dk"], got["dv"] = dk, dv
                        names = ("dk", "dv")
                    else:
                        dq = torch.empty_like(q)
                        K._launch_dq(q, k, v, go, dq, lse, delta, plan, cfg)
                        got["dq"] = dq
                        names = ("dq",)
                if DEVICE == "cuda":
                    torch.cuda.synchronize()
                _check(label, dtype, {n: got[n] for n in names}, naive,
                       {n: ref[n] for n in names}, results)
            except Exception as exc:  # e.g. out of shared memory: the tuner skips it too
                results.append({"check": label, "tensor": "-", "ok": None,
                                "error": f"{type(exc).__name__}: {str(exc).splitlines()[0]}"})
    return results


def _task(kind, args):
    t0 = time.perf_counter()
    try:
        res = run_shape(*args) if kind == "shape" else run_configs(*args)
    except Exception as exc:
        res = [{"check": f"{kind} {args}", "tensor": "-", "ok": False,
                "error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()}]
    for r in res:
        r["task_s"] = round(time.perf_counter() - t0, 2)
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="write every check as JSON here")
    ap.add_argument("--jobs", type=int, default=min(12, max(1, (os.cpu_count() or 2) - 2)))
    ap.add_argument("--parts", default="shapes,configs")
    ap.add_argument("--smoke", action="store_true",
                    help="CPU dry run of this script through the Triton interpreter, tiny shapes")
    args = ap.parse_args(argv)
    global SHAPES, FP32_SHAPES, CONFIG_COMBOS
    if args.smoke:  # before torch/triton: the kernels must be defined interpreted
        os.environ["TRITON_INTERPRET"] = "1"
        os.environ["ATTNBENCH_CHECK_DEVICE"] = "cpu"
        SHAPES = [(1, 2, 1, 33, 47, 40, 24, "window(5,3)"), (1, 2, 2, 1, 20, 16, 16, "causal")]
        FP32_SHAPES = SHAPES[:1]
        CONFIG_COMBOS = [("bfloat16", 64, "causal")]
    elif os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        print("gpu_correctness: TRITON_INTERPRET is set; unset it to check the compiled kernels")
        return 2
    import torch

    if not args.smoke and not torch.cuda.is_available():
        print("gpu_correctness: no CUDA GPU visible to torch; nothing to check here")
        return 2
    parts = set(args.parts.split(","))
    tasks = []
    if "configs" in parts:  # the longest tasks first
        tasks += [("configs", c) for c in CONFIG_COMBOS]
    if "shapes" in parts:
        tasks += [("shape", (s, dt)) for s in SHAPES for dt in SHAPE_DTYPES]
        tasks += [("shape", (s, "float32")) for s in FP32_SHAPES]
    device_name = "cpu (interpreter)" if args.smoke else torch.cuda.get_device_name()
    print(f"gpu_correctness: {len(tasks)} tasks on {device_name} with "
          f"{args.jobs} processes", flush=True)
    t0 = time.perf_counter()
    results = []
    with cf.ProcessPoolExecutor(args.jobs, mp_context=mp.get_context("spawn")) as pool:
        futures = [pool.submit(_task, kind, a) for kind, a in tasks]
        for fut in cf.as_completed(futures):
            res = fut.result()
            results += res
            bad = [r for r in res if r["ok"] is False]
            skipped = [r for r in res if r["ok"] is None]
            head = res[0]["check"] if res else "?"
            if head.startswith("config"):  # "config KERNEL CFG DTYPE dD MASK": name the combo
                head = "configs " + " ".join(head.split()[3:])
            print(f"  [{time.perf_counter() - t0:6.1f}s] {'FAIL' if bad else 'ok  '} {head} "
                  f"({len(res)} checks, {len(bad)} failed, {len(skipped)} not runnable)",
                  flush=True)
            for r in bad:
                what = r.get("error") or (f"maxabs {r['maxabs']:.3g} rel {r['rel']:.3g} "
                                          f"({r['bound']})")
                print(f"      FAIL {r['check']} {r['tensor']}: {what}", flush=True)
            for r in skipped:
                print(f"      not runnable {r['check']}: {r['error']}", flush=True)
    n_bad = sum(r["ok"] is False for r in results)
    n_ok = sum(r["ok"] is True for r in results)
    print(f"gpu_correctness: {n_ok} checks passed, {n_bad} failed, "
          f"{sum(r['ok'] is None for r in results)} configs not runnable, "
          f"{time.perf_counter() - t0:.0f} s", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"device": device_name, "torch": torch.__version__,
                       "triton": __import__("triton").__version__, "results": results}, f,
                      indent=1)
    return 1 if n_bad else 0


if __name__ == "__main__":
    sys.exit(main())
