"""Model runs as Records: what a run writes passes the checked reader and declares its
columns, a resumed run measures only the pairs it has not recorded, two model runs compare
by the one significance rule, and runs of the first layout (models-1) still load.

Resume and compare use an injected measurement (``records_of`` replaced: known samples, no
timing); one test runs the tiny real model once."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from attnbench.cli import main
from attnbench.core import metrics
from attnbench.core.model_case import COLUMNS as MODEL_CASE_COLUMNS
from attnbench.core.model_case import ModelCase
from attnbench.core.record import IDENTITY_COLUMNS, OPTIONAL_COLUMNS, Record
from attnbench.core.registry import all_backends
from attnbench.measure.budget import TimingBudget
from attnbench.measure.model_step import ModelJob, step_columns
from attnbench.measure.timing import Timing
from attnbench.reporting.model_report import model_report
from attnbench.runs import model_runner
from attnbench.runs.model_records import from_models_1, read_model_records
from attnbench.runs.model_suite import load_model_suite
from attnbench.runs.record_files import RecordWriter, read_records, record_lines

KNOWN = sorted(all_backends())
OLD_RUN = Path(__file__).parents[1] / "fixtures" / "models" / "2026-12-01-model-steps-cpu"
SUITE = """
name = "tiny-models"
[models]
backends = ["eager", "sdpa", "naive"]
share_passes = 1
timing = { warmup_s = 0.0, budget_s = 0.0, min_reps = 6, max_reps = 6 }
[[models.run]]
model = "llama3"
scale = "tiny"
batch = 1
seq_len = [16, 32]
"""
# Columns kernel records carry beside the declared ones: the run's context and the samples.
RUN_COLUMNS = {"suite", "format_version", "recorded_at", "env_id", "samples_ms",
               "sampling_stop", "probe_readings", "semantics", "backend_hash"}
BASE_MS = {"eager": 4.0, "sdpa": 3.0, "naive": 6.0}


def fake_measurement(monkeypatch, slower: dict[str, float] | None = None) -> list[tuple]:
    """``records_of`` replaced by known samples (8 rounds, +-2% around a backend's time,
    times ``slower``, as a change of that backend's code would: its hash changes too);
    returns the (model, N, steps, backends) each call measured."""
    slower = slower or {}
    calls: list[tuple] = []

    def records_of(job: ModelJob, suite) -> list[Record]:
        calls.append((job.model, job.seq_len, job.steps, job.backends))
        out = []
        for step in job.steps:
            for b in job.backends:
                ms = BASE_MS[b] * slower.get(b, 1.0) * job.seq_len / 16
                samples = [ms * (1 + 0.01 * ((3 * i) % 5 - 2)) for i in range(8)]
                cols = step_columns(Timing(samples, "max_reps"), TimingBudget())
                code = f"h-{b}" + ("-changed" if b in slower else "")
                out.append(Record.new(job.case(step), b, "ok", backend_hash=code,
                                      weights="random", semantics="exact", **cols))
        return out

    monkeypatch.setattr(model_runner, "records_of", records_of)
    return calls


def _run(write_suite, out: Path, run_id: str, resume: bool = False) -> Path:
    suite = load_model_suite(str(write_suite(SUITE)), KNOWN, "cpu")
    return model_runner.run_models(suite, out, "cpu", run_id=run_id, log=lambda *_: None,
                                   resume=resume)


def _declared(row: dict) -> set[str]:
    """The columns of ``row`` that no declaration names."""
    known = (set(IDENTITY_COLUMNS) | set(metrics.NAMES) | set(OPTIONAL_COLUMNS)
             | set(MODEL_CASE_COLUMNS) | RUN_COLUMNS)
    return {k for k in row if k not in known and not k.startswith("env_")}


def test_a_tiny_model_run_writes_records_the_checked_reader_accepts(write_suite, tmp_path):
    pytest.importorskip("transformers")
    text = SUITE.replace('"naive"]', ']\nsteps = ["fwd"]').replace("[16, 32]", "16")
    suite = load_model_suite(str(write_suite(text)), KNOWN, "cpu")
    run_dir = model_runner.run_models(suite, tmp_path, "cpu", run_id="t", log=lambda *_: None)
    rows = record_lines(run_dir / "records.jsonl")  # raises on a line that is not a record
    assert {(r["level"], r["backend"]) for r in rows} == {
        ("model", "eager"), ("model", "sdpa"), ("kernel", "sdpa")}
    for r in rows:
        assert r["status"] == "ok", r
        assert ModelCase.from_row(r).key == r["key"] == "llama3-tiny-b1-n16-float32-cpu-fwd-" \
            + r["level"]
        assert r["time_ms_ci_low"] <= r["time_ms_median"] <= r["time_ms_ci_high"]
        assert r["time_ms_min"] <= r["time_ms_median"] and r["time_ms_iqr"] >= 0
        assert r["n_samples"] == len(r["samples_ms"]) == 6 and r["time_cv"] >= 0
        assert r["format_version"] and r["env_id"] and r["run_id"] == "t"
        assert _declared(r) == set(), r
    model = {r["backend"]: r for r in rows if r["level"] == "model"}
    assert 0 < model["sdpa"]["attn_share"] < 1 and "attn_share" not in model["eager"]
    assert model["sdpa"]["rel_l2_vs_eager"] < 1e-5
    assert model["sdpa"]["peak_mem_bytes"] > 0
    assert model["sdpa"]["backend_hash"].endswith(f"+transformers {_version()}")
    meta = json.loads((run_dir / "meta.json").read_text())
    assert meta["device"] == "cpu" and meta["suite_toml"] == text


def _version() -> str:
    import importlib.metadata

    return importlib.metadata.version("transformers")


def test_resume_measures_only_the_pairs_not_recorded(write_suite, tmp_path, monkeypatch):
    calls = fake_measurement(monkeypatch)
    run_dir = _run(write_suite, tmp_path, "t")
    path = run_dir / "records.jsonl"
    full = path.read_bytes().splitlines(keepends=True)
    assert len(full) == 2 * 2 * 3  # (N) x (fwd, train) x backends
    # a kill: the second job's last pair (train, naive) lost, its line cut mid-write
    kept = b"".join(full[:-1])
    path.write_bytes(kept + full[-1][:25])
    calls.clear()
    _run(write_suite, tmp_path, "t", resume=True)
    assert calls == [("llama3", 32, ("train",), ("naive",))]  # the first job not at all
    now = path.read_bytes()
    assert now.startswith(kept)  # nothing recorded was touched
    rows = record_lines(path)
    assert len(rows) == len(full)
    assert len({(r["key"], r["backend"]) for r in rows}) == len(rows)  # each pair once
    assert (rows[-1]["key"], rows[-1]["backend"]) == ("llama3-tiny-b1-n32-float32-cpu-"
                                                      "train-model", "naive")
    calls.clear()
    _run(write_suite, tmp_path, "t", resume=True)  # all recorded: nothing measured
    assert calls == [] and path.read_bytes() == now


def test_resume_keeps_eager_for_a_forward_it_remeasures():
    job = ModelJob("llama3", "tiny", 1, 16, "float32", "cpu", ("eager", "sdpa", "naive"))
    done = {(job.case(s).key, b) for s in ("fwd", "train") for b in job.backends}
    assert model_runner.remaining(job, done) is None
    fwd_naive = done - {(job.case("fwd").key, "naive")}
    part = model_runner.remaining(job, fwd_naive)
    assert (part.steps, part.backends) == (("fwd",), ("eager", "naive"))


def test_the_command_resumes_and_refuses_what_contradicts_the_run(write_suite, tmp_path,
                                                                   monkeypatch, capsys):
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")  # the run in this process
    calls = fake_measurement(monkeypatch)
    out, reports = str(tmp_path / "out"), str(tmp_path / "reports")
    assert main(["model", str(write_suite(SUITE)), "--device", "cpu", "--out", out,
                 "--run-id", "t", "--report-dir", reports]) == 0
    lines = (tmp_path / "out" / "models" / "t" / "records.jsonl").read_text().splitlines()
    (tmp_path / "out" / "models" / "t" / "records.jsonl").write_text(
        "\n".join(lines[:6]) + "\n")  # the second job's records lost
    calls.clear()
    assert main(["model", "--resume", "t", "--out", out, "--report-dir", reports]) == 0
    assert [c[1] for c in calls] == [32]
    assert len(read_records(tmp_path / "out" / "models" / "t")) == len(lines)
    assert "N = 32" in (tmp_path / "reports" / "t" / "index.md").read_text()
    capsys.readouterr()
    shutil.copytree(OLD_RUN, tmp_path / "out" / "models" / OLD_RUN.name)
    for argv, said in (
            (["--resume", "t", "quick"], "--resume t with the suite 'quick': allowed: "),
            (["--resume", "t", "--device", "cuda"], "--device cuda: contradicts the run"),
            (["--resume", "t", "--run-id", "u"], "--run-id 'u' with --resume 't'"),
            (["--resume", "nope"], "--resume nope: no model run"),
            (["--resume", OLD_RUN.name], "records no copy of its suite")):
        assert main(["model", *argv, "--out", out, "--report-dir", reports]) == 2, argv
        err = capsys.readouterr().err.strip()
        assert said in err and "\n" not in err and "Traceback" not in err, err
    assert len(read_records(tmp_path / "out" / "models" / "t")) == len(lines)


def test_compare_of_two_model_runs_joins_on_key_and_backend(write_suite, tmp_path,
                                                            monkeypatch, capsys):
    fake_measurement(monkeypatch)
    base = _run(write_suite, tmp_path, "base")
    fake_measurement(monkeypatch, {"naive": 2.0})
    new = _run(write_suite, tmp_path, "new")
    assert main(["compare", str(base), str(new), "--fail-on-regression"]) == 1
    out = capsys.readouterr().out
    assert out.count("REGRESSION naive") == 4  # (N) x (fwd, train), the model level
    assert "REGRESSION sdpa" not in out and "REGRESSION eager" not in out
    assert "12 joined records" in out and "4 worse" in out and "8 unchanged" in out
    assert "REGRESSION naive llama3-tiny-b1-n32-float32-cpu-train-model" in out
    # and the report reads these records
    text = model_report(new)
    assert "### llama3 (tiny config, random weights), batch 1, N = 16" in text


def test_models_1_records_load_converted_with_their_keys_and_figures(tmp_path):
    raw = record_lines(OLD_RUN / "records.jsonl")
    rows = read_model_records(OLD_RUN)
    assert len(rows) == len(raw) == 40
    for old, new in zip(raw, rows):
        assert new["key"] == old["key"] == ModelCase.from_row(new).key
        assert (new["mode"], new["level"], new["backend"]) == (old["step"], old["level"],
                                                               old["backend"])
        assert new["size"] == ("real" if old["model"] == "minilm" else old["scale"])
        assert new["format"] == "models-1" and _declared(new) == set(), new
        assert "time_ms" not in new and "step" not in new and "scale" not in new
        if old["status"] == "ok":
            assert new["time_ms_median"] == pytest.approx(old["time_ms"])
            assert new["time_ms_ci_low"] == pytest.approx(old["time_ms_lo"])
            assert new["time_ms_ci_high"] == pytest.approx(old["time_ms_hi"])
            assert new["samples_ms"] == old["samples_ms"]
            assert new["sampling_stop"] == old["stop"]
            assert new["n_samples"] == len(old["samples_ms"])
            if old.get("peak_mem_mb") is not None:
                assert new["peak_mem_bytes"] == round(old["peak_mem_mb"] * 2**20)
    with RecordWriter(tmp_path) as writer:  # converted lines are records of today's layout
        for r in rows:
            writer.write(r)
    assert [r["key"] for r in record_lines(tmp_path / "records.jsonl")] == [
        r["key"] for r in raw]
    minilm = next(r for r in rows if r["model"] == "minilm" and r["backend"] == "sdpa")
    assert minilm["size"] == "real" and minilm["key"].startswith("minilm-real-b2-n256")


def test_a_models_1_line_and_a_new_one_share_their_key():
    old = {"model": "llama3", "scale": "tiny", "batch": 1, "seq_len": 16, "dtype": "float32",
           "device": "cpu", "backend": "sdpa", "step": "train", "level": "kernel",
           "status": "unsupported", "reason": "mask causal", "format": "models-1",
           "key": "llama3-tiny-b1-n16-float32-cpu-train-kernel"}
    new = from_models_1(old)
    job = ModelJob("llama3", "tiny", 1, 16, "float32", "cpu", ("eager", "sdpa"))
    assert new["key"] == old["key"] == job.case("train", "kernel").key
    assert new["status"] == "unsupported" and new["reason"] == "mask causal"
    assert "time_ms_median" not in new


def test_resume_with_retry_measures_unavailable_pairs_again(write_suite, tmp_path,
                                                            monkeypatch, capsys):
    monkeypatch.setattr(model_runner.hf_adapter, "transformers_reason",
                        lambda: "transformers is not installed")
    run_dir = _run(write_suite, tmp_path, "t")
    assert {r["status"] for r in read_records(run_dir)} == {"unavailable"}
    calls = fake_measurement(monkeypatch)
    _run(write_suite, tmp_path, "t", resume=True)
    assert calls == []  # unavailable is recorded: resumed without --retry, nothing to do
    suite = load_model_suite(str(write_suite(SUITE)), KNOWN, "cpu")
    model_runner.run_models(suite, tmp_path, "cpu", run_id="t", log=lambda *_: None,
                            resume=True, retry=("unavailable",))
    assert len(calls) == 2
    latest = read_records(run_dir)
    assert len(latest) == 12 and {r["status"] for r in latest} == {"ok"}
    assert len(record_lines(run_dir / "records.jsonl")) == 24  # the old ones kept as history
    for argv, said in ((["--retry", "error"], "--retry: only with --resume RUN_ID"),
                       (["--resume", "t", "--retry", "ok"], "--retry 'ok': allowed: ")):
        assert main(["model", *argv, "--out", str(tmp_path)]) == 2
        err = capsys.readouterr().err.strip()
        assert said in err and "\n" not in err, err


def test_compare_reads_an_older_model_run(capsys):
    """models-1 lines are converted on reading, so compare joins them on their keys."""
    assert main(["compare", str(OLD_RUN), str(OLD_RUN)]) == 0
    out = capsys.readouterr().out
    assert "40 joined records, 40 with the metric in both runs: 0 worse, 0 better" in out
