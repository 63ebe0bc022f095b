"""Device state per measured group (measure/device_state.py, measure/samplers.py): a fake
NVML (energy counter wrap, throttle mid-group, NVML missing), fake /proc and /sys trees,
and what the report and compare say about it."""

from __future__ import annotations

import json
import types
from pathlib import Path

import pandas as pd
import pytest

from attnbench.core.record import DEVICE_COLUMNS, Record, is_throttled
from attnbench.measure import device_state, samplers, timing
from attnbench.measure.timing import Timing, TimingBudget, measure_interleaved


@pytest.fixture(autouse=True)
def fresh_registry():
    samplers.reset()
    yield
    samplers.reset()


class FakeClock:
    def __init__(self):
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


class FakeNvml(types.ModuleType):
    """pynvml's calls the sampler makes, over a scripted device: ``sm`` and ``reasons``
    are read in turn (the last value repeats); energy in mJ, advanced by the test."""

    NVML_CLOCK_SM, NVML_CLOCK_MEM, NVML_TEMPERATURE_GPU = 1, 2, 0

    def __init__(self, sm=(1980.0,), reasons=(0,), energy_mj=0, no_energy=False):
        super().__init__("pynvml")
        self.sm, self.reasons = list(sm), list(reasons)
        self.energy_mj, self.no_energy = energy_mj, no_energy
        self.inits = 0

    def nvmlInit(self):
        self.inits += 1

    def nvmlDeviceGetHandleByIndex(self, i):
        return ("gpu", i)

    def _next(self, values):
        return values.pop(0) if len(values) > 1 else values[0]

    def nvmlDeviceGetClockInfo(self, h, which):
        return self._next(self.sm) if which == self.NVML_CLOCK_SM else 2619

    def nvmlDeviceGetTemperature(self, h, which):
        return 55

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, h):
        return self._next(self.reasons)

    def nvmlDeviceGetEnforcedPowerLimit(self, h):
        return 700_000  # mW

    def nvmlDeviceGetTotalEnergyConsumption(self, h):
        if self.no_energy:
            raise RuntimeError("Not Supported")
        return self.energy_mj


def nvml_sampler(fake: FakeNvml, monkeypatch) -> device_state.NvmlSampler:
    monkeypatch.setattr(device_state, "load_nvml", lambda: fake)
    s = device_state.nvml_sampler("cuda")
    assert isinstance(s, device_state.NvmlSampler)
    return s


