"""``attnbench recommend``: choice, margin and the 'no near shape' path on a synthetic run
whose records are written through the record/records API."""

from pathlib import Path

import pytest

from attnbench.analysis.recommend import parse_shape, recommend
from attnbench.cli import main
from attnbench.core.case import Case
from attnbench.core.errors import BadInput
from attnbench.core.record import Record
from attnbench.runs.record_files import RecordWriter, load_results, write_meta
from attnbench.runs.suite import load_suite
from attnbench.stats import intervals

STEPS = [1.0, 1.3, 0.9, 1.6, 1.1, 1.0, 1.4, 0.95]  # the machine drifting, round by round


def _case(n: int) -> Case:
    return Case(batch=1, heads_q=4, heads_kv=1, seq_q=n, seq_k=n, head_dim=128,
                head_dim_v=128, dtype="float32", device="cpu", mask="causal", mode="fwd")


def _ok(case, backend, base_ms, factors, semantics="exact", group="g"):
    samples = [base_ms * s * f for s, f in zip(STEPS, factors)]
    iv = intervals.median_interval(samples)
    return Record.new(case, backend, "ok", time_ms_median=iv.estimate, time_ms_ci_low=iv.low,
                      time_ms_ci_high=iv.high, samples_ms=samples, pair_group=group,
                      semantics=semantics)


@pytest.fixture
def run_dir(tmp_path):
    """One run: at N = 2048 sdpa beats naive by ~2x (paired rounds), linear (approximate) is
    faster still, sdpa_math is wrong, flex unsupported; at N = 8192 naive wins."""
    small, big = _case(2048), _case(8192)
    jitter = [1.0, 1.02, 0.99, 1.01, 1.0, 0.98, 1.03, 1.0]
    recs = [
        _ok(small, "sdpa", 10.0, [1.0] * 8, group="g1"),
        _ok(small, "naive", 20.0, jitter, group="g1"),
        _ok(small, "linear", 2.0, [1.0] * 8, semantics="approximate", group="g1"),
        Record.new(small, "sdpa_math", "wrong", "err_impl_out_rel 3e-2 above the float32 "
                                                "tolerance 1e-4"),
        Record.new(small, "flex", "unsupported", "mode fwd_bwd: no backward on cpu"),
        _ok(big, "sdpa", 90.0, [1.0] * 8, group="g2"),
        _ok(big, "naive", 60.0, [1.0] * 8, group="g2"),
    ]
    d = tmp_path / "results" / "synthetic-cpu"
    with RecordWriter(d) as w:
        for i, r in enumerate(recs):
            w.write(r.to_row() | {"run_id": d.name, "recorded_at": f"2026-12-01T00:00:{i:02d}"})
    write_meta(d, {"run_id": d.name, "suite": "synthetic"})
    return d


def test_choice_and_margin_at_the_nearest_length(run_dir):
    df = load_results(run_dir)
    answer = recommend(parse_shape("b=1,hq=32,hkv=8,n=3000,d=128,mask=causal"), df)
    (pick,) = answer.picks
    assert pick.device == "cpu" and pick.problem["seq_q"] == 2048  # 0.55 octave, not 1.45
    assert [r["backend"] for r in pick.ranked] == ["sdpa", "naive"]  # linear is not exact
    # naive over sdpa from the per-round ratios: drift shared by a round cancels
    expected = intervals.paired_ratio_interval(pick.ranked[1]["samples_ms"],
                                           pick.ranked[0]["samples_ms"])
    assert pick.margin.interval == expected
    assert pick.margin.interval.estimate == pytest.approx(2.0, rel=0.03)
    assert pick.margin.significant and pick.margin.is_paired
    assert {r["backend"]: r["status"] for r in pick.not_ok} == {"sdpa_math": "wrong",
                                                                 "flex": "unsupported"}
    assert pick.inexact == ["linear (approximate)"]
    # closer to 8192: naive wins there
    far = recommend(parse_shape("hq=4,hkv=1,n=6000,d=128,mask=causal"), df).picks[0]
    assert far.problem["seq_q"] == 8192 and far.ranked[0]["backend"] == "naive"
    assert far.margin.interval.estimate == pytest.approx(1.5)


