"""The GPU check's task list (``scripts/gpu_correctness.py``, step 1 of
``scripts/gpu_check.sh``): every GPU backend against the float64 reference, first of all.

The tasks run in the correctness harness (``measure/correctness.py``: the run's worker,
``jobs`` processes at a time), each at most one shape or one tuning candidate, so that
Triton and inductor compile in parallel and no task holds the others up:

* ``flex``: every flex job of the suite (each shape and mode it runs), as the suite runs
  it: each is a cold inductor compile, and doing them here fills inductor's on-disk cache
  so the suite's step does not compile them on its critical path;
* ``shapes``: triton_flash forward and backward on awkward shapes (ragged lengths,
  cross-attention, GQA/MQA, padded head dimensions, d_v != d, windows, a single query row)
  in bf16, fp16 and fp32, with the default launch configuration;
* ``configs``: every tuning candidate of every triton_flash kernel, one task each, for the
  head dims, dtypes and masks of suites/h200.toml, on a shape that specialises like the
  suite's (so the compiled kernels land in Triton's cache and the suite's tuning does not
  compile again);
* ``backends``: sdpa_flash, sdpa_cudnn, sdpa_efficient and xformers on the bf16 awkward
  shapes, flex on two of them, by the harness's verdict (an unsupported shape or a missing
  package is ``not runnable`` with the reason).

Criteria for triton_flash: fp32 relative L2 <= a tenth of the suite's fp32 tolerance (the
kernels multiply fp32 as three TF32 products); bf16/fp16 FlashAttention's: max-abs error
<= 2 x that of naive PyTorch in the same dtype + 1e-3 x max|ref|, and relative L2 within
the suite's dtype tolerance.

``smoke``: the same plumbing on a CPU through the Triton interpreter, on tiny shapes.
"""

from __future__ import annotations

from dataclasses import dataclass

from attnbench.core.case import Case
from attnbench.measure.correctness import Task, check_task


@dataclass(frozen=True)
class Grid:
    """What the check covers: shapes are (batch, heads_q, heads_kv, seq_q, seq_k, d, d_v,
    mask); combos are the suite's (dtype, d, mask)."""

    device: str
    shapes: list
    fp16_shapes: list
    fp32_shapes: list
    combos: list
    others: list  # every other GPU backend of the suite, by the harness's verdict
    flex_shapes: list  # indices into shapes: flex compiles per shape, so two
    config_heads: int
    config_seq: int


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
# Each (shape, dtype) compiles three kernels: bf16 on every shape, fp16 and fp32 (slow to
# compile: large tiles of 3xTF32 products) on the few that take every code path.
# Heads and lengths of the configs' shape divisible by 16, one kv head per q head: it
# specialises like every case of suites/h200.toml.
GPU = Grid("cuda", SHAPES, [SHAPES[i] for i in (2, 4, 7)], [SHAPES[i] for i in (2, 5)],
           [("bfloat16", d, m) for d in (128, 64) for m in ("causal", "none")]
           + [("bfloat16", 128, "window(4095,0)"), ("float16", 128, "causal")],
           ["sdpa_flash", "sdpa_cudnn", "sdpa_efficient", "xformers"], [0, 2], 16, 1024)
_TINY = [(1, 2, 1, 33, 47, 40, 24, "window(5,3)"), (1, 2, 2, 1, 20, 16, 16, "causal")]
SMOKE = Grid("cpu", _TINY, _TINY[1:], _TINY[:1], [("bfloat16", 64, "causal")],
             ["sdpa_flash", "sdpa_cudnn"], [], 2, 64)


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


def _case(shape, dtype, device, seed=0) -> Case:
    B, Hq, Hk, Nq, Nk, D, Dv, mask = shape
    return Case(batch=B, heads_q=Hq, heads_kv=Hk, seq_q=Nq, seq_k=Nk, head_dim=D, head_dim_v=Dv,
                dtype=dtype, device=device, mask=mask, mode="fwd_bwd", seed=seed)


def _grads(fn, inputs):
    import torch

    q, k, v = (t.detach().clone().requires_grad_(True) for t in (inputs.q, inputs.k, inputs.v))
    out = fn(q, k, v)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), inputs.grad_out)
    return {"out": out.detach(), "dq": dq, "dk": dk, "dv": dv}


def run_shape(shape, dtype, device="cuda"):
    """triton_flash forward and backward on one shape, default launch configuration."""
    import torch

    from attnbench.core.reference import case_reference
    from attnbench.core.registry import get_backend
    from attnbench.implementations import triton_flash

    K = triton_flash.kernels()
    results = []
    case = _case(shape, dtype, device)
    inputs = case.make_inputs()
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
    _check(f"shape {dtype} {case.key}", dtype, got, naive, ref, results)
    del got, naive, ref
    if device == "cuda":
        torch.cuda.empty_cache()
    return results


