"""One faulty backend per fault class, run in the isolated worker beside an honest one:
each fault gets its status and reason, and every other pair still completes."""

from __future__ import annotations

import pytest

from attnbench.runs.record_files import read_records

FAULTS = {  # backend: (fault class, status at seq_len 16 and 32)
    "fake_crash": ("segfault", "crashed"),
    "fake_abort": ("abort", "crashed"),
    "fake_hang": ("hang", "timeout"),
    "fake_nan": ("NaN", "wrong"),
    "fake_shape": ("wrong shape, last axis cut", "wrong"),
    "fake_shape_unsqueeze": ("wrong shape, broadcastable", "wrong"),
    "fake_shape_cat": ("wrong shape, batch doubled", "wrong"),
    "fake_extras_set": ("non-JSON extras", "error"),
    "fake_chatty": ("chatty output", "ok"),
}
SEED = {backend: seed for seed, backend in enumerate(FAULTS)}
# Each fault in a case of its own (its seed), so that its group holds it alone: a crash or
# hang costs one worker, never a retry of honest pairs one by one. timeout_s covers a fresh
# worker's start-up (importing torch) on a loaded machine.
SUITE = """
name = "faults"
[timing]
warmup_s = 0.0
budget_s = 0.002
min_reps = 1
max_reps = 2
timeout_s = 20
[defaults]
heads_q = 1
head_dim = 8
""" + "".join(f"""
[[sweep]]
backends = ["{backend}", "naive"]
[sweep.axes]
seq_len = [16, 32]
seed = {seed}
""" for seed, backend in enumerate(FAULTS)) + """
[[sweep]]
backends = ["fake_oom", "naive"]
[sweep.axes]
seq_len = [16, 64, 128]
seed = 99
"""


@pytest.fixture(scope="module")
def fault_run(tmp_path_factory):
    import os

    from conftest import TESTS

    from attnbench.core.registry import all_backends
    from attnbench.measure import worker
    from attnbench.runs.runner import RunOptions, run_suite
    from attnbench.runs.suite import load_suite

    old = {k: os.environ.get(k) for k in ("ATTNBENCH_PLUGINS", "PYTHONPATH")}
    os.environ["ATTNBENCH_PLUGINS"] = "fake_backends"
    os.environ["PYTHONPATH"] = str(TESTS)
    limits = worker.LOG_LIMIT, worker.LOG_KEEP
    worker.LOG_LIMIT, worker.LOG_KEEP = 1024, 512  # the chatty backend must meet the bound
    try:
        all_backends(refresh=True)
        path = tmp_path_factory.mktemp("suite") / "faults.toml"
        path.write_text(SUITE)
        suite = load_suite(str(path), sorted(all_backends()))
        out = tmp_path_factory.mktemp("results")
        yield run_suite(suite, "cpu", RunOptions(out=out, run_id="faults", progress=False,
                                                 measure_ceilings=False))
    finally:
        worker.LOG_LIMIT, worker.LOG_KEEP = limits
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        all_backends(refresh=True)


@pytest.fixture(scope="module")
def by_pair(fault_run):
    return {(r["backend"], r["seq_q"], r["seed"]): r for r in read_records(fault_run)}


def test_every_pair_has_its_record(by_pair):
    expected = {(b, n, s) for s, b in enumerate(FAULTS) for n in (16, 32)} | {
        ("naive", n, s) for s in range(len(FAULTS)) for n in (16, 32)} | {
        (b, n, 99) for b in ("fake_oom", "naive") for n in (16, 64, 128)}
    assert set(by_pair) == expected
    for (backend, _, _), rec in by_pair.items():  # honest pairs complete beside every fault
        assert backend != "naive" or rec["status"] == "ok", rec


@pytest.mark.parametrize("backend", list(FAULTS))
def test_each_fault_gets_its_status_and_a_reason(by_pair, backend):
    fault, status = FAULTS[backend]
    for n in (16, 32):
        rec = by_pair[(backend, n, list(FAULTS).index(backend))]
        assert rec["status"] == status, (fault, rec["status"], rec["reason"])
        assert status == "ok" or 0 < len(rec["reason"]) <= 300


