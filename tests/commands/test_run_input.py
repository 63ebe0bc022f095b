"""Hostile suites and command lines: each answered with one line and exit 2 (or a plan),
before anything is expanded or run."""

from __future__ import annotations

import json
import os
import textwrap

import pytest
from run_command import TINY, files_under, one_line_error, run

from attnbench.cli import main
from attnbench.core.masks import INT64_MAX
from attnbench.runs.record_files import RECORDS

BASE = """
name = "hostile"
backends = ["naive"]
[timing]
warmup_s = 0.0
budget_s = 0.002
min_reps = 1
max_reps = 2
[axes]
heads_q = 1
head_dim = 8
seq_len = [16]
"""


def answer(capsys, tmp_path, monkeypatch, text: str, *args: str) -> tuple[int, str]:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "s.toml").write_text(text)
    code = main(["run", "--suite", "s.toml", "--no-progress", "--no-report", *args])
    return code, capsys.readouterr().err.strip()


def one_line(err: str) -> str:
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    assert len(err) < 300, err
    return err


@pytest.mark.parametrize("derive, message", [
    ('batch = "max(seq_len)"', "max() takes two or more arguments"),
    ('batch = "min(seq_len)"', "min() takes two or more arguments"),
    ('seed = "0 - seq_len"', "seed must be an integer >= 0"),
    ('block_band = "-1"', "block_band must be an integer >= 0"),
    # an axis of a suite without sweeps derived too: was silently dropped (ran batch = 1)
    ('head_dim = "seq_len"', "derive.head_dim = 'seq_len': head_dim is also given in axes"),
])
def test_bad_derived_values_are_refused_at_load(capsys, tmp_path, monkeypatch, derive,
                                                message):
    code, err = answer(capsys, tmp_path, monkeypatch, BASE + f"[derive]\n{derive}\n",
                       "--dry-run")
    assert code == 2 and message in one_line(err)


@pytest.mark.parametrize("claim, message", [
    ('metric = ["time_ms_median"]', "claim[0].metric = ['time_ms_median']: not a declared"),
    ("metric = {a = 1}", "claim[0].metric = {'a': 1}: not a declared"),
    ('scale = "abc"', "claim[0].scale = 'abc': must be a finite nonzero number"),
    ("where = {seq_len = {a = 1}}", "claim[0].where.seq_len"),
])
def test_bad_claims_are_refused_at_load(capsys, tmp_path, monkeypatch, claim, message):
    text = BASE + ('[[claim]]\ntext = "t"\nkind = "value"\nbackend = "naive"\n'
                   'expected = [0.0]\n' + claim + "\n")
    code, err = answer(capsys, tmp_path, monkeypatch, text, "--dry-run")
    assert code == 2 and message in one_line(err)
    assert not (tmp_path / "results").exists()


def test_excludes_that_remove_every_case_are_refused(capsys, tmp_path, monkeypatch):
    text = BASE + "[[exclude]]\nseq_len = 16\n"
    for args in (["--dry-run"], []):
        code, err = answer(capsys, tmp_path, monkeypatch, text, *args)
        assert code == 2 and "no (case, backend) pair on cpu is left" in one_line(err)
    assert not (tmp_path / "results").exists()


HUGE = BASE.replace("seq_len = [16]", "seq_len = [16]\nbatch = {batch}\nseed = {seed}")


@pytest.mark.parametrize("batch, seed", [(3200, 1024), (1000, 1000), (2000, 100)])
def test_huge_plans_are_refused_from_their_axes(capsys, tmp_path, monkeypatch, batch, seed):
    from attnbench.runs.suite import Suite

    def expanded(*args, **kwargs):
        raise AssertionError("a plan over the limit was expanded")

    monkeypatch.setattr(Suite, "jobs", expanded)  # refused from the axes: never expanded
    text = HUGE.format(batch=list(range(1, batch + 1)), seed=list(range(seed)))
    code, err = answer(capsys, tmp_path, monkeypatch, text)
    assert code == 2 and f"at least {batch * seed} pairs exceed" in one_line(err)
    code, err = answer(capsys, tmp_path, monkeypatch, text, "--dry-run")
    assert code == 0 and err == ""
    assert not (tmp_path / "results").exists()


