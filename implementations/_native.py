"""attnbench's own C++ CPU kernels, compiled on first use with torch's extension builder.

Eager PyTorch caps a blocked backend at the speed of its separate small ops: a separate
softmax pass, Python between ops and matmuls of a few rows each. A fused kernel
(small products in register tiles, the softmax in one pass over a block's scores in cache)
is what sdpa's own CPU flash kernel is, and what our blocked backends are compared with.

``load(name)`` returns the compiled module or ``None`` with the reason: no C++ compiler or
ninja, a CPU without AVX2, a failed build (e.g. a torch without MKL's exported ``sgemm_``,
which segment_attention calls for head dims that are not a multiple of 16), or
``ATTNBENCH_NATIVE=0`` (the eager path, for comparison). A backend then runs its eager
path and says which one ran in its record's ``kernel``.

The kernels are built for the host's instruction set (``isa()``): AVX-512 where torch
dispatches its own kernels at AVX512, else AVX2; ``ATTNBENCH_NATIVE_ISA=avx2`` builds and
runs the AVX2 kernels on an AVX-512 host, to compare the two. The tiles are the same code
at either width (``simd_tiles.h``); a record's ``kernel`` ends with the one that ran.

The build lands in torch's extension cache (``TORCH_EXTENSIONS_DIR``, default
~/.cache/torch_extensions), in a folder named by a hash of its sources and flags, under a
lock no dead process can hold (``_native_build.py``). A run builds what its pairs need
before the first pair (``prepare``); ``attnbench build`` builds again, failures included.
"""

from __future__ import annotations

import os
import shutil
import threading
from pathlib import Path

import torch

from attnbench.implementations import _native_build

SOURCES = Path(__file__).with_name("native")
DISABLE_ENV = "ATTNBENCH_NATIVE"
ISA_ENV = "ATTNBENCH_NATIVE_ISA"
# Build flags per instruction set, narrowest first. ATen's Vectorized takes its width from
# the CPU_CAPABILITY macro, as in torch's own per-ISA kernel builds; an AVX-512 host gets
# the AVX-512 build, since the AVX2 one leaves half of each vector unit idle.
CFLAGS = {
    "avx2": ("-O3", "-mavx2", "-mfma", "-DCPU_CAPABILITY=AVX2", "-DCPU_CAPABILITY_AVX2"),
    "avx512": ("-O3", "-mavx2", "-mfma", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq",
               "-DCPU_CAPABILITY=AVX512", "-DCPU_CAPABILITY_AVX512"),
}
# The kernels' one parallel region a call is ATen's (native/cpu_pieces.h). Where ATen's
# backend is OpenMP its parallel_for is a header template that needs -fopenmp to fork
# (without, it runs serially); the extension then needs libgomp.so.1, which resolves to the
# copy torch has loaded already, so both share one OpenMP runtime and its thread count.
OPENMP = ("-fopenmp",) if "parallel backend: OpenMP" in torch.__config__.parallel_info() else ()
KERNELS = ("segment_attention", "linear_attention")
FIRST_BUILD = "building native kernels (first use, about a minute)"
# torch's CPU capability (which ATEN_CPU_CAPABILITY can lower) -> the widest build it runs
HOST_ISA = {"AVX2": "avx2", "AVX512": "avx512"}

_loaded: dict[str, tuple[object | None, str]] = {}
_lock = threading.Lock()


def disabled() -> bool:
    return os.environ.get(DISABLE_ENV, "1").strip().lower() in ("0", "false", "no", "off")


def host_isa() -> str | None:
    """The widest build this host runs, from torch's CPU capability; None below AVX2."""
    return HOST_ISA.get(torch.backends.cpu.get_cpu_capability())


def isa() -> str | None:
    """The build the kernels run as: ``ATTNBENCH_NATIVE_ISA`` where set, else the host's."""
    wanted = os.environ.get(ISA_ENV, "").strip().lower()
    return wanted or host_isa()


