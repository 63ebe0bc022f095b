"""attnbench's suites as pytest-benchmark benchmarks: one per (case, backend) pair.

    pytest --benchmark-only benchmarks/ [--attnbench-suite quick] [--attnbench-backends sdpa]
           [--attnbench-dtype float32] [--attnbench-seq-len 1024] [--attnbench-device cpu]

The pairs are the ones ``attnbench run`` with the same options would run (attnbench.runs.overrides),
set up and checked against the float64 reference by the harness itself
(attnbench.measure.execute.open_job); pytest-benchmark does the timing, saving and comparing
(``--benchmark-json``, ``--benchmark-save``, ``--benchmark-compare``,
``--benchmark-compare-fail``). Not collected by the default ``pytest`` (testpaths = tests).
"""

from __future__ import annotations

import os

import pytest

# As in attnbench's worker (runner.py): idle OpenMP threads that spin stall short CPU calls
# by whole scheduler quanta on shared cores. Set before torch starts its thread pool.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from attnbench.core.errors import BadInput  # noqa: E402

OPTIONS = ("suite", "backends", "dtype", "seq-len", "device")


def pytest_addoption(parser):
    group = parser.getgroup("attnbench", "attnbench pairs as benchmarks")
    group.addoption("--attnbench-suite", default="quick",
                    help="suite name (in suites/) or path to a .toml (default: quick)")
    group.addoption("--attnbench-backends", default=None,
                    help="comma-separated backends, each sweep keeping those it lists "
                         "(as run --backends)")
    group.addoption("--attnbench-dtype", default=None,
                    help="comma-separated dtypes, replacing the suite's (as run --dtype)")
    group.addoption("--attnbench-seq-len", default=None,
                    help="comma-separated sequence lengths (as run --seq-len)")
    group.addoption("--attnbench-device", default="auto", help="auto, cpu, cuda or cuda:N")


def _selection(config):
    """(suite, device, jobs) of the options, chosen once per session."""
    if not hasattr(config, "_attnbench_selection"):
        from attnbench.runs.overrides import select

        opts = {o: config.getoption(f"--attnbench-{o}") for o in OPTIONS}
        try:
            config._attnbench_selection = select(opts["suite"], opts["backends"],
                                                 opts["dtype"], opts["seq-len"],
                                                 opts["device"])
        except BadInput as exc:
            raise pytest.UsageError(f"attnbench: {exc}") from None
    return config._attnbench_selection


def pytest_generate_tests(metafunc):
    if "pair" not in metafunc.fixturenames:
        return
    from attnbench.measure.profiler import range_name

    _, _, jobs = _selection(metafunc.config)
    metafunc.parametrize("pair", jobs, ids=[range_name(c.key, b) for c, b in jobs])


@pytest.fixture(scope="session")
def suite_timing(request):
    return _selection(request.config)[0].timing


@pytest.fixture(scope="session")
def case_cache():
    from attnbench.measure.execute import CaseCache

    return CaseCache()


def pytest_benchmark_update_machine_info(config, machine_info):
    """What decides an attention benchmark's numbers, beside pytest-benchmark's own fields."""
    from attnbench.runs.environment import collect

    env = collect(_selection(config)[1])
    machine_info["attnbench"] = {k: env.get(k) for k in (
        "device", "device_name", "cpu_model", "cpu_capability", "threads", "torch", "triton",
        "xformers", "cuda", "driver", "gpu_capability", "attnbench", "git_commit")}
