"""SDPA pinned to one kernel (sdpa_math/flash/efficient/cudnn) and sdpa's kernel detection."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from attnbench.core.case import Case
from attnbench.core.dtypes import TOLERANCE_GRAD, TOLERANCE_OUT
from attnbench.core.errors import NotSupported
from attnbench.core.reference import case_reference
from attnbench.core.registry import get_backend
from attnbench.implementations.sdpa import kernel_from_ops
from attnbench.implementations.sdpa_kernels import KERNEL_LIMITS, SdpaKernel, _Pin, condense_refusal
from attnbench.measure.execute import CaseCache, execute
from attnbench.measure.timing import TimingBudget

HAS_CUDA = torch.cuda.is_available()

CASES = [
    Case(batch=1, heads_q=4, heads_kv=2, seq_q=24, seq_k=40, head_dim=16, head_dim_v=16,
         mask="causal"),
    Case(batch=2, heads_q=2, heads_kv=2, seq_q=40, seq_k=24, head_dim=16, head_dim_v=16,
         mask="window(3,0)"),  # bottom-right: the first 16 rows see no key
    Case(batch=1, heads_q=2, heads_kv=1, seq_q=33, seq_k=33, head_dim=8, head_dim_v=8,
         mask="window(4,2)"),
    Case(batch=1, heads_q=2, heads_kv=2, seq_q=70, seq_k=70, head_dim=16, head_dim_v=16,
         mask="block_sparse(bigbird)", block_size=16),
    Case(batch=1, heads_q=2, heads_kv=2, seq_q=20, seq_k=30, head_dim=16, head_dim_v=8,
         mask="none"),
]


def _check(backend, case):
    inputs = case.make_inputs()
    prepared = backend.prepare(case, inputs)
    outs = prepared.outputs(prepared.fn())
    ref = case_reference(case, inputs).as_dict()
    assert set(ref) <= set(outs)
    for name, r in ref.items():
        got = outs[name].double()
        assert got.shape == r.shape, name
        assert torch.isfinite(got).all(), name
        tol = TOLERANCE_OUT[case.dtype] if name == "out" else TOLERANCE_GRAD[case.dtype]
        rel = float((got - r).norm() / r.norm())
        assert rel < tol, (backend.name, case.key, name, rel)
    return prepared


def _runnable(backend, case):
    ok, _ = backend.is_available()
    return ok and not backend.not_supported_reasons(case)


@pytest.mark.parametrize("name", ["sdpa", "sdpa_math", "sdpa_flash"])
@pytest.mark.parametrize("mode", ["fwd", "fwd_bwd", "bwd"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.mask)
def test_against_float64_reference(name, mode, case):
    backend = get_backend(name)
    case = case.replace(mode=mode)
    if not _runnable(backend, case):
        # only sdpa_flash may decline here, and only for what its data says (d_v != d)
        assert name == "sdpa_flash" and case.head_dim_v != case.head_dim
        assert any("head_dim_v" in r for r in backend.not_supported_reasons(case))
        return
    prepared = _check(backend, case)
    kernel = prepared.extras["kernel"]
    expected = {"sdpa_math": "math", "sdpa_flash": "flash_cpu"}.get(name)
    if expected:
        assert kernel == expected
    else:  # PyTorch's CPU flash kernel unless d_v != d, where only math can run
        assert kernel == ("math" if case.head_dim_v != case.head_dim else "flash_cpu")


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float64"])
def test_low_and_double_precision(dtype):
    case = Case(heads_q=2, heads_kv=2, seq_q=48, seq_k=48, head_dim=16, head_dim_v=16,
                mask="causal", dtype=dtype, mode="fwd_bwd")
    for name in ("sdpa_math", "sdpa_flash", "sdpa"):
        _check(get_backend(name), case)


def test_unavailable_kernels_say_why_on_cpu_only_machine():
    for name in ("sdpa_efficient", "sdpa_cudnn"):
        backend = get_backend(name)
        ok, why = backend.is_available()
        case = Case(seq_q=32, seq_k=32, head_dim=16, head_dim_v=16, dtype="float16")
        assert "cpu" in " ".join(backend.not_supported_reasons(case))
        if HAS_CUDA:
            continue
        assert not ok and "CUDA" in why and name.split("_")[1] in why


def test_capabilities_follow_kernel_limits():
    flash, eff, cudnn = (get_backend(n) for n in ("sdpa_flash", "sdpa_efficient", "sdpa_cudnn"))
    assert eff.caps.devices == ("cuda",) and cudnn.caps.devices == ("cuda",)
    assert not eff.caps.gqa and cudnn.caps.gqa and not flash.caps.dv_differs
    assert "float32" not in cudnn.caps.dtypes and "float64" not in eff.caps.dtypes
    # device-specific limits come from KERNEL_LIMITS through extra_reasons
    big = Case(device="cuda", dtype="float16", head_dim=320, head_dim_v=320)
    assert any("> 256" in r for r in flash.extra_reasons(big))
    win = Case(device="cuda", dtype="float16", mask="window(8,0)")
    assert any("window" in r for r in flash.extra_reasons(win))
    assert not flash.extra_reasons(win.replace(device="cpu"))  # CPU flash takes masks
    odd = Case(device="cuda", dtype="float16", head_dim=20, head_dim_v=20)
    assert any("multiples of 8" in r for r in eff.extra_reasons(odd))
    assert not eff.extra_reasons(odd.replace(dtype="float32"))  # 20 % 4 == 0
    assert KERNEL_LIMITS["flash"]["cuda"].dtypes == ("float16", "bfloat16")
    fp32 = Case(device="cuda", dtype="float32")
    assert any("float32" in r for r in flash.extra_reasons(fp32))


def test_refusal_is_not_supported_with_pytorchs_reason():
    """Bypassing the capability data, PyTorch's own refusal becomes NotSupported."""
    case = Case(heads_q=2, heads_kv=2, seq_q=16, seq_k=16, head_dim=8, head_dim_v=16)
    backend = SdpaKernel("flash", "test")
    with pytest.raises(NotSupported) as info:
        backend.build(case, case.make_inputs())
    (reason,) = info.value.reasons
    assert reason.startswith("PyTorch refused the flash kernel:")
    assert "same last dimension" in reason and "\n" not in reason
    assert "Triggered internally" not in reason


