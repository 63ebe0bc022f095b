"""The noise flag says why: each check that flags a record gives what it measured and the
limit it passed; the report decides every run's flag by the current rule (a flag recorded
under an older rule is not kept) and lists each flagged record with its reason in the
appendix. Injected samples and probe readings only."""

import json

import pandas as pd
import pytest

from attnbench.core.case import Case
from attnbench.core.record import Record
from attnbench.reporting import findings
from attnbench.reporting.report import build_report
from attnbench.stats import noise

STEADY = [1.0, 1.01, 0.99, 1.0, 1.005, 0.995, 1.0, 1.002]
WILD = [1.0, 1.6, 0.7, 1.3, 0.8, 1.5, 0.9, 1.2]  # IQR far above the probe's
PROBE_FLAT = [100.0, 101.0, 99.0, 100.0, 100.5, 99.5, 100.0, 100.2]
PROBE_STEP = [100.0, 100.5, 99.5, 100.0, 80.0, 80.5, 79.5, 80.0]  # level fell 20%


def test_each_check_gives_its_figure_and_limit():
    moved = noise.flag_reasons(STEADY, 0.01, PROBE_STEP, 0.25, 0.05)
    assert [f.check for f in moved] == ["probe"]
    assert moved[0].measured == pytest.approx(20.0 / 90.0, rel=1e-6)  # over the median
    assert moved[0].limit == pytest.approx(1.0 / 90.0, rel=1e-6)
    assert "20%" not in moved[0].text() and "22%" in moved[0].text()
    wild = noise.flag_reasons(WILD, 0.4, PROBE_FLAT, 0.25, 0.05)
    assert [f.check for f in wild] == ["spread", "samples"]
    assert wild[0].measured == pytest.approx(noise.rel_spread(WILD))
    assert wild[0].limit == 0.05  # the floor is above twice the flat probe's IQR
    assert wild[1].text().startswith("samples: its interval reaches 40% from its median, "
                                      "over 25%")
    assert noise.flags(WILD, 0.4, PROBE_FLAT, 0.25, 0.05) == ["spread", "samples"]
    assert noise.flag_reasons(STEADY, 0.01, PROBE_FLAT, 0.25, 0.05) == []


def _row(key, samples, probe, noisy_by="probe", run="r1"):
    return {"run_id": run, "key": key, "backend": "naive", "status": "ok", "seq_q": 1024,
            "seq_k": 1024, "time_ms_median": float(pd.Series(samples).median()),
            "samples_ms": samples, "probe_readings": probe, "noisy": True,
            "noisy_by": noisy_by}


def test_the_report_decides_the_flag_again_with_each_reason():
    """Both records were flagged 'probe' under an older rule; by the current one the steady
    record on a flat probe is not noisy, the wild one is, with its figures."""
    df = pd.DataFrame([_row("a", STEADY, PROBE_FLAT), _row("b", WILD, PROBE_FLAT)])
    got = findings.noise_rechecked(df, {"r1": {"unsteady_rel": 0.25,
                                               "noise_threshold": 0.1}})
    assert list(got["noisy"]) == [False, True]
    assert got["noisy_by"][1] == "spread+samples"
    assert "over 10%" in got["noisy_why"][1]  # the run's own floor, not the default
    table = findings.noisy_records(got, ["backend"])
    assert list(table["backend"]) == ["naive"] and table["reason"][0] == got["noisy_why"][1]
    assert df["noisy"].all()  # the records themselves are not touched


def test_a_flag_without_samples_keeps_its_recorded_reason():
    row = _row("c", [], PROBE_FLAT) | {"samples_ms": None}
    got = findings.noise_rechecked(pd.DataFrame([row]), {})
    assert bool(got["noisy"][0]) is True
    assert "probe (recorded" in findings.noisy_records(got, ["backend"])["reason"][0]


def test_the_appendix_lists_each_flagged_record_with_its_reason(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    rows = []
    for n, samples in ((1024, STEADY), (2048, [x * 2 for x in WILD])):
        case = Case(batch=1, heads_q=2, heads_kv=2, seq_q=n, seq_k=n, head_dim=64,
                    head_dim_v=64)
        rows.append(Record.new(case, "naive", "ok", "", samples_ms=samples,
                               time_ms_median=float(pd.Series(samples).median()),
                               probe_readings=PROBE_FLAT, noisy=True,
                               noisy_by="probe").to_row())
    with open(run / "records.jsonl", "w") as fh:
        for r in rows:
            fh.write(json.dumps({k: v for k, v in r.items() if k != "run_id"}) + "\n")
    (run / "meta.json").write_text(json.dumps({
        "run_id": "run", "suite": "s", "environment": {"device": "cpu"},
        "timing": {"unsteady_rel": 0.25, "noise_threshold": 0.05}}))
    out = build_report([run], tmp_path / "rep")
    appendix = (out / "appendix.md").read_text()
    assert "Records flagged noisy" in appendix
    assert "1 of 2 ok records" in appendix
    assert "spread: samples' IQR" in appendix and "samples: its interval reaches" in appendix
    index = (out / "index.md").read_text()
    assert "unsteady: 1 of 2 ok records flagged noisy" in index
