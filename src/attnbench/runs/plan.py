"""The plan of a run before it runs: how many pairs, how long, and whether it is sane.

``attnbench run --dry-run`` prints it; a plan over the limits (too many pairs, or a case
whose inputs alone exceed the device's memory) is refused unless ``--force``, so a typo
such as ``--seq-len 1000000000`` never starts.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from attnbench.core.case import Case
from attnbench.core.dtypes import element_size
from attnbench.core.errors import BadInput
from attnbench.measure.timing import TimingBudget
from attnbench.runs.suite import Suite

MAX_PAIRS = 100_000
SETUP_S = 0.5  # rough per-pair cost outside the timed budget (inputs, check, memory call)
# Nominal rates for the part of a pair's cost that grows with its size (slow calls that
# outlast the budget, the float64 reference): only ever compared with one another, to
# balance ranks (sharding.py), so only their ratio to the budget matters.
NOMINAL_FLOPS = {"cpu": 5e10, "cuda": 5e13}
NOMINAL_BYTES_PER_S = {"cpu": 1e10, "cuda": 2e12}
UNTIMED_CALLS = 4  # warm-up, checked call, reference, memory call


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


def size_problem(suite: Suite, device: str) -> str | None:
    """The refusal of a plan too large, read from the lengths of its axes (nothing expanded,
    so a suite of millions of pairs is refused in milliseconds); None when it may fit."""
    low, _ = suite.pair_bounds(device)
    if low > MAX_PAIRS:
        return f"at least {low} pairs exceed the limit of {MAX_PAIRS}"
    return None


def expand(suite: Suite, device: str, force: bool) -> list[tuple[Case, str]]:
    """The plan's jobs; without ``force`` expansion stops past MAX_PAIRS (the plan is refused
    then, and need not be made whole)."""
    return suite.jobs_on(device, limit=None if force else MAX_PAIRS)


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
        more = "more than " if self.pairs > MAX_PAIRS else ""  # expansion stopped there
        return (f"{more}{self.pairs} (case, backend) pairs over {self.cases} cases; about "
                f"{self.estimate_s / 60:.1f} min at the suite's budgets (more for slow "
                f"calls){big}")

    def problems(self) -> list[str]:
        out = []
        if self.pairs > MAX_PAIRS:
            out.append(f"more than {MAX_PAIRS} pairs (the limit)")
        if self.memory_bytes and self.largest_bytes > self.memory_bytes:
            out.append(f"the inputs of {self.largest.key} alone need "
                       f"{self.largest_bytes / 2**30:.3g} GiB, more than the device's "
                       f"{self.memory_bytes / 2**30:.3g} GiB")
        return out


def pair_budget_s(timing: TimingBudget) -> float:
    """What any pair costs at the suite's budgets: warm-up, timed budget, setup."""
    return timing.warmup_s + timing.budget_s + SETUP_S * timing.processes


def pair_cost_s(case: Case, timing: TimingBudget, work_flops: float | None = None) -> float:
    """A pair's estimated cost: the budget, plus its counted work (the backend's FLOPs) and
    bytes at nominal rates for the calls no budget bounds (the minimum repetitions and the
    untimed ones), which dominate for the largest cases."""
    kind = case.device.split(":")[0]
    per_call = ((work_flops if work_flops is not None else case.flops)
                / NOMINAL_FLOPS.get(kind, NOMINAL_FLOPS["cpu"])
                + case.bytes / NOMINAL_BYTES_PER_S.get(kind, NOMINAL_BYTES_PER_S["cpu"]))
    primed = 2 if kind == "cpu" else 1  # on CPU an untimed call precedes each timed one
    calls = timing.processes * (primed * timing.min_reps + UNTIMED_CALLS)
    return pair_budget_s(timing) + calls * per_call


def make_plan(suite: Suite, jobs: list[tuple[Case, str]], device: str) -> Plan:
    per_pair = pair_budget_s(suite.timing)
    cases = {c.key: c for c, _ in jobs}
    largest = max(cases.values(), key=input_bytes, default=None)
    return Plan(len(jobs), len(cases), per_pair * len(jobs), largest,
                input_bytes(largest) if largest else 0, device_memory_bytes(device))


def check_plan(plan: Plan, force: bool) -> None:
    problems = plan.problems()
    if problems and not force:
        raise BadInput(f"plan refused: {'; '.join(problems)}; allowed: a smaller sweep, or "
                       f"--force to run it anyway")