def run_config(dtype, d, mask, kernel, index, grid: Grid = GPU):
    """Candidate ``index`` of ``kernel`` (fwd, dkdv or dq) on one suite-like shape: one
    task per candidate, so compiling them spreads over every process."""
    import torch

    from attnbench.core.reference import case_reference
    from attnbench.core.registry import get_backend
    from attnbench.implementations import triton_flash

    K = triton_flash.kernels()
    results = []
    h, n = grid.config_heads, grid.config_seq
    case = _case((1, h, h, n, n, d, d, mask), dtype, grid.device)
    inputs = case.make_inputs()
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
        if grid.device == "cuda":
            torch.cuda.synchronize()
        _check(label, dtype, got, naive, {n: ref[n] for n in got}, results)
    except Exception as exc:  # e.g. out of shared memory: the tuner skips it too
        if K.is_cuda_fault(exc):  # not the candidate's size: the process is poisoned
            raise
        results.append({"check": label, "tensor": "-", "ok": None,
                        "error": f"{type(exc).__name__}: {str(exc).splitlines()[0]}"})
    return results


def noop(label):  # the harness's plumbing alone (its tests)
    return [{"check": label, "tensor": "-", "ok": True}]


def as_task(kind: str, args: tuple, grid: Grid = GPU) -> Task:
    """One entry of the task list as the harness's Task."""
    if kind == "backend":
        shape, dtype, backend = args
        return check_task(_case(shape, dtype, grid.device), backend)
    if kind == "flex":
        return check_task(args[0], "flex", f"flex {args[0].key}")
    if kind == "shape":
        return Task(run_shape, (*args, grid.device), f"shape {args[1]} {args[0]}")
    if kind == "config":
        dtype, d, mask, kernel, index = args
        return Task(run_config, (*args, grid), f"config {kernel} #{index} {dtype} d{d} {mask}")
    if kind == "noop":
        return Task(noop, (f"noop {args}",), f"noop {args}")
    raise ValueError(f"task kind {kind!r}: allowed: backend, flex, shape, config, noop")


def task_list(parts, flex_cases: list[Case], smoke: bool = False) -> list[Task]:
    """The tasks, the longest first: flex compiles through inductor, shapes compile three
    kernels; every combo's forward before its dK/dV and dQ (which run the default forward,
    by then in the disk cache)."""
    from attnbench.implementations import triton_flash

    grid = SMOKE if smoke else GPU
    tasks = [("flex", (case,)) for case in flex_cases] if "flex" in parts else []
    if "backends" in parts:
        tasks += [("backend", (grid.shapes[i], "bfloat16", "flex")) for i in grid.flex_shapes]
    if "shapes" in parts:
        for dtype, shapes in (("bfloat16", grid.shapes), ("float16", grid.fp16_shapes),
                              ("float32", grid.fp32_shapes)):
            tasks += [("shape", (s, dtype)) for s in shapes]
    if "configs" in parts:
        K = triton_flash.kernels()
        for kernel in ("fwd", "dkdv", "dq"):
            for dtype, d, mask in grid.combos:
                count = 1 if smoke else len(K.candidate_configs(kernel, d, d))
                tasks += [("config", (dtype, d, mask, kernel, i)) for i in range(count)]
    if "backends" in parts:
        tasks += [("backend", (s, "bfloat16", b)) for s in grid.shapes for b in grid.others]
    return [as_task(kind, args, grid) for kind, args in tasks]


def parse_faults(spec: str, n_tasks: int) -> dict[int, str]:
    """``segv@3,cuda@5`` -> {3: "segv", 5: "cuda"} (GPU_CHECK_FAULTS: rehearse a crashed
    worker and a poisoned CUDA context on a CPU)."""
    faults = {}
    for item in filter(None, (x.strip() for x in spec.split(","))):
        kind, _, index = item.partition("@")
        if kind not in ("segv", "cuda") or not index.isdigit() or int(index) >= n_tasks:
            raise SystemExit(f"gpu_correctness: GPU_CHECK_FAULTS item {item!r}: expected "
                             f"segv@I or cuda@I with I < {n_tasks}")
        faults[int(index)] = kind
    return faults


def progress_lines(rows: list[dict], elapsed_s: float) -> list[str]:
    """A finished task as the log shows it: one line, then one per failed or skipped check."""
    bad = [r for r in rows if r["ok"] is False]
    skipped = [r for r in rows if r["ok"] is None]
    head = rows[0]["check"] if rows else "?"
    out = [f"  [{elapsed_s:6.1f}s] {'FAIL' if bad else 'ok  '} {head} "
           f"({len(rows)} checks, {len(bad)} failed, {len(skipped)} not runnable)"]
    for r in bad:
        what = r.get("error") or (f"maxabs {r['maxabs']:.3g} rel {r['rel']:.3g} "
                                  f"({r['bound']})")
        out.append(f"      FAIL {r['check']} {r['tensor']}: {what}")
    out += [f"      not runnable {r['check']}: {r['error']}" for r in skipped]
    return out


def summary_line(rows: list[dict], stats: dict, elapsed_s: float) -> str:
    """The check's last line: checks passed, failed and not runnable, and the processes lost."""
    said = {k: sum(r["ok"] is v for r in rows) for k, v in
            (("passed", True), ("failed", False), ("not runnable", None))}
    return (f"gpu_correctness: {said['passed']} checks passed, {said['failed']} failed, "
            f"{said['not runnable']} not runnable, {stats['crashed']} tasks crashed their "
            f"process, {stats['retired']} processes retired after a CUDA fault, "
            f"{elapsed_s:.0f} s")
