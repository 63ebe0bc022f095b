#!/usr/bin/env python3
"""Every GPU backend of suites/h200.toml against the float64 reference, first of all.

Three parts, spread over worker processes (Triton and inductor compile on the CPU, one
kernel at a time per process, so compiling in parallel is what keeps this short; each task
is at most one shape or one tuning candidate, so no task holds the others up):

* ``shapes``: triton_flash forward and backward on a grid of awkward shapes (ragged
  lengths, cross-attention, GQA/MQA, padded head dimensions, d_v != d, windows, a single
  query row) in fp32, bf16 and fp16, with the default launch configuration;
* ``configs``: every tuning candidate of every triton_flash kernel, one task each, for the
  head dims, dtypes and masks of suites/h200.toml, on a shape that specialises like the
  suite's (so the compiled kernels land in Triton's on-disk cache and the suite's tuning
  does not compile again);
* ``backends``: sdpa_flash, sdpa_cudnn, sdpa_efficient and xformers on the bf16 awkward
  shapes, flex on two of them, through the harness (its float64 check and status: an
  unsupported shape or a missing package is ``not runnable`` with the reason);
* ``flex``: every flex job of ``--suite`` (each shape and mode the suite runs), through the
  harness as the suite runs it, first of all: each is a cold inductor compile, and doing
  them here, in parallel with the Triton compiles, fills inductor's on-disk cache so the
  suite's step does not compile them on its critical path.

Every task runs in the correctness harness (``attnbench.measure.correctness``: the run's
worker, one task at a time per process): a process that dies (a segfault) or hangs fails
only the task it was running, and one whose task raised a CUDA fault (which poisons its
CUDA context) is retired; both are replaced by a fresh process for the tasks still to run.
``GPU_CHECK_FAULTS=segv@I,cuda@J`` injects those faults into tasks I and J (indices in the
task list) to rehearse this on a CPU.

Criteria: fp32 relative L2 <= a tenth of the suite's fp32 tolerance (the kernels multiply
fp32 as three TF32 products); bf16/fp16 FlashAttention's: max-abs error <= 2 x that of naive
PyTorch in the same dtype + 1e-3 x max|ref|, and relative L2 within the suite's dtype
tolerance; other backends: the harness's verdict. The JSON (``--out``) is rewritten after
every task, so a run cut short by its time limit still holds what finished. Exit code 1 if
any check failed or the run was interrupted, 2 without a GPU.

Usage: python scripts/gpu_correctness.py [--out FILE.json] [--jobs N] [--suite SUITE]
       [--parts flex,shapes,configs,backends] [--smoke]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import signal
import sys
import time

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
# Each (shape, dtype) compiles three kernels (about 30 s of one core): bf16 on every shape,
# fp16 and fp32 on the few that take every code path (docs/gpu.md, "Budget").
FP16_SHAPES = [SHAPES[i] for i in (2, 4, 7)]
# fp32 compiles slowly (large tiles of 3xTF32 products): a subset with every code path.
FP32_SHAPES = [SHAPES[i] for i in (2, 5)]

# Combos of suites/h200.toml: (dtype, d, mask). Shape (1, 16, 16, 1024, 1024) specialises like
# every case of the suite (lengths and heads divisible by 16, one kv head per q head).
CONFIG_COMBOS = [("bfloat16", d, m) for d in (128, 64) for m in ("causal", "none")]
CONFIG_COMBOS += [("bfloat16", 128, "window(4095,0)"), ("float16", 128, "causal")]
# Every other GPU backend of the suite, through the harness (its own float64 check), on the
# awkward shapes it accepts; flex compiles per shape, so it gets two.
OTHER_BACKENDS = ["sdpa_flash", "sdpa_cudnn", "sdpa_efficient", "xformers"]
FLEX_SHAPES = [0, 2]  # indices into SHAPES


def _check(label, dtype, got, naive, ref, results):
    """Triton's kernels, stricter than the harness's verdict (the module's criteria)."""
    from attnbench.core.accuracy import errors, tolerance

    for name, expected in ref.items():
        t = got[name]
        finite = bool(t.isfinite().all())
        mx, rel = errors(t, expected)
        if dtype == "float32":  # 3xTF32 products: a tenth of the suite's fp32 tolerance
            tol = tolerance(dtype, name) / 10
            ok = finite and rel <= tol
            bound = f"rel<={tol:g}"
        else:
            nmx, nrel = errors(naive[name], expected)
            tol = tolerance(dtype, name)
            slack = 1e-3 * float(expected.abs().max())
            ok = finite and mx <= 2 * nmx + slack and rel <= tol
            bound = f"maxabs<=2*{nmx:.2e}+{slack:.1e}, rel<={tol:g}"
        results.append({"check": label, "tensor": name, "ok": ok, "maxabs": mx, "rel": rel,
                        "bound": bound})


DEVICE = os.environ.get("ATTNBENCH_CHECK_DEVICE", "cuda")  # "cpu" only for --smoke


def _case(shape, dtype, seed=0):
    from attnbench.core.case import Case

    B, Hq, Hk, Nq, Nk, D, Dv, mask = shape
    return Case(batch=B, heads_q=Hq, heads_kv=Hk, seq_q=Nq, seq_k=Nk, head_dim=D, head_dim_v=Dv,
                dtype=dtype, device=DEVICE, mask=mask, mode="fwd_bwd", seed=seed)


def _inputs(shape, dtype, seed=0):
    case = _case(shape, dtype, seed)
    return case, case.make_inputs()


def _grads(fn, inputs):
    q, k, v = (t.detach().clone().requires_grad_(True) for t in (inputs.q, inputs.k, inputs.v))
    out = fn(q, k, v)
    dq, dk, dv = __import__("torch").autograd.grad(out, (q, k, v), inputs.grad_out)
    return {"out": out.detach(), "dq": dq, "dk": dk, "dv": dv}


def run_shape(shape, dtype):
    import torch

    from attnbench.core.reference import case_reference
    from attnbench.core.registry import get_backend
    from attnbench.implementations import triton_flash

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


def run_config(dtype, d, mask, kernel, index):
    """Candidate ``index`` of ``kernel`` (fwd, dkdv or dq) on one suite-like shape: one
    task per candidate, so compiling them spreads over every process."""
    import torch

    from attnbench.core.reference import case_reference
    from attnbench.core.registry import get_backend
    from attnbench.implementations import triton_flash

    K = triton_flash.kernels()
    results = []
    n = 64 if DEVICE == "cpu" else 1024
    case, inputs = _inputs((1, 2 if DEVICE == "cpu" else 16, 2 if DEVICE == "cpu" else 16, n, n,
                            d, d, mask), dtype)
    plan = K.make_plan(case.softmax_scale, case.mask_spec.window)
    q, k, v, go = inputs.q, inputs.k, inputs.v, inputs.grad_out
    ref = case_reference(case, inputs).as_dict()
    naive = _grads(get_backend("naive").build(case, inputs), inputs)
    cfg = K.candidate_configs(kernel, d, d)[index]
    label = f"config {kernel} {cfg} {dtype} d{d} {mask}"
    try:
        o, lse = K.forward(q, k, v, plan, cfg if kernel == "fwd" else None)
        if kernel == "fwd":
            got = {"out": o}
        else:
            delta = K._delta(o, go)
            if kernel == "dkdv":
                dk, dv = torch.empty_like(k), torch.empty_like(v)
                K._launch_dkdv(q, k, v, go, dk, dv, lse, delta, plan, cfg)
                got = {"dk": dk, "dv": dv}
            else:
                dq = torch.empty_like(q)
                K._launch_dq(q, k, v, go, dq, lse, delta, plan, cfg)
                got = {"dq": dq}
        if DEVICE == "cuda":
            torch.cuda.synchronize()
        _check(label, dtype, got, naive, {n: ref[n] for n in got}, results)
    except Exception as exc:  # e.g. out of shared memory: the tuner skips it too
        if K.is_cuda_fault(exc):  # not the candidate's size: the process is poisoned
            raise
        results.append({"check": label, "tensor": "-", "ok": None,
                        "error": f"{type(exc).__name__}: {str(exc).splitlines()[0]}"})
    return results


def backend_task(shape, dtype, backend):
    """Another GPU backend through the harness: its record's status and errors."""
    from attnbench.measure.correctness import check_task

    return check_task(_case(shape, dtype), backend)


def task_label(kind, args) -> str:
    if kind == "config":
        dtype, d, mask, kernel, index = args
        return f"config {kernel} #{index} {dtype} d{d} {mask}"
    if kind == "flex":
        return f"flex {args[0].key}"
    if kind == "shape":
        return f"shape {args[1]} {args[0]}"
    return f"{kind} {args}"


def noop(label):  # the scheduler's own tests: nothing but the harness's plumbing
    return [{"check": label, "tensor": "-", "ok": True}]


def as_task(kind, args):
    """A task of the list as the harness's Task (run in its worker)."""
    from attnbench.measure.correctness import Task, check_task

    label = task_label(kind, args)
    if kind == "backend":
        return backend_task(*args)
    if kind == "flex":
        return check_task(args[0], "flex", label)
    if kind == "noop":
        return Task(noop, (label,), label)
    return Task({"shape": run_shape, "config": run_config}[kind], args, label)


def parse_faults(spec: str, n_tasks: int) -> dict[int, str]:
    """``segv@3,cuda@5`` -> {3: "segv", 5: "cuda"} (GPU_CHECK_FAULTS)."""
    faults = {}
    for item in filter(None, (x.strip() for x in spec.split(","))):
        kind, _, index = item.partition("@")
        if kind not in ("segv", "cuda") or not index.isdigit() or int(index) >= n_tasks:
            raise SystemExit(f"gpu_correctness: GPU_CHECK_FAULTS item {item!r}: expected "
                             f"segv@I or cuda@I with I < {n_tasks}")
        faults[int(index)] = kind
    return faults


def worker_count(requested: int | None = None) -> int:
    """Processes to run: the CPUs this process may use (its affinity mask), not the host's."""
    if requested:
        return requested
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return os.cpu_count() or 2


def run_tasks(tasks, jobs: int, faults: dict[int, str], on_result) -> dict:
    """Every (kind, args) task in the harness's workers (``correctness.run_tasks``)."""
    from attnbench.measure import correctness

    return correctness.run_tasks([as_task(kind, a) for kind, a in tasks], jobs, on_result,
                                 faults)


def suite_flex_jobs(suite_name: str | None, device: str) -> list:
    """Every (case) the suite runs on flex on ``device``: each shape and mode is a compile."""
    if not suite_name:
        return []
    from attnbench.core.errors import BadInput
    from attnbench.runs.suite import load_suite

    try:
        jobs = load_suite(suite_name).jobs_on(device)
    except BadInput as exc:  # step 2 will say the same; step 1 checks the rest
        print(f"gpu_correctness: no flex warm-up: {exc}", flush=True)
        return []
    return [case for case, backend in jobs if backend == "flex"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="write every check as JSON here")
    ap.add_argument("--jobs", type=int, help="processes (default: the CPUs of the affinity "
                    "mask; ptxas and inductor compile on one core each)")
    ap.add_argument("--parts", default="flex,shapes,configs,backends")
    ap.add_argument("--suite", help="warm up every flex job of this suite (name or .toml)")
    ap.add_argument("--smoke", action="store_true",
                    help="CPU dry run of this script through the Triton interpreter, tiny shapes")
    args = ap.parse_args(argv)
    global SHAPES, FP16_SHAPES, FP32_SHAPES, CONFIG_COMBOS
    signal.signal(signal.SIGINT, _interrupt_once)
    if args.out:  # from the first second: a step cut before any task still says so
        _write(args.out, {"tasks": None, "finished": 0, "results": [],
                          "state": "starting (importing torch and triton)"})
    if args.smoke:  # before torch/triton: the kernels must be defined interpreted
        os.environ["TRITON_INTERPRET"] = "1"
        os.environ["ATTNBENCH_CHECK_DEVICE"] = "cpu"
        SHAPES = [(1, 2, 1, 33, 47, 40, 24, "window(5,3)"), (1, 2, 2, 1, 20, 16, 16, "causal")]
        FP16_SHAPES = SHAPES[1:]
        FP32_SHAPES = SHAPES[:1]
        CONFIG_COMBOS = [("bfloat16", 64, "causal")]
        OTHER_BACKENDS[:] = ["sdpa_flash", "sdpa_cudnn"]
    elif os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        print("gpu_correctness: TRITON_INTERPRET is set; unset it to check the compiled kernels")
        return 2
    import torch

    if not args.smoke and not torch.cuda.is_available():
        print("gpu_correctness: no CUDA GPU visible to torch; nothing to check here")
        return 2
    parts = set(args.parts.split(","))
    from attnbench.implementations import triton_flash

    K = triton_flash.kernels()
    tasks = []  # the longest first: flex compiles through inductor, shapes compile 3 kernels
    if "flex" in parts:
        flex_cases = suite_flex_jobs(args.suite, "cpu" if args.smoke else "cuda")
        tasks += [("flex", (case,)) for case in flex_cases]
        print(f"gpu_correctness: flex warm-up, {len(flex_cases)} compiles (every flex shape and "
              f"mode of {args.suite or 'no suite'}): "
              + (", ".join(c.key for c in flex_cases) or "none"), flush=True)
    if "backends" in parts and not args.smoke:
        tasks += [("backend", (SHAPES[i], "bfloat16", "flex")) for i in FLEX_SHAPES]
    if "shapes" in parts:
        tasks += [("shape", (s, "bfloat16")) for s in SHAPES]
        tasks += [("shape", (s, "float16")) for s in FP16_SHAPES]
        tasks += [("shape", (s, "float32")) for s in FP32_SHAPES]
    if "configs" in parts:  # every combo's forward first: a dK/dV or dQ task runs the
        for kernel in ("fwd", "dkdv", "dq"):  # default forward, by then in the disk cache
            for dtype, d, mask in CONFIG_COMBOS:
                count = 1 if args.smoke else len(K.candidate_configs(kernel, d, d))
                tasks += [("config", (dtype, d, mask, kernel, i)) for i in range(count)]
    if "backends" in parts:
        tasks += [("backend", (s, "bfloat16", b)) for s in SHAPES for b in OTHER_BACKENDS]
    faults = parse_faults(os.environ.get("GPU_CHECK_FAULTS", ""), len(tasks))
    jobs = worker_count(args.jobs)
    device_name = "cpu (interpreter)" if args.smoke else torch.cuda.get_device_name()
    print(f"gpu_correctness: {len(tasks)} tasks on {device_name} with {jobs} processes"
          + (f"; injected faults {faults}" if faults else ""), flush=True)
    header = {"device": device_name, "torch": torch.__version__,
              "triton": __import__("triton").__version__, "tasks": len(tasks),
              "triton_cache_dir": os.environ.get("TRITON_CACHE_DIR", "(Triton's default)")}
    t0 = time.perf_counter()
    results = []
    finished = set()

    def on_result(res):
        results.extend(res)
        finished.update(r["task"] for r in res)
        _report(res, time.perf_counter() - t0)
        if args.out:  # as results come: a run cut short still says what it checked
            _write(args.out, header | {"finished": len(finished), "state": "running",
                                       "results": results})

    if args.out:
        _write(args.out, header | {"finished": 0, "state": "running", "results": []})
    try:
        stats = run_tasks(tasks, jobs, faults, on_result)
    except KeyboardInterrupt:  # the time limit (timeout -s INT): keep what finished
        print(f"gpu_correctness: interrupted after {len(finished)} of {len(tasks)} tasks",
              flush=True)
        if args.out:
            _write(args.out, header | {"finished": len(finished), "results": results,
                                       "state": "interrupted (time limit)"})
        for child in mp.active_children():  # no orphan may hold the GPU during step 2
            child.kill()
        os._exit(1)  # now: waiting for the workers could outlast timeout's grace period
    if args.out:
        _write(args.out, header | {"finished": len(finished), "results": results,
                                   "state": "done"} | stats)
    n_bad = sum(r["ok"] is False for r in results)
    n_ok = sum(r["ok"] is True for r in results)
    print(f"gpu_correctness: {n_ok} checks passed, {n_bad} failed, "
          f"{sum(r['ok'] is None for r in results)} not runnable, "
          f"{stats['crashed']} tasks crashed their process, {stats['retired']} processes "
          f"retired after a CUDA fault, {time.perf_counter() - t0:.0f} s", flush=True)
    return 1 if n_bad else 0


def _interrupt_once(signum, frame):
    """The time limit: `timeout` sends SIGINT to this process and then to its whole group,
    so it comes twice; the second must not interrupt the saving of what finished."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    raise KeyboardInterrupt


def _report(res: list[dict], elapsed: float) -> None:
    bad = [r for r in res if r["ok"] is False]
    skipped = [r for r in res if r["ok"] is None]
    head = res[0]["check"] if res else "?"
    print(f"  [{elapsed:6.1f}s] {'FAIL' if bad else 'ok  '} {head} "
          f"({len(res)} checks, {len(bad)} failed, {len(skipped)} not runnable)", flush=True)
    for r in bad:
        what = r.get("error") or (f"maxabs {r['maxabs']:.3g} rel {r['rel']:.3g} "
                                  f"({r['bound']})")
        print(f"      FAIL {r['check']} {r['tensor']}: {what}", flush=True)
    for r in skipped:
        print(f"      not runnable {r['check']}: {r['error']}", flush=True)


def _write(path: str, doc: dict) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1)
    os.replace(tmp, path)


if __name__ == "__main__":
    sys.exit(main())
