"""GPU timing methods (measure/timing_methods.py) on a fake CUDA device: events, a CUDA graph
over input copies sized from L2 (falling back to events when the capture fails), the
profiler's kernel time; on a CPU every method means the wall clock, said once in meta.json;
the suite's ``[timing] method`` is validated."""

from __future__ import annotations

import contextlib
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from attnbench.core.errors import BadInput, NotSupported
from attnbench.measure import samplers, timing_methods
from attnbench.measure.timing import TimingBudget, measure_interleaved
from attnbench.measure.timing_methods import Copies


class FakeCuda:
    """A device timeline in ms: a closure 'launches' a kernel by ``launch(ms)``; inside a
    graph capture the launch is recorded instead, and a replay runs what was recorded."""

    def __init__(self, l2=1 << 20, free=1 << 34):
        self.now, self.capturing, self.l2, self.free = 0.0, None, l2, free
        self.syncs = 0
        fake = self

        class Event:
            def __init__(self, enable_timing=False):
                self.at = None

            def record(self):
                self.at = fake.now

            def elapsed_time(self, other):
                return other.at - self.at

        class CUDAGraph:
            def __init__(self):
                self.kernels = []

            def replay(self):
                fake.now += sum(self.kernels)

        class Stream:
            def wait_stream(self, other):
                pass

        self.Event, self.CUDAGraph, self.Stream = Event, CUDAGraph, Stream
        self.main = Stream()

    def launch(self, ms: float) -> None:
        if self.capturing is not None:
            self.capturing.kernels.append(ms)
        else:
            self.now += ms

    @contextlib.contextmanager
    def graph(self, g):
        self.capturing = g
        try:
            yield
        finally:
            self.capturing = None

    @contextlib.contextmanager
    def stream(self, s):
        yield

    def current_stream(self):
        return self.main

    def synchronize(self, dev=None):
        self.syncs += 1

    def get_device_properties(self, dev):
        return SimpleNamespace(L2_cache_size=self.l2)

    def mem_get_info(self, dev):
        return self.free, self.free


@pytest.fixture
def fake_cuda(monkeypatch):
    fake = FakeCuda()
    monkeypatch.setattr(timing_methods, "cuda", fake)
    # the flush buffer lives on the CPU: the fake device has no memory of its own
    monkeypatch.setattr(timing_methods, "_empty_int32",
                        lambda n, dev: torch.empty(n, dtype=torch.int32))
    samplers.reset()
    return fake


def kernel(fake: FakeCuda, ms: float, log: list | None = None, tag=None):
    def fn():
        if log is not None:
            log.append(tag)
        fake.launch(ms)
    return fn


BUDGET = TimingBudget(warmup_s=0.0, min_warmup=1, budget_s=60.0, min_reps=5, max_reps=5)


