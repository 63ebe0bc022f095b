"""Which instruction set the C++ kernels are built for: the host's widest (AVX-512 where torch
dispatches at AVX512, else AVX2), ``ATTNBENCH_NATIVE_ISA`` to pick a narrower one, a clear
reason for one the host cannot run, the build named in each record's ``kernel``, and the two
builds computing the same results where a host runs both."""

import pytest
import torch
from kernel_paths import needs_native

from attnbench.core.case import Case
from attnbench.core.registry import get_backend
from attnbench.implementations import _native


@pytest.fixture
def capability(monkeypatch):
    """Sets the CPU capability torch reports (what ATEN_CPU_CAPABILITY would)."""
    def set_to(cap: str) -> None:
        monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: cap)
    monkeypatch.delenv(_native.ISA_ENV, raising=False)
    return set_to


@pytest.mark.parametrize("cap, isa", [("AVX512", "avx512"), ("AVX2", "avx2")])
def test_the_build_follows_the_host(capability, cap, isa):
    capability(cap)
    assert _native.isa() == isa and _native._isa_problem() == ""


def test_a_host_below_avx2_gets_the_reason(capability):
    capability("DEFAULT")
    assert _native.isa() is None
    assert _native._isa_problem() == "CPU capability DEFAULT: the native kernels need AVX2"


def test_the_override_picks_a_narrower_build(capability, monkeypatch):
    capability("AVX512")
    monkeypatch.setenv(_native.ISA_ENV, "AVX2")
    assert _native.isa() == "avx2" and _native._isa_problem() == ""


@pytest.mark.parametrize("cap, wanted, says", [
    ("AVX2", "avx512", "ATTNBENCH_NATIVE_ISA=avx512 but this host (CPU capability AVX2) "
                       "cannot run it"),
    ("AVX512", "sse4", "ATTNBENCH_NATIVE_ISA='sse4': expected one of avx2, avx512"),
])
def test_an_override_that_cannot_run_says_why(capability, monkeypatch, cap, wanted, says):
    capability(cap)
    monkeypatch.setenv(_native.ISA_ENV, wanted)
    monkeypatch.setattr(_native, "_loaded", {})
    assert _native._why_not() == says
    assert _native.load("linear_attention") == (None, says)  # and nothing is built


def test_each_build_has_its_own_flags():
    assert "-DCPU_CAPABILITY_AVX2" in _native.CFLAGS["avx2"]
    assert not any("avx512" in f for f in _native.CFLAGS["avx2"])
    assert {"-mavx512f", "-DCPU_CAPABILITY_AVX512"} <= set(_native.CFLAGS["avx512"])


# The cases the two builds are compared on: each kernel's forms (fp32, D = 64 as in the
# suites, lengths that leave partial tiles and chunks), as (backend, case).
def two_heads(n: int, **knobs) -> Case:
    return Case(seq_q=n, seq_k=n, heads_q=2, heads_kv=2, **knobs)


AGREE = {
    "linear-elu": ("linear", two_heads(200, feature_map="elu")),
    "linear-favor-causal": ("linear", two_heads(200, mask="causal", feature_map="favor",
                                                num_features=64)),
    "linear-elu-fwd_bwd": ("linear", two_heads(200, feature_map="elu", mode="fwd_bwd")),
    "sliding_window": ("sliding_window", two_heads(300, mask="window(63,0)")),
    "block_sparse": ("block_sparse", two_heads(300, mask="block_sparse(bigbird)",
                                               block_size=32)),
    "sliding_window-fwd_bwd": ("sliding_window", two_heads(300, mask="window(63,0)",
                                                           mode="fwd_bwd")),
    "block_sparse-fwd_bwd": ("block_sparse", two_heads(300, mask="block_sparse(bigbird)",
                                                       block_size=32, mode="fwd_bwd")),
}


def run_on(build: str, backend: str, case: Case, monkeypatch) -> tuple[str, dict]:
    """(the record's kernel, the outputs) of one call with the kernels of ``build``."""
    monkeypatch.setenv(_native.ISA_ENV, build)
    prepared = get_backend(backend).prepare(case, case.make_inputs())
    return prepared.extras["kernel"], prepared.outputs(prepared.fn())


@needs_native
@pytest.mark.skipif(_native.host_isa() != "avx512",
                    reason="this host runs only the AVX2 build: nothing to compare it with")
@pytest.mark.parametrize("name", list(AGREE))
def test_the_two_builds_agree(name, monkeypatch):
    backend, case = AGREE[name]
    kernel_wide, wide = run_on("avx512", backend, case, monkeypatch)
    kernel_narrow, narrow = run_on("avx2", backend, case, monkeypatch)
    assert kernel_wide.endswith(",avx512") and kernel_narrow.endswith(",avx2")
    assert kernel_wide.removesuffix("avx512") == kernel_narrow.removesuffix("avx2")
    assert set(wide) == set(narrow) and "out" in wide
    for key in wide:  # the tiles round alike; sums over vector lanes and exp's may differ
        diff = (wide[key].double() - narrow[key].double()).norm() / narrow[key].double().norm()
        assert diff < 1e-6, (key, float(diff))
