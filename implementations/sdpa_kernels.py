"""sdpa_math, sdpa_flash, sdpa_efficient, sdpa_cudnn: SDPA pinned to one kernel.

Each backend calls ``torch.nn.functional.scaled_dot_product_attention`` with exactly one
kernel enabled (what ``torch.nn.attention.sdpa_kernel(SDPBackend.X)`` does), with the
same mask arguments as the auto-dispatching ``sdpa`` backend (:func:`sdpa_arguments`).

What each kernel accepts is data (:data:`KERNEL_LIMITS`, per device type), taken from
PyTorch's own gate checks (``sdp_utils.cpp`` / ``sdp_utils_cpp.cpp``). Limits that depend
on the GPU or library versions (SM range, cuDNN version, ...) are left to PyTorch: setup
runs the function once and, when PyTorch refuses ("No available kernel"), raises
``NotSupported`` carrying PyTorch's own reasons, condensed to one line.

Note: on CPU, ``SDPBackend.FLASH_ATTENTION`` is PyTorch's CPU flash kernel
(``_scaled_dot_product_flash_attention_for_cpu``): sdpa_flash runs there, and the
``kernel`` column says ``flash_cpu``.
"""

from __future__ import annotations

import re
import warnings
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from attnbench.core.backend import ALL_DTYPES, ALL_MASKS, Backend, Capabilities, wrap_mode
from attnbench.core.errors import NotSupported
from attnbench.implementations.sdpa import (
    KERNEL_OPS,
    detect_kernel,
    run_pinned_once,
    sdpa_arguments,
)


@dataclass(frozen=True)
class KernelLimits:
    """What one SDPA kernel accepts on one device type."""

    dtypes: tuple[str, ...] = ALL_DTYPES
    masks: tuple[str, ...] = ALL_MASKS
    head_dim_max: int = 1 << 16
    head_dim_multiple: dict[str, int] = field(default_factory=dict)  # per dtype; 1 if absent
    gqa: bool = True
    dv_differs: bool = True
    note: str = ""


_HALF = ("float16", "bfloat16")

# From PyTorch's gate functions (torch 2.5 - 2.13): use_flash_attention_cpp (CPU),
# can_use_flash_attention / can_use_mem_efficient_attention / can_use_cudnn_attention (CUDA).
KERNEL_LIMITS: dict[str, dict[str, KernelLimits]] = {
    "math": {"cpu": KernelLimits(), "cuda": KernelLimits()},
    "flash": {
        # CPU flash: float/double/bf16/half, boolean or float masks, GQA; same last dims.
        "cpu": KernelLimits(dv_differs=False),
        # FlashAttention-2 on sm80+: fp16/bf16, head_dim <= 256, no attn_mask (causal only,
        # bottom-right causal through causal_lower_right), GQA, same last dims.
        "cuda": KernelLimits(dtypes=_HALF, masks=("none", "causal"), head_dim_max=256,
                             dv_differs=False),
    },
    "efficient": {
        # CUTLASS memory-efficient kernel: fp32/fp16/bf16 (bf16 on sm80+), any mask,
        # no GQA; last dims divisible by the GEMM alignment (8 for half, 4 for fp32 on sm80+).
        "cuda": KernelLimits(dtypes=("float32",) + _HALF,
                             head_dim_multiple={"float16": 8, "bfloat16": 8, "float32": 4},
                             gqa=False),
    },
    "cudnn": {
        # cuDNN 9 fused attention: fp16/bf16, sm80+, head dims multiple of 8 and <= 128
        # (<= 256 on sm90 with cuDNN >= 9.10), masks as attn_mask, GQA, seq_k > 1.
        "cuda": KernelLimits(dtypes=_HALF, head_dim_max=256,
                             head_dim_multiple={"float16": 8, "bfloat16": 8}),
    },
}

_SDP = {"math": SDPBackend.MATH, "flash": SDPBackend.FLASH_ATTENTION,
        "efficient": SDPBackend.EFFICIENT_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}
# The header PyTorch warns before the reasons of each kernel when none can run.
_HEADER = {"flash": "flash attention", "efficient": "memory efficient",
           "cudnn": "cudnn attention"}
_TRIGGERED = re.compile(r"\s*\(Triggered internally at [^)]*\)\.?\s*$")
_NOT_USED = re.compile(r"^(.*) kernel not used because:?$", re.IGNORECASE)


