"""How one GPU sample is taken: the suite's ``[timing] method``.

- ``events``: CUDA events around each call, the L2 cache flushed before it (launch overhead
  included: most of a microsecond kernel's sample).
- ``cudagraph``: N calls captured in one CUDA graph and replayed between two events; the
  calls rotate over copies of the inputs whose total is larger than L2, so that no call
  finds the previous one's inputs in the cache. A sample is the replay's time over N.
- ``profiler``: the device time of the kernels one call launched, from torch.profiler
  (no launch gaps, no host overhead).

The timing loop (``timing.measure_interleaved``) is the same for all three: a method only
says how closure ``i`` is sampled (``sample``), when the round's samples are read back
(``settle``), and what a record says about it (``fields``). The method is a GPU notion: on a
CPU every pair is timed by the wall clock (a perf_counter around each call, ``wallclock``),
whatever the suite's method, and the run's meta.json says so once (``cpu_note``). A
cudagraph capture that fails falls back to ``events`` for that closure, and its record says
why (``timing_method_note``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from attnbench.core.errors import NotSupported
from attnbench.measure.budget import TIMING_METHODS

# The CUDA module every method here calls: a module attribute so tests give a fake device.
cuda = torch.cuda

GRAPH_TARGET_MS = 2.0  # a replay long enough that two event reads are a small part of it
GRAPH_MAX_CALLS = 1000  # captured calls at most (graph memory, capture time)
MAX_COPIES = 64  # input copies at most
COPIES_MEMORY_SHARE = 0.25  # copies may take at most this share of the free device memory


def _empty_int32(n: int, device: torch.device) -> torch.Tensor:
    return torch.empty(n, dtype=torch.int32, device=device)


def l2_bytes(device: torch.device) -> int:
    props = cuda.get_device_properties(device)
    return int(getattr(props, "L2_cache_size", 0) or 64 * 2**20)


def l2_flush_buffer(device: torch.device) -> torch.Tensor:
    """A buffer twice the GPU's L2: zeroing it before a call evicts what the last one left."""
    return _empty_int32(2 * l2_bytes(device) // 4 + 1, device)


WALLCLOCK = "wallclock"  # a CPU record's timing_method: perf_counter around each call


def unsupported_reason(method: str, device: torch.device) -> str | None:
    """Why ``method`` cannot time on ``device`` (None: it can; on a CPU every known method
    means the wall clock)."""
    if method not in TIMING_METHODS:
        return f"timing method {method!r} unknown; allowed: {', '.join(TIMING_METHODS)}"
    return None


def cpu_note(method: str, device) -> str | None:
    """What a run's meta.json says, once, when its suite names a GPU method and it runs on a
    CPU (None: nothing to say)."""
    if method == "events" or torch.device(device).type == "cuda":
        return None
    return f"timing.method {method} applies to CUDA devices; CPU pairs timed by the wall clock"


@dataclass
class Copies:
    """How to make closures over fresh copies of a pair's inputs (cudagraph): ``make(k)``
    returns k closures, each over its own copy of inputs of ``input_bytes``."""

    input_bytes: int
    make: Callable[[int], list[Callable[[], object]]]


def input_copy(inputs):
    """A copy of a case's Inputs with tensors of their own (same values, same grad flag)."""
    def fresh(t):
        return None if t is None else t.detach().clone().requires_grad_(t.requires_grad)
    return dataclasses.replace(inputs, q=fresh(inputs.q), k=fresh(inputs.k), v=fresh(inputs.v),
                               grad_out=fresh(inputs.grad_out))


def copies_needed(input_bytes: int, l2: int, free_bytes: int | None = None) -> int:
    """Copies whose total exceeds twice L2 (one more than that): by the time a copy is read
    again, more than L2 of other inputs went through the cache. At most MAX_COPIES, and at
    most COPIES_MEMORY_SHARE of the free memory; at least one."""
    k = math.ceil(2 * l2 / max(input_bytes, 1)) + 1
    if free_bytes is not None:
        k = min(k, int(COPIES_MEMORY_SHARE * free_bytes // max(input_bytes, 1)))
    return max(1, min(k, MAX_COPIES))


def calls_per_graph(call_ms: float, copies: int) -> int:
    """Calls per graph: about GRAPH_TARGET_MS of work, a whole number of rotations over the
    copies (each copy as often), within GRAPH_MAX_CALLS."""
    n = math.ceil(GRAPH_TARGET_MS / call_ms) if call_ms > 0 else GRAPH_MAX_CALLS
    rotations = max(1, math.ceil(n / copies))
    while rotations > 1 and rotations * copies > GRAPH_MAX_CALLS:
        rotations -= 1
    return rotations * copies


class EventsMethod:
    """One cold (L2-flushed) CUDA-event sample per call; read back once per round."""

    name = "events"

    def __init__(self, dev: torch.device):
        self.dev = dev
        self.flush = l2_flush_buffer(dev)
        self.pending: list[tuple[list[float], object, object, int]] = []

    def _timed(self, body: Callable[[], object], into: list[float], per: int = 1) -> None:
        self.flush.zero_()  # evict L2 so every sample starts cold
        begin, end = cuda.Event(enable_timing=True), cuda.Event(enable_timing=True)
        begin.record()
        body()
        end.record()
        self.pending.append((into, begin, end, per))

    def prepare(self, index: int, fn: Callable[[], object]) -> None:
        pass

    def sample(self, index: int, fn: Callable[[], object], into: list[float]) -> None:
        self._timed(fn, into)

    def settle(self) -> None:
        cuda.synchronize(self.dev)
        for into, begin, end, per in self.pending:
            into.append(begin.elapsed_time(end) / per)
        self.pending.clear()

    def fields(self, index: int) -> dict:
        return {"timing_method": self.name}


class GraphMethod(EventsMethod):
    """Each closure's N calls over input copies, captured once in a CUDA graph (at its first
    sample), replayed per sample between two events."""

    name = "cudagraph"

    def __init__(self, dev: torch.device, copies: list[Copies | None] | None = None):
        super().__init__(dev)
        self.copies = copies or []
        self.graphs: dict[int, tuple[object, int, int]] = {}  # index: (graph, calls, copies)
        self.keep: dict[int, list] = {}  # the closures a graph replays stay alive with it
        self.fallback: dict[int, str] = {}  # index: why its capture failed (timed by events)

    def _one_call_ms(self, fn) -> float:
        probe: list[float] = []
        self._timed(fn, probe)
        self.settle()
        return probe[0]

    def _capture(self, index: int, fn) -> tuple[object, int, int]:
        spec = self.copies[index] if index < len(self.copies) else None
        fns = [fn]
        if spec is not None:
            free = cuda.mem_get_info(self.dev)[0] if hasattr(cuda, "mem_get_info") else None
            k = copies_needed(spec.input_bytes, l2_bytes(self.dev), free)
            fns = spec.make(k) if k > 1 else [fn]
        n = calls_per_graph(self._one_call_ms(fn), len(fns))
        try:
            side = cuda.Stream()
            side.wait_stream(cuda.current_stream())
            with cuda.stream(side):  # capture wants its closures warmed off the main stream
                for f in fns:
                    f()
            cuda.current_stream().wait_stream(side)
            graph = cuda.CUDAGraph()
            with cuda.graph(graph):
                for j in range(n):
                    fns[j % len(fns)]()
        except Exception as exc:
            # the pair is still timed (by events) rather than lost; its record says why
            first = (str(exc).strip().splitlines() or [""])[0]
            self.fallback[index] = f"cudagraph capture failed: {type(exc).__name__}: {first}"
            cuda.synchronize(self.dev)  # the failed capture's work ends before events time
            return None
        self.keep[index] = fns
        return graph, n, len(fns)

    def prepare(self, index: int, fn: Callable[[], object]) -> None:
        if index not in self.graphs and index not in self.fallback:
            captured = self._capture(index, fn)
            if captured is not None:
                self.graphs[index] = captured

    def sample(self, index: int, fn: Callable[[], object], into: list[float]) -> None:
        self.prepare(index, fn)
        if index in self.fallback:
            self._timed(fn, into)
            return
        graph, n, _ = self.graphs[index]
        self._timed(graph.replay, into, per=n)

    def fields(self, index: int) -> dict:
        if index in self.fallback:
            return {"timing_method": EventsMethod.name,
                    "timing_method_note": self.fallback[index]}
        _, n, k = self.graphs.get(index, (None, 0, 0))
        return {"timing_method": self.name, "graph_calls": n, "graph_copies": k}


def _profile(fn) -> list:
    """The profiler's events of one call (CUDA activity)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        cuda.synchronize()
    return list(prof.events())


def kernel_device_us(events: list) -> float:
    """Device time of the kernels among profiler events (microseconds)."""
    from torch.autograd import DeviceType

    return sum(e.time_range.elapsed_us() for e in events
               if getattr(e, "device_type", None) == DeviceType.CUDA)


class ProfilerMethod:
    """The summed device time of one call's kernels; the L2 flush runs before, unprofiled."""

    name = "profiler"
    profile = staticmethod(_profile)  # tests give a fake profiler

    def __init__(self, dev: torch.device):
        self.dev = dev
        self.flush = l2_flush_buffer(dev)

    def prepare(self, index: int, fn: Callable[[], object]) -> None:
        pass

    def sample(self, index: int, fn: Callable[[], object], into: list[float]) -> None:
        self.flush.zero_()
        cuda.synchronize(self.dev)
        us = kernel_device_us(self.profile(fn))
        if us <= 0:
            raise NotSupported("timing", ["timing method profiler: the profiler saw no CUDA "
                                          "kernel of this call"])
        into.append(us / 1e3)

    def settle(self) -> None:
        pass

    def fields(self, index: int) -> dict:
        return {"timing_method": self.name}


def for_device(method: str, device: torch.device, copies: list[Copies | None] | None = None):
    """The method object for a GPU group, None on a CPU (timing.py's perf_counter path,
    whatever the method); NotSupported for a method not known."""
    why = unsupported_reason(method, device)
    if why:
        raise NotSupported("timing", [why])
    dev = torch.device(device)
    if dev.type != "cuda":
        return None
    if method == "cudagraph":
        return GraphMethod(dev, copies)
    if method == "profiler":
        return ProfilerMethod(dev)
    return EventsMethod(dev)