def test_cli_prints_winner_margin_and_reasons(run_dir, capsys):
    assert main(["recommend", "--shape", "b=1,hq=32,hkv=8,n=2048,d=128,mask=causal",
                 str(run_dir)]) == 0
    out = capsys.readouterr().out
    assert "fastest within tolerance: sdpa" in out
    assert "margin over the runner-up naive" in out and "significant: yes (paired rounds)" in out
    assert "sdpa_math: failed its error tolerance: err_impl_out_rel" in out
    assert "flex: unsupported: mode fwd_bwd: no backward on cpu" in out
    assert "b=1,hq=4,hkv=1,n=2048,d=128" in out  # the measured problem, not the asked one


@pytest.mark.parametrize("shape,far", [
    ("b=1,hq=32,hkv=8,n=8192,d=128,dtype=bfloat16,mask=causal", None),  # another dtype
    ("hq=4,hkv=4,n=2048,d=128,mask=causal", None),  # another GQA group
    ("hq=4,hkv=1,n=65536,d=128,mask=causal", "b=1,hq=4,hkv=1,n=8192,d=128"),  # 3 octaves
    ("hq=4,hkv=1,n=2048,d=128,mask=causal,device=cuda", None),  # measured on cpu only
])
def test_no_near_shape_prints_the_run_that_would_measure_it(run_dir, capsys, tmp_path, shape,
                                                           far):
    assert main(["recommend", "--shape", shape, str(run_dir)]) == 0
    out = capsys.readouterr().out
    assert "holds a near shape" in out and "fastest" not in out
    assert (f"nearest comparable: {far}" in out) == (far is not None)
    suite_text = out.split("<<'EOF'\n")[1].split("\nEOF\n")[0]
    command = out.split("\nEOF\n")[1].strip()
    assert command.startswith("attnbench run --suite shape.toml")
    assert command.endswith("--device cuda") == ("device=cuda" in shape)
    path = tmp_path / "shape.toml"
    path.write_text(suite_text)
    (case,) = {c for c, _ in load_suite(str(path)).jobs()}
    assert case.key == parse_shape(shape).case.key