def test_condense_refusal_keeps_the_pinned_kernels_section():
    msgs = [
        "Memory efficient kernel not used because: (Triggered internally at x.cpp:1.)",
        "Memory Efficient attention has been runtime disabled. (Triggered internally at "
        "x.cpp:2.)",
        "Flash attention kernel not used because: (Triggered internally at x.cpp:3.)",
        "Flash attention requires q,k,v to have the same last dimension and to be less than "
        "or equal to 256. Got Query.size(-1): 512 (Triggered internally at x.cpp:4.)",
        "Flash attention requires q,k,v to have the same last dimension and to be less than "
        "or equal to 256. Got Query.size(-1): 512 (Triggered internally at x.cpp:4.)",
        "cuDNN attention kernel not used because: (Triggered internally at x.cpp:5.)",
        "cuDNN attention has been runtime disabled. (Triggered internally at x.cpp:6.)",
    ]
    line = condense_refusal("flash", msgs, RuntimeError("No available kernel. Aborting."))
    assert line.count("Flash attention requires") == 1
    assert "runtime disabled" not in line and "Memory" not in line and "cuDNN" not in line
    # no warnings at all: the exception's text
    line = condense_refusal("cudnn", [], RuntimeError("No viable backend for sdpa\nmore"))
    assert line == "PyTorch refused the cudnn kernel: No viable backend for sdpa"


def test_pin_enables_one_kernel_and_restores():
    names = ("flash", "mem_efficient", "math", "cudnn")

    def flags():
        return tuple(getattr(torch._C, f"_get_{n}_sdp_enabled")() for n in names)

    before = flags()
    with sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION):
        expected = flags()
    with _Pin(SDPBackend.EFFICIENT_ATTENTION):
        assert flags() == expected == (False, True, False, False)
    assert flags() == before
    q = torch.randn(1, 1, 4, 8)
    with pytest.raises(RuntimeError):  # even when the call fails, flags are restored
        with _Pin(SDPBackend.EFFICIENT_ATTENTION):
            F.scaled_dot_product_attention(q, q, q)
    assert flags() == before


def test_kernel_names():
    assert kernel_from_ops(["aten::ones", "aten::scaled_dot_product_attention",
                            "aten::_scaled_dot_product_flash_attention_for_cpu"]) == "flash_cpu"
    assert kernel_from_ops(["aten::_scaled_dot_product_efficient_attention"]) == "efficient"
    assert kernel_from_ops(["aten::_efficient_attention_forward"]) == "efficient"
    assert kernel_from_ops(["aten::_scaled_dot_product_cudnn_attention"]) == "cudnn"
    assert kernel_from_ops(["aten::_scaled_dot_product_attention_math"]) == "math"
    assert kernel_from_ops(["aten::mm"]) == "unknown"


def test_runner_records_kernel_and_unsupported():
    budget = TimingBudget(warmup_s=0.0, budget_s=0.01, min_reps=1, max_reps=2)
    cache = CaseCache()
    case = Case(heads_q=2, heads_kv=2, seq_q=32, seq_k=32, head_dim=16, head_dim_v=16,
                mask="causal")
    rec = execute(case, "sdpa", budget, cache).to_row()
    assert rec["status"] == "ok" and rec["kernel"] == "flash_cpu"
    rec = execute(case, "sdpa_math", budget, cache).to_row()
    assert rec["status"] == "ok" and rec["kernel"] == "math"
    rec = execute(case, "sdpa_cudnn", budget, cache).to_row()  # a CPU case: never runs
    assert rec["status"] in ("unavailable", "unsupported") and rec["reason"]


@pytest.mark.parametrize("mask, mode, seq_q, dtype", [
    ("none", "fwd", 40, "float32"), ("causal", "bwd", 40, "float32"),
    ("window(5,0)", "fwd_bwd", 40, "float32"), ("causal", "fwd", 40, "bfloat16"),
    ("causal", "fwd", 24, "float32"),  # causal_lower_right: only the profiler can tell
])
def test_kernel_named_without_a_profiler_is_the_one_the_profiler_sees(mask, mode, seq_q, dtype):
    """The dispatcher's own answer (torch._fused_sdp_choice) and the op a profiled call
    runs name the same kernel; where the dispatcher cannot be asked, the profiler does."""
    from attnbench.implementations import sdpa as sdpa_module

    case = Case(batch=1, heads_q=2, heads_kv=1, seq_q=seq_q, seq_k=40, head_dim=16,
                head_dim_v=16, dtype=dtype, mask=mask, mode=mode)
    inputs = case.make_inputs()
    f = get_backend("sdpa").build(case, inputs)
    profiled = sdpa_module.detect_kernel(f, case, inputs)
    asked = sdpa_module.chosen_kernel(case, inputs)
    if seq_q != 40 and mask == "causal":
        assert asked is None
    elif hasattr(torch, "_fused_sdp_choice"):
        assert asked == profiled
    record = get_backend("sdpa").prepare(case, inputs).extras["kernel"]
    assert record == profiled