def _isa_problem() -> str:
    wanted, host = isa(), host_isa()
    if host is None:
        return (f"CPU capability {torch.backends.cpu.get_cpu_capability()}: the native "
                f"kernels need AVX2")
    if wanted not in CFLAGS:
        return f"{ISA_ENV}={wanted!r}: expected one of {', '.join(CFLAGS)}"
    if list(CFLAGS).index(wanted) > list(CFLAGS).index(host):
        return f"{ISA_ENV}={wanted} but this host (CPU capability {host.upper()}) cannot run it"
    return ""


def _why_not() -> str:
    if disabled():
        return f"{DISABLE_ENV}=0 (eager torch ops)"
    problem = _isa_problem()
    if problem:
        return problem
    if not (shutil.which(os.environ.get("CXX", "c++")) or shutil.which("g++")):
        return "no C++ compiler on PATH (install g++ to build the native kernels)"
    if not _ninja_on_path():
        return "no ninja on PATH (pip install ninja)"
    return ""


def _ninja_on_path() -> bool:
    """torch's builder runs ``ninja``; the PyPI package (a dependency) puts it beside the
    interpreter, which is not on PATH when the venv is not activated: add it there."""
    if shutil.which("ninja"):
        return True
    try:
        import ninja
    except ImportError:
        return False
    os.environ["PATH"] = ninja.BIN_DIR + os.pathsep + os.environ.get("PATH", "")
    return shutil.which("ninja") is not None


def sources(name: str) -> tuple[Path, ...]:
    """The files kernel ``name`` is built from (for a backend's ``code_files``)."""
    return (SOURCES / f"{name}.cpp", *sorted(SOURCES.glob("*.h")))


def spec(name: str, target: str | None = None) -> _native_build.Spec:
    """How kernel ``name`` is built for instruction set ``target`` (default: ``isa()``)."""
    target = target or isa()
    return _native_build.Spec(name, target, sources=(SOURCES / f"{name}.cpp",),
                              headers=tuple(sorted(SOURCES.glob("*.h"))),
                              cflags=(*CFLAGS[target], *OPENMP), ldflags=OPENMP,
                              include_paths=(str(SOURCES),))


def load(name: str, retry: bool = False):
    """(module, "") for ``native/<name>.cpp``, or (None, reason) when it cannot be used.
    ``retry``: build again even where a build finished or failed before."""
    key = f"{name}/{isa()}"
    with _lock:
        if retry or key not in _loaded:
            _loaded[key] = _build(name, retry)
        return _loaded[key]


def pending(name: str) -> bool:
    """Whether loading kernel ``name`` would compile it (no finished or failed build)."""
    if _why_not():
        return False
    built = spec(name)
    return _native_build.failed_reason(built) is None and \
        _native_build.built_library(built) is None


def prepare(names, retry: bool = False, say=_native_build.say) -> dict[str, str]:
    """Build kernels ``names`` now (before any pair is timed): {name: why it cannot be
    used} for those that did not build; with one line first where anything compiles."""
    names = list(dict.fromkeys(names))
    if retry or any(pending(n) for n in names):
        say(FIRST_BUILD)
    problems = {}
    for name in names:
        _, reason = load(name, retry=retry)
        if reason:
            problems[name] = reason
    return problems


def _build(name: str, retry: bool = False):
    reason = _why_not()
    if reason:
        return None, reason
    return _native_build.load(spec(name), retry=retry)


def records_grad(*tensors: torch.Tensor) -> bool:
    """Whether autograd records a call on ``tensors`` (the kernels are forwards only)."""
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


def applies(name: str, device, dtype: torch.dtype, needs_grad: bool) -> bool:
    """Whether kernel ``name`` runs a case: the kernels are fp32 CPU forwards without
    autograd, and only where they built."""
    return (torch.device(device).type == "cpu" and dtype == torch.float32 and not needs_grad
            and load(name)[0] is not None)


def kernel_name(name: str, fused: bool, eager: str, device, dtype, needs_grad: bool,
                label: str) -> str:
    """A record's ``kernel``: ``label`` where kernel ``name`` ran, else the eager path's
    name, with the reason the kernel did not run where it would have."""
    if fused:
        return f"{label},{isa()}"
    if torch.device(device).type == "cpu" and dtype == torch.float32 and not needs_grad:
        reason = load(name)[1]
        if reason:
            return f"{eager} (fused kernel unavailable: {reason})"
    return eager