def test_dry_run_says_a_huge_plan_would_be_refused(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "s.toml").write_text(HUGE.format(batch=list(range(1, 1001)),
                                                 seed=list(range(1000))))
    assert main(["run", "--suite", "s.toml", "--dry-run"]) == 0
    assert "would be refused without --force: at least 1000000 pairs" in capsys.readouterr().out


def test_excludes_count_in_the_bound_and_the_rest_is_expanded_up_to_the_limit(
        capsys, tmp_path, monkeypatch):
    # 150,000 points, an exclude removes 100,000 of them: 50,000 pairs, under the limit
    text = HUGE.format(batch=list(range(1, 151)), seed=list(range(1000))) + (
        f"[[exclude]]\nbatch = {list(range(1, 101))}\n")
    from attnbench.runs.suite import load_suite

    (tmp_path / "s.toml").write_text(text)
    assert load_suite(str(tmp_path / "s.toml")).pair_bounds("cpu") == (50_000, 150_000)


@pytest.mark.parametrize("threads", ["0", "-3", "100000"])
def test_threads_are_bounded_by_the_cpus_this_process_may_use(capsys, tmp_path, monkeypatch,
                                                              threads):
    code, err = answer(capsys, tmp_path, monkeypatch, BASE, "--threads", threads, "--dry-run")
    assert code == 2 and f"--threads {threads}: allowed: 1 to" in one_line(err)


@pytest.mark.parametrize("size", ["1e400G", "512M", "abc"])
def test_dry_run_checks_max_memory(capsys, tmp_path, monkeypatch, size):
    code, err = answer(capsys, tmp_path, monkeypatch, BASE, "--max-memory", size, "--dry-run")
    assert code == 2 and "--max-memory" in one_line(err)


def test_resume_replays_the_suite_it_recorded(capsys, tmp_path, monkeypatch):
    text = BASE.replace("seq_len = [16]", "seq_len = [16, 32]")
    code, _ = answer(capsys, tmp_path, monkeypatch, text, "--run-id", "rb")
    assert code == 0
    run_dir = tmp_path / "results" / "rb"
    lines = (run_dir / "records.jsonl").read_text().splitlines()
    (run_dir / "records.jsonl").write_text(lines[0] + "\n")  # as if killed after one pair
    (tmp_path / "s.toml").write_text(text.replace("head_dim = 8", "head_dim = 16"))
    other = tmp_path / "elsewhere"
    other.mkdir()
    monkeypatch.chdir(other)  # the relative --suite path no longer resolves from here
    assert main(["run", "--resume", "rb", "--out", str(tmp_path / "results"),
                 "--no-progress", "--no-report"]) == 0
    records = [json.loads(x) for x in (run_dir / "records.jsonl").read_text().splitlines()]
    assert sorted(r["seq_q"] for r in records) == [16, 32]
    assert {r["head_dim"] for r in records} == {8}  # the recorded suite, not the edited file


def test_resume_of_a_run_without_a_recorded_suite_refuses_a_changed_file(
        capsys, tmp_path, monkeypatch):
    code, _ = answer(capsys, tmp_path, monkeypatch, BASE, "--run-id", "old")
    meta_path = tmp_path / "results" / "old" / "meta.json"
    meta = json.loads(meta_path.read_text())
    del meta["suite_toml"]  # a run from before the suite was recorded
    meta_path.write_text(json.dumps(meta))
    (tmp_path / "s.toml").write_text(BASE.replace("head_dim = 8", "head_dim = 16"))
    assert main(["run", "--resume", "old", "--no-progress", "--no-report"]) == 2
    assert "changed since the run started" in one_line(capsys.readouterr().err)


def test_ctrl_c_while_the_command_loads_is_one_line(capsys, monkeypatch):
    import attnbench.cli

    def interrupted():
        raise KeyboardInterrupt

    monkeypatch.setattr(attnbench.cli, "build_parser", interrupted)
    assert main(["run", "--dry-run"]) == 130
    assert capsys.readouterr().err == "attnbench: interrupted\n"


