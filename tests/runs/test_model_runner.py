"""Model-level runs: the [models] suite section, the records of a run (statuses, environment,
results.csv), the report's sections, and a run without transformers. Timing is never asserted;
a tiny model and a tiny budget keep it short."""

import json
from pathlib import Path

import pytest

from attnbench.core.errors import BadInput
from attnbench.core.registry import all_backends
from attnbench.reporting.model_report import amdahl, model_report
from attnbench.runs import model_runner
from attnbench.runs.model_suite import load_model_suite
from attnbench.runs.record_files import load_results, read_records

SUITES = Path(__file__).parents[2] / "suites"
KNOWN = sorted(all_backends())
TINY = """
name = "tiny-models"
[models]
backends = ["eager", "sdpa", "naive", "sliding_window"]
share_passes = 2
timing = { warmup_s = 0.0, budget_s = 0.0, min_reps = 6, max_reps = 6 }
[[models.run]]
model = "llama3"
scale = "tiny"
batch = 1
seq_len = 16
"""


@pytest.mark.parametrize("name", ["model_steps_cpu.toml", "h200.toml"])
def test_shipped_model_sections_are_valid(name):
    suite = load_model_suite(str(SUITES / name), KNOWN, "cpu")
    assert {j.model for j in suite.jobs} >= {"minilm", "llama3"}
    assert all(j.backends[0] == "eager" for j in suite.jobs)


@pytest.mark.parametrize("change,expected", [
    (('model = "llama3"', 'model = "t5"'),
     "models.run[0].model = 't5': allowed: minilm, llama3, mistral, gpt2, bert"),
    (('scale = "tiny"', 'scale = "huge"'), "models.run[0].scale = 'huge': allowed: tiny"),
    (('batch = 1', 'batch = 0'), "models.run[0].batch = 0: must be a positive integer"),
    (('"naive"', '"nope"'), "models.backends = ['eager', 'sdpa', 'nope', 'sliding_window']: "
                            "unknown name 'nope'; allowed: eager,"),
    (("min_reps = 6", "min_reps = 0"), "models.timing.min_reps = 0: must be a positive integer"),
    (("share_passes = 2", "colour = 2"), "models.colour = 2: unknown key; allowed: description"),
    (("budget_s = 0.0", "budget_s = -1"),
     "models.timing.budget_s = -1: must be a non-negative number"),
])
def test_bad_model_sections_are_one_line(write_suite, change, expected):
    path = write_suite(TINY.replace(*change))
    with pytest.raises(BadInput) as err:
        load_model_suite(str(path), KNOWN, "cpu")
    assert expected in str(err.value) and "\n" not in str(err.value)
    assert str(path) in str(err.value)


def test_a_suite_without_models_section_is_bad_input():
    with pytest.raises(BadInput, match=r"no \[models\] section"):
        load_model_suite(str(SUITES / "quick.toml"), KNOWN, "cpu")


def test_without_transformers_every_job_is_unavailable_with_the_install_command(
        write_suite, tmp_path, monkeypatch):
    monkeypatch.setattr(model_runner.hf_adapter, "transformers_reason",
                        lambda: "transformers is not installed; install it with: "
                                "pip install -e '.[models]'")
    suite = load_model_suite(str(write_suite(TINY)), KNOWN, "cpu")
    run_dir = model_runner.run_models(suite, tmp_path / "out", "cpu", log=lambda *_: None)
    records = read_records(run_dir)
    assert len(records) == 2 * 4  # (fwd, train) x backends
    assert {r["status"] for r in records} == {"unavailable"}
    assert all("pip install -e '.[models]'" in r["reason"] for r in records)
    assert all(r["env_torch"] and r["env_id"] for r in records)
    assert "unavailable: transformers is not installed" in model_report(run_dir)


def test_amdahl_is_the_end_to_end_speedup_of_a_share():
    assert amdahl(0.5, 2.0) == pytest.approx(1 / 0.75)
    assert amdahl(0.0, 10.0) == 1.0


def test_a_tiny_model_run_records_every_backend_and_reports_it(write_suite, tmp_path):
    pytest.importorskip("transformers")
    suite = load_model_suite(str(write_suite(TINY)), KNOWN, "cpu")
    run_dir = model_runner.run_models(suite, tmp_path / "out", "cpu", run_id="t",
                                      log=lambda *_: None)
    assert run_dir == tmp_path / "out" / "models" / "t"
    records = read_records(run_dir)
    model = {(r["mode"], r["backend"]): r for r in records if r["level"] == "model"}
    assert set(model) == {(s, b) for s in ("fwd", "train")
                          for b in ("eager", "sdpa", "naive", "sliding_window")}
    for step in ("fwd", "train"):
        for b in ("eager", "sdpa", "naive"):
            r = model[(step, b)]
            assert r["status"] == "ok", r
            assert r["time_ms_ci_low"] <= r["time_ms_median"] <= r["time_ms_ci_high"]
            assert len(r["samples_ms"]) == 6
        # the causal model is refused by sliding_window before timing, with its reason
        refused = model[(step, "sliding_window")]
        assert refused["status"] == "unsupported" and "mask causal" in refused["reason"]
        for b in ("sdpa", "naive"):  # attention's share from the adapter's clock
            assert 0 < model[(step, b)]["attn_share"] < 1
        assert "attn_share" not in model[(step, "eager")]
    # exact backends reproduce eager's output on the forward
    assert model[("fwd", "sdpa")]["rel_l2_vs_eager"] < 1e-5
    kernel = {(r["mode"], r["backend"]): r for r in records if r["level"] == "kernel"}
    assert kernel[("train", "sdpa")]["attn_case"].endswith("causal-fwd_bwd-s0-scale=0.25")
    assert "hkv2" in kernel[("fwd", "naive")]["attn_case"]  # GQA kept at the kernel level
    assert all(r["env_torch"] and r["run_id"] == "t" for r in records)
    meta = json.loads((run_dir / "meta.json").read_text())
    assert meta["kind"] == "models" and meta["transformers"]
    df = load_results(run_dir / "results.csv")
    assert len(df) == len(records)
    text = model_report(run_dir)
    assert "### llama3 (tiny config, random weights), batch 1, N = 16" in text
    assert "| fwd |" in text and "| train |" in text  # best backend, kernel beside model
    assert "sliding_window (fwd): unsupported: mask causal" in text


def test_bad_model_suite_on_the_command_line_is_exit_2_and_one_line(write_suite, capsys):
    from attnbench.cli import main

    path = write_suite(TINY.replace('model = "llama3"', 'model = "t5"'))
    assert main(["model", str(path), "--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "models.run[0].model = 't5'" in err
