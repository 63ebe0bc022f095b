"""triton_flash: forward and backward against the float64 reference, through the Triton
interpreter on CPU (``TRITON_INTERPRET=1``, set below) or compiled on CUDA when the variable
is explicitly ``0`` (``TRITON_INTERPRET=0 pytest tests/implementations/test_triton_flash.py``
on a GPU).

Triton picks interpreter or compiler when a kernel is *defined* (``@triton.jit`` runs), not
when ``triton`` is imported, so setting the variable here, at collection, is early enough:
the backend imports its kernel module on first use. ``test_interpreter_mode_is_active``
fails loudly if something imported the kernels compiled before this file was collected.

Accuracy: fp32 must match float64 closely; for bf16/fp16 the criterion is FlashAttention's:
the kernel's error may be at most twice the error of the same-dtype naive PyTorch
implementation, plus a small absolute slack.
"""

from __future__ import annotations

import os

ON_GPU = os.environ.get("TRITON_INTERPRET", "").strip() == "0"
if not ON_GPU:
    os.environ["TRITON_INTERPRET"] = "1"

import itertools  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import re  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import textwrap  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

pytest.importorskip("triton")

from attnbench.core.case import Case, Inputs  # noqa: E402
from attnbench.core.masks import MaskSpec  # noqa: E402
from attnbench.core.reference import case_reference  # noqa: E402
from attnbench.core.registry import get_backend  # noqa: E402

DEVICE = "cuda" if ON_GPU else "cpu"
if ON_GPU and not torch.cuda.is_available():
    pytest.skip("TRITON_INTERPRET=0 asks for the compiled kernels, but no CUDA GPU is present",
                allow_module_level=True)

ROOT = Path(__file__).resolve().parents[2]
BACKEND = get_backend("triton_flash")
# fp32 relative L2 bound: the interpreter multiplies in fp32; on a GPU fp32 runs as 3xTF32.
FP32_TOL = 2e-5 if ON_GPU else 2e-6


def kernels():
    from attnbench.implementations import triton_flash

    return triton_flash.kernels()


def run_backend(case: Case, inputs: Inputs, backend=BACKEND):
    """Output and gradients of a backend's build() on the case's inputs (float64 copies)."""
    q, k, v = (t.detach().clone().requires_grad_(True) for t in (inputs.q, inputs.k, inputs.v))
    f = backend.build(case, inputs)
    out = f(q, k, v)
    out.backward(inputs.grad_out)
    return {"out": out.detach(), "dq": q.grad, "dk": k.grad, "dv": v.grad}


def rel_l2(a: torch.Tensor, ref: torch.Tensor) -> float:
    a = a.detach().to(ref.device, torch.float64)
    den = float(ref.norm())
    num = float((a - ref).norm())
    return num / den if den > 0 else num


def max_abs(a: torch.Tensor, ref: torch.Tensor) -> float:
    return float((a.detach().to(ref.device, torch.float64) - ref).abs().max())


def make_case(nq, nk, d, mask, hq=2, hkv=2, dtype="float32", dv=None, batch=1, scale=None,
              seed=0) -> Case:
    return Case(batch=batch, heads_q=hq, heads_kv=hkv, seq_q=nq, seq_k=nk, head_dim=d,
                head_dim_v=dv or d, dtype=dtype, device=DEVICE, mask=mask, mode="fwd_bwd",
                seed=seed, scale=scale)


# ---- availability -----------------------------------------------------------------------
def test_interpreter_mode_is_active():
    from attnbench.implementations import triton_flash

    if ON_GPU:
        assert not triton_flash.interpreter_mode()
    else:
        assert triton_flash.interpreter_mode()
        assert kernels().INTERPRET, "kernels were compiled before TRITON_INTERPRET=1 was set"
    assert BACKEND.is_available() == (True, "")
    assert BACKEND.not_supported_reasons(make_case(16, 16, 16, "causal")) == []


def test_cpu_without_interpreter_is_refused_with_the_reason(monkeypatch):
    from attnbench.implementations import triton_flash

    monkeypatch.setattr(triton_flash, "interpreter_mode", lambda: False)
    case = make_case(16, 16, 16, "none").replace(device="cpu")
    assert BACKEND.not_supported_reasons(case) == [triton_flash.CPU_REASON]
    assert "TRITON_INTERPRET=1" in triton_flash.CPU_REASON
    if not torch.cuda.is_available():
        assert BACKEND.is_available() == (False, triton_flash.CPU_REASON)


