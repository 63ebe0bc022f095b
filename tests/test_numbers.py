"""Numbers that hold up: paired rounds against drift, distinct rows for knob sweeps,
declared metrics, the typed record, honest work counts."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pandas as pd
import pytest

from attnbench.core import metrics
from attnbench.core.case import Case
from attnbench.core.record import Record
from attnbench.core.registry import all_backends
from attnbench.measure.ceilings import copy_roof
from attnbench.measure.execute import CaseCache, execute, execute_group
from attnbench.measure.timing import TimingBudget
from attnbench.reporting import tables
from attnbench.stats import intervals

ROOT = Path(__file__).resolve().parents[1]

# Enough rounds for a tight interval; target_rel 0 so sampling never stops early.
# rewarm_s 0: one untimed call before each timed one, which the drifting fakes' wobble
# counts on (it flips every second call).
DRIFT_BUDGET = TimingBudget(warmup_s=0.0, budget_s=0.3, min_reps=12, max_reps=40,
                            min_warmup=1, target_rel=0.0, rewarm_s=0.0)


def test_paired_rounds_recover_the_true_ratio_under_drift(fake_clock):
    """The machine slows down ~1.5x per 100 ms (of a fake clock the calls advance, so the
    numbers are exact under any load). Timed one after the other, the slow backend (2 units)
    sees a faster machine than the fast one (1 unit) and the ratio reads far below 2; timed
    in interleaved rounds, the paired interval contains 2."""
    from fake_backends import Drift

    case = Case(batch=1, heads_q=1, heads_kv=1, seq_q=8, seq_k=8, head_dim=4, head_dim_v=4)
    cache = CaseCache()
    Drift.restart()
    slow = execute(case, "fake_drift_slow", DRIFT_BUDGET, cache)
    fast = execute(case, "fake_drift_fast", DRIFT_BUDGET, cache)
    sequential = intervals.ratio_interval(slow.info["samples_ms"], fast.info["samples_ms"])
    assert not sequential.contains(2.0), sequential

    Drift.restart()
    slow, fast = execute_group([(case, "fake_drift_slow"), (case, "fake_drift_fast")],
                               DRIFT_BUDGET, cache)
    assert slow.status == fast.status == "ok"
    assert slow.info["pair_group"] == fast.info["pair_group"]
    a, b = slow.info["samples_ms"], fast.info["samples_ms"]
    assert len(a) == len(b) >= 12
    paired = intervals.paired_ratio_interval(a, b)
    assert paired.contains(2.0), paired
    assert paired.half_width_rel < 0.15  # and an informative one (the wobble is +-5%)
    assert max(a) / min(a) > 2  # the drift really was there during the paired rounds


def test_adaptive_sampling_stops_when_precise(fake_clock, monkeypatch):
    from fake_backends import Drift

    monkeypatch.setattr(Drift, "per_step", 0.0)  # a steady machine, +-5% call to call
    monkeypatch.setattr(Drift, "unit_ms", 2.0)
    case = Case(batch=1, heads_q=1, heads_kv=1, seq_q=8, seq_k=8, head_dim=4, head_dim_v=4)
    budget = TimingBudget(warmup_s=0.0, budget_s=5.0, min_reps=3, max_reps=200,
                          target_rel=0.06)
    rec = execute(case, "fake_drift_slow", budget, CaseCache())
    assert rec.info["sampling_stop"] == "precision"
    # 3.8 and 4.2 ms, two of each in turn: from n = 6 (the first count whose interval can
    # cover 95%) the interval is [3.8, 4.2]; the median sits at 4.0 (within 6%) at n = 8
    assert rec.metrics["n_samples"] == 8
    assert sorted({round(x, 9) for x in rec.info["samples_ms"]}) == [3.8, 4.2]
    low, high, med = (rec.metrics[k] for k in ("time_ms_ci_low", "time_ms_ci_high",
                                               "time_ms_median"))
    assert low <= med <= high and max(high - med, med - low) <= 0.06 * med


def _linear_knob_records():
    budget = TimingBudget(warmup_s=0.0, budget_s=0.01, min_reps=2, max_reps=3)
    cache = CaseCache()
    rows = []
    for fmap in ("elu", "favor"):
        for n in (32, 64):
            case = Case(batch=1, heads_q=2, heads_kv=2, seq_q=n, seq_k=n, head_dim=16,
                        head_dim_v=16, feature_map=fmap, num_features=32)
            rows.append(execute(case, "linear", budget, cache).to_row() | {"run_id": "r"})
    return pd.DataFrame(rows)


def test_knob_sweep_gets_a_row_per_knob_value_in_every_table(tmp_path):
    df = _linear_knob_records()
    assert (df["status"] == "ok").all(), df[["status", "reason"]]
    assert "feature_map" in tables.line_columns(df)
    for m in metrics.tabulated():
        if m.name in df.columns and df[m.name].notna().any():
            table = tables.pivot(df, m.name)
            assert len(table) == 2, (m.name, table)
            assert set(table.index.get_level_values("feature_map")) == {"elu", "favor"}
    # the plot draws one line per knob value too
    from attnbench.reporting.plots import time_chart

    drawn = []
    import matplotlib.axes

    original = matplotlib.axes.Axes.errorbar

    def spy(self, *args, label=None, **kwargs):
        drawn.append(label)
        return original(self, *args, label=label, **kwargs)

    matplotlib.axes.Axes.errorbar = spy
    try:
        assert time_chart(df, "t", tmp_path / "p.png", tables.line_columns(df))
    finally:
        matplotlib.axes.Axes.errorbar = original
    assert sorted(drawn) == ["feature_map=elu linear", "feature_map=favor linear"]


def test_pivot_never_drops_a_record():
    row = {"run_id": "r", "key": "k", "backend": "b", "status": "ok", "seq_q": 8, "seq_k": 8,
           "dtype": "float32", "mask": "none", "mode": "fwd", "time_ms_median": 1.0}
    df = pd.DataFrame([row, row | {"time_ms_median": 9.0}])
    cell = tables.pivot(df).iloc[0, 0]
    assert "1" in cell and "9" in cell


def test_every_record_is_built_by_one_constructor_and_round_trips():
    case = Case(seq_q=8, seq_k=8, head_dim=4, head_dim_v=4, feature_map="favor",
                block_pairs=((0, 1),))
    rec = Record.new(case, "linear", "crashed", "worker process killed by signal SIGSEGV",
                     time_ms_median=1.5, kernel="x")
    assert rec.metrics == {"time_ms_median": 1.5} and rec.info == {"kernel": "x"}
    back = Record.from_row(rec.to_row())
    assert back == rec
    with pytest.raises(ValueError, match="allowed: ok, unavailable"):
        Record.new(case, "linear", "exploded")


def test_records_doc_lists_every_declared_metric():
    doc = (ROOT / "docs" / "records.md").read_text()
    assert metrics.markdown_table() in doc, "regenerate: python -m attnbench.core.metrics"


def test_compare_direction_comes_from_the_declarations():
    assert metrics.get("time_ms_median").worse(1.2, 0.1)
    assert metrics.get("tflops").worse(0.8, 0.1) and not metrics.get("tflops").worse(1.2, 0.1)
    assert metrics.get("peak_mem_bytes").worse(1.2, 0.1)
    with pytest.raises(KeyError, match="not a declared metric"):
        metrics.get("energy_j")


@pytest.mark.parametrize("name,case", [
    ("block_sparse", Case(seq_q=2048, seq_k=2048, head_dim=64, head_dim_v=64,
                          block_layout_name="bigbird", block_size=64)),
    ("linear", Case(seq_q=4096, seq_k=4096, head_dim=64, head_dim_v=64)),
    ("sliding_window", Case(seq_q=4096, seq_k=4096, mask="window(255,0)")),
    ("additive", Case(seq_q=512, seq_k=512)),
    ("sdpa", Case(seq_q=512, seq_k=512, mask="causal")),
])
def test_work_is_counted_per_backend(name, case):
    backend = all_backends()[name]
    work = backend.work_flops(case)
    assert work > 0 and math.isfinite(work)
    if name == "sdpa":
        assert work == case.flops
    if name == "linear":  # O(N) work: far below the dense count
        assert work < case.flops_dense / 10
    if name == "sliding_window":  # the band and its ragged edge, far below dense
        assert case.flops <= work < case.flops_dense / 4
    if name == "block_sparse":  # the layout's tiles of a dense case
        assert work < case.flops_dense / 2


def test_design_doc_is_in_the_repo_and_cited():
    assert (ROOT / "docs" / "design.md").exists()
    for path in (ROOT / "src").rglob("*.py"):
        assert not re.search(r"(?<!docs/)DESIGN\.md", path.read_text()), path


def test_groups_are_timed_in_fresh_processes_and_pooled(fake_clock, write_suite, tmp_path):
    """processes = 2: each group is timed in a second, fresh worker too; the records pool
    both processes' samples (still round-aligned) and say so."""
    from attnbench.runs.record_files import read_records
    from attnbench.runs.runner import RunOptions, run_suite
    from attnbench.runs.suite import load_suite

    path = write_suite('name = "p"\nbackends = ["fake_drift_slow", "fake_drift_fast"]\n'
                       "[timing]\nwarmup_s = 0.0\nrewarm_s = 0.0\nbudget_s = 0.02\nmin_reps = 6\n"
                       "max_reps = 6\nprocesses = 2\ntimeout_s = 60\n"
                       "[axes]\nheads_q = 1\nhead_dim = 4\nseq_len = 8\n")
    suite = load_suite(str(path), sorted(all_backends()))
    run = run_suite(suite, "cpu", RunOptions(out=tmp_path, run_id="r", progress=False,
                                             measure_ceilings=False))
    slow, fast = read_records(run)
    assert slow["status"] == fast["status"] == "ok", (slow["reason"], fast["reason"])
    assert slow["processes"] == fast["processes"] == 2
    assert slow["n_samples"] == fast["n_samples"] == 6  # 3 rounds in each process
    assert slow["pair_group"] == fast["pair_group"]
    ratio = intervals.paired_ratio_interval(slow["samples_ms"], fast["samples_ms"])
    assert ratio.contains(2.0), ratio