def test_copies_exceed_twice_l2_within_their_caps():
    mib = 1 << 20
    assert timing_methods.copies_needed(10 * mib, 50 * mib) == 11  # 110 MiB > 100 MiB
    assert timing_methods.copies_needed(300 * mib, 50 * mib) == 2  # larger than L2: 2
    assert timing_methods.copies_needed(mib // 4, 50 * mib) == timing_methods.MAX_COPIES
    # at most a quarter of the free memory: 40 MiB free -> 10 MiB of copies
    assert timing_methods.copies_needed(mib, 50 * mib, free_bytes=40 * mib) == 10
    assert timing_methods.copies_needed(mib, 50 * mib, free_bytes=0) == 1


def test_calls_per_graph_are_whole_rotations_of_about_the_target():
    assert timing_methods.calls_per_graph(0.01, 11) == 209  # 200 calls -> 19 rotations
    assert timing_methods.calls_per_graph(5.0, 3) == 3  # one rotation at least
    assert timing_methods.calls_per_graph(0.0001, 7) <= timing_methods.GRAPH_MAX_CALLS
    assert timing_methods.calls_per_graph(0.0001, 7) % 7 == 0


def test_events_method_times_each_call_between_its_events(fake_cuda):
    a, b = measure_interleaved([kernel(fake_cuda, 1.5), kernel(fake_cuda, 0.25)], "cuda",
                               BUDGET, samplers=[])
    assert a.samples_ms == [1.5] * 5 and b.samples_ms == [0.25] * 5
    assert a.fields == {"timing_method": "events"}


def test_cudagraph_rotates_over_input_copies_and_divides_the_replay(fake_cuda):
    """L2 of 1 MiB, inputs of 256 KiB: 2 MiB / 256 KiB + 1 = 9 copies; a call of 0.01 ms
    gives 2 ms / 0.01 = 200 calls, 23 rotations = 207 captured calls, each copy 23 times;
    a sample is the replay over 207, and a replay calls no closure."""
    calls: list = []
    made: list = []

    def make(k):
        made.append(k)
        return [kernel(fake_cuda, 0.01, calls, i) for i in range(k)]

    fn = kernel(fake_cuda, 0.01, calls, "original")
    budget = TimingBudget(method="cudagraph", warmup_s=0.0, min_warmup=1, budget_s=60.0,
                          min_reps=4, max_reps=4)
    (t,) = measure_interleaved([fn], "cuda", budget, samplers=[],
                               copies=[Copies(256 * 1024, make)])
    assert made == [9]
    assert t.fields == {"timing_method": "cudagraph", "graph_calls": 207, "graph_copies": 9}
    assert t.samples_ms == pytest.approx([0.01] * 4)
    captured = [c for c in calls if c != "original"]
    # each copy once to warm it on the side stream, then 23 times in the capture
    assert all(captured.count(i) == 24 for i in range(9)) and len(captured) == 216
    assert calls.count("original") == 2  # its warm-up and the one call that sized N


def test_cudagraph_without_copies_replays_the_closure_itself(fake_cuda):
    fn = kernel(fake_cuda, 0.5)
    method = timing_methods.GraphMethod(torch.device("cpu"))
    method.prepare(0, fn)
    into: list[float] = []
    method.sample(0, fn, into)
    method.settle()
    assert into == [0.5] and method.fields(0) == {"timing_method": "cudagraph",
                                                  "graph_calls": 4, "graph_copies": 1}


def uncapturable(fake: FakeCuda, ms: float):
    def bad():
        if fake.capturing is not None:
            raise RuntimeError("operation not permitted when stream is capturing\nmore text")
        fake.launch(ms)
    return bad


NOT_CAPTURED = ("cudagraph capture failed: RuntimeError: operation not permitted when stream "
                "is capturing")


def test_a_closure_that_cannot_be_captured_is_timed_by_events_and_says_why(fake_cuda):
    """The failed capture costs the graph, not the pair: its samples are event-timed calls of
    the closure itself, and its fields name events with the capture's error in one line."""
    bad = uncapturable(fake_cuda, 0.1)
    method = timing_methods.GraphMethod(torch.device("cpu"))
    method.prepare(0, bad)
    into: list[float] = []
    method.sample(0, bad, into)
    method.sample(0, bad, into)
    method.settle()
    assert into == pytest.approx([0.1, 0.1])
    assert method.fields(0) == {"timing_method": "events", "timing_method_note": NOT_CAPTURED}
    assert 0 not in method.graphs and 0 not in method.keep


def test_in_a_group_only_the_uncapturable_closure_falls_back(fake_cuda):
    budget = TimingBudget(method="cudagraph", warmup_s=0.0, min_warmup=1, budget_s=60.0,
                          min_reps=4, max_reps=4)
    good, bad = kernel(fake_cuda, 0.5), uncapturable(fake_cuda, 0.25)
    a, b = measure_interleaved([good, bad], "cuda", budget, samplers=[])
    assert a.fields == {"timing_method": "cudagraph", "graph_calls": 4, "graph_copies": 1}
    assert a.samples_ms == pytest.approx([0.5] * 4)
    assert b.fields == {"timing_method": "events", "timing_method_note": NOT_CAPTURED}
    assert b.samples_ms == pytest.approx([0.25] * 4)


def test_profiler_sums_the_device_time_of_the_calls_kernels(fake_cuda, monkeypatch):
    from torch.autograd import DeviceType

    def event(us, device=DeviceType.CUDA):
        return SimpleNamespace(device_type=device,
                               time_range=SimpleNamespace(elapsed_us=lambda: us))

    seen = []

    def fake_profile(fn):
        seen.append(fn)
        fn()
        return [event(30.0), event(12.5), event(999.0, DeviceType.CPU)]

    monkeypatch.setattr(timing_methods.ProfilerMethod, "profile", staticmethod(fake_profile))
    budget = TimingBudget(method="profiler", warmup_s=0.0, min_warmup=1, budget_s=60.0,
                          min_reps=3, max_reps=3)
    (t,) = measure_interleaved([kernel(fake_cuda, 1.0)], "cuda", budget, samplers=[])
    assert t.samples_ms == pytest.approx([0.0425] * 3)  # 42.5 us of kernels, not the CPU op
    assert t.fields == {"timing_method": "profiler"} and len(seen) == 3

    monkeypatch.setattr(timing_methods.ProfilerMethod, "profile",
                        staticmethod(lambda fn: [event(5.0, DeviceType.CPU)]))
    with pytest.raises(NotSupported, match="saw no CUDA kernel"):
        measure_interleaved([kernel(fake_cuda, 1.0)], "cuda", budget, samplers=[])


@pytest.mark.parametrize("method", ["events", "cudagraph", "profiler"])
def test_on_a_cpu_every_method_times_by_the_wall_clock(method):
    """A GPU method does not apply on a CPU: the pairs are timed as always and say
    wallclock; nothing is unsupported for it."""
    from attnbench.core.case import Case
    from attnbench.measure.case_cache import CaseCache
    from attnbench.measure.execute import execute_group

    case = Case(batch=1, heads_q=1, heads_kv=1, seq_q=16, seq_k=16, head_dim=8, head_dim_v=8)
    budget = TimingBudget(method=method, warmup_s=0.0, budget_s=0.01, min_reps=2, max_reps=2)
    recs = execute_group([(case, "sdpa"), (case, "naive")], budget, CaseCache())
    for rec in recs:
        assert rec.status == "ok", rec.reason
        assert rec.info["timing_method"] == "wallclock"
        assert "timing_method_note" not in rec.info and "graph_calls" not in rec.info
        assert rec.metrics["n_samples"] == 2
    assert timing_methods.for_device(method, torch.device("cpu")) is None
    assert timing_methods.unsupported_reason(method, torch.device("cpu")) is None


def test_an_unknown_method_is_refused_before_any_call():
    calls = []
    with pytest.raises(NotSupported, match="timing method 'graph' unknown; allowed: events"):
        measure_interleaved([lambda: calls.append(1)], "cpu",
                            TimingBudget(method="graph"), samplers=[])
    assert calls == []


def test_the_cpu_note_is_said_for_gpu_methods_on_a_cpu_only():
    note = timing_methods.cpu_note("cudagraph", "cpu")
    assert note == ("timing.method cudagraph applies to CUDA devices; CPU pairs timed by the "
                    "wall clock")
    assert timing_methods.cpu_note("events", "cpu") is None
    assert timing_methods.cpu_note("profiler", "cuda") is None
    assert timing_methods.cpu_note("profiler", "cpu").startswith("timing.method profiler ")


def test_a_cpu_run_of_a_cudagraph_suite_says_so_once_in_meta(tmp_path, monkeypatch):
    """A whole (in-process) run: meta.json's timing says the method does not apply, once;
    no record is unsupported for it and none repeats the note."""
    import json

    from attnbench.runs.runner import RunOptions, run_suite
    from attnbench.runs.suite import parse_suite

    suite = parse_suite(SUITE | {"timing": {"method": "cudagraph", "warmup_s": 0.0,
                                            "budget_s": 0.01, "min_reps": 2, "max_reps": 2}},
                        Path("t.toml"), ["sdpa"])
    run = run_suite(suite, "cpu", RunOptions(out=tmp_path / "results", isolate=False,
                                             progress=False, measure_ceilings=False))
    meta = json.loads((run / "meta.json").read_text())
    assert meta["timing"]["method"] == "cudagraph"
    assert meta["timing"]["method_note"] == ("timing.method cudagraph applies to CUDA devices; "
                                             "CPU pairs timed by the wall clock")
    rows = [json.loads(line) for line in (run / "records.jsonl").read_text().splitlines()]
    assert rows and all(r["status"] == "ok" and r["timing_method"] == "wallclock"
                        for r in rows)
    assert not any("applies to CUDA" in json.dumps(r) for r in rows)


def test_input_copy_has_its_own_tensors_with_the_same_values_and_grad_flag():
    from attnbench.core.case import Inputs

    q = torch.randn(1, 1, 4, 2, requires_grad=True)
    inputs = Inputs(q=q, k=torch.randn(1, 1, 4, 2), v=torch.randn(1, 1, 4, 2))
    c = timing_methods.input_copy(inputs)
    assert c.q.data_ptr() != q.data_ptr() and torch.equal(c.q, q)
    assert c.q.requires_grad and c.q.is_leaf and not c.k.requires_grad
    assert c.grad_out is None


SUITE = {"name": "t", "backends": ["sdpa"], "axes": {"seq_len": [16]}}


def test_suite_timing_method_is_read():
    from attnbench.runs.suite import parse_suite

    suite = parse_suite(SUITE | {"timing": {"method": "cudagraph"}}, Path("t.toml"), ["sdpa"])
    assert suite.timing.method == "cudagraph"
    assert parse_suite(SUITE, Path("t.toml"), ["sdpa"]).timing.method == "events"


@pytest.mark.parametrize("value", ["graph", 3, ""])
def test_suite_timing_method_outside_the_list_is_one_line(value):
    from attnbench.runs.suite import parse_suite

    with pytest.raises(BadInput) as err:
        parse_suite(SUITE | {"timing": {"method": value}}, Path("t.toml"), ["sdpa"])
    text = str(err.value)
    assert text.startswith("t.toml: timing.method = ") and "\n" not in text
    assert text.endswith("must be one of events, cudagraph, profiler")