def test_energy_per_call_across_a_counter_wrap(monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(device_state, "clock", clock)
    fake = FakeNvml(energy_mj=device_state.NVML_COUNTER_WRAP - 1000)
    s = nvml_sampler(fake, monkeypatch)
    s.begin()
    fake.energy_mj = 3000  # wrapped: 4000 mJ since begin
    clock.t = 2.0  # over 2 s: 2 W
    a, b = s.end([Timing(samples_ms=[10.0, 12.0, 14.0]), Timing(samples_ms=[1.0])])
    assert a["power_w"] == pytest.approx(2.0) and b["power_w"] == pytest.approx(2.0)
    assert a["energy_j"] == pytest.approx(2.0 * 0.012)  # mean power x median time
    assert b["energy_j"] == pytest.approx(2.0 * 0.001)
    assert a["energy_source"] == "nvml"
    assert a["gpu_power_limit_w"] == 700 and a["gpu_mem_mhz"] == 2619
    assert a["throttled"] == [] and a["gpu_sm_mhz"] == 1980
    assert device_state.tflops_per_j(a, 4.8e10) == {
        "tflops_per_j": pytest.approx(4.8e10 / 1e12 / 0.024)}


def test_counter_delta_wraps_once():
    assert device_state.counter_delta(10, 25, 100) == 15
    assert device_state.counter_delta(90, 5, 100) == 15


def test_throttle_appearing_mid_group_is_marked(monkeypatch):
    """Readings at begin, after the first timed call and every SAMPLE_EVERY_S after, and at
    end: the clock falls from 1980 to 1590 MHz and a thermal slowdown appears mid-group."""
    clock = FakeClock()
    monkeypatch.setattr(device_state, "clock", clock)
    fake = FakeNvml(sm=[1980, 1980, 1980, 1590, 1590], reasons=[0, 0, 0, 0x20, 0x1])
    s = nvml_sampler(fake, monkeypatch)  # the factory reads once (1980, no reason)
    s.begin()
    for step in range(1, 4):
        clock.t = step * device_state.SAMPLE_EVERY_S
        s.per_call(0)
        s.per_call(1)  # within SAMPLE_EVERY_S of the last reading: not read
    (fields,) = s.end([Timing(samples_ms=[1.0])])
    assert fields["device_readings"] == 5
    assert fields["gpu_sm_mhz_min"] == 1590 and fields["gpu_sm_mhz_max"] == 1980
    assert fields["gpu_throttle_reasons"] == ["gpu_idle", "sw_thermal_slowdown"]
    assert fields["throttled"] == ["sm clock fell 20% (1980 -> 1590 MHz)",
                                   "sw_thermal_slowdown"]
    assert is_throttled(fields["throttled"])


def test_idle_readings_at_the_ends_of_a_group_mark_no_throttle(monkeypatch):
    """Before the first call and after the last sync the GPU idles at a low clock: those
    readings (gpu_idle set) are not a clock fall; a short group still has a busy reading."""
    fake = FakeNvml(sm=[1980, 1410, 1980, 345], reasons=[0, 0x1, 0, 0x1])
    s = nvml_sampler(fake, monkeypatch)  # the factory's reading: 1980
    s.begin()  # idle, 1410
    s.per_call(0)  # the first call is always read: busy, 1980
    s.per_call(0)  # within SAMPLE_EVERY_S: not read
    (fields,) = s.end([Timing(samples_ms=[1.0])])  # idle again at the end: 345
    assert fields["throttled"] == [] and fields["gpu_sm_mhz"] == 1980
    assert fields["device_readings"] == 3 and fields["gpu_throttle_reasons"] == ["gpu_idle"]


def test_a_clock_rising_from_idle_or_an_idle_reason_is_no_throttle():
    assert device_state.throttle_marks([1200, 1980, 1965], ["gpu_idle"]) == []
    assert device_state.clock_drop([1200, 1980, 1965]) == pytest.approx(15 / 1980)
    drop = 1 - device_state.CLOCK_DROP_REL - 0.01
    assert device_state.throttle_marks([1000, 1000 * drop], []) != []


def test_nvml_missing_says_why_once_and_records_carry_no_gpu_fields(monkeypatch):
    def missing():
        raise ImportError("No module named 'pynvml'")

    monkeypatch.setattr(device_state, "load_nvml", missing)
    assert samplers.unavailable("cuda")["nvml"] == device_state.NVML_MISSING
    assert "pip install 'attnbench[gpu]'" in device_state.NVML_MISSING
    assert [s.name for s in samplers.for_device("cuda")] == []


def test_a_gpu_without_an_energy_counter_keeps_its_clocks(monkeypatch):
    fake = FakeNvml(no_energy=True)
    s = nvml_sampler(fake, monkeypatch)
    assert s.unreadable["energy"] == "NVML total energy: RuntimeError: Not Supported"
    s.begin()
    (fields,) = s.end([Timing(samples_ms=[1.0])])
    assert "energy_j" not in fields and fields["gpu_sm_mhz"] == 1980


def test_nvml_index_follows_cuda_visible_devices(monkeypatch):
    import torch

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,1")
    assert device_state.nvml_index(torch.device("cuda:1")) == 1
    assert device_state.nvml_index(torch.device("cuda:0")) == 3
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert device_state.nvml_index(torch.device("cuda:2")) == 2


# ---- the host CPU: fake /sys and /proc trees -----------------------------------------------


def fake_host(tmp_path, monkeypatch, cpufreq=None, cpuinfo=None, rapl=None):
    sys_cpu, proc, cap = tmp_path / "cpu", tmp_path / "cpuinfo", tmp_path / "powercap"
    sys_cpu.mkdir()
    cap.mkdir()
    for i, khz in enumerate(cpufreq or []):
        d = sys_cpu / f"cpu{i}" / "cpufreq"
        d.mkdir(parents=True)
        (d / "scaling_cur_freq").write_text(f"{khz}\n")
    if cpuinfo is not None:
        proc.write_text("".join(f"processor\t: {i}\ncpu MHz\t\t: {m}\n\n"
                                for i, m in enumerate(cpuinfo)))
    for name, (uj, wrap) in (rapl or {}).items():
        d = cap / name
        d.mkdir()
        (d / "energy_uj").write_text(f"{uj}\n")
        (d / "max_energy_range_uj").write_text(f"{wrap}\n")
    monkeypatch.setattr(device_state, "CPU_SYS", sys_cpu)
    monkeypatch.setattr(device_state, "CPUINFO", proc)
    monkeypatch.setattr(device_state, "POWERCAP", cap)
    return cap


def test_cpu_frequency_from_cpufreq_else_cpuinfo(tmp_path, monkeypatch):
    fake_host(tmp_path, monkeypatch, cpufreq=[3_000_000, 2_000_000], cpuinfo=[1000.0])
    assert device_state.cpu_mhz() == (2500.0, "cpufreq")
    (tmp_path / "b").mkdir()
    fake_host(tmp_path / "b", monkeypatch, cpuinfo=[2400.0, 2600.0])
    assert device_state.cpu_mhz() == (2500.0, "cpuinfo")


def test_cpu_energy_from_rapl_packages_across_a_wrap(tmp_path, monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(device_state, "clock", clock)
    cap = fake_host(tmp_path, monkeypatch, cpufreq=[2_000_000],
                    rapl={"intel-rapl:0": (999_000_000, 999_999_999),
                          "intel-rapl:0:0": (5, 999_999_999),  # a sub-zone: not added again
                          "intel-rapl:1": (100, 999_999_999)})
    s = device_state.cpu_sampler("cpu")
    assert isinstance(s, device_state.CpuSampler) and s.unreadable == {}
    s.begin()
    (cap / "intel-rapl:0" / "energy_uj").write_text("1000000\n")  # wrapped: +2,000,000 uJ
    (cap / "intel-rapl:1" / "energy_uj").write_text("1000100\n")  # +1,000,000 uJ
    clock.t = 3.0
    (fields,) = s.end([Timing(samples_ms=[100.0])])
    assert fields["power_w"] == pytest.approx(1.0)  # 3 J over 3 s
    assert fields["energy_j"] == pytest.approx(0.1)
    assert fields["energy_source"] == "rapl"
    assert fields["cpu_mhz_begin"] == 2000.0 and "throttled" not in fields


def test_what_the_host_cannot_read_is_said_once_in_meta(tmp_path, monkeypatch):
    from attnbench.runs import environment

    cap = fake_host(tmp_path, monkeypatch, cpuinfo=[2600.0])
    (cap / "intel-rapl:0").mkdir()  # present, energy_uj unreadable
    env = environment.collect("cpu")
    state = env["device_state"]
    assert state["sampled"] == ["cpu"]
    assert "CPU energy not readable here" in state["not_readable"]["cpu.energy"]
    assert state["at_start"] == {"cpu_mhz": 2600.0, "cpu_mhz_source": "cpuinfo"}
    json.dumps(env)  # meta.json holds it


def test_a_host_with_nothing_readable_has_no_cpu_sampler(tmp_path, monkeypatch):
    fake_host(tmp_path, monkeypatch)
    assert samplers.for_device("cpu") == []
    why = samplers.unavailable("cpu")["cpu"]
    assert "CPU frequency not readable here" in why and "CPU energy not readable" in why


# ---- the hook in the one timing loop --------------------------------------------------------


class Recorder:
    name = "recorder"

    def __init__(self):
        self.calls = []

    def begin(self):
        self.calls.append("begin")

    def per_call(self, i):
        self.calls.append(i)

    def end(self, timings):
        self.calls.append("end")
        return [{"seen": len(t.samples_ms)} for t in timings]


def _fake_clock_closures(monkeypatch, ms):
    clock = FakeClock()
    monkeypatch.setattr(timing, "clock", clock)

    def closure(m):
        def fn():
            clock.t += m / 1e3
        return fn
    return [closure(m) for m in ms]


def test_samplers_wrap_the_timed_rounds_of_the_one_loop(monkeypatch):
    fns = _fake_clock_closures(monkeypatch, [1.0, 2.0])
    rec = Recorder()
    budget = TimingBudget(warmup_s=0.0, budget_s=0.0, min_reps=4, max_reps=4, rewarm_s=0.0)
    a, b = measure_interleaved(fns, "cpu", budget, samplers=[rec])
    assert rec.calls[0] == "begin" and rec.calls[-1] == "end"
    timed = rec.calls[1:-1]
    assert len(timed) == 8 and sorted(timed) == [0, 0, 0, 0, 1, 1, 1, 1]
    assert a.fields == b.fields == {"timing_method": "wallclock", "seen": 4}
    assert a.samples_ms == pytest.approx([1.0] * 4) and b.samples_ms == pytest.approx([2.0] * 4)


def test_a_failing_sampler_costs_its_fields_not_the_times(monkeypatch):
    class Broken(Recorder):
        name = "broken"

        def end(self, timings):
            raise OSError("counter gone")

    fns = _fake_clock_closures(monkeypatch, [1.0])
    budget = TimingBudget(warmup_s=0.0, budget_s=0.0, min_reps=3, max_reps=3)
    (t,) = measure_interleaved(fns, "cpu", budget, samplers=[Broken(), Recorder()])
    assert t.samples_ms == pytest.approx([1.0] * 3)
    assert t.fields["seen"] == 3
    assert t.fields["sampler_error"] == "broken: OSError: counter gone"


def test_a_registered_sampler_is_used_by_default(monkeypatch):
    rec = Recorder()
    samplers.register("recorder", lambda dev: rec)
    try:
        fns = _fake_clock_closures(monkeypatch, [1.0])
        budget = TimingBudget(warmup_s=0.0, budget_s=0.0, min_reps=3, max_reps=3)
        (t,) = measure_interleaved(fns, "cpu", budget)
        assert t.fields["seen"] == 3 and rec.calls[0] == "begin"
    finally:
        samplers.unregister("recorder")


# ---- records, report and compare ---------------------------------------------------------


def test_old_records_without_device_fields_still_load_and_new_ones_round_trip():
    from attnbench.core.case import Case

    old = Record.from_row({"key": "k", "backend": "sdpa", "status": "ok", "batch": 1,
                           "time_ms_median": 1.0})
    assert "throttled" not in old.info and not is_throttled(old.info.get("throttled"))
    new = Record.new(Case(), "sdpa", "ok", time_ms_median=1.0, gpu_sm_mhz=1980.0,
                     throttled=["sw_power_cap"], energy_j=0.5, tflops_per_j=2.0)
    back = Record.from_row(json.loads(json.dumps(new.to_row())))
    assert back.info["throttled"] == ["sw_power_cap"] and back.info["energy_j"] == 0.5
    assert {"throttled", "energy_j", "tflops_per_j", "gpu_sm_mhz"} <= set(DEVICE_COLUMNS)


def test_results_csv_places_device_columns_after_the_metrics():
    from attnbench.runs.record_files import LEADING_COLUMNS, records_frame

    df = records_frame([{"energy_j": 1.0, "zzz": 1, "backend": "b", "time_ms_median": 2.0}])
    assert list(df.columns) == ["backend", "time_ms_median", "energy_j", "zzz"]
    assert LEADING_COLUMNS.index("throttled") > LEADING_COLUMNS.index("time_ms_median")


@pytest.mark.parametrize("value, marked", [
    ([], False), (["sw_power_cap"], True), ("[]", False), ("['hw_slowdown']", True),
    (None, False), (float("nan"), False)])
def test_throttled_reads_from_jsonl_and_csv(value, marked):
    assert is_throttled(value) is marked


def _run(label, records, state=None):
    from attnbench.runs.dataset import Run

    meta = {"run_id": label, "environment": {"device": "cuda", "device_state": state or {}}}
    return Run(path=Path(label), meta=meta,
               records=pd.DataFrame(records), label=label)


GPU_ROWS = [{"gpu_sm_mhz": 1980.0, "gpu_sm_mhz_min": 1590.0, "gpu_sm_mhz_max": 1980.0,
             "gpu_mem_mhz": 2619.0, "gpu_temp_c": 71.0, "power_w": 540.0,
             "gpu_power_limit_w": 700.0, "throttled": ["sm clock fell 20% (1980 -> 1590 MHz)"]},
            {"gpu_sm_mhz": 1980.0, "gpu_sm_mhz_min": 1965.0, "gpu_sm_mhz_max": 1980.0,
             "gpu_mem_mhz": 2619.0, "gpu_temp_c": 65.0, "power_w": 520.0,
             "gpu_power_limit_w": 700.0, "throttled": []}]


def test_report_environment_table_shows_device_state_and_throttled_count():
    from attnbench.reporting import device_state_table

    base = pd.DataFrame({"a": {"run id": "a"}, "b": {"run id": "b"}})
    base.index.name = "field"
    cpu = _run("b", [{"cpu_mhz_begin": 2600.0}],
               {"not_readable": {"cpu.energy": "CPU energy not readable here (x)"}})
    table = device_state_table.extend(base, [_run("a", GPU_ROWS), cpu])
    assert table.loc["measured throttled", "a"] == "1 of 2 records"
    assert table.loc["measured throttled", "b"] == "-"
    assert table.loc["device state", "a"].startswith("SM 1980 MHz (1590-1980), memory 2619 MHz")
    assert "limit 700 W" in table.loc["device state", "a"]
    assert table.loc["device state", "b"].startswith("CPU 2600 MHz")
    assert "CPU energy not readable here" in table.loc["not readable", "b"]
    assert list(table.index[:1]) == ["run id"]


def test_report_without_device_state_adds_no_rows():
    from attnbench.reporting import device_state_table

    base = pd.DataFrame({"a": {"run id": "a"}})
    assert device_state_table.extend(base, [_run("a", [{"time_ms_median": 1.0}])]).equals(base)


def test_compare_names_a_clock_difference_and_throttled_counts():
    from attnbench.analysis import run_diff

    base = pd.DataFrame([{"gpu_sm_mhz": 1980.0, "throttled": []}] * 3)
    new = pd.DataFrame([{"gpu_sm_mhz": 1590.0, "throttled": ["hw_slowdown"]}] * 2
                       + [{"gpu_sm_mhz": 1590.0, "throttled": []}])
    lines = run_diff.device_state_difference({}, {}, base, new)
    assert lines[0].startswith("GPU SM clock 1980 -> 1590 MHz (1.25x")
    assert lines[1] == "records measured throttled: 0 of 3 -> 2 of 3"
    same = run_diff.device_state_difference({}, {}, base, base)
    assert same == []
    assert "device_state" not in " ".join(run_diff.environment_difference(
        {"environment": {"device_state": {"at_start": {"cpu_mhz": 1}}}},
        {"environment": {"device_state": {"at_start": {"cpu_mhz": 2}}}}))


def test_compare_prints_device_state_before_the_verdicts(tmp_path, capsys, monkeypatch):
    """End to end through ``attnbench compare`` on two written runs."""
    from attnbench import cli
    from attnbench.runs import record_files

    for name, mhz, marks in (("base", 1980.0, []), ("new", 1500.0, ["sw_power_cap"])):
        d = tmp_path / name
        d.mkdir()
        record_files.write_meta(d, {"run_id": name, "environment": {"device": "cuda"}})
        with record_files.RecordWriter(d) as w:
            w.write({"run_id": name, "key": "k1", "backend": "sdpa", "status": "ok",
                     "time_ms_median": 1.0, "samples_ms": [1.0] * 8, "gpu_sm_mhz": mhz,
                     "throttled": marks})
    rc = cli.main(["compare", str(tmp_path / "base"), str(tmp_path / "new")])
    out = capsys.readouterr().out
    assert rc == 0
    assert "device state: GPU SM clock 1980 -> 1500 MHz" in out
    assert "device state: records measured throttled: 0 of 1 -> 1 of 1" in out
    assert out.index("device state:") < out.index("joined records")


def test_pynvml_is_an_optional_extra():
    text = (Path(__file__).parents[2] / "pyproject.toml").read_text()
    assert 'gpu = ["nvidia-ml-py"]' in text


def test_the_report_of_a_run_shows_its_device_state_and_throttled_count(tmp_path):
    """Through the report's own environment section, on a written run."""
    from attnbench.core.case import Case
    from attnbench.reporting.document import Table
    from attnbench.reporting.report import Report
    from attnbench.runs import dataset, record_files

    run = tmp_path / "gpu-run"
    run.mkdir()
    state = {"sampled": ["nvml"], "not_readable": {}, "at_start": {"gpu_sm_mhz": 1980.0}}
    record_files.write_meta(run, {"run_id": "gpu-run", "environment": {
        "device": "cuda", "device_name": "Fake GPU", "device_state": state}})
    with record_files.RecordWriter(run) as w:
        for i, row in enumerate(GPU_ROWS):
            case = Case(seq_q=256 * (i + 1), seq_k=256 * (i + 1))
            w.write(Record.new(case, "sdpa", "ok", time_ms_median=1.0, **row).to_row()
                    | {"run_id": "gpu-run"})
    report = Report(dataset.load([run]), tmp_path / "rep")
    (table,) = [b for b in report._environment() if isinstance(b, Table)]
    column = table.frame.iloc[:, 0]
    assert column["measured throttled"] == "1 of 2 records"
    assert column["device state"].startswith("SM 1980 MHz (1590-1980)")


def test_a_cpu_record_carries_the_host_frequency(tmp_path, monkeypatch):
    """execute_group on a CPU: the record holds the frequency the fake host reports, and no
    energy (no readable RAPL zone) and no throttle mark."""
    from attnbench.core.case import Case
    from attnbench.measure.case_cache import CaseCache
    from attnbench.measure.execute import execute_group

    fake_host(tmp_path, monkeypatch, cpufreq=[2_800_000, 3_200_000])
    case = Case(batch=1, heads_q=1, heads_kv=1, seq_q=16, seq_k=16, head_dim=8, head_dim_v=8)
    budget = TimingBudget(warmup_s=0.0, budget_s=0.01, min_reps=2, max_reps=2)
    (rec,) = execute_group([(case, "sdpa")], budget, CaseCache())
    assert rec.status == "ok"
    assert rec.info["cpu_mhz_begin"] == 3000.0 and rec.info["cpu_mhz_end"] == 3000.0
    assert "energy_j" not in rec.info and "throttled" not in rec.info
    assert rec.info["timing_method"] == "wallclock"  # perf_counter, as always on a CPU
