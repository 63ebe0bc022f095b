"""Every timed record says how its samples were taken (timing_method), and compare names a
difference in it between two runs before any verdict on the code."""

from __future__ import annotations

import json

import pandas as pd

from attnbench.analysis import run_diff
from attnbench.core.case import Case
from attnbench.core.record import DEVICE_COLUMNS, OPTIONAL_COLUMNS, Record

CASES = [Case(batch=8, heads_q=32, heads_kv=8, seq_q=1, seq_k=n, head_dim=128, head_dim_v=128,
              dtype="bfloat16", device="cuda") for n in (1024, 2048)]
SAMPLES = [1.0, 1.01, 0.99, 1.02, 0.98, 1.0, 1.01, 0.99]


def rows(run_id: str, methods: dict, scale: float = 1.0, case_list=CASES) -> list[dict]:
    """One timed record per (case, backend); ``methods[backend]`` is its timing_method
    (None: a record written before the column)."""
    out = []
    for case in case_list:
        for backend, method in methods.items():
            samples = [s * scale for s in SAMPLES]
            extra = {} if method is None else {"timing_method": method}
            rec = Record.new(case, backend, "ok", time_ms_median=sorted(samples)[4],
                             samples_ms=samples, **extra)
            out.append(rec.to_row() | {"run_id": run_id})
    return out


def test_the_columns_are_declared_once():
    assert "timing_method" in DEVICE_COLUMNS and "timing_method_note" in DEVICE_COLUMNS
    assert "wallclock" in OPTIONAL_COLUMNS["timing_method"]


def test_a_method_difference_is_named_first_with_its_count():
    base = pd.DataFrame(rows("a", {"sdpa": "events", "sdpa_flash": "events"}))
    new = pd.DataFrame(rows("b", {"sdpa": "cudagraph", "sdpa_flash": "events"}))
    new["gpu_sm_mhz"], base["gpu_sm_mhz"] = 1590.0, 1980.0
    lines = run_diff.device_state_difference({}, {}, base, new)
    assert lines[0] == ("timing method differs on 2 of 4 records timed in both (events -> "
                        "cudagraph: 2): their times were taken differently, a cause beside "
                        "the code")
    assert lines[1].startswith("GPU SM clock 1980 -> 1590 MHz")
    assert run_diff.timing_method_difference(base, base) == []


def test_records_from_before_the_column_count_as_events_on_a_gpu_and_wallclock_on_a_cpu():
    old_gpu = pd.DataFrame(rows("a", {"sdpa": None}))
    assert run_diff.timing_method_difference(old_gpu, pd.DataFrame(
        rows("b", {"sdpa": "events"}))) == []
    assert "events -> cudagraph: 2" in run_diff.timing_method_difference(
        old_gpu, pd.DataFrame(rows("b", {"sdpa": "cudagraph"})))[0]
    cpu = [c.replace(device="cpu", dtype="float32") for c in CASES]
    old_cpu = pd.DataFrame(rows("a", {"sdpa": None}, case_list=cpu))
    assert run_diff.timing_method_difference(old_cpu, pd.DataFrame(
        rows("b", {"sdpa": "wallclock"}, case_list=cpu))) == []


def test_untimed_records_and_frames_without_keys_say_nothing():
    failed = pd.DataFrame([Record.new(CASES[0], "sdpa", "error", "boom").to_row()])
    timed = pd.DataFrame(rows("b", {"sdpa": "cudagraph"}))
    assert run_diff.timing_method_difference(failed, timed) == []
    assert run_diff.timing_method_difference(pd.DataFrame([{"gpu_sm_mhz": 1.0}]), timed) == []


def write_run(root, run_id: str, records: list[dict]):
    run = root / run_id
    run.mkdir(parents=True)
    (run / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    meta = {"run_id": run_id, "suite": "t", "environment": {"device": "cuda",
                                                            "device_name": "Fake GPU"}}
    (run / "meta.json").write_text(json.dumps(meta))
    return str(run)


def test_compare_prints_the_method_difference_before_its_verdicts(tmp_path, capsys):
    from attnbench.cli import main

    a = write_run(tmp_path, "a", rows("a", {"sdpa": "events", "sdpa_flash": "events"}))
    b = write_run(tmp_path, "b", rows("b", {"sdpa": "cudagraph", "sdpa_flash": "cudagraph"},
                                      scale=0.5))
    assert main(["compare", a, b, "--absolute"]) == 0
    out = capsys.readouterr().out
    said = out.index("device state: timing method differs on 4 of 4 records timed in both "
                     "(events -> cudagraph: 4)")
    assert said < out.index("better") and said < out.index("joined records")