@pytest.mark.parametrize("shape,message", [
    ("hq=32,n=8192", "d is required"),
    ("hq=32,d=128", "n (or nk) is required"),
    ("hq=32,d=128,n=0", "n=0 must be a positive integer"),
    ("hq=32,d=128,n=many", "n='many' must be a positive integer"),
    ("hq=32,hkv=5,d=128,n=64", "heads_q (32) must be a multiple of heads_kv (5)"),
    ("hq=32,d=128,n=64,dtype=fp8", "unknown dtype 'fp8'"),
    ("hq=32,d=128,n=64,mask=diagonal", "unknown mask 'diagonal'"),
    ("hq=32,d=128,n=64,heads=3", "unknown key 'heads'; allowed: b, hq, hkv"),
    ("hq=32,d=128,n=64,nk=128", "give n or nq/nk, not both"),
    ("hq=32,d=128,n=64,device=tpu", "device='tpu'; allowed: cpu, cuda"),
    ("hq=32,d,n=8", "'d' is not key=value"),
])
def test_bad_shape_is_one_line_and_exit_2(run_dir, capsys, shape, message):
    with pytest.raises(BadInput):
        parse_shape(shape)
    assert main(["recommend", "--shape", shape, str(run_dir)]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err


def test_window_mask_with_its_comma_parses():
    case = parse_shape("hq=32,hkv=8,nq=1,nk=8192,d=128,mask=window(4095,0)").case
    assert (case.mask, case.seq_q, case.seq_k) == ("window(4095,0)", 1, 8192)


def test_backends_after_the_runner_up_carry_their_ratio_interval(tmp_path, capsys):
    case = _case(2048)
    jitter = [1.0, 1.02, 0.99, 1.01, 1.0, 0.98, 1.03, 1.0]
    d = tmp_path / "results" / "three-cpu"
    with RecordWriter(d) as w:
        for r in (_ok(case, "sdpa", 10.0, [1.0] * 8), _ok(case, "naive", 20.0, jitter),
                  _ok(case, "sdpa_math", 30.0, jitter)):
            w.write(r.to_row() | {"run_id": d.name, "recorded_at": "2026-12-01T00:00:00"})
    write_meta(d, {"run_id": d.name, "suite": "synthetic"})
    assert main(["recommend", "--shape", "hq=4,hkv=1,n=2048,d=128,mask=causal", str(d)]) == 0
    then = [line for line in capsys.readouterr().out.splitlines() if "then sdpa_math" in line]
    assert len(then) == 1 and "3x [" in then[0], then  # paired rounds: 3 with its interval


FAMILY = Path(__file__).parents[1] / "fixtures" / "recommend-family"  # a family run's causal fwd
FAVOR = "b1-hq8-hkv8-q4096-k4096-d64-dv64-float32-cpu-causal-fwd-s0-feature_map=favor"


def test_nearest_problem_where_an_exact_backend_ran_ok_and_the_skipped_keys(capsys):
    """At the shape itself two problems were measured: sdpa and linear on the plain case,
    and linear alone on its FAVOR+ variant (recorded later). The variant is skipped, and
    named; sdpa answers."""
    assert main(["recommend", "--shape", "b=1,hq=8,n=4096,d=64,dtype=float32,mask=causal",
                 str(FAMILY)]) == 0
    out = capsys.readouterr().out
    assert "no exact backend passed" not in out
    assert "measured at the shape itself" in out
    assert "fastest within tolerance: sdpa  86.6 ms" in out
    assert f"skipped as near or nearer, no exact backend ran ok there: {FAVOR}" in out
    answer = recommend(parse_shape("b=1,hq=8,n=4096,d=64,mask=causal"), load_results(FAMILY))
    (pick,) = answer.picks
    assert pick.problem["seq_q"] == 4096 and pick.ranked[0]["backend"] == "sdpa"
    assert [key for _, key in pick.skipped] == [FAVOR]


def test_without_any_exact_ok_the_nearest_problem_is_still_shown(tmp_path, capsys):
    """When no near problem has an exact backend ok, the nearest is reported as before,
    with nothing skipped."""
    run = tmp_path / "r"
    with RecordWriter(run) as w:
        w.write(_ok(_case(2048), "linear", 2.0, [1.0] * 8, semantics="approximate").to_row()
                | {"run_id": run.name})
    write_meta(run, {"run_id": run.name, "suite": "synthetic"})
    answer = recommend(parse_shape("hq=4,hkv=1,n=2048,d=128,mask=causal"), load_results(run))
    (pick,) = answer.picks
    assert pick.ranked == [] and pick.skipped == [] and pick.inexact == ["linear (approximate)"]


def test_a_record_timed_under_an_interpreter_is_never_the_pick(tmp_path):
    """An interpreter's time is no speed: a faster-looking interpreted record is left out."""
    case = _case(2048)
    d = tmp_path / "results" / "interp-cpu"
    interpreted = _ok(case, "triton_flash", 1.0, [1.0] * 8).to_row() | {
        "timed_under": "triton interpreter"}
    with RecordWriter(d) as w:
        for row in (_ok(case, "sdpa", 10.0, [1.0] * 8).to_row(), interpreted,
                    _ok(case, "naive", 20.0, [1.0] * 8).to_row()):
            w.write(row | {"run_id": d.name, "recorded_at": "2026-12-01T00:00:00"})
    write_meta(d, {"run_id": d.name, "suite": "synthetic"})
    (pick,) = recommend(parse_shape("hq=4,hkv=1,n=2048,d=128,mask=causal"),
                        load_results(d)).picks
    assert [r["backend"] for r in pick.ranked] == ["sdpa", "naive"]
