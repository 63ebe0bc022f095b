"""Native kernel builds never hang and never build twice: a build killed at any moment is
followed by one that finishes, a finished build is imported without the builder, a failed
one is remembered (until ``attnbench build``), and the flags are never mutated."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest
import torch

from attnbench.implementations import _native
from attnbench.implementations import _native_build as nb

TESTS = Path(__file__).resolve().parents[1]
# Hang bounds only: the fake build takes about a second; a start that waits on a dead
# build's lock never finishes at all.
START_S = 120  # a fresh interpreter reaching a moment, on a loaded machine
RESTART_S = 60


def spec_in(tmp_path: Path, text: str = "int f();\n", **kw) -> nb.Spec:
    source = tmp_path / "fake.cpp"
    source.write_text(text)
    return nb.Spec("fake", "test", sources=(source,), **kw)


def python_builder(calls: list, value: int = 42):
    """A builder whose "library" is a Python file; counts its calls."""

    def build(spec: nb.Spec, where: Path):
        calls.append(spec.ext_name)
        library = where / f"{spec.ext_name}.py"
        library.write_text(f"VALUE = {value}\n")
        return nb.import_file(library)

    return build


def refusing_builder(spec, where):
    raise AssertionError("the builder ran, though a finished or failed build was there")


@pytest.fixture
def ext_dir(tmp_path, monkeypatch):
    where = tmp_path / "ext"
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(where))
    return where


def _moments(work: Path) -> list[str]:
    path = work / "moments"
    return path.read_text().split() if path.exists() else []


def _start(ext: Path, work: Path, pause_at: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(TESTS / "slow_builder.py"), str(ext),
                             str(work), pause_at], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGINT], ids=["SIGKILL", "SIGINT"])
@pytest.mark.parametrize("moment", ["before", "held", "written"])
def test_a_build_killed_at_any_moment_is_finished_by_the_next_start(tmp_path, sig, moment):
    """The issue's hang: a build killed while holding torch's lock left it, and every later
    load waited on it forever. Now the restart removes it (it holds the build's flock, so
    no live process can hold the lock) and finishes within the hang bound."""
    ext, work = tmp_path / "ext", tmp_path / "work"
    work.mkdir()
    (work / "fake.cpp").write_text("int f();\n")
    first = _start(ext, work, moment)
    deadline = time.monotonic() + START_S
    while moment not in _moments(work):
        if first.poll() is not None or time.monotonic() > deadline:
            first.kill()
            pytest.fail(f"the builder never reached {moment!r}: {first.communicate()}")
        time.sleep(0.02)
    first.send_signal(sig)
    assert first.wait(timeout=RESTART_S) != 0
    (lock,) = list(ext.glob(f"*/{nb.TORCH_LOCK}")) or [None]
    # torch's builder releases its lock in a finally: only a SIGKILL after taking it leaves it
    left = sig == signal.SIGKILL and moment != "before"
    assert (lock is not None) == left
    try:
        again = subprocess.run([sys.executable, str(TESTS / "slow_builder.py"), str(ext),
                                str(work), "never"], capture_output=True, text=True,
                               timeout=RESTART_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the restart after a {sig.name} at {moment!r} waited past "
                    f"{RESTART_S} s (a stale build lock)")
    assert again.returncode == 0, again.stderr
    assert again.stdout.strip() == "VALUE 42"
    stale_line = "removed a stale build lock left by an interrupted build: "
    assert (stale_line + str(lock) in again.stderr) == left, again.stderr
    assert not list(ext.glob(f"*/{nb.TORCH_LOCK}"))
    assert list(ext.glob(f"*/{nb.STAMP}"))


def test_a_finished_build_is_imported_without_the_builder(tmp_path, ext_dir):
    spec, calls = spec_in(tmp_path), []
    module, reason = nb.load(spec, builder=python_builder(calls))
    assert (module.VALUE, reason, len(calls)) == (42, "", 1)
    again, reason = nb.load(spec, builder=refusing_builder)  # as a later process would
    assert (again.VALUE, reason) == (42, "")
    assert nb.built_library(spec) == nb.folder(spec) / f"{spec.ext_name}.py"


def test_a_failed_build_is_remembered_until_a_build_is_asked_for(tmp_path, ext_dir):
    spec = spec_in(tmp_path)

    def failing(spec, where):
        raise RuntimeError("Error building extension\nfake.cpp:1:5: error: 'f' was not "
                           "declared\nninja: build stopped")

    module, reason = nb.load(spec, builder=failing)
    assert module is None
    assert reason == "fake.cpp did not build: fake.cpp:1:5: error: 'f' was not declared"
    # no later process compiles it again: it gets the reason, and says how to retry
    module, later = nb.load(spec, builder=refusing_builder)
    assert module is None and later == f"{reason} ({nb.RETRY_HINT})"
    calls = []
    module, reason = nb.load(spec, builder=python_builder(calls), retry=True)
    assert (module.VALUE, reason, len(calls)) == (42, "", 1)
    assert nb.failed_reason(spec) is None
    assert nb.load(spec, builder=refusing_builder)[0].VALUE == 42


def test_a_stale_torch_lock_is_removed_with_a_line(tmp_path, ext_dir, capsys):
    spec = spec_in(tmp_path)
    nb.folder(spec).mkdir(parents=True)
    stale = nb.folder(spec) / nb.TORCH_LOCK
    stale.touch()
    module, _ = nb.load(spec, builder=python_builder([]))
    assert module.VALUE == 42 and not stale.exists()
    assert capsys.readouterr().err.strip() == (
        f"removed a stale build lock left by an interrupted build: {stale}")


def test_a_damaged_stamp_builds_again(tmp_path, ext_dir):
    spec, calls = spec_in(tmp_path), []
    nb.load(spec, builder=python_builder(calls))
    (nb.folder(spec) / nb.STAMP).write_text("{not json")
    assert nb.load(spec, builder=python_builder(calls, 7))[0].VALUE == 7
    assert len(calls) == 2


def test_the_name_changes_with_what_is_built_and_nothing_else(tmp_path):
    """Names are read as each spec is made: spec_in writes the one source file."""
    flags = {"cflags": ("-O3",), "include_paths": ("/a/native",)}
    base = spec_in(tmp_path, **flags).ext_name
    assert base == spec_in(tmp_path, **flags).ext_name
    assert base.startswith("attnbench_fake_test_")
    header = tmp_path / "h.h"
    header.write_text("// one\n")
    names = [spec_in(tmp_path, cflags=("-O2",), include_paths=("/a/native",)).ext_name,
             spec_in(tmp_path, cflags=("-O3",), include_paths=("/b/native",)).ext_name,
             spec_in(tmp_path, **flags, ldflags=("-fopenmp",)).ext_name,
             spec_in(tmp_path, "int g();\n", **flags).ext_name,
             spec_in(tmp_path, **flags, headers=(header,)).ext_name]
    header.write_text("// two\n")
    names.append(spec_in(tmp_path, **flags, headers=(header,)).ext_name)
    assert len({base, *names}) == 1 + len(names)


def test_each_kernel_is_built_with_the_flags_it_was_given(tmp_path, ext_dir, monkeypatch):
    """torch appends its -L/-l flags to the ldflags list it is given: the old loader passed
    its module-level list, so the second kernel loaded was built with the first's linker
    flags too (another build.ninja, another build). Each build now gets copies."""
    import torch.utils.cpp_extension as cpp

    seen = []

    def fake_load(name, sources, extra_cflags, extra_ldflags, extra_include_paths, **kw):
        seen.append((list(extra_cflags), list(extra_ldflags)))
        extra_ldflags += ["-L/torch/lib", "-ltorch"]  # as torch's _prepare_ldflags does
        extra_cflags.append("-DTORCH_EXTENSION_NAME=" + name)
        library = Path(kw.get("build_directory") or tmp_path) / f"{name}.py"
        library.parent.mkdir(parents=True, exist_ok=True)
        library.write_text("")
        return types.SimpleNamespace(__file__=str(library))

    monkeypatch.setattr(cpp, "load", fake_load)
    monkeypatch.setattr(_native, "_loaded", {})
    monkeypatch.setattr(_native, "_why_not", lambda: "")
    monkeypatch.setenv(_native.ISA_ENV, "avx2")
    openmp, cflags = list(_native.OPENMP), list(_native.CFLAGS["avx2"])
    for name in (*_native.KERNELS, *_native.KERNELS):  # twice: the second time from stamps
        monkeypatch.setattr(_native, "_loaded", {})
        assert _native.load(name)[1] == ""
    assert len(seen) == len(_native.KERNELS)  # one build each
    assert all(ld == openmp for _, ld in seen)
    assert all(c == [*cflags, *openmp] for c, _ in seen)
    assert list(_native.OPENMP) == openmp and list(_native.CFLAGS["avx2"]) == cflags
    assert _native.spec("linear_attention").ext_name == \
        _native.spec("linear_attention").ext_name


def test_a_failed_kernel_leaves_its_backend_eager_with_the_reason(ext_dir, monkeypatch):
    monkeypatch.setattr(_native, "_loaded", {})
    monkeypatch.setattr(_native, "_why_not", lambda: "")
    monkeypatch.setenv(_native.ISA_ENV, "avx2")
    spec = _native.spec("segment_attention")
    nb.folder(spec).mkdir(parents=True)
    (nb.folder(spec) / nb.FAILED).write_text("segment_attention.cpp did not build: boom\n")
    assert not _native.pending("segment_attention")
    assert _native.load("segment_attention") == (None, nb.failed_reason(spec))
    kernel = _native.kernel_name("segment_attention", False, "blocked", "cpu",
                                 torch.float32, False, "fused")
    assert kernel == (f"blocked (fused kernel unavailable: segment_attention.cpp did not "
                      f"build: boom ({nb.RETRY_HINT}))")


def test_prepare_says_it_builds_only_when_something_compiles(tmp_path, ext_dir, monkeypatch):
    said, calls = [], []
    monkeypatch.setattr(_native, "_loaded", {})
    monkeypatch.setattr(_native, "_why_not", lambda: "")
    monkeypatch.setattr(nb, "torch_builder", python_builder(calls))
    assert _native.prepare(["linear_attention"], say=said.append) == {}
    assert said == [_native.FIRST_BUILD] and len(calls) == 1
    monkeypatch.setattr(_native, "_loaded", {})
    assert _native.prepare(["linear_attention"], say=said.append) == {}
    assert said == [_native.FIRST_BUILD] and len(calls) == 1  # built: nothing said again


def test_a_run_knows_which_kernels_its_pairs_need():
    from attnbench.core.case import Case
    from attnbench.runs.runner import native_kernels_for

    fp32, bf16 = Case(seq_q=16, seq_k=16), Case(seq_q=16, seq_k=16, dtype="bfloat16")
    assert native_kernels_for([(fp32, "sdpa"), (bf16, "linear")]) == []
    assert sorted(native_kernels_for([(fp32, "linear"), (fp32, "block_sparse"),
                                      (fp32, "sliding_window"), (fp32, "no_such")])) == \
        ["linear_attention", "segment_attention"]


def test_attnbench_build_refuses_an_unknown_kernel(capsys):
    from attnbench.cli import main

    assert main(["build", "flash"]) == 2
    assert capsys.readouterr().err.strip() == (
        "attnbench: error: build: unknown kernel 'flash'; allowed: segment_attention, "
        "linear_attention")


def test_no_kill_leaves_our_own_flock_held(tmp_path, ext_dir):
    """The flock dies with its holder: a process killed mid-build never blocks the next."""
    spec = spec_in(tmp_path)
    where = nb.folder(spec)
    where.mkdir(parents=True)
    holder = subprocess.Popen([sys.executable, "-c", (
        "import fcntl, os, sys, time\n"
        f"fd = os.open({str(where / nb.FLOCK)!r}, os.O_RDWR | os.O_CREAT)\n"
        "fcntl.flock(fd, fcntl.LOCK_EX)\nprint('held', flush=True)\ntime.sleep(3600)\n")],
        stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait(timeout=RESTART_S)
    assert nb.load(spec, builder=python_builder([]))[0].VALUE == 42


def test_a_run_builds_its_kernels_before_its_first_pair(tmp_path, write_suite, monkeypatch,
                                                        capsys):
    """A build inside a pair's worker ran under that pair's bounds: a run builds first, and
    a kernel that did not build is named once, its backends then running eager."""
    from attnbench.core.registry import all_backends
    from attnbench.measure import worker
    from attnbench.runs.record_files import read_records
    from attnbench.runs.runner import RunOptions, run_suite
    from attnbench.runs.suite import load_suite

    events = []

    def prepare(names, retry=False, say=print):
        events.append(("build", list(names)))
        return {"linear_attention": "linear_attention.cpp did not build: boom"}

    real = worker.InProcessExecutor.run_group
    monkeypatch.delenv(_native.DISABLE_ENV, raising=False)
    monkeypatch.setattr(_native, "prepare", prepare)
    monkeypatch.setattr(worker.InProcessExecutor, "run_group", lambda self, jobs, *a, **k: (
        events.append(("pair", jobs[0][1])), real(self, jobs, *a, **k))[1])
    monkeypatch.setattr(_native, "_loaded", {("linear_attention/" + str(_native.isa())): (
        None, "linear_attention.cpp did not build: boom")})
    path = write_suite('name = "k"\nbackends = ["linear", "naive"]\n[timing]\nwarmup_s = 0.0\n'
                       "budget_s = 0.002\nmin_reps = 1\nmax_reps = 2\n"
                       "[axes]\nheads_q = 1\nhead_dim = 16\nseq_len = 16\n")
    suite = load_suite(str(path), sorted(all_backends()))
    run = run_suite(suite, "cpu", RunOptions(out=tmp_path, run_id="r", progress=False,
                                             isolate=False, measure_ceilings=False))
    assert events[0] == ("build", ["linear_attention"]) and events[1][0] == "pair"
    assert ("native kernel linear_attention not used: linear_attention.cpp did not build: "
            "boom; its backends run their eager path") in capsys.readouterr().err
    linear = next(r for r in read_records(run) if r["backend"] == "linear")
    assert linear["status"] == "ok", linear["reason"]
    assert "(fused kernel unavailable: linear_attention.cpp did not build: boom)" in \
        linear["kernel"]


def test_attnbench_build_builds_again_and_says_how_each_kernel_went(ext_dir, monkeypatch,
                                                                    capsys):
    from attnbench.cli import main

    asked = []

    def prepare(names, retry=False, say=print):
        asked.append((list(names), retry))
        return {"linear_attention": "linear_attention.cpp did not build: boom"}

    monkeypatch.setattr(_native, "prepare", prepare)
    monkeypatch.setattr(_native, "_why_not", lambda: "")
    monkeypatch.setenv(_native.ISA_ENV, "avx2")
    assert main(["build"]) == 1
    assert asked == [(list(_native.KERNELS), True)]  # failures included: a retry
    out = capsys.readouterr().out.splitlines()
    assert out == [f"segment_attention: built in "
                   f"{nb.folder(_native.spec('segment_attention'))}",
                   "linear_attention: linear_attention.cpp did not build: boom"]
