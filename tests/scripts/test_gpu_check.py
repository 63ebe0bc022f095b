"""The GPU check's fault handling, as far as a CPU can prove it: step 1's tasks in the
correctness harness with a worker that segfaults and one whose CUDA context is poisoned,
CUDA faults told from candidates that do not fit, the task list, the flex warm-up list, the
summary of an empty run. (The end-to-end rehearsal with injected faults is in
tests/implementations/test_triton_flash.py.)"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

import gpu_correctness as cli  # noqa: E402

from attnbench.implementations import _triton_flash_kernels as K  # noqa: E402
from attnbench.measure import correctness, gpu_check  # noqa: E402


def test_a_segfault_and_a_cuda_fault_fail_only_their_own_tasks():
    """Tasks 2 (segfault) and 4 (CUDA fault, which poisons its process) on 2 processes:
    every other task finishes, none in a poisoned process (an injected fault makes every
    later task of that process fail 'poisoned by task 4')."""
    tasks = [gpu_check.as_task("noop", (i,)) for i in range(8)]
    got = []
    stats = correctness.run_tasks(tasks, 2, got.extend, {2: "segv", 4: "cuda"})
    by_task = {r["task"]: r for r in got}
    assert sorted(by_task) == list(range(8)) and len(got) == 8
    assert by_task[2]["ok"] is False and by_task[2]["crashed"]
    assert "worker process died" in by_task[2]["error"]
    assert by_task[4]["ok"] is False and by_task[4]["cuda_fault"]
    assert "injected" in by_task[4]["error"]
    assert all(by_task[i]["ok"] is True for i in (0, 1, 3, 5, 6, 7))
    assert not any("poisoned" in r.get("error", "") for r in got)
    assert stats == {"crashed": 1, "retired": 1}


def test_fault_spec_is_checked():
    assert gpu_check.parse_faults("segv@1, cuda@3", 5) == {1: "segv", 3: "cuda"}
    assert gpu_check.parse_faults("", 5) == {}
    with pytest.raises(SystemExit, match="GPU_CHECK_FAULTS item 'oom@1'"):
        gpu_check.parse_faults("oom@1", 5)
    with pytest.raises(SystemExit, match="I < 5"):
        gpu_check.parse_faults("segv@5", 5)


def test_pool_size_is_the_affinity_mask(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 3, 5}, raising=False)
    assert correctness.default_jobs() == 3
    assert correctness.default_jobs(7) == 7


@pytest.mark.parametrize("text, fault", [
    ("CUDA error: an illegal memory access was encountered", True),
    ("Triton Error [CUDA]: unspecified launch failure", True),
    ("CUDA error: device-side assert triggered", True),
    ("out of resource: shared memory, Required: 262144, Hardware limit: 232448", False),
    ("PassManager::run failed", False),
])
def test_cuda_faults_are_told_from_candidates_that_do_not_fit(text, fault):
    assert K.is_cuda_fault(RuntimeError(text)) is fault


def test_tuner_skips_a_candidate_that_does_not_fit_but_raises_a_cuda_fault():
    def bench(call):
        return call()

    def run(cfg):
        if cfg == "big":
            raise RuntimeError("out of resource: shared memory")
        if cfg == "bad":
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return {"slow": 2.0, "fast": 1.0}[cfg]

    log = []
    assert K.fastest("fwd", ["slow", "big", "fast"], run, bench, log.append) == "fast"
    assert any("big: failed" in line for line in log)
    with pytest.raises(RuntimeError, match="illegal memory access"):
        K.fastest("fwd", ["slow", "bad", "fast"], run, bench)
    assert K.fastest("fwd", ["big"], run, bench) is None


def test_flex_warm_up_covers_every_flex_job_of_the_h200_suite():
    """Step 1 compiles every flex shape and mode that step 2 runs (so step 2 hits the cache)."""
    from attnbench.runs.suite import load_suite

    cases = cli.suite_flex_jobs("h200", "cuda")
    suite_flex = [c.key for c, b in load_suite("h200").jobs_on("cuda") if b == "flex"]
    assert [c.key for c in cases] == suite_flex and len(set(suite_flex)) == len(suite_flex)
    assert {c.mode for c in cases} == {"fwd", "bwd"} and len(cases) == 6
    assert cli.suite_flex_jobs(None, "cuda") == []


def test_summary_of_a_run_without_records_says_so_in_one_line(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "records.jsonl").write_text("")
    (run / "meta.json").write_text("{}")
    for target in (run, tmp_path / "missing"):
        proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_summary.py"),
                               str(target), "--out", str(tmp_path / "s.md")],
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
        assert (tmp_path / "s.md").read_text().strip() == \
            f"gpu_summary: {target} holds no records; nothing to summarise"


def test_correctness_json_exists_before_torch_is_imported(tmp_path):
    """Step 1 writes its file first: a step cut (or refused) before any task still says so."""
    out = tmp_path / "c.json"
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_correctness.py"),
                           "--out", str(out), "--parts", "none"],
                          capture_output=True, text=True, timeout=300,
                          env={k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"})
    import json

    doc = json.loads(out.read_text())
    assert doc["finished"] == 0 and doc["results"] == [], proc.stdout + proc.stderr
    if proc.returncode == 2:  # no GPU here: it stopped after writing the header
        assert "no CUDA GPU visible" in proc.stdout


def test_an_outdir_that_cannot_be_written_is_refused_in_one_line(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), str(blocker / "out")],
                          cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env=env | {"PYTHON": sys.executable, "GPU_CHECK_REHEARSAL": "x.toml"})
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stdout.strip() == f"gpu_check: OUTDIR {blocker / 'out'} is not a writable " \
                                  "folder; nothing was run"


def test_the_h200_suite_times_packed_batches_and_paged_decode_on_cuda():
    """Step 2 covers both workloads, after the core (a cut run keeps the core), without a
    new flex compile (step 1's warm-up list is unchanged) and within the job count that
    docs/gpu.md's budget is derived from."""
    from attnbench.runs.suite import load_suite

    jobs = load_suite("h200").jobs_on("cuda")
    packed = [(c, b) for c, b in jobs if c.lengths]
    paged = [(c, b) for c, b in jobs if c.page_size]
    assert len(jobs) == 176 and len(packed) == 16 and len(paged) == 6
    assert {b for _, b in packed} == {"sdpa", "triton_flash", "xformers", "sdpa_padded"}
    assert {c.lengths for c, _ in packed} == {"uniform(64,1024)", "lognormal(256,1)"}
    assert all(c.batch * c.seq_q == 16384 and c.mask == "none" for c, _ in packed)
    assert {b for _, b in paged} == {"sdpa", "triton_flash"}
    assert {c.pages for c, _ in paged} == {"contiguous", "shuffled", "fragmented"}
    assert all((c.seq_q, c.seq_k, c.page_size, c.mode, c.dtype) == (1, 16384, 16, "fwd",
                                                                    "bfloat16")
               for c, _ in paged)
    first_new = min(i for i, (c, _) in enumerate(jobs) if c.lengths or c.page_size)
    assert first_new == len(jobs) - len(packed) - len(paged)  # the last sweeps
    assert all(b != "flex" for _, b in packed + paged)


def test_the_decode_suite_uses_cudagraph_which_a_cpu_run_ignores():
    from attnbench.measure import timing_methods
    from attnbench.runs.suite import load_suite

    assert load_suite("decode").timing.method == "cudagraph"
    assert timing_methods.for_device("cudagraph", "cpu") is None  # the wall clock instead