def test_missing_triton_is_unavailable(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "triton" else real(name, *a))
    ok, why = BACKEND.is_available()
    assert not ok and "triton" in why


def test_capabilities_reject_what_the_kernel_does_not_do():
    assert BACKEND.not_supported_reasons(make_case(16, 16, 16, "block_sparse(local)"))
    assert BACKEND.not_supported_reasons(make_case(16, 16, 16, "none", dtype="float64"))
    assert BACKEND.not_supported_reasons(make_case(16, 16, 512, "none"))
    assert BACKEND.not_supported_reasons(make_case(16, 16, 64, "none", dv=320))
    assert BACKEND.not_supported_reasons(make_case(16, 16, 256, "none"))  # fp32 tiles too big
    assert not BACKEND.not_supported_reasons(make_case(16, 16, 256, "none", dtype="bfloat16"))


# ---- fp32: tight agreement with float64 ---------------------------------------------------
FP32_CASES = [
    # (seq_q, seq_k, d, mask, heads_q, heads_kv, d_v)
    (17, 17, 16, "none", 2, 2, None),
    (113, 64, 40, "causal", 4, 2, None),  # cross, GQA; rows 0..48 see no key at all
    (64, 113, 64, "window(20,5)", 2, 1, None),  # MQA, both window edges, ragged tail
    (1, 113, 16, "causal", 2, 2, None),  # one query row sees everything
    (33, 17, 8, "window(3,inf)", 2, 2, 24),  # left-only window, d_v != d, tiny head dim
]


@pytest.mark.parametrize("nq,nk,d,mask,hq,hkv,dv", FP32_CASES,
                         ids=[f"q{c[0]}-k{c[1]}-d{c[2]}-{c[3]}-h{c[4]}x{c[5]}" for c in FP32_CASES])
def test_fp32_matches_float64(nq, nk, d, mask, hq, hkv, dv):
    case = make_case(nq, nk, d, mask, hq, hkv, dv=dv)
    inputs = case.make_inputs()
    got = run_backend(case, inputs)
    ref = case_reference(case, inputs).as_dict()
    for name, expected in ref.items():
        assert got[name].shape == expected.shape, name
        assert bool(torch.isfinite(got[name]).all()), name
        assert rel_l2(got[name], expected) < FP32_TOL, (name, rel_l2(got[name], expected))


def test_scale_argument_is_used():
    case = make_case(24, 40, 16, "causal", scale=0.7)
    inputs = case.make_inputs()
    got = run_backend(case, inputs)
    ref = case_reference(case, inputs).as_dict()
    default = case_reference(case.replace(scale=None), inputs).as_dict()
    assert rel_l2(got["out"], ref["out"]) < FP32_TOL
    assert rel_l2(got["dq"], ref["dq"]) < FP32_TOL
    assert rel_l2(default["out"], ref["out"]) > 1e-2  # the scale matters in this case


# ---- low precision: FlashAttention's criterion against naive PyTorch ----------------------
LOW_CASES = [
    (64, 64, 64, "causal", 2, 2, "bfloat16"),
    (113, 47, 40, "window(16,16)", 4, 2, "bfloat16"),
    (17, 80, 64, "none", 2, 1, "float16"),
    (1, 20, 16, "causal", 2, 2, "bfloat16"),  # few numbers: needs round-to-nearest casts
]


@pytest.mark.parametrize("nq,nk,d,mask,hq,hkv,dtype", LOW_CASES,
                         ids=[f"{c[6]}-q{c[0]}-k{c[1]}-d{c[2]}-{c[3]}" for c in LOW_CASES])
def test_low_precision_within_twice_naive_error(nq, nk, d, mask, hq, hkv, dtype):
    case = make_case(nq, nk, d, mask, hq, hkv, dtype=dtype)
    inputs = case.make_inputs()
    got = run_backend(case, inputs)
    naive = run_backend(case, inputs, get_backend("naive"))
    ref = case_reference(case, inputs).as_dict()
    for name, expected in ref.items():
        assert got[name].dtype == case.torch_dtype
        slack = 1e-3 * float(expected.abs().max())
        ours, theirs = max_abs(got[name], expected), max_abs(naive[name], expected)
        assert ours <= 2 * theirs + slack, (name, "max-abs", ours, theirs)
        ours, theirs = rel_l2(got[name], expected), rel_l2(naive[name], expected)
        assert ours <= 2 * theirs + 1e-3, (name, "rel-L2", ours, theirs)


