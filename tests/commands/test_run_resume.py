"""Chaos: runs SIGKILLed at many moments, then resumed with the bare run id.

The issue's promise: a run SIGKILLed at random moments (the parent and the worker), then
resumed with ``attnbench run --resume RUN_ID`` alone, ends with exactly the pairs of an
uninterrupted run: no duplicates, no torn lines; results.csv, meta.json and reports are
written by atomic rename.

Kill points (12, all real SIGKILLs of live processes, each asserted to have landed):

* parent chain (5): after the ceilings, before any record; at a pseudo-random moment
  (``random.Random(SEED)``, 0-1.5 s after the first new record); after 3 new records (then
  a torn last line is simulated); at a pseudo-random moment after the worker starts; once
  every record is in (while meta.json and results.csv are rewritten). Each resume must get
  past the lock the killed parent left (``.lock`` still naming it), and orphaned workers are
  left to die on their own, as they would after a real ``kill -9``.
* worker chain (5, plus one parent kill): during the ceilings (the run goes on without them
  and meta.json says why; its parent is then killed after two records), then, in the
  resumed run (which measures the ceilings again), after the first group, at a
  pseudo-random moment after a fresh worker starts, and twice more later; the run goes on
  (crashed records), and a ``--retry crashed`` resume redoes what crashed.
* the parent during the ceilings (1): the run resumes (meta.json is written first).

What "ends with exactly the pairs" means here (``check_complete``):

* ``read_records`` gives one record per pair of the uninterrupted run, every one ``ok``;
* records.jsonl ends with a newline and every line parses as JSON (no torn line survives);
* in the raw file each (key, backend) has exactly one ``ok`` record, its last; after parent
  kills alone each pair appears exactly once; after worker kills the earlier records of a
  pair may only be ``crashed`` ones a ``--retry crashed`` resume superseded;
* meta.json parses, has ended, keeps the ceilings and the invocation (the suite path);
* results.csv has one row per pair, the same pairs;
* no ``.meta.json.tmp`` / ``.results.csv.tmp`` (or any ``.*.tmp``) is left.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import pandas as pd
import pytest
from run_command import one_line_error, run

from attnbench.reporting import document
from attnbench.runs import record_files
from attnbench.runs.record_files import CSV, META, RECORDS, read_meta, read_records
from attnbench.runs.run_folder import RunLock

SUITE = """
name = "chaos"
description = "16 tiny pairs: naive and sdpa, N 16..64, fwd and fwd+bwd"
backends = ["naive", "sdpa"]
[timing]
warmup_s = 0.0
budget_s = 0.01
min_reps = 2
max_reps = 3
[axes]
heads_q = 1
head_dim = 8
seq_len = [16, 32, 48, 64]
mode = ["fwd", "fwd_bwd"]
"""
SEED = 20240917
RANDOM_MAX_S = 1.5
WAIT_S = 180  # for any one condition: generous, the machine is shared
POLL_S = 0.01


def _env() -> dict:
    env = dict(os.environ)
    env.pop("ATTNBENCH_PLUGINS", None)
    return env


def _cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "attnbench.cli", "run", *args, "--no-progress",
            "--no-report"]


class Runs:
    """The attnbench processes a test starts, each in its own session, logged to a file."""

    def __init__(self, logs: Path):
        self.logs = logs
        logs.mkdir(parents=True, exist_ok=True)
        self.procs: list[subprocess.Popen] = []

    def start(self, name: str, *args: str) -> subprocess.Popen:
        log = open(self.logs / f"{len(self.procs):02d}-{name}.log", "wb")
        proc = subprocess.Popen(_cmd(*args), stdout=log, stderr=subprocess.STDOUT, env=_env(),
                                start_new_session=True)
        log.close()
        proc.log = Path(log.name)
        self.procs.append(proc)
        return proc

    def finish(self, proc: subprocess.Popen, timeout: float = WAIT_S) -> int:
        try:
            return proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{proc.args}: still running after {timeout} s\n{tail(proc)}")

    def cleanup(self) -> None:
        """Kill, by id, what is left of the sessions this test started (orphaned workers)."""
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        sessions = {p.pid for p in self.procs}
        for pid in _pids_in_sessions(sessions):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)


def _pids_in_sessions(sessions: set[int]) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()
        if int(fields[3]) in sessions:  # state ppid pgrp session ...
            found.append(int(entry.name))
    return found


def tail(proc: subprocess.Popen, n: int = 3000) -> str:
    return proc.log.read_text(errors="replace")[-n:]


def lines(run_dir: Path) -> int:
    """Complete lines (records) in records.jsonl."""
    try:
        return (run_dir / RECORDS).read_bytes().count(b"\n")
    except FileNotFoundError:
        return 0


def lock_holder(run_dir: Path) -> str:
    try:
        return (run_dir / ".lock").read_text().strip()
    except FileNotFoundError:
        return ""


def wait_until(cond, proc: subprocess.Popen, what: str, timeout: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if proc.poll() is not None:
            pytest.fail(f"waiting for {what}: the run exited ({proc.returncode}) first\n"
                        f"{tail(proc)}")
        if time.monotonic() > deadline:
            pytest.fail(f"waiting for {what}: not within {timeout} s\n{tail(proc)}")
        time.sleep(POLL_S)


def workers(pid: int, exclude: set[int] = frozenset()) -> list[int]:
    """The live spawned workers of ``pid`` (not its resource tracker)."""
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        children = [str(p) for p in _children_by_scan(pid)]
    found = []
    for child in map(int, children):
        try:
            cmdline = Path(f"/proc/{child}/cmdline").read_bytes()
        except OSError:
            continue  # gone already
        if b"spawn_main" in cmdline and child not in exclude:
            found.append(child)
    return found


def _children_by_scan(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, ValueError, IndexError):
                stat = (entry / "stat").read_text()
                if int(stat[stat.rfind(")") + 2:].split()[1]) == pid:
                    found.append(int(entry.name))
    return found


def kill_parent(runs: Runs, proc: subprocess.Popen, run_dir: Path) -> int:
    """SIGKILL the run's parent; it must have been alive. Returns the records on disk."""
    os.kill(proc.pid, signal.SIGKILL)
    rc = runs.finish(proc)
    assert rc == -signal.SIGKILL, f"the kill did not land: exit {rc}\n{tail(proc)}"
    assert lock_holder(run_dir) == str(proc.pid)  # a stale lock: the next resume must pass
    return lines(run_dir)


