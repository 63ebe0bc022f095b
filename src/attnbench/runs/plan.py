"""The plan of a run before it runs: how many pairs, how long, and whether it is sane.

``attnbench run --dry-run`` prints it; a plan over the limits (too many pairs, or a case
whose inputs alone exceed the device's memory) is refused unless ``--force``, so a typo
such as ``--seq-len 1000000000`` never starts.
"""

from __future__ import annotations

import dataclasses
import functools
import statistics
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from attnbench.core.case import Case
from attnbench.core.dtypes import element_size
from attnbench.core.errors import BadInput
from attnbench.measure.budget import TimingBudget
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
    import torch  # here: a plan's size is checked before torch is imported

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
    so a suite of millions of pairs is refused in milliseconds); None when it may fit.
    ``device`` may be a request not yet resolved (``auto``: resolving it imports torch): the
    bound is then the least over the device types it may be that some sweep runs on, so a
    plan refused here is refused wherever it would run."""
    from attnbench.runs.overrides import device_types

    kinds = [k for k in device_types(device) if any(s.runs_on(k) for s in suite.sweeps)]
    low = min((suite.pair_bounds(k)[0] for k in kinds), default=0)
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
    assumed: str = ""  # what the estimate rests on (``estimate``)
    # sequential claims whose pairs take every round they may: the longest the run can take
    most_s: float | None = None

    def summary(self) -> str:
        mem = "" if self.memory_bytes is None else f" of {self.memory_bytes / 2**30:.0f} GiB"
        big = "" if self.largest is None else (
            f"; largest inputs {self.largest_bytes / 2**20:.4g} MiB{mem} ({self.largest.key})")
        more = "more than " if self.pairs > MAX_PAIRS else ""  # expansion stopped there
        how = f" ({self.assumed})" if self.assumed else " at the suite's budgets"
        most = ""
        if self.most_s is not None and self.most_s > 1.05 * self.estimate_s:
            most = (f", up to {self.most_s / 60:.1f} min if every sequential claim takes all "
                    f"its rounds")
        return (f"{more}{self.pairs} (case, backend) pairs over {self.cases} cases; about "
                f"{self.estimate_s / 60:.1f} min{most}{how}{big}")

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
    return pair_budget_s(timing) + timing.processes * (
        timing.min_reps * timed_call_s(per_call, timing, kind) + UNTIMED_CALLS * per_call)


def timed_call_s(t: float, timing: TimingBudget, kind: str) -> float:
    """Wall seconds of one timed call that takes ``t`` seconds, with the untimed calls that
    precede it: on CPU at least one, and for at least ``rewarm_s``; on a GPU none."""
    return t + (max(t, timing.rewarm_s) if kind == "cpu" else 0.0)


def make_plan(suite: Suite, jobs: list[tuple[Case, str]], device: str,
              history: Path | None = None, measure: bool = False) -> Plan:
    """The plan; its time from ``estimate`` when ``history`` (a results folder) is given or
    ``measure`` allows measuring the matmul rate, else the suite's budgets alone. A plan
    whose inputs exceed the device's memory is refused: it is not estimated (the estimate
    asks every backend about every case, and planning a case of 2**62 tokens never ends)."""
    cases = {c.key: c for c, _ in jobs}
    largest = max(cases.values(), key=input_bytes, default=None)
    largest_bytes = input_bytes(largest) if largest else 0
    memory = device_memory_bytes(device)
    fits = not (memory and largest_bytes > memory)
    most = None
    if (history is not None or measure) and fits:
        seconds, assumed, most = estimate(suite, jobs, device, history)
    else:
        seconds, assumed = pair_budget_s(suite.timing) * len(jobs), ""
    return Plan(len(jobs), len(cases), seconds, largest, largest_bytes, memory, assumed, most)


# ---- the estimate: per-call times from measured rates, calibrated by an earlier run ------
SKIP_S = 0.05  # a pair that cannot run (unsupported, unavailable): a record, no worker time
DEFAULT_EFFICIENCY = 0.25  # share of the matmul rate a call reaches, without an earlier run


def call_pair_s(t: float, timing: TimingBudget, kind: str, rounds: int | None = None
                ) -> float:
    """Wall seconds of one pair whose call takes ``t`` seconds: per worker process its
    setup, warm-up and timed rounds (``timed_call_s`` each; the repetitions the budget
    allows, within min and max, or ``rounds`` pooled over the processes where a sequential
    claim sets them), then the untimed calls."""
    share = timing.per_process()
    per_timed = timed_call_s(t, timing, kind)
    reps = min(max(share.min_reps, share.budget_s / per_timed), share.max_reps)
    if rounds is not None:
        reps = max(reps, -(-rounds // timing.processes))
    per_process = SETUP_S + max(share.warmup_s, share.min_warmup * t) + reps * per_timed
    return timing.processes * per_process + UNTIMED_CALLS * t


def _runs_of(results: Path, suite: str, kind: str) -> list[tuple[Path, dict]]:
    """Finished earlier runs of ``suite`` on this device type, newest first."""
    from attnbench.runs import record_files
    out = []
    for d in results.iterdir() if results.is_dir() else []:
        if not (d / "meta.json").is_file():
            continue
        try:
            meta = record_files.read_meta(d)
        except Exception:  # an unreadable run is no evidence
            continue
        device = str((meta.get("invocation") or {}).get("device") or "")
        records = d / record_files.RECORDS
        if meta.get("suite") == suite and meta.get("ended") and meta.get("started") \
                and records.is_file() and (device in ("", "auto") or device.startswith(kind)):
            out.append((d, meta))
    return sorted(out, key=lambda r: str(r[1]["started"]), reverse=True)


def _seconds(meta: dict) -> float:
    start, end = (datetime.fromisoformat(meta[k]) for k in ("started", "ended"))
    return (end - start).total_seconds()


def _call_s(case: Case, backend: str, rate: float, efficiency: dict[str, float],
            known: dict[tuple[str, str], float]) -> float:
    if (case.key, backend) in known:
        return known[(case.key, backend)]
    eff = efficiency.get(backend, statistics.median(efficiency.values()) if efficiency
                         else DEFAULT_EFFICIENCY)
    return case.flops / (rate * eff) + case.bytes / NOMINAL_BYTES_PER_S.get(
        case.device.split(":")[0], NOMINAL_BYTES_PER_S["cpu"])


class Runnable:
    """Whether a backend runs a case, asked once per (backend, case key) and once per
    backend for its availability: the estimate models the same pairs more than once."""

    def __init__(self):
        from attnbench.core.registry import all_backends
        self.backends = all_backends()
        self.available: dict[str, bool] = {}
        self.answers: dict[tuple[str, str], bool] = {}

    def __call__(self, case: Case, name: str) -> bool:
        pair = (name, case.key)
        if pair not in self.answers:
            b = self.backends.get(name)
            if b is not None and name not in self.available:
                self.available[name] = bool(b.is_available()[0])
            self.answers[pair] = (b is not None and self.available[name]
                                  and not b.not_supported_reasons(case))
        return self.answers[pair]


def _modelled_s(jobs, timing: TimingBudget, rate: float, efficiency: dict, known: dict,
                kind: str, rounds: dict | None = None, runs: Runnable | None = None
                ) -> float:
    """The cost model's seconds for ``jobs``; ``rounds`` ((case key, backend) -> pooled
    rounds) for the pairs a sequential claim keeps timing."""
    runs = runs or Runnable()
    total = 0.0
    for case, name in jobs:
        if not runs(case, name):
            total += SKIP_S
        else:
            total += call_pair_s(_call_s(case, name, rate, efficiency, known), timing, kind,
                                 (rounds or {}).get((case.key, name)))
    return total


def claim_round_budget(suite: Suite, jobs) -> dict[tuple[str, str], int]:
    """(case key, backend) -> the last look's rounds, for every pair of a group that holds
    both sides of a sequential claim (the whole group is timed in its rounds)."""
    if not suite.claims:  # nothing to pair: no need to import the claims' statistics
        return {}
    from attnbench.runs.pairing import claim_rounds, job_groups
    out = {}
    for group in job_groups(list(jobs), suite.claims, suite.comparisons):
        rule = claim_rounds(group, suite.claims)
        if rule is not None:
            out.update({(c.key, b): rule.looks[-1] for c, b in group})
    return out


def estimate(suite: Suite, jobs: list[tuple[Case, str]], device: str,
             history: Path | None) -> tuple[float, str, float]:
    """Seconds the run will take, and what that assumes. Per-call times come from the
    newest finished earlier run of the suite on this device type under ``history`` (its
    median times per pair, each backend's share of its measured matmul rate for pairs it did
    not run), or else from the matmul rate measured now at ``DEFAULT_EFFICIENCY``; the cost
    model (``call_pair_s``) is then scaled by the earlier run's measured wall time over what
    the model says of that run, which folds in worker start-up and the ceilings. The third
    value is the longest it may take: every sequential claim's pairs timed to its last look
    (a claim decided at its first look takes a fraction of that, and which it will be is
    not known in advance)."""
    from attnbench.runs import record_files
    kind = device.split(":")[0]
    most_rounds = claim_round_budget(suite, jobs)
    earlier = _runs_of(history, suite.name, kind) if history is not None else []
    if earlier:
        here = _machine(device)
        same = [r for r in earlier if _machine_of(r[1]) in (here, UNKNOWN_MACHINE)]
        run_dir, meta = (same or earlier)[0]
        records = [r for r in record_files.read_records(run_dir)]
        rate = float(max((meta.get("ceilings") or {}).get("matmul_tflops", {}).values(),
                         default=0.0)) * 1e12
        # Another machine's times say little of this one's until scaled by the two matmul
        # rates (a 2.4x faster AVX-512 host read 2x low here without it).
        scale, moved = 1.0, ""
        then_fp32 = float(((meta.get("ceilings") or {}).get("matmul_tflops") or {}).get(
            "float32") or 0.0) * 1e12  # like for like: _matmul_rate is fp32
        if not same and then_fp32:
            now = _matmul_rate(device)
            scale, rate = then_fp32 / now, rate * now / then_fp32
            moved = (f" (measured on {_machine_of(meta)[0] or 'another machine'}: its times "
                     f"scaled x{scale:.2f} by its matmul rate over this machine's, measured "
                     f"now)")
        known = {(r["key"], r["backend"]): r["time_ms_median"] * 1e-3 * scale for r in records
                 if r.get("status") == "ok" and r.get("time_ms_median")}
        shares: dict[str, list[float]] = {}
        for r in records:
            if r.get("status") == "ok" and r.get("time_ms_median") and r.get("flops") and rate:
                shares.setdefault(r["backend"], []).append(
                    r["flops"] / (r["time_ms_median"] * 1e-3) / rate)
        efficiency = {b: statistics.median(v) for b, v in shares.items()}
        rate = rate or _matmul_rate(device)
        then = TimingBudget(**{k: v for k, v in (meta.get("timing") or {}).items()
                               if k in {f.name for f in dataclasses.fields(TimingBudget)}})
        own = [(Case(**{k: v for k, v in r.items() if k in Case.columns() and v is not None}),
                r["backend"]) for r in records]
        runs = Runnable()
        modelled = _modelled_s(own, then, rate, efficiency, known, kind, runs=runs)
        factor = min(max(_seconds(meta) * scale / modelled, 0.2), 5.0) if modelled > 0 else 1.0
        seconds = factor * _modelled_s(jobs, suite.timing, rate, efficiency, known, kind,
                                       runs=runs)
        most = factor * _modelled_s(jobs, suite.timing, rate, efficiency, known, kind,
                                    most_rounds, runs) if most_rounds else seconds
        covered = sum((c.key, b) in known for c, b in jobs)
        return seconds, (f"from run {run_dir.name}{moved}: {_seconds(meta) / 60:.1f} min measured; "
                         f"{covered} of {len(jobs)} pairs at its measured times, the rest at "
                         f"its backends' rates; the model scaled x{factor:.2f} to match that "
                         f"run"), max(most, seconds)
    rate = _matmul_rate(device)
    runs = Runnable()
    seconds = _modelled_s(jobs, suite.timing, rate, {}, {}, kind, runs=runs)
    most = _modelled_s(jobs, suite.timing, rate, {}, {}, kind, most_rounds, runs) \
        if most_rounds else seconds
    return seconds, (f"no earlier run of {suite.name} on {kind}: calls at "
                     f"{DEFAULT_EFFICIENCY:.0%} of the matmul rate measured now "
                     f"({rate / 1e9:.0f} GFLOP/s); a first run can take 2x longer"), \
        max(most, seconds)


UNKNOWN_MACHINE = (None, None, None)  # a run that recorded no environment: taken as this one


def _machine_of(meta: dict) -> tuple:
    """What tells two machines apart for timing: the device's name, the CPU kernels'
    capability, the threads."""
    env = meta.get("environment") or {}
    return env.get("device_name"), env.get("cpu_capability"), env.get("threads")


@functools.cache
def _machine(device: str) -> tuple:
    from attnbench.runs.environment import collect
    return _machine_of({"environment": collect(device)})


@functools.cache
def _matmul_rate(device: str) -> float:
    """fp32 matmul FLOP/s now, measured once per process (one size on CPU: 1024^3)."""
    from attnbench.measure.ceilings import matmul_tflops
    return matmul_tflops("float32", device, 1024 if device.startswith("cpu") else None) * 1e12


def check_plan(plan: Plan, force: bool) -> None:
    problems = plan.problems()
    if problems and not force:
        raise BadInput(f"plan refused: {'; '.join(problems)}; allowed: a smaller sweep, or "
                       f"--force to run it anyway")