def test_shape_paired_comparisons_and_sided_claims_are_timed_together():
    from attnbench.runs.pairing import job_groups
    from attnbench.runs.suite import load_suite

    suite = load_suite("family", sorted(all_backends()))
    groups = job_groups(suite.jobs(), suite.claims, suite.comparisons)
    for n in (1024, 2048, 4096, 8192):  # the window-vs-causal comparison, at every N
        (group,) = [g for g in groups if any(c.seq_q == n and c.mask == "causal"
                                             and b == "sdpa" for c, b in g)]
        peers = {("window(255,0)", "flex")} if n == 8192 else set()  # window-vs-flex
        if n >= 4096:  # linear-forms' causal elu forward is the same case as sdpa's
            peers |= {("causal", "linear")}
        assert {(c.mask, b) for c, b in group} == {
            ("causal", "sdpa"), ("window(255,0)", "sliding_window"),
            ("window(255,0)", "naive")} | peers
    assert sum(len(g) for g in groups) == len(suite.jobs())


def test_a_column_the_lengths_determine_moves_along_the_line():
    """h200's batch = 16384 // N: one line per (backend, head_dim), not a diagonal table;
    a batch swept at each N still gets a line per value."""
    import pandas as pd

    from attnbench.reporting.tables import line_columns, moving_caption

    rows = [dict(backend=b, dtype="bfloat16", mask="causal", mode="fwd", seq_q=n, seq_k=n,
                 batch=16384 // n, head_dim=d, heads_q=2048 // d)
            for b in ("triton_flash", "sdpa_flash") for d in (64, 128) for n in (1024, 4096)]
    derived = line_columns(pd.DataFrame(rows))
    assert "batch" not in derived and {"head_dim", "heads_q"} <= set(derived)
    # the rows cannot say it, so the caption does
    assert moving_caption(pd.DataFrame(rows)) == \
        "Moving with N, not a row of its own: batch (1024: 16, 4096: 4)."
    swept = pd.DataFrame([r | {"batch": b} for r in rows for b in (1, 4)])
    assert "batch" in line_columns(swept) and moving_caption(swept) == ""
    # two runs that measured different lengths stay two lines
    runs = pd.DataFrame([r | {"run_id": "h100" if r["seq_q"] == 1024 else "h200"}
                         for r in rows])
    assert "run_id" in line_columns(runs)


@pytest.mark.parametrize("rates,tried,best", [
    # TFLOP/s by size: larger matmuls run faster (AMX bf16), so the ceiling is the best size
    ({256: 0.2, 512: 0.4, 1024: 0.49, 2048: 0.9, 4096: 0.8}, [256, 512, 1024, 2048, 4096], 0.9),
    # a slow dtype (bf16 without native support): 1024^3 would take 0.43 s, not started
    ({256: 0.005, 512: 0.005}, [256, 512], 0.005),
])
def test_matmul_ceiling_is_the_best_rate_over_the_sizes_it_can_afford(monkeypatch, rates,
                                                                       tried, best):
    from types import SimpleNamespace

    from attnbench.measure import ceilings

    seen = []

    def fake_measure(fn, device, budget):
        size = fn.__defaults__[0].shape[0]  # the closure's bound (size, size) operand
        seen.append(size)
        return SimpleNamespace(min_ms=2 * size**3 / (rates[size] * 1e12) * 1e3)

    monkeypatch.setattr(ceilings, "measure", fake_measure)
    monkeypatch.setattr(ceilings, "SIZES", {"cpu": (256, 512, 1024, 2048, 4096)})
    assert ceilings.matmul_tflops("float32", "cpu") == pytest.approx(best)
    assert seen == tried


def test_copy_roof_holds_a_record_to_the_copy_of_its_own_size():
    ladder = {"copy_gbps": 10.0,
              "copy_gbps_by_bytes": {str(2**20): 40.0, str(8 * 2**20): 25.0,
                                     str(128 * 2**20): 10.0}}
    assert copy_roof(ladder, 3 * 2**20) == 40.0  # in-cache: the 1 MiB copy's roof
    assert copy_roof(ladder, 16 * 2**20) == 25.0  # a copy of 8 MiB moves 16 MiB
    assert copy_roof(ladder, 2**30) == 10.0  # streaming
    assert copy_roof(ladder, 1000) == 40.0  # smaller than every copy: the fastest roof
    assert copy_roof({"copy_gbps": 10.0}, 1000) == 10.0  # runs from before the ladder
    assert copy_roof({}, 1000) is None


def test_interleaved_rounds_on_cpu_time_a_call_that_follows_its_own_untimed_call():
    from attnbench.measure.timing import measure_interleaved

    calls = []
    fns = [lambda i=i: calls.append(i) for i in range(3)]
    timings = measure_interleaved(fns, "cpu", TimingBudget(warmup_s=0.0, budget_s=0.0,
                                                           min_reps=3, max_reps=3, rewarm_s=0.0))
    assert all(len(t.samples_ms) == 3 for t in timings)
    # after the warm-up calls: rounds start one closure later, each closure called twice in a
    # row (the untimed call, then the timed one)
    assert calls[-18:] == [0, 0, 1, 1, 2, 2, 1, 1, 2, 2, 0, 0, 2, 2, 0, 0, 1, 1]


class _Recovering:
    """A fake CPU that is slow right after a neighbour: a closure's call takes ``ms``, plus
    half of it more until ``recover_ms`` of its own calls have run since another closure
    (or the probe) last ran. The harness must time such a closure at ``ms``."""

    def __init__(self, clock, recover_ms: float = 8.0):
        self.clock, self.recover_ms = clock, recover_ms
        self.last, self.own_ms = None, 0.0
        self.log: list[tuple[str, float]] = []

    def closure(self, name: str, ms: float):
        def call():
            if self.last != name:
                self.last, self.own_ms = name, 0.0
            took = ms * (1.5 if self.own_ms < self.recover_ms else 1.0)
            self.clock.advance(took / 1e3)
            self.own_ms += took
            self.log.append((name, took))
        return call


@pytest.mark.parametrize("rewarm_s,short_ms,short_calls", [
    # one untimed call: warm-up 1 + 4 rounds x (untimed + timed); every sample after the
    # long neighbour is slow (round 3 starts with short, right after its own timed call)
    (0.0, [3.0, 3.0, 2.0, 3.0], 9),
    # 10 ms of untimed calls: 3 + 3 + 3 + 2 ms after the long neighbour (4 calls), 5 x 2 ms
    # in round 3: 1 + 5 + 5 + 6 + 5
    (0.01, [2.0] * 4, 22),
])
def test_a_short_call_after_a_long_neighbour_is_timed_once_it_has_recovered(
        fake_clock, rewarm_s, short_ms, short_calls):
    """After a 50 ms neighbour a 2 ms call is half as slow again for 8 ms of its own calls
    (the Xeon host's linear 4K beside sdpa, docs/design.md): one untimed call leaves every
    sample slow; untimed calls for ``rewarm_s`` time it as it runs alone."""
    from attnbench.measure.timing import measure_interleaved

    cpu = _Recovering(fake_clock)
    fns = [cpu.closure("short", 2.0), cpu.closure("long", 50.0)]
    budget = TimingBudget(warmup_s=0.0, budget_s=0.0, min_reps=4, max_reps=4,
                          rewarm_s=rewarm_s)
    short, long = measure_interleaved(fns, "cpu", budget)
    assert short.samples_ms == pytest.approx(short_ms)
    # a long call recovers within its own untimed call
    assert long.samples_ms == pytest.approx([50.0] * 4)
    assert sum(who == "short" for who, _ in cpu.log) == short_calls


class _FakeProbe:
    """The drift probe's interface: each reading is a 20 ms neighbour on the recovering
    CPU, read after every round."""

    def __init__(self, cpu):
        self.cpu, self.readings = cpu, []

    def read(self):
        self.cpu.closure("probe", 20.0)()
        self.readings.append((self.cpu.clock(), 100.0))
        return 100.0

    def maybe_read(self):
        return self.read()

    def readings_since(self, start):
        return [r for t, r in self.readings if t >= start]


def test_a_single_closure_recovers_from_the_probe_before_it_is_timed(fake_clock):
    from attnbench.measure.timing import measure_interleaved

    cpu = _Recovering(fake_clock)
    budget = TimingBudget(warmup_s=0.0, budget_s=0.0, min_reps=3, max_reps=3)
    (only,) = measure_interleaved([cpu.closure("only", 2.0)], "cpu", budget,
                                  probe=_FakeProbe(cpu))
    assert only.samples_ms == pytest.approx([2.0] * 3)
    assert len(only.probe_readings) == 4  # before the rounds and after each


SEQUENTIAL_SUITE = """name = "seq"
backends = ["fake_drift_slow", "fake_drift_fast"]
[timing]
warmup_s = 0.0
rewarm_s = 0.0  # one untimed call per timed one: the fakes' wobble counts on it
budget_s = 0.02
min_reps = 6
max_reps = 6
processes = {processes}
timeout_s = 60
[axes]
heads_q = 1
head_dim = 4
seq_len = 8
[[claim]]
text = "the fast one is at least {bound}x faster"
kind = "ratio"
numerator = "fake_drift_slow"
denominator = "fake_drift_fast"
expected = [{bound}]
rounds = [8, 16, 24, 32]
"""


@pytest.mark.parametrize("bound,processes,rounds,stop,used,verdict,isolate", [
    # true ratio 2 (per-round 1.9 / 2.1): far from 1.5, the first look decides
    (1.5, 1, 8, "decided", 1, "holds", True),
    (1.5, 3, 8, "decided", 1, "holds", True),  # decided in the first process: no other runs
    # on the bound: every look straddles 2, rounds go on to the budget (past max_reps)
    (2.0, 1, 32, "claim_budget", 1, "inconclusive", True),
    (2.0, 3, 32, "claim_budget", 3, "inconclusive", True),  # looks over 3 processes
    (1.5, 3, 8, "decided", 1, "holds", False),  # the same without isolation
    (2.0, 3, 32, "claim_budget", 3, "inconclusive", False),
])
def test_a_sequential_claim_stops_when_decided_or_at_its_budget(
        fake_clock, write_suite, tmp_path, bound, processes, rounds, stop, used, verdict,
        isolate):
    import pandas as pd

    from attnbench.analysis.claims import claims_table
    from attnbench.runs.record_files import read_records
    from attnbench.runs.runner import RunOptions, run_suite
    from attnbench.runs.suite import load_suite

    path = write_suite(SEQUENTIAL_SUITE.format(bound=bound, processes=processes))
    suite = load_suite(str(path), sorted(all_backends()))
    run = run_suite(suite, "cpu", RunOptions(out=tmp_path, run_id="r", progress=False,
                                             measure_ceilings=False, isolate=isolate))
    slow, fast = read_records(run)
    assert slow["status"] == fast["status"] == "ok", (slow["reason"], fast["reason"])
    for rec in (slow, fast):
        assert (rec["claim_rounds"], rec["claim_stop"]) == (rounds, stop)
        assert rec["n_samples"] == rounds and rec.get("processes", 1) == used
    table = claims_table(pd.DataFrame([slow, fast]), suite.claims)
    assert table["verdict"][0] == verdict
    assert f"98.75% intervals (4 looks), {rounds} rounds ({stop})" in \
        table["measured (95% interval)"][0]


def test_a_narrow_dtype_is_judged_against_the_faster_of_its_matmul_and_float32s():
    """On a host without native bf16 torch's bf16 matmul ran 110x slower than fp32, while
    sdpa's bf16 kernels compute in fp32: the bf16 record's roof is the fp32 rate then, and
    where bf16 is the faster (a GPU, AMX) it stays bf16's; fp32 is never judged by bf16."""
    from attnbench.measure.ceilings import matmul_roof
    avx2 = {"matmul_tflops": {"bfloat16": 0.0013, "float32": 0.147}}
    assert matmul_roof(avx2, "bfloat16") == 0.147
    amx = {"matmul_tflops": {"bfloat16": 2.05, "float32": 0.32}}
    assert matmul_roof(amx, "bfloat16") == 2.05
    assert matmul_roof(amx, "float32") == 0.32
    assert matmul_roof({"matmul_tflops": {}}, "float16") is None


@pytest.mark.parametrize("samples, verdict", [
    ([10.0, 10.1, 9.9, 10.05, 9.95, 10.0, 10.02, 9.98], "holds"),  # 60% +- 1%
    ([8.0, 12.0, 9.0, 11.5, 10.0, 13.0, 8.5, 12.5], "inconclusive"),  # straddles 50%
    ([13.0, 13.1, 12.9, 13.05, 12.95, 13.0, 13.02, 12.98], "does not hold"),  # 46%
])
def test_a_rate_claim_carries_the_time_interval_through_the_inverse(samples, verdict):
    """frac_matmul = work / median time / roof: a claim on it gets the median time's
    interval, inverted (a slow sample lowers the rate), not a point that always decides."""
    import statistics

    import pandas as pd

    from attnbench.analysis.claims import claims_table, measure_claim
    from attnbench.stats import intervals
    median = statistics.median(samples)
    frac = 0.6 * 10.0 / median  # 60% of the roof at 10 ms
    row = {"backend": "sliding_window", "status": "ok", "seq_q": 4096, "seq_k": 4096,
           "mask": "window(255,0)", "key": "k", "time_ms_median": median,
           "frac_matmul": frac, "samples_ms": samples}
    claim = {"text": "t", "kind": "value", "backend": "sliding_window",
             "metric": "frac_matmul", "where": {"seq_len": [4096]}, "expected": [0.5]}
    (iv,), _ = measure_claim(pd.DataFrame([row]), claim, across=False)
    time = intervals.median_interval(samples)
    assert iv.estimate == pytest.approx(frac)
    assert iv.low == pytest.approx(frac * time.estimate / time.high)
    assert iv.high == pytest.approx(frac * time.estimate / time.low)
    assert iv.low < frac < iv.high
    assert claims_table(pd.DataFrame([row]), [claim])["verdict"][0] == verdict