def test_fault_reasons_say_what_happened(by_pair):
    assert "SIGSEGV" in by_pair[("fake_crash", 16, SEED["fake_crash"])]["reason"]
    assert "SIGABRT" in by_pair[("fake_abort", 16, SEED["fake_abort"])]["reason"]
    assert "20 s limit" in by_pair[("fake_hang", 16, SEED["fake_hang"])]["reason"]
    assert "NaN" in by_pair[("fake_nan", 16, SEED["fake_nan"])]["reason"]
    assert by_pair[("fake_shape_unsqueeze", 16, SEED["fake_shape_unsqueeze"])]["reason"] == (
        "out has shape (1, 1, 1, 16, 8), the case needs (1, 1, 16, 8)")
    assert by_pair[("fake_shape_cat", 32, SEED["fake_shape_cat"])]["reason"] == (
        "out has shape (2, 1, 32, 8), the case needs (1, 1, 32, 8)")
    extras = by_pair[("fake_extras_set", 16, SEED["fake_extras_set"])]["reason"]
    assert "cannot be written as JSON" in extras and "set is not JSON serializable" in extras


def test_a_crashed_group_says_so_on_the_records_measured_again_alone(by_pair):
    honest = by_pair[("naive", 16, SEED["fake_crash"])]
    assert honest["status"] == "ok" and "pair_group" not in honest
    assert honest["timed_alone"].startswith("its group of 2 crashed: ")
    assert "SIGSEGV" in honest["timed_alone"]
    paired = by_pair[("naive", 16, SEED["fake_chatty"])]  # its group ran: no such column
    assert "timed_alone" not in paired and paired["pair_group"]


def test_oom_is_recorded_and_larger_cases_skipped(by_pair):
    assert [by_pair[("fake_oom", n, 99)]["status"] for n in (16, 64, 128)] == [
        "ok", "oom", "skipped"]


def test_chatty_output_stays_in_the_worker_log(fault_run, capfd):
    log = (fault_run / "worker.log").read_bytes()
    assert b"fake_chatty: stdout noise" in log
    assert len(log) < 1024 + 4096  # cut between groups past 1 KiB here
    # (the cut itself: test_worker_limits.py)
    assert "fake_chatty" not in capfd.readouterr().out


# ---- fault backends in the isolated worker ---------------------------------------------
STATE_AND_MEMORY_FAULTS = """
name = "faults"
[timing]
warmup_s = 0.0
budget_s = 0.005
min_reps = 2
max_reps = 3
timeout_s = 60
[defaults]
heads_q = 1
head_dim = 8
[[sweep]]
backends = ["fake_state", "fake_abort", "fake_shape", "fake_chatty", "fake_state_check",
            "naive"]
[sweep.axes]
seq_len = [16, 32]
[[sweep]]
backends = ["fake_hog"]
[sweep.axes]
seq_len = [16, 256, 512]
"""


@pytest.mark.slow
def test_fault_backends_cost_one_record_each(fake_backends, tmp_path, capfd, monkeypatch):
    import torch

    from attnbench.core.registry import all_backends
    from attnbench.runs.runner import RunOptions, run_suite
    from attnbench.runs.suite import load_suite

    monkeypatch.setenv("FAKE_EXPECT_THREADS", str(torch.get_num_threads()))
    path = tmp_path / "faults.toml"
    path.write_text(STATE_AND_MEMORY_FAULTS)
    suite = load_suite(str(path), sorted(all_backends()))
    run_dir = run_suite(suite, "cpu", RunOptions(out=tmp_path / "results", run_id="f",
                                                 progress=False, measure_ceilings=False,
                                                 max_memory_bytes=4 * 2**30))
    by = {(r["backend"], r["seq_q"]): r for r in read_records(run_dir)}
    for n in (16, 32):
        abort = by[("fake_abort", n)]
        assert abort["status"] == "crashed" and "SIGABRT" in abort["reason"]
        assert "fake_abort: giving up on purpose" in abort["reason"]
        assert by[("fake_shape", n)]["status"] in ("error", "wrong")
        for ok in ("fake_state", "fake_chatty", "naive"):
            assert by[(ok, n)]["status"] == "ok", by[(ok, n)]
        # settings fake_state left behind were restored before the next backend's setup
        assert by[("fake_state_check", n)]["status"] == "ok", by[("fake_state_check", n)]
    assert by[("fake_hog", 16)]["status"] == "ok"
    assert by[("fake_hog", 256)]["status"] == "oom"  # 8 GiB under a 4 GiB cap
    assert by[("fake_hog", 512)]["status"] == "skipped"
    assert "fake_chatty: stdout noise" not in capfd.readouterr().out
    assert "fake_chatty: stdout noise" in (run_dir / "worker.log").read_text()
