"""Hand freed host memory back to the operating system (glibc's ``malloc_trim``).

A float64 reference allocates and frees the same chunk-sized temporaries thousands of times.
glibc raises its mmap threshold after the first frees, so later temporaries come from the
heap, and with several threads allocating the freed pieces are not always reused: the
worker's resident memory then grows chunk after chunk (0.4 to 14 GiB for one additive
reference at N = 4096, varying run to run) until the kernel's OOM killer ends it. Trimming
after each chunk bounds it without changing how the timed kernels allocate.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools


@functools.cache
def _trim():
    """glibc's malloc_trim, or None where the C library has none (macOS, musl)."""
    name = ctypes.util.find_library("c")
    try:
        fn = ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):
        return None
    if fn is not None:
        fn.argtypes, fn.restype = [ctypes.c_size_t], ctypes.c_int
    return fn


def release_freed() -> bool:
    """Return the heap's free pages to the OS; whether the C library could."""
    fn = _trim()
    if fn is None:
        return False
    fn(0)
    return True