def kill_worker(proc: subprocess.Popen, killed: set[int]) -> int:
    """SIGKILL the parent's current worker (waiting for one to be up)."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        for pid in workers(proc.pid, killed):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                continue
            killed.add(pid)
            return pid
        if proc.poll() is not None:
            break
        time.sleep(POLL_S)
    pytest.fail(f"no worker to kill (run exit {proc.poll()})\n{tail(proc)}")


def acquired(run_dir: Path, proc: subprocess.Popen):
    """True once this process holds the run's lock (it writes its pid there)."""
    return lambda: lock_holder(run_dir) == str(proc.pid)


def check_complete(run_dir: Path, suite: Path, pairs: set, retried: bool = False) -> None:
    data = (run_dir / RECORDS).read_bytes()
    assert data.endswith(b"\n"), "records.jsonl ends in a torn line"
    raw = [json.loads(line) for line in data.decode("utf-8").split("\n")[:-1]]  # all parse
    statuses = defaultdict(list)
    for r in raw:
        statuses[(r["key"], r["backend"])].append(r["status"])
    assert set(statuses) == pairs
    for pair, seen in statuses.items():
        assert seen[-1] == "ok" and seen.count("ok") == 1, (pair, seen)
        if retried:
            assert set(seen[:-1]) <= {"crashed"}, (pair, seen)
        else:
            assert len(seen) == 1, (pair, seen)

    final = read_records(run_dir)
    assert len(final) == len(pairs)
    assert {(r["key"], r["backend"]) for r in final} == pairs
    assert {r["status"] for r in final} == {"ok"}
    assert {r["run_id"] for r in final} == {run_dir.name}

    meta = json.loads((run_dir / META).read_text())
    assert meta["run_id"] == run_dir.name and meta["ended"]
    assert meta["invocation"]["suite"] == str(suite)
    assert meta["ceilings"]["matmul_tflops"]
    df = pd.read_csv(run_dir / CSV)
    assert len(df) == len(pairs)
    assert set(zip(df["key"], df["backend"])) == pairs
    assert set(df["status"]) == {"ok"}
    assert not list(run_dir.glob(".*.tmp")), list(run_dir.glob(".*.tmp"))


@pytest.fixture(scope="module")
def suite_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("chaos-suite") / "chaos.toml"
    path.write_text(SUITE)
    return path


