"""A memory check that does not time anything: the largest tensor any aten op returns.

Used by the backends' tests to show that temporaries stay within a budget or grow linearly
in N (forward and backward), by watching every operator under a TorchDispatchMode.
"""

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


class LargestTensor(TorchDispatchMode):
    """Records, over every op run inside it, the largest result: ``largest_bytes`` by its
    storage (a view reports its base) and ``largest_numel`` by elements; ``ops`` counts ops.
    With ``skip_views`` only ops that allocate count (views of the inputs are ignored)."""

    def __init__(self, skip_views: bool = False):
        super().__init__()
        self.skip_views = skip_views
        self.largest_bytes = 0
        self.largest_numel = 0
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.ops += 1
        if self.skip_views and func.is_view:
            return out
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self.largest_bytes = max(self.largest_bytes, t.untyped_storage().nbytes())
                self.largest_numel = max(self.largest_numel, t.numel())
        return out


def largest_allocation(backend, case) -> int:
    """Bytes of the largest tensor the timed closure (forward, and backward if any) creates."""
    prepared = backend.prepare(case, case.make_inputs())
    with LargestTensor() as mode:
        prepared.fn()
    return mode.largest_bytes


_PEAK_SCRIPT = """
import json, sys
from attnbench.core.case import Case
from attnbench.measure.memory import peak_memory_bytes
from attnbench.core.registry import get_backend
backend = get_backend(sys.argv[1])
peaks = []
for kwargs in json.loads(sys.argv[2]):
    case = Case(**kwargs)
    prepared = backend.prepare(case, case.make_inputs())
    prepared.fn()
    measured = [peak_memory_bytes(prepared.fn, "cpu") for _ in range(3)]
    peaks.append(None if None in measured else min(measured))
print(json.dumps(peaks))
"""


def fresh_process_peaks(backend: str, cases: list[dict], threads: int = 1
                        ) -> list[int | None]:
    """Best-of-three resident peak of each case's timed closure, in a fresh process.

    As in the runner's worker: VmHWM is process-wide, so inside pytest the threads other
    tests leave behind (compilers, profilers) would be counted with the backend's memory.
    One torch thread by default: the blocked backends share their chunks over threads, and
    the peak of two threads' temporaries depends on how their chunks happen to overlap in
    time (block_sparse fwd_bwd at N = 4096 read 32-35 MiB on two threads, 42 on one), which
    hides the growth in N these tests are about.
    """
    import json
    import os
    import subprocess
    import sys

    env = os.environ | {"OMP_NUM_THREADS": str(threads)}
    out = subprocess.run([sys.executable, "-c", _PEAK_SCRIPT, backend, json.dumps(cases)],
                         capture_output=True, text=True, timeout=300, check=True, env=env)
    return json.loads(out.stdout.strip().splitlines()[-1])
