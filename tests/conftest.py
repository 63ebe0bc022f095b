import os
import sys
from pathlib import Path

import pytest

# Triton picks interpreter or compiler when a kernel is defined, and under xdist each worker
# collects every test file, so a file collected before
# tests/implementations/test_triton_flash.py (which asks for the interpreter) could define
# the kernels compiled. Set it before any collection;
# TRITON_INTERPRET=0 still selects the compiled kernels on a GPU.
if os.environ.get("TRITON_INTERPRET", "").strip() != "0":
    os.environ["TRITON_INTERPRET"] = "1"

TESTS = Path(__file__).resolve().parent
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))


@pytest.fixture
def fake_backends(monkeypatch):
    """Register tests/fake_backends.py through the plugin variable, for this test only."""
    from attnbench.core.registry import all_backends

    monkeypatch.setenv("ATTNBENCH_PLUGINS", "fake_backends")
    monkeypatch.setenv("PYTHONPATH", str(TESTS))
    all_backends(refresh=True)
    yield
    monkeypatch.delenv("ATTNBENCH_PLUGINS")
    all_backends(refresh=True)


@pytest.fixture
def write_suite(tmp_path):
    def write(text: str, name: str = "tiny.toml") -> Path:
        path = tmp_path / name
        path.write_text(text)
        return path

    return write


@pytest.fixture
def tiny(tmp_path):
    """run_command.TINY written as a suite file: four pairs that run in a second."""
    from run_command import TINY

    path = tmp_path / "tiny.toml"
    path.write_text(TINY)
    return path


@pytest.fixture
def fake_clock(fake_backends, monkeypatch):
    """The timer and the drifting fake backends on one FakeClock (also in worker processes
    this test starts): sampling, rounds and drift are then exact on any machine."""
    import fake_backends as fb

    from attnbench.measure import timing

    monkeypatch.setattr(timing, "clock", timing.clock)
    monkeypatch.setattr(fb.Drift, "clock", fb.Drift.clock)
    monkeypatch.setattr(fb.Drift, "t0", fb.Drift.t0)
    monkeypatch.setenv("ATTNBENCH_FAKE_CLOCK", "1")
    return fb.FakeClock().install()


@pytest.fixture(scope="session")
def native_kernels():
    """The native CPU kernels, built once for the session (under the build's own lock, so
    xdist workers build each kernel once between them): {kernel: (module or None, reason)}."""
    from attnbench.implementations import _native

    _native.prepare(_native.KERNELS)
    return {name: _native.load(name) for name in _native.KERNELS}


def pytest_collection_modifyitems(config, items):
    """Tests of modules that call the native kernels (they import kernel_paths's
    ``needs_native``) get them built first, outside any test's own time."""
    for item in items:
        if (hasattr(getattr(item, "module", None), "needs_native")
                and "native_kernels" not in item.fixturenames):
            item.fixturenames.append("native_kernels")  # set up like a requested fixture
