"""Peak memory of one call above what was already held (the inputs, the retained graph).

GPU: the caching allocator's peak statistics.
CPU (Linux): reset the kernel's resident high-water mark (write ``5`` to
``/proc/self/clear_refs``), run, and read ``VmHWM`` minus the ``VmRSS`` before.

glibc's malloc is tuned twice. While timing, every block comes from the heap and is
reused once freed, as in a warmed-up program, so no backend is charged fresh page faults on
every call (sliding_window at N=8192 measured 59 ms with every block unmapped on free,
52 ms reused). glibc's own dynamic mmap threshold stops at 32 MiB, and a block of 32 MiB or
more was mapped afresh on every call: a (1, 8, 16384, 64) fp32 output is exactly 32 MiB, and
linear (elu) at N=16384 measured 21.9 ms a call with 8193 minor faults, 10.5 ms with its
output's memory reused (sliding_window 58.3 -> 46.0 ms; scratch, Xeon host, 2 threads).
So mapping is switched off while timing (``M_MMAP_MAX`` 0) and free memory at the heap's
top is kept up to 1 GiB (in the timing loops of N=16384's forwards and backwards: no minor
fault in the median call, against 8192-16384 before); blocks larger than that are still
returned and faulted in again. For the one call whose peak is measured, every block above
128 KiB is mapped and unmapped on its own and free memory is trimmed first, so the resident
high-water mark counts live tensors rather than heap slack.
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
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_M_MMAP_MAX = -4
_libc = None
# (mmap threshold, trim threshold, most blocks mapped at once): while timing, nothing mapped
# (the threshold, glibc's 64-bit maximum, is then moot) and at most 1 GiB of free heap
# kept; for accounting, the tight setting under which resident memory tracks live
# allocations, with glibc's default count of mappings.
_TIMING_THRESHOLDS = (32 * 2**20, 2**30, 0)
_ACCOUNTING_THRESHOLDS = (128 * 2**10, 128 * 2**10, 65536)


def _set_thresholds(libc, thresholds) -> None:
    mmap_threshold, trim_threshold, mmap_max = thresholds
    libc.mallopt(_M_MMAP_THRESHOLD, mmap_threshold)
    libc.mallopt(_M_TRIM_THRESHOLD, trim_threshold)
    libc.mallopt(_M_MMAP_MAX, mmap_max)


def configure_allocator():
    """glibc with its timing thresholds (None where there is no glibc)."""
    global _libc
    if _libc is None and sys.platform.startswith("linux"):
        try:
            _libc = ctypes.CDLL("libc.so.6")
            _set_thresholds(_libc, _TIMING_THRESHOLDS)
        except (OSError, AttributeError):
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


def settle_garbage() -> None:
    """Collect cyclic garbage, then move every survivor to the collector's permanent
    generation, so the collection before each peak measurement scans only the objects the
    current job made. Called between job groups: a full collection over torch's, triton's
    and inductor's objects took 0.67 s on the CPU machine, per job, before this (about 100 s
    of the GPU check's 154 jobs). What survives a group is alive (caches, modules, compiled
    kernels); if it later dies, reference counting frees it."""
    gc.collect()
    gc.freeze()


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
        _set_thresholds(libc, _ACCOUNTING_THRESHOLDS)
        libc.malloc_trim(0)
    try:
        before = _status_kib("VmRSS")
        _CLEAR_REFS.write_text("5")
        result = fn()
        peak = _status_kib("VmHWM")
        del result
    finally:
        if libc is not None:
            _set_thresholds(libc, _TIMING_THRESHOLDS)
    return max(0, (peak - before) * 1024)
