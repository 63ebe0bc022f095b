"""The worker's malloc settings (measure/memory.py): while timing, a large block freed is
reused by the next call instead of being mapped (and faulted in) afresh; for the peak
measurement, large blocks are still mapped on their own, so the peak counts them.

Checked by page-fault counts and resident memory in a fresh process (the settings are
process-wide), never by time."""

import subprocess
import sys

import pytest

SCRIPT = """
import resource, statistics, torch
from attnbench.measure.memory import configure_allocator, peak_memory_bytes
if configure_allocator() is None:
    print("no-glibc"); raise SystemExit
torch.set_num_threads(1)
n = 48 * 2**20 // 4  # 48 MiB of fp32: above glibc's largest mmap threshold (32 MiB)
def call():  # a timed call's shape: a fresh output, written, returned, then dropped
    return torch.empty(n).fill_(1.0)
def faults_per_call(calls=8):
    counts = []
    for _ in range(calls):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        out = call()
        counts.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
        del out
    return counts
first = faults_per_call(1)[0]  # the heap grows: every page faults once
# Warm up as the timer does: the first calls' one-time small allocations (dispatch
# caches...) may settle inside a freed block, and the next block then comes from fresh heap.
faults_per_call()
timed = statistics.median(faults_per_call())
peak = peak_memory_bytes(call, "cpu")
faults_per_call()  # (the trim before the peak call returned the free pages)
timed_after = statistics.median(faults_per_call())  # the timing settings are back
print(first, timed, timed_after, peak)
"""


def test_timing_reuses_large_blocks_and_peak_still_counts_them():
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                         timeout=120, check=True).stdout.strip()
    if out == "no-glibc":
        pytest.skip("not glibc: the allocator is left as it is")
    first, timed, timed_after, peak = (None if x == "None" else float(x) for x in out.split())
    pages = 48 * 2**20 // 4096
    assert first > pages // 2  # the first call touches fresh memory (so the check can fail)
    assert timed < pages // 20  # glibc's own settings: every call maps and faults afresh
    assert timed_after < pages // 20
    if peak is not None:  # /proc peak support
        assert peak >= 48 * 2**20