def test_the_package_loads_without_torch():
    import subprocess
    import sys

    code = ("import sys, attnbench, attnbench.cli; "
            "assert 'torch' not in sys.modules, 'torch imported'; print(attnbench.Case)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "attnbench.core.case.Case" in proc.stdout


# The done-when "a 3-million-pair suite is refused in under 2 seconds" is about the whole
# process: torch, scipy.stats and pandas cost about 3 s of imports here, so the path up to the
# refusal must load none of them. Asserted on what was imported, never on wall time.
PROBE = """
import sys
from attnbench.cli import main
code = main(sys.argv[1:])
heavy = [m for m in ("torch", "scipy.stats", "pandas") if m in sys.modules]
print("loaded:", ",".join(heavy) or "none")
sys.exit(code)
"""
THREE_MILLION = HUGE.format(batch=list(range(1, 3001)), seed=list(range(1000)))


@pytest.mark.parametrize("args, code, stream, message", [
    ((), 2, "err", "plan refused: at least 3000000 pairs exceed the limit of 100000"),
    (("--dry-run",), 0, "out",
     "plan: would be refused without --force: at least 3000000 pairs exceed the limit"),
    (("--device", "cpu", "--backends", "naive"), 2, "err", "at least 3000000 pairs exceed"),
    (("--device", "cuda", "--dry-run"), 0, "out", "at least 3000000 pairs exceed"),
])
def test_a_huge_plan_is_refused_before_torch_pandas_or_scipy_load(tmp_path, args, code,
                                                                  stream, message):
    import subprocess
    import sys

    (tmp_path / "s.toml").write_text(THREE_MILLION)
    proc = subprocess.run([sys.executable, "-c", PROBE, "run", "--suite", "s.toml", *args],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == code, proc.stderr
    assert proc.stdout.splitlines()[-1] == "loaded: none", proc.stdout
    said = one_line(proc.stderr.strip()) if stream == "err" else proc.stdout
    assert message in said
    if stream == "out":
        assert proc.stderr == ""
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.toml"]  # nothing written


def test_backend_names_are_still_checked_when_the_plan_is_not_refused(capsys, tmp_path,
                                                                      monkeypatch):
    # Names are checked after the size (the registry imports every implementation): a plan
    # that may run has every name checked, the comparisons' too.
    text = BASE.replace('backends = ["naive"]', 'backends = ["naive", "flashy"]')
    code, err = answer(capsys, tmp_path, monkeypatch, text, "--dry-run")
    assert code == 2 and "s.toml: backends = 'flashy': unknown backend; allowed:" in one_line(err)
    text = BASE + '[[comparison]]\nname = "c"\nbaseline = "naive"\nbackends = ["fastest"]\n'
    code, err = answer(capsys, tmp_path, monkeypatch, text, "--dry-run")
    assert code == 2 and "comparison[0].backends = 'fastest': unknown backend" in one_line(err)


def test_a_huge_plan_with_an_unknown_backend_is_never_run(capsys, tmp_path, monkeypatch):
    # Refused for its size first; --force goes on to the names, which refuse it too.
    text = HUGE.format(batch=list(range(1, 1001)), seed=list(range(1000))).replace(
        'backends = ["naive"]', 'backends = ["flashy"]')
    code, err = answer(capsys, tmp_path, monkeypatch, text)
    assert code == 2 and "at least 1000000 pairs exceed" in one_line(err)
    code, err = answer(capsys, tmp_path, monkeypatch, text, "--force", "--dry-run")
    assert code == 2 and "backends = 'flashy': unknown backend" in one_line(err)
    assert not (tmp_path / "results").exists()


def test_a_plan_too_large_on_one_device_only_waits_for_the_device(capsys, tmp_path,
                                                                  monkeypatch):
    # --device auto may be CPU or CUDA: a huge CUDA-only sweep beside a small CPU one is not
    # refused before the device is known; on this CPU host the small sweep is the plan.
    text = (BASE.split("[axes]")[0].replace('backends = ["naive"]\n', "")
            + '[[sweep]]\nbackends = ["naive"]\ndevices = ["cuda"]\n[sweep.axes]\nseq_len = 16\n'
            + f"batch = {list(range(1, 1001))}\nseed = {list(range(1000))}\n"
            + '[[sweep]]\nbackends = ["naive"]\ndevices = ["cpu"]\n[sweep.axes]\nseq_len = 16\n'
            + "head_dim = 8\n")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "s.toml").write_text(text)
    assert main(["run", "--suite", "s.toml", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "plan: 1 (case, backend) pairs over 1 cases" in out and "refused" not in out


def test_a_dry_run_does_not_estimate_a_plan_whose_inputs_cannot_fit(capsys, tmp_path,
                                                                    monkeypatch):
    # The fuzz test's hang: seq_len 2**62 with additive, whose chunk planning loops over
    # every row; the estimate asked it. Refused for memory, such a plan is not estimated.
    import attnbench.runs.plan as plan_module

    def estimated(*args, **kwargs):
        raise AssertionError("a plan that cannot fit was estimated")

    monkeypatch.setattr(plan_module, "estimate", estimated)
    text = BASE.replace('["naive"]', '["naive", "additive"]').replace(
        "seq_len = [16]", f"seq_len = {2**62}")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "s.toml").write_text(text)
    assert main(["run", "--suite", "s.toml", "--dry-run"]) == 0
    assert "would be refused without --force: the inputs of" in capsys.readouterr().out


def test_auto_is_refused_before_the_device_is_resolved_where_every_device_is_too_large(
        capsys, tmp_path, monkeypatch):
    # One huge sweep for CPUs only: on CUDA no sweep runs, so the plan is too large wherever
    # it runs, and is refused before the backends and the device are resolved (torch).
    import attnbench.runs.overrides as overrides

    def resolved(*args, **kwargs):
        raise AssertionError("resolved before the size was checked")

    monkeypatch.setattr(overrides, "finish_selection", resolved)
    text = HUGE.format(batch=list(range(1, 1001)), seed=list(range(1000))).replace(
        "[axes]", "[[sweep]]\ndevices = [\"cpu\"]\n[sweep.axes]").replace(
        'backends = ["naive"]\n', "").replace("[[sweep]]\n", '[[sweep]]\nbackends = ["naive"]\n')
    code, err = answer(capsys, tmp_path, monkeypatch, text)
    assert code == 2 and "at least 1000000 pairs exceed" in one_line(err)


@pytest.mark.parametrize("run_id", ["../escape", "a/b", "x" * 230, "nul\x00byte", ".hidden"])
def test_unsafe_run_ids_are_refused(tiny, tmp_path, capsys, run_id):
    out = tmp_path / "results"
    assert run("--suite", str(tiny), "--out", str(out), "--run-id", run_id) == 2
    assert "--run-id" in one_line_error(capsys)
    assert files_under(tmp_path) <= {tiny} | files_under(out)
    assert not (tmp_path / "escape").exists()


def _bad_suite(tmp_path, text):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize("argv", [
    ["--backends", ""], ["--dtype", ""], ["--threads", "-1"], ["--seq-len", "0"],
    ["--retry", "crashed"], ["--device", "tpu"],
])
def test_bad_command_lines(tiny, tmp_path, capsys, argv):
    out = tmp_path / "results"
    assert run("--suite", str(tiny), "--out", str(out), *argv) == 2
    one_line_error(capsys)
    assert not out.exists() or not any(out.iterdir())


@pytest.mark.parametrize("patch", [
    ('budget_s = 0.002', 'budget_s = "fast"'),
    ('budget_s = 0.002', 'timeout_s = [1]'),
    ('budget_s = 0.002', 'timeout_s = inf'),
    ('budget_s = 0.002', 'timeout_s = 1e308'),
    ('seq_len = [16, 32]', 'seq_len = ' + '[' * 500 + '1' + ']' * 500),
    ('[axes]\nheads_q = 1\nhead_dim = 8\nseq_len = [16, 32]', '[axes]'),
    ('[timing]', '[[claim]]\ntext = "t"\nkind = "value"\nbackend = "naive"\n'
                 'metric = "reason"\n[timing]'),
])
def test_bad_suites(tmp_path, capsys, patch):
    text = TINY.replace(*patch)
    assert text != TINY
    out = tmp_path / "results"
    assert run("--suite", _bad_suite(tmp_path, text), "--out", str(out)) == 2
    one_line_error(capsys)
    assert not out.exists()


def test_bad_files_and_outputs(tiny, tmp_path, capsys):
    a_file = tmp_path / "file"
    a_file.write_text("x")
    assert run("--suite", str(tiny), "--out", str(a_file)) == 2
    assert "is a file" in one_line_error(capsys)
    out = tmp_path / "results"
    assert run("--suite", str(tiny), "--out", str(out), "--run-id", "M") == 0
    (out / "M" / "meta.json").write_text("{not json")
    capsys.readouterr()
    assert run("--resume", "M", "--out", str(out)) == 2
    assert "corrupt" in one_line_error(capsys)
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / RECORDS).write_text("")
    assert main(["report", str(empty)]) == 2
    assert "holds no record" in one_line_error(capsys)
    assert main(["compare", str(out / "M"), str(out / "M"), "--metric", "reason"]) == 2
    one_line_error(capsys)
    assert main(["compare", str(out / "M"), str(out / "M"), "--threshold", "-5"]) == 2
    one_line_error(capsys)
    if os.geteuid() != 0:  # root writes anywhere
        ro = tmp_path / "ro"
        ro.mkdir(mode=0o500)
        assert run("--suite", str(tiny), "--out", str(ro / "x")) == 2
        one_line_error(capsys)


def test_dry_run_refuses_a_bad_run_id_like_the_real_run(tmp_path, capsys):
    from attnbench.cli import main
    assert main(["run", "--dry-run", "--run-id", "../x", "--out", str(tmp_path)]) == 2
    assert "--run-id '../x'" in capsys.readouterr().err


BEYOND_INT64 = "99999999999999999999999"  # beyond int64


def _suite(tmp_path, body: str):
    path = tmp_path / "s.toml"
    path.write_text(textwrap.dedent(body))
    return path


def _run(path, tmp_path, *extra):
    return main(["run", "--suite", str(path), "--out", str(tmp_path / "results"),
                 "--no-progress", "--device", "cpu", *extra])


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    return err


# ---- bounds ---------------------------------------------------------------------------
@pytest.mark.parametrize("dry", [True, False])
def test_window_bound_beyond_int64_is_one_line_exit_2(tmp_path, capsys, dry):
    path = _suite(tmp_path, f"""
        name = "w"
        backends = ["sdpa"]
        [axes]
        seq_len = 64
        mask = "window({BEYOND_INT64},0)"
    """)
    assert _run(path, tmp_path, *(["--dry-run"] if dry else [])) == 2
    err = _one_error_line(capsys)
    assert str(path) in err and "axes.mask" in err and BEYOND_INT64 in err
    assert f"at most {INT64_MAX}" in err and "inf" in err
    assert not (tmp_path / "results").exists()  # nothing recorded


@pytest.mark.parametrize("key, value", [("seed", BEYOND_INT64), ("batch", BEYOND_INT64),
                                        ("block_pairs", f"[[0, {BEYOND_INT64}]]")])
def test_integers_beyond_int64_are_refused_at_load(tmp_path, capsys, key, value):
    path = _suite(tmp_path, f"""
        name = "i"
        backends = ["sdpa"]
        [axes]
        seq_len = 64
        {key} = {value}
    """)
    assert _run(path, tmp_path, "--dry-run") == 2
    err = _one_error_line(capsys)
    assert f"axes.{key}" in err and "int64" in err and f"{INT64_MAX}" in err


def test_block_longer_than_every_length_is_refused(tmp_path, capsys):
    path = _suite(tmp_path, """
        name = "b"
        backends = ["block_sparse"]
        [axes]
        seq_len = [64, 128]
        mask = "block_sparse(bigbird)"
        block_size = [64, 256]
    """)
    assert _run(path, tmp_path, "--dry-run") == 2
    err = _one_error_line(capsys)
    assert "axes.block_size = 256" in err and "at most 128" in err
    # a block no longer than some length loads; a --seq-len below every block does not
    ok = _suite(tmp_path, """
        name = "b"
        backends = ["block_sparse"]
        [axes]
        seq_len = [64, 128]
        mask = "block_sparse(bigbird)"
        block_size = 128
    """)
    assert _run(ok, tmp_path, "--dry-run") == 0
    capsys.readouterr()
    assert _run(ok, tmp_path, "--dry-run", "--seq-len", "32") == 2
    assert "block_size = 128" in _one_error_line(capsys)
