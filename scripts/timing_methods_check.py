"""Do the three GPU timing methods agree? A few pairs timed under each.

Each pair is run as a run runs it (``execute_group``: setup, the float64 check, timing)
once per ``[timing] method`` (events, cudagraph, profiler; measure/timing_methods.py),
and the JSON says each method's median and its ratio to ``events``. A ratio far below 1
on a microsecond kernel is the launch overhead ``events`` includes. On a CPU (the GPU
check's rehearsal) cudagraph and profiler are recorded unsupported, with their reason.

    python scripts/timing_methods_check.py --device cuda --out timing-methods.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

import torch

from attnbench.core.case import Case
from attnbench.measure.budget import TIMING_METHODS, TimingBudget
from attnbench.measure.case_cache import CaseCache
from attnbench.measure.execute import execute_group
from attnbench.measure.worker import setup_process

AGREE_REL = 0.10  # two methods agree when their medians are within this of each other
BUDGET = TimingBudget(warmup_s=0.02, budget_s=0.2, min_reps=10, max_reps=40)

# A prefill pair of each kind the suite compares, and two decode calls (microseconds).
PREFILL = dict(batch=4, heads_q=16, heads_kv=16, seq_q=4096, seq_k=4096, head_dim=128,
               head_dim_v=128, dtype="bfloat16", mask="causal", mode="fwd")
DECODE = dict(batch=8, heads_q=32, heads_kv=8, seq_q=1, seq_k=8192, head_dim=128,
              head_dim_v=128, dtype="bfloat16", mask="none", mode="fwd")
GPU_PAIRS = [(PREFILL, "sdpa_flash"), (PREFILL, "triton_flash"), (DECODE, "sdpa_flash"),
             (DECODE, "sdpa_efficient")]
CPU_PAIRS = [(dict(batch=1, heads_q=2, heads_kv=2, seq_q=64, seq_k=64, head_dim=16,
                   head_dim_v=16), "sdpa"),
             (dict(batch=1, heads_q=2, heads_kv=2, seq_q=64, seq_k=64, head_dim=16,
                   head_dim_v=16), "naive")]


def one_pair(case: Case, backend: str) -> dict:
    cache = CaseCache()  # inputs and the float64 reference, shared by the three methods
    out = {"backend": backend, "key": case.key, "methods": {}}
    # on a CPU every method is the wall clock: one timing, nothing to agree on
    methods = TIMING_METHODS if torch.device(case.device).type == "cuda" else ("events",)
    for method in methods:
        (rec,) = execute_group([(case, backend)], dataclasses.replace(BUDGET, method=method),
                               cache)
        got = {"status": rec.status, "reason": rec.reason}
        for name in ("time_ms_median", "time_ms_ci_low", "time_ms_ci_high", "n_samples"):
            if name in rec.metrics:
                got[name] = rec.metrics[name]
        for name in ("graph_calls", "graph_copies", "gpu_sm_mhz", "throttled"):
            if name in rec.info:
                got[name] = rec.info[name]
        out["methods"][method] = got
    events = out["methods"]["events"].get("time_ms_median")
    ratios = {m: g["time_ms_median"] / events for m, g in out["methods"].items()
              if m != "events" and events and "time_ms_median" in g}
    out["ratio_to_events"] = ratios
    out["agree"] = bool(ratios) and all(abs(r - 1) <= AGREE_REL for r in ratios.values())
    return out


def line(pair: dict) -> str:
    parts = []
    for method, got in pair["methods"].items():
        if "time_ms_median" in got:
            parts.append(f"{method} {got['time_ms_median']:.4g} ms")
        else:
            parts.append(f"{method} {got['status']} ({got['reason']})")
    ratios = ", ".join(f"{m}/events {r:.3g}" for m, r in pair["ratio_to_events"].items())
    return (f"{pair['backend']} {pair['key']}: " + "; ".join(parts)
            + (f"; {ratios}; {'agree' if pair['agree'] else 'differ'} within {AGREE_REL:.0%}"
               if ratios else ""))


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--out", required=True)
    args = p.parse_args()
    setup_process(torch.get_num_threads())
    pairs = GPU_PAIRS if args.device == "cuda" else CPU_PAIRS
    results = []
    for fields, backend in pairs:
        case = Case(**fields, device=args.device)
        results.append(one_pair(case, backend))
        print(line(results[-1]), flush=True)
        with open(args.out, "w", encoding="utf-8") as fh:  # a cut step keeps what it timed
            json.dump({"agree_rel": AGREE_REL, "pairs": results}
                      | ({} if args.device == "cuda" else
                         {"note": "timing methods apply to CUDA devices; CPU pairs timed "
                                  "once, by the wall clock"}),
                      fh, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