def limits_reasons(lim: KernelLimits, case, caps: Capabilities | None = None) -> list[str]:
    """Reasons ``case`` falls outside ``lim`` (one kernel on the case's device type).

    With ``caps``, limits that ``caps`` already reports are not repeated.
    """
    caps = caps or Capabilities()
    out = []
    if case.dtype in caps.dtypes and case.dtype not in lim.dtypes:
        out.append(f"dtype {case.dtype} not supported on {case.device} "
                   f"(supports {', '.join(lim.dtypes)})")
    kind = case.mask_spec.kind
    if kind in caps.masks and kind not in lim.masks:
        out.append(f"mask {case.mask} not supported on {case.device} "
                   f"(supports {', '.join(lim.masks)})")
    if caps.head_dim_min <= case.head_dim <= caps.head_dim_max and \
            max(case.head_dim, case.head_dim_v) > lim.head_dim_max:
        out.append(f"head_dim {max(case.head_dim, case.head_dim_v)} > {lim.head_dim_max} "
                   f"on {case.device}")
    mult = lim.head_dim_multiple.get(case.dtype, 1)
    if case.head_dim % mult or case.head_dim_v % mult:
        out.append(f"head dims must be multiples of {mult} for {case.dtype} "
                   f"(got {case.head_dim}, {case.head_dim_v})")
    if caps.gqa and not lim.gqa and case.heads_q != case.heads_kv:
        out.append(f"grouped-query attention (heads_q != heads_kv) not supported on "
                   f"{case.device}")
    if caps.dv_differs and not lim.dv_differs and case.head_dim_v != case.head_dim:
        out.append(f"head_dim_v != head_dim not supported on {case.device}")
    return out


def condense_refusal(kernel: str, messages: list[str], exc: BaseException | None = None) -> str:
    """PyTorch's warnings when it refuses a pinned kernel, as one line.

    PyTorch warns ``"<Kernel> kernel not used because:"`` followed by that kernel's
    reasons, for every kernel; keep the pinned kernel's section and drop the
    "runtime disabled" lines that pinning itself causes.
    """
    lines = [_TRIGGERED.sub("", str(m)).strip() for m in messages]
    lines = [ln for ln in lines if ln]
    sections: dict[str, list[str]] = {}
    current = None
    loose: list[str] = []
    for ln in lines:
        m = _NOT_USED.match(ln)
        if m:
            current = m.group(1).strip().lower()
            sections.setdefault(current, [])
            continue
        (sections[current] if current is not None else loose).append(ln)
    header = _HEADER.get(kernel, kernel)
    picked = [ln for h, body in sections.items() if h.startswith(header) for ln in body]
    if not picked:
        picked = loose + [ln for body in sections.values() for ln in body]
    picked = [ln for ln in picked if "runtime disabled" not in ln.lower()]
    if not picked and exc is not None:
        text = str(exc).strip().splitlines()
        picked = [text[0]] if text else [type(exc).__name__]
    # drop exact duplicates (PyTorch may repeat a reason), keep order
    picked = list(dict.fromkeys(re.sub(r"\s+", " ", ln) for ln in picked))
    return f"PyTorch refused the {kernel} kernel: " + "; ".join(picked)


def _is_refusal(exc: BaseException) -> bool:
    text = str(exc)
    return isinstance(exc, RuntimeError) and ("No available kernel" in text
                                              or "No viable backend" in text)


class _Pin:
    """Exactly one SDPA kernel enabled for the duration of a call, flags restored after.

    The same as ``sdpa_kernel(backend)``, but with the flag accessors looked up once: the
    context manager costs ~10 us per call, which would show in small GPU timings. Falls
    back to ``sdpa_kernel`` where those accessors are missing.
    """

    def __init__(self, backend: SDPBackend):
        self.backend = backend
        self._cm = None
        try:
            import torch.nn.attention as attn

            self._flags = [(getattr(torch._C, f"_get_{n}_sdp_enabled"),
                            getattr(torch._C, f"_set_sdp_use_{n}"),
                            getattr(SDPBackend, member) == backend)
                           for n, member in attn._backend_names.items()]
        except (AttributeError, TypeError, ImportError):
            self._flags = None

    def __enter__(self):
        if self._flags is None:
            self._cm = sdpa_kernel(self.backend)
            self._cm.__enter__()
            return self
        self._saved = [get() for get, _, _ in self._flags]
        for _, set_flag, on in self._flags:
            set_flag(on)
        return self

    def __exit__(self, *exc_info):
        if self._flags is None:
            return self._cm.__exit__(*exc_info)
        for (_, set_flag, _), was in zip(self._flags, self._saved, strict=True):
            set_flag(was)
        return False