# ---- masked blocks are skipped, empty rows are zero -----------------------------------------
def _largest_blocks() -> tuple[int, int]:
    """(BLOCK_M, BLOCK_N) bounds over every configuration the kernels may run with here."""
    K = kernels()
    if K.INTERPRET:
        return K.INTERPRETER_CONFIG.block_m, K.INTERPRETER_CONFIG.block_n
    configs = [c for kern in ("fwd", "dkdv", "dq") for eb in (2, 4)
               for c in K.candidate_configs(kern, 16, 16, eb)]
    return max(c.block_m for c in configs), max(c.block_n for c in configs)


def test_fully_masked_key_blocks_are_never_read():
    """Keys no query can see are poisoned with NaN: visiting their block would spread NaN
    (0 * NaN = NaN in P @ V), so finite, correct results prove those blocks were skipped."""
    _, bn = _largest_blocks()
    nq, left = 16, 4
    nk = 3 * bn + 32  # query i sees keys [i + nk - nq - left, i + nk - nq]
    dead = ((nk - nq - left) // bn) * bn  # whole key blocks nobody sees
    assert dead >= 3 * bn - bn
    case = make_case(nq, nk, 16, f"window({left},0)")
    inputs = case.make_inputs()
    k, v = inputs.k.clone(), inputs.v.clone()
    k[:, :, :dead] = float("nan")
    v[:, :, :dead] = float("nan")
    got = run_backend(case, Inputs(inputs.q, k, v, inputs.grad_out))
    ref = case_reference(case, inputs).as_dict()
    for name, expected in ref.items():
        assert bool(torch.isfinite(got[name]).all()), name
        assert rel_l2(got[name], expected) < FP32_TOL, name
    assert bool((got["dk"][:, :, :dead] == 0).all()) and bool((got["dv"][:, :, :dead] == 0).all())


def test_rows_without_visible_keys_are_zero_and_never_read():
    """Causal with seq_q > seq_k: the first seq_q - seq_k rows see no key. Their q and dO are
    NaN, yet the outputs are 0 there, dq is 0 there, and the rest matches the clean reference."""
    bm, _ = _largest_blocks()
    nk = 16
    empty = 3 * bm  # whole query blocks of empty rows
    nq = nk + empty
    case = make_case(nq, nk, 16, "causal")
    inputs = case.make_inputs()
    q, go = inputs.q.clone(), inputs.grad_out.clone()
    q[:, :, :empty] = float("nan")
    go[:, :, :empty] = float("nan")
    got = run_backend(case, Inputs(q, inputs.k, inputs.v, go))
    ref = case_reference(case, inputs).as_dict()
    assert bool((got["out"][:, :, :empty] == 0).all())
    assert bool((got["dq"][:, :, :empty] == 0).all())
    for name, expected in ref.items():
        assert bool(torch.isfinite(got[name]).all()), name
        assert rel_l2(got[name], expected) < FP32_TOL, name


def test_strided_inputs_are_read_in_place():
    """(B, N, H, D) storage viewed as (B, H, N, D): no contiguity is required."""
    case = make_case(20, 36, 40, "causal", 2, 1)
    inputs = case.make_inputs()
    q, k, v, go = (t.transpose(1, 2).contiguous().transpose(1, 2)
                   for t in (inputs.q, inputs.k, inputs.v, inputs.grad_out))
    assert not q.is_contiguous()
    got = run_backend(case, Inputs(q, k, v, go))
    ref = case_reference(case, inputs).as_dict()
    for name, expected in ref.items():
        assert rel_l2(got[name], expected) < FP32_TOL, name


# ---- through the public API and the runner ---------------------------------------------------
def test_public_attention_is_differentiable():
    import attnbench

    g = torch.Generator().manual_seed(1)
    q = torch.randn(1, 2, 12, 16, generator=g, device="cpu").to(DEVICE).requires_grad_(True)
    k = torch.randn(1, 1, 20, 16, generator=g).to(DEVICE).requires_grad_(True)
    v = torch.randn(1, 1, 20, 16, generator=g).to(DEVICE).requires_grad_(True)
    out = attnbench.attention(q, k, v, backend="triton_flash", window=(5, 0), scale=0.3)
    out.square().sum().backward()
    ref_case = Case(batch=1, heads_q=2, heads_kv=1, seq_q=12, seq_k=20, head_dim=16,
                    head_dim_v=16, device=DEVICE, mask="window(5,0)", scale=0.3)
    ref = case_reference(ref_case, Inputs(q, k, v, (2 * out).detach()), need_grads=True)
    assert rel_l2(out, ref.out) < FP32_TOL
    assert rel_l2(q.grad, ref.dq) < 5 * FP32_TOL and rel_l2(k.grad, ref.dk) < 5 * FP32_TOL


def test_runner_records_ok_with_kernel_extras():
    from attnbench.measure.execute import CaseCache, execute
    from attnbench.measure.timing import TimingBudget

    case = Case(batch=1, heads_q=2, heads_kv=2, seq_q=17, seq_k=17, head_dim=16, head_dim_v=16,
                device=DEVICE, mask="causal", mode="bwd")
    rec = execute(case, "triton_flash", TimingBudget(0.0, 0.0, 1, 1, 1), CaseCache()).to_row()
    assert rec["status"] == "ok", rec.get("reason")
    assert rec["err_impl_dk_rel"] < 5 * FP32_TOL
    assert rec["kernel"].startswith("triton_flash[causal] fwd=")
    assert "compile_s" in rec


# ---- tuning data and the GPU compile ---------------------------------------------------------
def test_candidate_configs_are_hopper_tiles():
    K = kernels()
    for kernel, elem_bytes in itertools.product(("fwd", "dkdv", "dq"), (2, 4)):
        for d in (16, 40, 64, 80, 96, 112, 128, 256):
            configs = K.candidate_configs(kernel, d, d, elem_bytes)
            assert configs and len(set(configs)) == len(configs)
            for c in configs:
                resident, step = ((c.block_n, c.block_m) if kernel == "dkdv"
                                  else (c.block_m, c.block_n))
                assert resident in (64, 128) and step in (32, 64, 128), (kernel, d, c)
                assert c.num_warps in (4, 8) and 2 <= c.num_stages <= 4
    assert K.head_block(40) == 64 and K.head_block(8) == 16 and K.head_block(256) == 256


def _nvidia_backend_present() -> bool:
    try:
        from triton.backends import backends

        return "nvidia" in backends
    except Exception:
        return False


@pytest.mark.skipif(not _nvidia_backend_present(), reason="Triton's NVIDIA backend is missing")
def test_kernels_compile_for_hopper_without_a_gpu():
    """The interpreter accepts code the compiler rejects: compile each kernel for sm_90
    (ptxas included) in a fresh process, with the window mask (both edges) and a padded
    head dimension, which take every code path, and check the shared memory fits an H100."""
    script = textwrap.dedent("""
        import os, sys
        os.environ.pop("TRITON_INTERPRET", None)
        import torch
        import triton
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource
        from attnbench.implementations import _triton_flash_kernels as K
        assert not K.INTERPRET
        from attnbench.implementations import _triton_flash_meta as M
        D = 96
        plan = K.Plan(scale=1.0, has_left=True, has_right=True, left=7, right=0)
        for name, fn in K.KERNELS.items():
            cfg = K.candidate_configs(name, D, D)[0]
            consts = K.launch_constants(D, D, plan, cfg, torch.bfloat16)
            sig, constexprs, attrs = M.launch_signature(fn, consts, "bf16", K.POINTERS,
                                                        K.FP32_POINTERS)
            assert sig["LSE"] == "*fp32" and sig["Q"] == "*bf16", sig
            for unit in ("GROUP", "sqd", "s_dkd", "s_dvd"):  # as a launch specialises them
                if unit in fn.arg_names:
                    assert constexprs[(fn.arg_names.index(unit),)] == 1, (unit, constexprs)
            assert (fn.arg_names.index("LEFT"),) not in attrs, attrs
            src = ASTSource(fn=fn, signature=sig, constexprs=constexprs, attrs=attrs)
            ck = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                                options={"num_warps": cfg.num_warps,
                                         "num_stages": cfg.num_stages})
            assert ck.metadata.shared <= 227 * 1024, (name, ck.metadata.shared)
            assert "wgmma" in ck.asm["ptx"], name
            print(name, cfg, ck.metadata.shared)
    """)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_DEFAULT_FP_FUSION"] = "1"
    proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("\n") == 3


@pytest.mark.skipif(not ON_GPU and not _nvidia_backend_present(),
                    reason="Triton's NVIDIA backend is missing")
def test_records_carry_config_and_compiled_metadata(tmp_path):
    """triton_config always; triton_compiled from the GPU binary, or, under the interpreter,
    from a compile for sm_90 when the record is profiled (it costs a process)."""
    from attnbench.measure.execute import CaseCache, execute_group
    from attnbench.measure.timing import TimingBudget

    case = Case(batch=1, heads_q=1, heads_kv=1, seq_q=16, seq_k=16, head_dim=16,
                head_dim_v=16, dtype="bfloat16", device=DEVICE, mask="causal")
    rec = execute_group([(case, "triton_flash")], TimingBudget(0.0, 0.0, 1, 1, 1), CaseCache(),
                        profile_dir=str(tmp_path))[0]
    assert rec.status == "ok", rec.reason
    K = kernels()
    inputs = case.make_inputs()
    ran = K.config_for("fwd", inputs.q, inputs.k, inputs.v,
                       K.make_plan(case.softmax_scale, (math.inf, 0)))
    assert rec.info["triton_config"] == {"fwd": {"block_m": ran.block_m, "block_n": ran.block_n,
                                                 "num_warps": ran.num_warps,
                                                 "num_stages": ran.num_stages}}
    source = rec.info["triton_compiled_source"]
    assert source.startswith("gpu binary" if ON_GPU else "sm_90 compile without a GPU"), source
    fwd = rec.info["triton_compiled"]["fwd"]
    assert 0 < fwd["registers"] <= 255 and fwd["spill_bytes"] >= 0
    assert 0 < fwd["shared_bytes"] <= 227 * 1024
    if not ON_GPU:  # what was compiled: a GPU's untuned configuration, not the interpreter's
        assert fwd["config"] == str(K.candidate_configs("fwd", 16, 16, 2)[0])
    assert "profile_trace" in rec.info


def test_reference_mask_convention_matches_kernel_plan():
    K = kernels()
    assert K.make_plan(1.0, MaskSpec.parse("causal").window).kind == "causal"
    assert K.make_plan(1.0, MaskSpec.parse("none").window).kind == "none"
    plan = K.make_plan(1.0, MaskSpec.parse("window(7,inf)").window)
    assert (plan.has_left, plan.has_right, plan.left, plan.kind) == (True, False, 7, "window")
    assert math.isclose(K.LOG2E, 1 / math.log(2))


# ---- the GPU scripts, as far as a CPU can check them ----------------------------------------
@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_gpu_check_without_a_gpu_says_so_in_one_line(tmp_path):
    out = tmp_path / "out"
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), str(out)],
                          cwd=ROOT, env={**os.environ, "PYTHON": sys.executable},
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpu_check: no CUDA GPU on this machine ("), \
        proc.stdout + proc.stderr
    assert not out.exists()  # nothing was run, nothing written


REHEARSAL_SUITE = """
name = "tiny_rehearsal"
backends = ["naive", "sdpa"]
[timing]
warmup_s = 0.001
budget_s = 0.05
min_reps = 5
max_reps = 5
[axes]
heads_q = 2
head_dim = 16
seq_len = [64, 128]

[[claim]]
text = "sdpa is at least 0.001x as fast as naive"
source = "the rehearsal test"
kind = "ratio"
numerator = "naive"
denominator = "sdpa"
where = { seq_len = 128 }
expected = [0.001]
unit = "x"
"""


@pytest.mark.slow
def test_gpu_check_rehearsal_with_faults_leaves_four_files_that_hold_the_whole_check(tmp_path):
    """The GPU check's plumbing end to end on the CPU (GPU_CHECK_REHEARSAL), with the faults a
    first GPU run may meet injected: a step-1 task that segfaults its process (task 1), one
    whose CUDA context is poisoned (task 4: an injected fault fails every later task of its
    process), and a report that overruns its limit. Every other task finishes, each fault is
    blamed on its own task, the suite and its summary are unaffected, and OUTDIR holds its
    four files alone (the GPU machine hands back at most 8)."""
    import tarfile

    suite = tmp_path / "tiny_rehearsal.toml"
    suite.write_text(REHEARSAL_SUITE)
    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    # Generous step limits: this machine is shared; the report's limit is what overruns.
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=900,
                          env=env | {"PYTHON": sys.executable,
                                     "GPU_CHECK_REHEARSAL": str(suite),
                                     "GPU_CHECK_FAULTS": "segv@1,cuda@4",
                                     "CHECK_LIMIT_S": "400", "RUN_LIMIT_S": "300",
                                     "METHODS_LIMIT_S": "300",
                                     "SUMMARY_LIMIT_S": "300", "REPORT_LIMIT_S": "1"})
    assert sorted(p.name for p in out.iterdir()) == [
        "correctness.json", "gpu-check.tar.gz", "log.txt", "summary.md"]
    log = (out / "log.txt").read_text()
    checks = json.loads((out / "correctness.json").read_text())
    assert checks["finished"] == checks["tasks"] == 11 and checks["state"] == "done", log
    by_task = {}
    for r in checks["results"]:
        by_task.setdefault(r["task"], []).append(r)
    assert sorted(by_task) == list(range(11))
    assert [r.get("crashed") for r in by_task[1]] == [True]
    assert [r.get("cuda_fault") for r in by_task[4]] == [True]
    assert not any("poisoned" in str(r.get("error")) for r in checks["results"])
    assert (checks["crashed"], checks["retired"]) == (1, 1)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "step 1/3" in log and "step 2/3" in log and "step 3/3" in log
    assert "correctness exit code 1\n" in log and "run exit code 0\n" in log
    assert "report exit code 124 (time limit reached: interrupted); render it offline" in log
    assert "tar failed" not in log
    summary = (out / "summary.md").read_text()
    claim = next((line for line in summary.splitlines() if "0.001x as fast" in line), summary)
    assert re.search(r"\| [0-9.]+ \[[0-9.]+, [0-9.]+.*\| (holds|inconclusive|does not hold) \|$",
                     claim), summary
    with tarfile.open(out / "gpu-check.tar.gz") as tar:
        names = tar.getnames()
        run_dir = next(n for n in names if n.startswith("./results/rehearsal-")
                       and n.endswith("/records.jsonl"))
        records = [json.loads(line) for line in
                   tar.extractfile(run_dir).read().decode().splitlines()]
    assert len(records) == 4 and {r["status"] for r in records} <= {"ok", "wrong"}
    assert {"./summary.md", "./correctness.json", "./timing-methods.json"} <= set(names)
    assert "step 2b/3" in log and "timing methods exit code 0\n" in log
    assert not any(n.endswith("/.lock") for n in names)