@pytest.fixture(scope="module")
def baseline(suite_file, tmp_path_factory) -> set:
    """The (key, backend) pairs of the uninterrupted run."""
    out = tmp_path_factory.mktemp("chaos-base") / "results"
    proc = subprocess.run(_cmd("--suite", str(suite_file), "--out", str(out), "--run-id",
                               "base"), env=_env(), capture_output=True, text=True,
                          timeout=WAIT_S)
    assert proc.returncode == 0, proc.stderr[-3000:]
    pairs = {(r["key"], r["backend"]) for r in read_records(out / "base")}
    assert len(pairs) == 16  # 4 lengths x 2 modes x 2 backends
    check_complete(out / "base", suite_file, pairs)
    return pairs


@pytest.fixture
def runs(tmp_path):
    r = Runs(tmp_path / "logs")
    yield r
    r.cleanup()


@pytest.mark.slow
def test_parent_killed_five_times_then_resumed_ends_with_the_uninterrupted_pairs(
        baseline, suite_file, tmp_path, runs):
    rng = random.Random(SEED)
    out, run_id = tmp_path / "results", "chaos-parent"
    run_dir = out / run_id
    total = len(baseline)
    resume = ("--resume", run_id, "--out", str(out))  # bare: the run's own suite and options
    landed = []

    # 1. After the ceilings (meta.json is written), before any record.
    proc = runs.start("fresh", "--suite", str(suite_file), "--out", str(out), "--run-id",
                      run_id)
    wait_until(lambda: (run_dir / META).exists(), proc, "meta.json")
    landed.append(("after the ceilings", kill_parent(runs, proc, run_dir)))
    assert landed[-1][1] == 0

    # 2. At a pseudo-random moment after the first record this process writes.
    proc = runs.start("resume-random-record", *resume)
    wait_until(acquired(run_dir, proc), proc, "the lock (a killed parent left it)")
    before = lines(run_dir)
    wait_until(lambda: lines(run_dir) > before, proc, "a first record")
    deadline = time.monotonic() + rng.uniform(0, RANDOM_MAX_S)
    wait_until(lambda: time.monotonic() >= deadline or lines(run_dir) >= total, proc,
               "the random moment")
    landed.append(("random after a record", kill_parent(runs, proc, run_dir)))

    # 3. After 3 new records; then the last line is torn, as a kill mid-write leaves it.
    proc = runs.start("resume-3-records", *resume)
    wait_until(acquired(run_dir, proc), proc, "the lock")
    before = lines(run_dir)
    wait_until(lambda: lines(run_dir) >= min(before + 3, total), proc, "3 new records")
    landed.append(("after 3 records", kill_parent(runs, proc, run_dir)))
    data = (run_dir / RECORDS).read_bytes()
    if data.endswith(b"\n"):
        start = data.rfind(b"\n", 0, len(data) - 1) + 1
        (run_dir / RECORDS).write_bytes(data[: start + (len(data) - start) // 2])

    # 4. At a pseudo-random moment after this process's worker starts.
    proc = runs.start("resume-random-worker", *resume)
    wait_until(acquired(run_dir, proc), proc, "the lock")
    wait_until(lambda: workers(proc.pid) or lines(run_dir) >= total, proc, "a worker")
    deadline = time.monotonic() + rng.uniform(0, RANDOM_MAX_S)
    wait_until(lambda: time.monotonic() >= deadline or lines(run_dir) >= total, proc,
               "the random moment")
    landed.append(("random after the worker starts", kill_parent(runs, proc, run_dir)))

    # 5. Once every record is in: while meta.json and results.csv are rewritten.
    proc = runs.start("resume-all-records", *resume)
    wait_until(acquired(run_dir, proc), proc, "the lock")
    wait_until(lambda: lines(run_dir) >= total, proc, "every record")
    landed.append(("every record in", kill_parent(runs, proc, run_dir)))

    # The last resume completes; orphaned workers of the killed parents never held the lock.
    proc = runs.start("resume-final", *resume)
    assert runs.finish(proc) == 0, tail(proc)
    assert len(landed) == 5, landed
    check_complete(run_dir, suite_file, baseline)


@pytest.mark.slow
def test_worker_killed_five_times_then_retried_ends_with_the_uninterrupted_pairs(
        baseline, suite_file, tmp_path, runs):
    out, run_id = tmp_path / "results", "chaos-worker"
    run_dir = out / run_id
    killed: set[int] = set()

    # 1. The worker during the ceilings: the run goes on without them (meta.json says
    # why); its parent is then killed after two records, so the resume has work left.
    proc = runs.start("fresh", "--suite", str(suite_file), "--out", str(out), "--run-id",
                      run_id)
    kill_worker(proc, killed)
    wait_until(lambda: lines(run_dir) >= 2, proc, "two records after the ceilings")
    kill_parent(runs, proc, run_dir)
    ceilings = json.loads((run_dir / META).read_text())["ceilings"]
    assert "ceilings not measured" in ceilings["error"], ceilings

    # 2-5. In the bare resume: after the first group; then the next two workers as soon as
    # each is up (a kill in a group of two retries its jobs one by one in fresh workers, so
    # one of these two kills lands in a lone job and costs its record, however the first
    # kill fell); then after 12 records. The run goes on.
    proc = runs.start("resume", "--resume", run_id, "--out", str(out))
    wait_until(acquired(run_dir, proc), proc, "the lock")
    wait_until(lambda: lines(run_dir) >= 4, proc, "the first group's records")
    kill_worker(proc, killed)
    for _ in range(2):
        wait_until(lambda: workers(proc.pid, killed), proc, "a fresh worker")
        kill_worker(proc, killed)
    wait_until(lambda: lines(run_dir) >= 12, proc, "12 records")
    kill_worker(proc, killed)
    assert runs.finish(proc) == 0, tail(proc)
    assert len(killed) == 5
    crashed = [r for r in read_records(run_dir) if r["status"] == "crashed"]
    assert crashed, "no kill cost a record: the --retry path went untested"
    assert all("SIGKILL" in r["reason"] for r in crashed), crashed

    proc = runs.start("retry", "--resume", run_id, "--out", str(out), "--retry", "crashed")
    assert runs.finish(proc) == 0, tail(proc)
    check_complete(run_dir, suite_file, baseline, retried=True)
    raw = (run_dir / RECORDS).read_text().splitlines()
    assert len(raw) == len(baseline) + len(crashed)  # the crashed records stay as history


@pytest.mark.slow
def test_parent_killed_during_the_ceilings_can_be_resumed(baseline, suite_file, tmp_path,
                                                          runs):
    out, run_id = tmp_path / "results", "chaos-ceilings"
    run_dir = out / run_id
    proc = runs.start("fresh", "--suite", str(suite_file), "--out", str(out), "--run-id",
                      run_id)
    wait_until(lambda: workers(proc.pid), proc, "the worker measuring the ceilings")
    kill_parent(runs, proc, run_dir)
    meta = json.loads((run_dir / META).read_text()) if (run_dir / META).exists() else {}
    assert "ceilings" not in meta  # killed before they were measured
    proc = runs.start("resume", "--resume", run_id, "--out", str(out))
    assert runs.finish(proc) == 0, tail(proc)
    check_complete(run_dir, suite_file, baseline)


# Atomic writes, unit level: a write that fails (or is killed) before its rename leaves the
# previous file whole.


class Killed(BaseException):
    """Stands for a SIGKILL at that point: nothing after it runs."""


def _fail_rename(monkeypatch) -> None:
    def boom(*args, **kwargs):
        raise OSError("rename refused (simulated)")

    monkeypatch.setattr(os, "replace", boom)
    monkeypatch.setattr(os, "rename", boom)


def test_write_atomic_never_leaves_a_partial_target(tmp_path, monkeypatch):
    target = tmp_path / "meta.json"
    record_files.write_atomic(target, "old\n")
    assert target.read_text() == "old\n" and not list(tmp_path.glob(".*.tmp"))

    real_write_text = Path.write_text

    def half_then_killed(self, text, *args, **kwargs):
        real_write_text(self, text[: len(text) // 2], *args, **kwargs)
        raise Killed

    with monkeypatch.context() as m:  # killed while writing the temporary file
        m.setattr(Path, "write_text", half_then_killed)
        with pytest.raises(Killed):
            record_files.write_atomic(target, "new content\n" * 1000)
    assert target.read_text() == "old\n"

    with monkeypatch.context() as m:  # killed (failed) at the rename itself
        _fail_rename(m)
        with pytest.raises(OSError):
            record_files.write_atomic(target, "new content\n" * 1000)
    assert target.read_text() == "old\n"

    record_files.write_atomic(target, "new\n")  # a later write replaces it and its leftover
    assert target.read_text() == "new\n" and not list(tmp_path.glob(".*.tmp"))


def test_meta_and_csv_are_written_by_atomic_rename(tmp_path, monkeypatch):
    rec = {"key": "k1", "backend": "naive", "status": "ok", "time_ms_median": 1.0}
    (tmp_path / RECORDS).write_text(json.dumps(rec) + "\n")
    record_files.write_meta(tmp_path, {"run_id": "old"})
    record_files.write_csv(tmp_path)
    before = {name: (tmp_path / name).read_bytes() for name in (META, CSV)}
    with (tmp_path / RECORDS).open("a") as fh:
        fh.write(json.dumps(rec | {"key": "k2"}) + "\n")
    _fail_rename(monkeypatch)
    with pytest.raises(OSError):
        record_files.write_meta(tmp_path, {"run_id": "new"})
    with pytest.raises(OSError):
        record_files.write_csv(tmp_path)
    assert {name: (tmp_path / name).read_bytes() for name in (META, CSV)} == before
    assert record_files.read_meta(tmp_path) == {"run_id": "old"}
    assert len(pd.read_csv(tmp_path / CSV)) == 1


def test_report_pages_are_written_by_atomic_rename(tmp_path, monkeypatch):
    document.write([document.Heading(1, "old"), document.Para(["old"])], tmp_path, "old")
    before = {name: (tmp_path / name).read_bytes() for name in ("index.md", "index.html")}
    _fail_rename(monkeypatch)
    with contextlib.suppress(OSError):
        document.write([document.Heading(1, "new"), document.Para(["new"])], tmp_path, "new")
    assert {name: (tmp_path / name).read_bytes() for name in before} == before


def test_cutting_a_torn_tail_when_killed_midway_keeps_every_complete_record(tmp_path,
                                                                           monkeypatch):
    complete = "".join(json.dumps({"key": f"k{i}", "backend": "naive", "status": "ok"})
                       + "\n" for i in range(3))
    path = tmp_path / RECORDS
    path.write_text(complete + '{"key": "k3", "back')
    real_open = Path.open

    def opened_then_killed(self, *args, **kwargs):  # Path.write_bytes: open(wb), write
        real_open(self, *args, **kwargs).close()
        raise Killed

    with monkeypatch.context() as m:
        m.setattr(Path, "write_bytes", lambda self, data: opened_then_killed(self, "wb"))
        with contextlib.suppress(Killed):
            record_files.RecordWriter(tmp_path).close()
    assert path.read_text().startswith(complete)
    assert [r["key"] for r in read_records(tmp_path)] == ["k0", "k1", "k2"]


@pytest.mark.slow
def test_bare_resume_replays_the_runs_own_suite_and_flags(tiny, tmp_path, capsys):
    out = tmp_path / "results"
    assert run("--suite", str(tiny), "--seq-len", "16,32", "--backends", "naive",
               "--out", str(out), "--run-id", "F") == 0
    full = read_records(out / "F")
    assert len(full) == 2
    lines = (out / "F" / RECORDS).read_text().splitlines()
    (out / "F" / RECORDS).write_text(lines[0] + "\n" + lines[1][:20])  # killed mid-write
    capsys.readouterr()
    assert run("--resume", "F", "--out", str(out)) == 0  # no --suite: the run's own
    assert "the last line was cut off" in capsys.readouterr().err
    again = read_records(out / "F")
    assert sorted((r["key"], r["backend"]) for r in again) == \
        sorted((r["key"], r["backend"]) for r in full)
    assert read_meta(out / "F")["suite"] == "tiny"
    assert run("--resume", "F", "--out", str(out), "--suite", "quick") == 2
    assert "contradicts the run being resumed" in one_line_error(capsys)


def test_retry_supersedes_the_crashed_record(tiny, tmp_path):
    out = tmp_path / "results"
    assert run("--suite", str(tiny), "--out", str(out), "--run-id", "R") == 0
    path = out / "R" / RECORDS
    recs = [json.loads(x) for x in path.read_text().splitlines()]
    recs[0] |= {"status": "crashed", "reason": "worker process killed by signal SIGSEGV"}
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    assert run("--resume", "R", "--out", str(out), "--retry", "crashed,timeout") == 0
    after = read_records(out / "R")
    assert len(after) == len(recs) and all(r["status"] == "ok" for r in after)
    assert len(path.read_text().splitlines()) == len(recs) + 1  # history kept in the file


def test_a_locked_run_refuses_a_second_writer(tiny, tmp_path, capsys):
    out = tmp_path / "results"
    assert run("--suite", str(tiny), "--out", str(out), "--run-id", "L") == 0
    with RunLock(out / "L"):
        assert run("--resume", "L", "--out", str(out)) == 2
    assert "a run is writing to it" in one_line_error(capsys)
