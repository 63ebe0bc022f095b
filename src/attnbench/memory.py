"""Peak memory of one call above what was already held (the inputs, the retained graph).

GPU: the caching allocator's peak statistics.
CPU (Linux): reset the kernel's resident high-water mark (write ``5`` to
``/proc/self/clear_refs``), run, and read ``VmHWM`` minus the ``VmRSS`` before. glibc's
malloc is told to hand large blocks straight back to the kernel (a fixed mmap threshold)
and trimmed before the call, so memory freed by earlier cases cannot hide new peaks.
"""

from __future__ import annotations

import ctypes
import gc
import sys
from collections.abc import Callable
from pathlib import Path

import torch

_CLEAR_REFS = Path("/proc/self/clear_refs")
_STATUS = Path("/proc/self/status")
_M_MMAP_THRESHOLD = -3
_libc = None


def configure_allocator():
    global _libc
    if _libc is None and sys.platform.startswith("linux"):
        try:
            lib = ctypes.CDLL("libc.so.6")
            lib.mallopt(_M_MMAP_THRESHOLD, 128 * 1024)  # no dynamic threshold: frees unmap
            _libc = lib
        except OSError:
            _libc = False
    return _libc or None


def _status_kib(field: str) -> int:
    for line in _STATUS.read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in {_STATUS}")


def cpu_peak_supported() -> tuple[bool, str]:
    if not sys.platform.startswith("linux"):
        return False, "CPU peak memory needs Linux /proc (VmHWM)"
    try:
        _CLEAR_REFS.write_text("5")
        _status_kib("VmHWM")
    except OSError as exc:
        return False, f"cannot reset VmHWM via {_CLEAR_REFS}: {exc}"
    return True, ""


def peak_memory_bytes(fn: Callable[[], object], device: torch.device | str) -> int | None:
    """Bytes allocated at the peak of ``fn()`` above what was held before; None if unknown."""
    dev = torch.device(device)
    gc.collect()
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
        base = torch.cuda.memory_allocated(dev)
        torch.cuda.reset_peak_memory_stats(dev)
        result = fn()
        torch.cuda.synchronize(dev)
        peak = torch.cuda.max_memory_allocated(dev) - base
        del result
        return max(0, peak)
    if not cpu_peak_supported()[0]:
        return None
    libc = configure_allocator()
    if libc is not None:
        libc.malloc_trim(0)
    before = _status_kib("VmRSS")
    _CLEAR_REFS.write_text("5")
    result = fn()
    peak = _status_kib("VmHWM")
    del result
    return max(0, (peak - before) * 1024)