def test_gpu_summary_reads_goals_from_records():
    """The summary states the suite's own claims (its goals, as data) from the records."""
    import importlib.util

    import pandas as pd

    from attnbench.runs.suite import load_suite

    spec = importlib.util.spec_from_file_location("gpu_summary",
                                                  ROOT / "scripts" / "gpu_summary.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    rows = []
    shape = dict(batch=1, heads_q=16, heads_kv=16, seq_q=16384, seq_k=16384, head_dim=128,
                 head_dim_v=128, dtype="bfloat16")
    # triton_flash forward 1.5x faster than sdpa_flash; the window 2.5x faster than causal
    for backend, factor in (("triton_flash", 1.0), ("sdpa_flash", 1.5), ("sdpa_cudnn", 1.1)):
        for mask, ms in (("causal", 10.0), ("none", 20.0), ("window(4095,0)", 4.0)):
            if mask.startswith("window") and backend != "triton_flash":
                continue
            samples = [ms * factor * (1 + 0.001 * i) for i in range(12)]
            rows.append(dict(shape, backend=backend, status="ok", key=f"{mask}-fwd",
                             mask=mask, mode="fwd", tflops=400 / factor,
                             frac_matmul=0.5 / factor, time_ms_median=samples[6],
                             samples_ms=samples))
    rows.append(dict(shape, backend="triton_flash", status="wrong", key="k2", mask="none",
                     mode="bwd", reason="dq NaN"))
    text = "\n".join(mod.summarise(pd.DataFrame(rows), load_suite("h200").claims))
    assert "triton_flash wrong: k2: dq NaN" in text
    assert "| fwd | causal | 16384 | 400.0 (0.50) | 266.7 (0.33) | 363.6 (0.45) |" in text
    lines = {line.split(" | ")[0].lstrip("| "): line for line in text.splitlines()
             if line.startswith("| ")}
    fwd = lines["triton_flash forward is at least 1.2x faster than SDPA's flash kernel "
                "(bf16, d=128, N >= 4K)"]
    assert "1.5" in fwd and fwd.endswith("| holds |")
    assert lines["moonshot: triton_flash forward at least 0.95x as fast as SDPA's cuDNN "
                 "kernel (bf16, d=128, N >= 4K)"].endswith("| holds |")
    assert lines["triton_flash backward at least as fast as SDPA's flash kernel (bf16, d=128, "
                 "N >= 4K)"].endswith("| not measured |")
    window = lines["a causal window of 4096 keys is at least 1.8x faster than full causal at "
                   "N = 16K (triton_flash, bf16, d=128)"]
    assert "2.5" in window and window.endswith("| holds |")
