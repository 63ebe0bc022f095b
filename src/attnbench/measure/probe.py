"""The drift probe: a small fixed workload timed between measuring rounds.

Its rate (GFLOP/s of one fixed matmul) tells how fast the machine is at that moment: on a
shared VM or a throttling laptop it moves, and a record measured while it moved is flagged
``noisy`` (a flag beside the status). The probe is sized for about a millisecond per call,
so reading it costs little; reads are rate-limited to one per ``interval_s``.
"""

from __future__ import annotations

import statistics
import time

import torch

from attnbench.measure import timing

# Square matmul size per device type: ~1 ms on 2 CPU cores, ~0.1 ms on a datacenter GPU.
PROBE_N = {"cpu": 256, "cuda": 4096}


class DriftProbe:
    def __init__(self, device: str | torch.device, interval_s: float = 0.05, calls: int = 3):
        self.dev = torch.device(device)
        n = PROBE_N.get(self.dev.type, 256)
        dtype = torch.float16 if self.dev.type == "cuda" else torch.float32
        gen = torch.Generator().manual_seed(0)
        self.a = torch.randn(n, n, generator=gen).to(self.dev, dtype)
        self.b = torch.randn(n, n, generator=gen).to(self.dev, dtype)
        self.flop = 2.0 * n**3
        self.interval_s = interval_s
        self.calls = calls
        # (time on the timer's clock, GFLOP/s)
        self.readings: list[tuple[float, float]] = []
        self._last = -float("inf")

    def _sync(self) -> None:
        if self.dev.type == "cuda":
            torch.cuda.synchronize(self.dev)

    def read(self) -> float:
        """The probe's rate now: the best of a few calls, in GFLOP/s."""
        best = float("inf")
        for _ in range(self.calls):
            self._sync()
            t0 = time.perf_counter()  # the real machine's speed, whatever clock times
            torch.matmul(self.a, self.b)
            self._sync()
            best = min(best, time.perf_counter() - t0)
        now = timing.clock()
        rate = self.flop / best / 1e9
        self.readings.append((now, rate))
        self._last = now
        return rate

    def maybe_read(self) -> float | None:
        if timing.clock() - self._last >= self.interval_s:
            return self.read()
        return None

    def readings_since(self, start: float) -> list[float]:
        return [rate for t, rate in self.readings if t >= start]


def spread(rates: list[float]) -> float | None:
    """(max - min) / median of probe rates; None with fewer than two readings."""
    if len(rates) < 2:
        return None
    return (max(rates) - min(rates)) / statistics.median(rates)


def summary(rates: list[float]) -> dict:
    """The probe over a whole run, for meta.json."""
    if not rates:
        return {"n": 0}
    return {"n": len(rates), "gflops_min": min(rates), "gflops_median": statistics.median(rates),
            "gflops_max": max(rates), "spread": spread(rates)}
