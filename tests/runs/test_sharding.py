"""Sharded runs under torchrun (two CPU ranks, gloo) and datasets merged across machines.

* The merged run of two ranks holds exactly the (case, backend) pairs of a single-process
  run of the same suite, each once, groups timed together never split over ranks.
* A rank SIGKILLed after its first group's records keeps them; a plain one-rank
  ``--resume`` completes the run with the same pairs, each once.
* A dataset merged from two runs measured in different environments: the report labels
  both devices, ``compare`` names the environment difference first; bad input is one line,
  exit 2.

Runs use ``--no-isolate`` (the rank process measures itself, so a kill of the rank is a
kill of the measuring process) and an 8-pair suite of 4 groups, to stay fast on 2 cores
(no sdpa: its kernel probe imports the profiler, seconds per process).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from attnbench import cli
from attnbench.reporting.report import build_report
from attnbench.runs import dataset, rank_folders, record_files
from attnbench.runs.pairing import job_groups
from attnbench.runs.sharding import Shard, assign
from attnbench.runs.suite import load_suite

TESTS = Path(__file__).resolve().parents[1]
SUITE = """
name = "shard"
description = "8 tiny pairs in 4 groups: naive and a fake, N 16 and 32, fwd and fwd+bwd"
backends = ["naive", "fake_kill_rank"]
[timing]
warmup_s = 0.0
budget_s = 0.01
min_reps = 2
max_reps = 3
[axes]
heads_q = 1
head_dim = 8
seq_len = [16, 32]
mode = ["fwd", "fwd_bwd"]
"""
QUIET = ["--no-isolate", "--no-report", "--no-progress"]
STAND_IN = "NVIDIA H200 (stand-in)"  # this host has one device: a second one is simulated


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")}
    return env | {"ATTNBENCH_PLUGINS": "fake_backends", "PYTHONPATH": str(TESTS), **extra}


def torchrun(suite: Path, out: Path, run_id: str, **env) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           "--nproc-per-node", "2", "-m", "attnbench", "run", "--suite", str(suite),
           "--out", str(out), "--run-id", run_id, *QUIET]
    return subprocess.run(cmd, env=_env(**env), capture_output=True, text=True, timeout=300)


def raw_pairs(run_dir: Path) -> list[tuple[str, str]]:
    """Every line of records.jsonl as (key, backend): duplicates stay visible."""
    lines = (run_dir / record_files.RECORDS).read_text().splitlines()
    return [(r["key"], r["backend"]) for r in map(json.loads, lines)]


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    """The suite, a single-process run of it (in this process), and an empty results root."""
    root = tmp_path_factory.mktemp("sharding")
    suite = root / "shard.toml"
    suite.write_text(SUITE)
    with pytest.MonkeyPatch.context() as mp:
        for k, v in _env().items():
            mp.setenv(k, v)
        for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
            mp.delenv(k, raising=False)
        from attnbench.core.registry import all_backends
        all_backends(refresh=True)
        assert cli.main(["run", "--suite", str(suite), "--out", str(root / "results"),
                         "--run-id", "single", *QUIET]) == 0
        yield {"suite": suite, "out": root / "results", "root": root,
               "single": root / "results" / "single",
               "pairs": set(raw_pairs(root / "results" / "single"))}
    all_backends(refresh=True)


def test_assignment_is_balanced_deterministic_and_keeps_groups(write_suite):
    # costliest first to the least loaded rank: 5 | 4, then 3 -> rank 1 (4), 3 -> rank 0
    assert assign([5, 4, 3, 3], 2) == [0, 1, 1, 0]
    assert assign([1.0] * 5, 3) == [0, 1, 2, 0, 1]
    path = write_suite("""
