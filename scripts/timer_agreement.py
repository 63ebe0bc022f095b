"""Does attnbench's median agree with torch.utils.benchmark's? Measured interleaved.

For sdpa (fp32 forward, B=1, H=8, D=64, as in the family suite) at each N, the same
prepared closure is timed alternately by attnbench's sampler (``timing.measure``) and by
``torch.utils.benchmark.Timer.blocked_autorange``, for several rounds, in one process set up
like the runner's worker (OMP_WAIT_POLICY=PASSIVE, the worker's allocator settings). Prints
each round and the ratio of the two medians-of-rounds; agreement means within 5%.

    python scripts/timer_agreement.py [--seq-len 2048,8192] [--rounds 4] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as the runner's worker process

import torch  # noqa: E402
import torch.utils.benchmark as tb  # noqa: E402

from attnbench.core.case import Case  # noqa: E402
from attnbench.core.registry import get_backend  # noqa: E402
from attnbench.measure.timing import TimingBudget, measure  # noqa: E402
from attnbench.measure.worker import setup_process  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--seq-len", default="2048,8192")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--json")
    args = p.parse_args()
    setup_process(torch.get_num_threads())
    results = []
    for n in (int(x) for x in args.seq_len.split(",")):
        case = Case(batch=1, heads_q=8, heads_kv=8, seq_q=n, seq_k=n, head_dim=64,
                    head_dim_v=64, dtype="float32", mode="fwd")
        prepared = get_backend("sdpa").prepare(case, case.make_inputs())
        fn = prepared.fn
        budget = TimingBudget(warmup_s=0.2, budget_s=2.0, min_reps=5, max_reps=100)
        timer = tb.Timer(stmt="fn()", globals={"fn": fn}, num_threads=torch.get_num_threads())
        fn()
        ours, theirs = [], []
        for r in range(args.rounds):
            ours.append(measure(fn, "cpu", budget).median_ms)
            theirs.append(timer.blocked_autorange(min_run_time=2.0).median * 1e3)
            print(f"N={n} round {r}: attnbench {ours[-1]:.3f} ms, "
                  f"torch.utils.benchmark {theirs[-1]:.3f} ms", flush=True)
        a, b = statistics.median(ours), statistics.median(theirs)
        ratio = a / b
        verdict = "agree" if abs(ratio - 1) <= 0.05 else "differ"
        print(f"N={n}: attnbench {a:.3f} ms vs torch.utils.benchmark {b:.3f} ms: "
              f"ratio {ratio:.3f} ({verdict} within 5%)", flush=True)
        results.append({"seq_len": n, "attnbench_ms": ours, "torch_benchmark_ms": theirs,
                        "ratio_of_medians": ratio, "verdict": verdict,
                        "threads": torch.get_num_threads(), "torch": torch.__version__})
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(results, fh, indent=2)


if __name__ == "__main__":
    main()
