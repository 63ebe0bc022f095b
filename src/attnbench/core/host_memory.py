"""Hand freed host memory back to the operating system (glibc's ``malloc_trim``).

A float64 reference allocates and frees the same chunk-sized temporaries thousands of times.
After the first frees glibc raises its mmap threshold, so later temporaries come from the
heap, whose freed pieces it neither always reuses nor returns: the worker's resident memory
can then grow chunk after chunk, by an amount that varies run to run, until the kernel's OOM
killer ends it. Trimming after each chunk bounds it without changing how timed kernels
allocate.
"""

from __future__ import annotations

import ctypes
import functools


@functools.cache
def _trim():
    """glibc's malloc_trim from the process's own symbols (no library search, which minimal
    images may lack), or None where the C library has none (macOS, musl)."""
    try:
        fn = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None
    fn.argtypes, fn.restype = [ctypes.c_size_t], ctypes.c_int
    return fn


def release_freed() -> bool:
    """Return the heap's free pages to the OS; whether the C library could."""
    fn = _trim()
    if fn is None:
        return False
    fn(0)
    return True
