"""Coarse-grained CPU parallelism for backends made of many small torch ops.

A blocked backend (sliding_window, block_sparse, chunked linear) issues hundreds of small
ops per call. Left to torch's intra-op threads, every op is its own OpenMP parallel region:
its threads meet at a barrier hundreds of times a call, and where idle threads sleep
(``OMP_WAIT_POLICY=PASSIVE``, as attnbench's workers run, or any shared machine) each
region waits for them to wake, which made such a backend far slower than with
spinning threads.

The fused kernels these backends are compared with (sdpa's flash kernel) parallelise once,
over (batch, head, query block), each thread running its share serially. ``split_work``
does the same from Python: the items are cut into a few contiguous pieces per thread, the
threads (torch single-threaded on each; ops release the GIL) take pieces from one queue
until it is empty, and torch's thread count is restored afterwards. Taking pieces rather
than one fixed half each keeps both threads busy to the end when one of them is slowed
(a shared machine's vCPU is now and then taken away). CPU only; a GPU tensor's ops are
asynchronous and gain nothing from it. The fused kernels (``native/``) share their tasks out
the same way inside the kernel (``native/cpu_pieces.h``), without Python between pieces.
"""

from __future__ import annotations

import os
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, wait

import torch

_pool: ThreadPoolExecutor | None = None
_pool_size = 0
_pool_pid = 0  # a forked child inherits the pool object but none of its threads
_pool_lock = threading.Lock()
PIECES_PER_THREAD = 8  # pieces a thread's share is cut into, handed out from one queue


def _executor(workers: int) -> ThreadPoolExecutor:
    """One process-wide pool, grown on demand (threads are started once, not per call)."""
    global _pool, _pool_size, _pool_pid
    with _pool_lock:
        if _pool is None or _pool_size < workers or _pool_pid != os.getpid():
            if _pool is not None and _pool_pid == os.getpid():
                _pool.shutdown(wait=True)
            _pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="attnbench-cpu")
            _pool_size, _pool_pid = workers, os.getpid()
        return _pool


def ranges(n_items: int, parts: int) -> list[tuple[int, int]]:
    """[0, n_items) cut into ``parts`` contiguous ranges whose sizes differ by at most 1."""
    parts = max(1, min(parts, n_items))
    base, extra = divmod(n_items, parts)
    out, lo = [], 0
    for i in range(parts):
        hi = lo + base + (i < extra)
        out.append((lo, hi))
        lo = hi
    return out


def split_work(work: Callable[[int, int], None], n_items: int, device,
               pieces_per_thread: int | None = None) -> None:
    """Call ``work(lo, hi)`` over [0, n_items) in contiguous pieces, on every torch CPU
    thread, each thread taking the next piece until none is left.

    ``work`` must only write what its own range owns (a piece's work buffers are its
    own: allocate them inside ``work``). It runs without autograd (these are
    explicit forward/backward computations), in the caller's inference mode and CPU
    autocast state: these are per thread, so a piece on a pool thread would otherwise run
    without them (tensors made in inference mode may only be written in it, and an
    autocast caller would get ranges computed in two dtypes). With one thread, one item,
    or a non-CPU device it is one plain call with torch's own threading. After an error
    no new piece starts; it is raised once the running ones have ended.
    """
    threads = min(torch.get_num_threads(), max(n_items, 1))
    inference = torch.is_inference_mode_enabled()
    autocast = (torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu"))

    def run(lo: int, hi: int) -> None:
        with torch.inference_mode(inference), torch.no_grad(), \
                torch.autocast("cpu", enabled=autocast[0], dtype=autocast[1]):
            work(lo, hi)

    if torch.device(device).type != "cpu" or threads < 2:
        run(0, n_items)
        return

    per = PIECES_PER_THREAD if pieces_per_thread is None else max(1, pieces_per_thread)
    pieces = deque(ranges(n_items, threads * per))
    failed: list[BaseException] = []

    def drain() -> None:  # popleft is atomic: each piece is taken by exactly one thread
        while pieces and not failed:
            try:
                lo, hi = pieces.popleft()
            except IndexError:
                return
            try:
                run(lo, hi)
            except BaseException as exc:  # stop handing out pieces; raised by the caller
                failed.append(exc)

    before = torch.get_num_threads()
    torch.set_num_threads(1)  # process-wide: every op below runs on its caller's thread
    try:
        futures = [_executor(threads - 1).submit(drain) for _ in range(threads - 1)]
        try:
            drain()
        finally:
            wait(futures)  # never restore the threads while a piece still runs
        if failed:
            raise failed[0]
    finally:
        torch.set_num_threads(before)