class SdpaKernel(Backend):
    """SDPA with one kernel enabled."""

    kernel: str = "math"

    def __init__(self, kernel: str, description: str):
        self.kernel = kernel
        self.name = f"sdpa_{kernel}"
        self.description = description
        self.limits = KERNEL_LIMITS[kernel]
        lims = list(self.limits.values())
        self.caps = Capabilities(
            devices=tuple(self.limits),
            dtypes=tuple(d for d in ALL_DTYPES if any(d in lim.dtypes for lim in lims)),
            masks=tuple(m for m in ALL_MASKS if any(m in lim.masks for lim in lims)),
            head_dim_max=max(lim.head_dim_max for lim in lims),
            gqa=any(lim.gqa for lim in lims),
            dv_differs=any(lim.dv_differs for lim in lims),
        )

    # ---- availability and support ---------------------------------------
    def is_available(self):
        if "cpu" in self.limits:
            return True, ""
        if not torch.cuda.is_available():
            return False, (f"the {self.kernel} SDPA kernel needs a CUDA GPU; none is available "
                           f"(torch {torch.__version__})")
        if self.kernel == "cudnn" and not torch.backends.cudnn.is_available():
            return False, f"cuDNN is not available in this PyTorch build ({torch.__version__})"
        return True, ""

    def extra_reasons(self, case):
        dev = torch.device(case.device).type
        lim = self.limits.get(dev)
        if lim is None:
            return []  # the device itself is reported by the capabilities
        out = limits_reasons(lim, case, self.caps)
        if dev == "cuda" and self.kernel == "flash" and \
                not torch.backends.cuda.is_flash_attention_available():
            out.append("this PyTorch build has no CUDA flash attention")
        if dev == "cuda" and self.kernel == "cudnn":
            if case.seq_k == 1:
                out.append("cuDNN SDPA does not support key/value sequence length 1")
            if max(case.head_dim, case.head_dim_v) > 128 and not _cudnn_allows_256(case):
                out.append("cuDNN SDPA head_dim limit is 128 here (256 needs sm90 and "
                           "cuDNN >= 9.10)")
        return out

    # ---- computation --------------------------------------------------------
    def _function(self, case, inputs):
        kwargs = sdpa_arguments(case, inputs.q.device)
        pin = _Pin(_SDP[self.kernel])

        def sdpa_pinned(q, k, v):
            with pin:
                return F.scaled_dot_product_attention(q, k, v, **kwargs)  # (B, Hq, Nq, Dv)

        return sdpa_pinned

    def _checked_run(self, f, case, inputs) -> str:
        """Run ``f`` once (untimed); NotSupported with PyTorch's reasons if refused."""
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                kernel = (run_pinned_once(f, case, inputs, self.kernel)
                          or detect_kernel(f, case, inputs))
            except RuntimeError as exc:
                if not _is_refusal(exc):
                    raise
                reason = condense_refusal(self.kernel, [w.message for w in caught], exc)
                raise NotSupported(self.name, [reason]) from None
        wanted = {n for op, n in KERNEL_OPS.items() if _op_kernel(op) == self.kernel}
        if kernel not in wanted and kernel != "unknown":
            raise NotSupported(self.name, [f"PyTorch ran the {kernel} kernel instead of "
                                           f"{self.kernel}"])
        return kernel

    def build(self, case, inputs):
        f = self._function(case, inputs)
        if self.kernel != "math":
            self._checked_run(f, case, inputs)
        return f

    def prepare(self, case, inputs):
        f = self._function(case, inputs)
        kernel = self._checked_run(f, case, inputs)
        prepared = wrap_mode(f, case, inputs)
        prepared.extras["kernel"] = kernel
        return prepared


def _op_kernel(op: str) -> str:
    """The pinned-kernel family an ATen SDPA op belongs to."""
    short = KERNEL_OPS[op]
    return {"flash_cpu": "flash", "math_mps": "math"}.get(short, short)


def _cudnn_allows_256(case) -> bool:
    try:
        major, minor = torch.cuda.get_device_capability(torch.device(case.device))
        version = torch.backends.cudnn.version() or 0
    except Exception:  # no device to ask: let PyTorch decide at setup
        return True
    return (major, minor) == (9, 0) and version >= 91000


BACKENDS = [
    SdpaKernel("math", "SDPA pinned to the math kernel (reference-style, materializes scores)"),
    SdpaKernel("flash", "SDPA pinned to FlashAttention-2 (CUDA) or the CPU flash kernel"),
    SdpaKernel("efficient", "SDPA pinned to the memory-efficient (CUTLASS) kernel, CUDA only"),
    SdpaKernel("cudnn", "SDPA pinned to cuDNN fused attention, CUDA only"),
]
