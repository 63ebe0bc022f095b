"""The plan of a run before it runs: how many pairs, how long, and whether it is sane.

``attnbench run --dry-run`` prints it; a plan over the limits (too many pairs, or a case
whose inputs alone exceed the device's memory) is refused unless ``--force``, so a typo
such as ``--seq-len 1000000000`` never starts.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from .case import Case
from .dtypes import element_size
from .errors import BadInput
from .suite import Suite

MAX_PAIRS = 100_000
SETUP_S = 0.5  # rough per-pair cost outside the timed budget (inputs, check, memory call)


def input_bytes(case: Case) -> int:
    """Bytes q, k, v (and grad_out in backward modes) hold."""
    e = element_size(case.dtype)
    q = case.batch * case.heads_q * case.seq_q * case.head_dim
    kv = case.batch * case.heads_kv * case.seq_k * (case.head_dim + case.head_dim_v)
    go = case.batch * case.heads_q * case.seq_q * case.head_dim_v if case.needs_grad else 0
    return e * (q + kv + go)


def device_memory_bytes(device: str) -> int | None:
    dev = torch.device(device)
    if dev.type == "cuda" and torch.cuda.is_available():
        return torch.cuda.get_device_properties(dev).total_memory
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


@dataclass
class Plan:
    pairs: int
    cases: int
    estimate_s: float
    largest: Case | None
    largest_bytes: int
    memory_bytes: int | None

    def summary(self) -> str:
        mem = "" if self.memory_bytes is None else f" of {self.memory_bytes / 2**30:.0f} GiB"
        big = "" if self.largest is None else (
            f"; largest inputs {self.largest_bytes / 2**20:.4g} MiB{mem} ({self.largest.key})")
        return (f"{self.pairs} (case, backend) pairs over {self.cases} cases; about "
                f"{self.estimate_s / 60:.1f} min at the suite's budgets (more for slow "
                f"calls){big}")

    def problems(self) -> list[str]:
        out = []
        if self.pairs > MAX_PAIRS:
            out.append(f"{self.pairs} pairs exceed the limit of {MAX_PAIRS}")
        if self.memory_bytes and self.largest_bytes > self.memory_bytes:
            out.append(f"the inputs of {self.largest.key} alone need "
                       f"{self.largest_bytes / 2**30:.3g} GiB, more than the device's "
                       f"{self.memory_bytes / 2**30:.3g} GiB")
        return out


def make_plan(suite: Suite, jobs: list[tuple[Case, str]], device: str) -> Plan:
    t = suite.timing
    per_pair = t.warmup_s + t.budget_s + SETUP_S * t.processes
    cases = {c.key: c for c, _ in jobs}
    largest = max(cases.values(), key=input_bytes, default=None)
    return Plan(len(jobs), len(cases), per_pair * len(jobs), largest,
                input_bytes(largest) if largest else 0, device_memory_bytes(device))


def check_plan(plan: Plan, force: bool) -> None:
    problems = plan.problems()
    if problems and not force:
        raise BadInput(f"plan refused: {'; '.join(problems)}; allowed: a smaller sweep, or "
                       f"--force to run it anyway")