name = "paired"
description = "a window compared with causal on the same shapes: their groups are joined"
backends = ["naive", "sdpa"]
[axes]
seq_len = [16, 32, 64]
mask = ["causal", "window(3,0)"]
[[comparison]]
name = "window-vs-causal"
baseline = "sdpa"
backends = ["naive"]
pair = "shape"
baseline_where = { mask = "causal" }
backends_where = { mask = "window(3,0)" }
""")
    suite = load_suite(str(path), ["naive", "sdpa"])
    jobs = suite.jobs_on("cpu")
    shares = [Shard(r, 3, r, 3).share(jobs, suite) for r in range(3)]
    ids = Counter((c.key, b) for s in shares for c, b in s)
    assert ids == Counter((c.key, b) for c, b in jobs)  # a partition: each pair once
    owner = {(c.key, b): r for r, s in enumerate(shares) for c, b in s}
    groups = job_groups(jobs, suite.claims, suite.comparisons)
    assert any({c.mask for c, _ in g} == {"causal", "window(3,0)"} for g in groups)
    for g in groups:
        assert len({owner[(c.key, b)] for c, b in g}) == 1, g
    assert all(s == Shard(r, 3, r, 3).share(jobs, suite) for r, s in enumerate(shares))


@pytest.mark.slow
def test_two_ranks_record_exactly_the_pairs_of_one_process(work):
    done = torchrun(work["suite"], work["out"], "two")
    assert done.returncode == 0, done.stderr[-3000:]
    run = work["out"] / "two"
    pairs = raw_pairs(run)
    assert len(work["pairs"]) == 8
    assert Counter(pairs) == Counter(work["pairs"])  # the same pairs, each once
    rows = record_files.read_records(run)
    assert {r["status"] for r in rows} == {"ok"}
    assert {r["rank"] for r in rows} == {0, 1}  # both ranks measured
    by_group: dict = {}
    for r in rows:  # the pairs timed together were measured by one rank
        by_group.setdefault(r["pair_group"], set()).add(r["rank"])
    assert all(len(ranks) == 1 for ranks in by_group.values())
    meta = json.loads((run / record_files.META).read_text())
    ranks = meta["ranks"]
    assert sorted(e["rank"] for e in ranks) == [0, 1]
    assert all(e["environment"]["threads"] == 1 and e["ceilings"]["matmul_tflops"]
               for e in ranks)  # 2 cores // 2 local ranks; each measured its own ceilings
    assert ranks[0]["cpu_affinity"] != ranks[1]["cpu_affinity"]
    assert meta["ended"] and not rank_folders.pending(run)
    assert not (run / rank_folders.RANKS).exists()
    assert len(record_files.load_results(run / record_files.CSV)) == 8


def test_a_killed_rank_loses_only_its_group_in_flight_and_one_rank_resumes(work):
    done = torchrun(work["suite"], work["out"], "killed", FAKE_KILL_RANK="1")
    assert done.returncode != 0, "rank 1 should have been killed"
    run = work["out"] / "killed"
    kept = [json.loads(x) for x in (rank_folders.folder(run, 1) / record_files.RECORDS)
            .read_text().splitlines()]
    assert len(kept) == 2 and len({r["pair_group"] for r in kept}) == 1  # its first group

    assert cli.main(["run", "--resume", "killed", "--out", str(work["out"]), "--no-report",
                     "--no-progress"]) == 0  # one rank, no torchrun
    pairs = raw_pairs(run)
    assert Counter(pairs) == Counter(work["pairs"])
    rows = {(r["key"], r["backend"]): r for r in record_files.read_records(run)}
    for r in kept:  # measured once, by the rank that died, and kept
        assert rows[(r["key"], r["backend"])]["recorded_at"] == r["recorded_at"]
        assert rows[(r["key"], r["backend"])]["rank"] == 1
    assert not rank_folders.pending(run)
    assert {e["rank"] for e in json.loads((run / record_files.META).read_text())["ranks"]} <= {0, 1}


def _as_other_machine(src: Path, dst: Path) -> Path:
    """A copy of a run relabelled as measured on another device (there is one here)."""
    shutil.copytree(src, dst)
    meta = json.loads((dst / record_files.META).read_text())
    meta["run_id"] = dst.name
    meta["environment"] |= {"device": "cuda", "device_name": STAND_IN, "cuda": "12.8"}
    meta["environment_id"] = "standin00000"
    (dst / record_files.META).write_text(json.dumps(meta))
    rows = [json.loads(x) | {"run_id": dst.name, "env_device_name": STAND_IN}
            for x in (dst / record_files.RECORDS).read_text().splitlines()]
    (dst / record_files.RECORDS).write_text("".join(json.dumps(r) + "\n" for r in rows))
    return dst


def test_merged_runs_keep_their_environments_in_report_and_compare(work, capsys):
    other = _as_other_machine(work["single"], work["root"] / "elsewhere")
    out = work["root"] / "merged"
    assert cli.main(["merge", str(work["single"]), str(other), "--out", str(out)]) == 0
    rows = record_files.read_records(out)
    assert len(rows) == 16 and {r["run_id"] for r in rows} == {"single", "elsewhere"}
    runs = dataset.load([out])
    assert [r.run_id for r in runs] == ["single", "elsewhere"]
    assert STAND_IN in runs[1].label and runs[0].device in runs[0].label

    report = build_report([out], work["root"] / "report")
    md = (report / "index.md").read_text()
    for run in runs:  # every legend and table row names its device
        assert md.count(run.label) >= 5, run.label
    capsys.readouterr()
    assert cli.main(["compare", str(out)]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith("environment differs: ") and f"-> {STAND_IN}" in first

    # the same run twice counts once
    again = work["root"] / "again"
    assert cli.main(["merge", str(out), str(work["single"]), "--out", str(again)]) == 0
    assert len(record_files.read_records(again)) == 16


def test_merge_refuses_bad_input_in_one_line(work, capsys, tmp_path):
    twin = tmp_path / "twin"
    shutil.copytree(work["single"], twin)
    rows = [json.loads(x) for x in (twin / record_files.RECORDS).read_text().splitlines()]
    rows[0]["time_ms_median"] = 123.0  # one run's copy disagrees with the other
    (twin / record_files.RECORDS).write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "empty").mkdir()
    cases = [
        ([str(tmp_path / "nowhere")], "no such run directory"),
        ([str(tmp_path / "empty")], "not a run"),
        ([str(work["single"]), str(twin)], "differs from the one in"),
    ]
    for inputs, said in cases:
        capsys.readouterr()
        assert cli.main(["merge", *inputs, "--out", str(tmp_path / "o")]) == 2
        err = capsys.readouterr().err
        assert said in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "o").exists()  # nothing written
    existing = tmp_path / "full"
    existing.mkdir()
    (existing / "x").write_text("")
    assert cli.main(["merge", str(work["single"]), "--out", str(existing)]) == 2
    assert "already exists" in capsys.readouterr().err
    # compare with one folder needs a dataset of two runs; --runs names two of its runs
    for argv, said in ((["compare", str(work["single"])], "needs a merged dataset"),
                       (["compare", str(work["single"]), str(twin), "--runs", "x"],
                        "allowed: two run ids")):
        assert cli.main(argv) == 2
        err = capsys.readouterr().err
        assert said in err and len(err.strip().splitlines()) == 1, err


def test_fold_done_again_after_a_kill_adds_nothing_twice(work, tmp_path):
    """A fold killed after it rewrote records.jsonl and meta.json but before it removed the
    rank folders is simply done again at the next start."""
    run = tmp_path / "run"
    run.mkdir()
    (run / record_files.META).write_text(json.dumps({"run_id": "run"}))
    rows = [json.loads(x) for x in (work["single"] / record_files.RECORDS).read_text().splitlines()]
    for rank, part in ((0, rows[:5]), (1, rows[5:])):
        d = rank_folders.folder(run, rank)
        text = "".join(json.dumps(r) + "\n" for r in part)
        (d / record_files.RECORDS).write_text(text + ('{"torn' if rank else ""))  # killed mid-line
        (d / rank_folders.RANK_META).write_text(json.dumps({"rank": rank, "started": "t0"}))
    shutil.copytree(run / rank_folders.RANKS, tmp_path / "left")
    assert rank_folders.fold(run) == len(rows)
    shutil.copytree(tmp_path / "left", run / rank_folders.RANKS)  # as if killed before removal
    assert rank_folders.fold(run) == 0
    assert Counter(raw_pairs(run)) == Counter(work["pairs"])
    assert [r["rank"] for r in map(json.loads, (run / record_files.RECORDS).read_text()
                                   .splitlines())].count(1) == len(rows) - 5
    assert [e["rank"] for e in json.loads((run / record_files.META).read_text())["ranks"]] == [0, 1]
    assert not (run / rank_folders.RANKS).exists()
