"""The model-shaped suites (models, decode) and the per-sweep ``devices`` key they use."""

from pathlib import Path

import pytest

from attnbench.core.backend import EXACT
from attnbench.core.errors import BadInput
from attnbench.core.registry import all_backends
from attnbench.runs.suite import load_suite

SUITES = Path(__file__).parents[2] / "suites"
TWO = """
name = "tiny"
[[sweep]]
name = "big"
devices = ["cuda"]
backends = ["sdpa"]
[sweep.axes]
heads_q = 8
heads_kv = 2
seq_len = 64
[[sweep]]
name = "small"
devices = "cpu"
backends = ["naive", "sdpa"]
[sweep.axes]
heads_q = 4
heads_kv = 1
seq_len = 16
"""


def test_devices_select_the_sweeps_a_device_runs(write_suite):
    suite = load_suite(str(write_suite(TWO)), ["naive", "sdpa"])
    cpu = suite.jobs_on("cpu")
    assert {(c.heads_q, c.device, b) for c, b in cpu} == {(4, "cpu", "naive"), (4, "cpu", "sdpa")}
    cuda = suite.jobs_on("cuda:1")  # an index still names the device type cuda
    assert {(c.heads_q, c.heads_kv, c.device, b) for c, b in cuda} == {(8, 2, "cuda:1", "sdpa")}
    assert len(suite.jobs()) == 3  # without a device: every sweep


@pytest.mark.parametrize("devices,expected", [
    ('["tpu"]', "sweep[0].devices = ['tpu']: must be a non-empty list of device types; "
                "allowed: cpu, cuda"),
    ("[]", "sweep[0].devices = []: must be a non-empty list"),
    ("3", "sweep[0].devices = 3: must be a non-empty list"),
])
def test_bad_devices_are_one_line(write_suite, devices, expected):
    text = TWO.replace('devices = ["cuda"]', f"devices = {devices}")
    with pytest.raises(BadInput) as err:
        load_suite(str(write_suite(text)), ["naive", "sdpa"])
    assert expected in str(err.value) and "\n" not in str(err.value)


def test_a_device_no_sweep_runs_on_is_bad_input(write_suite):
    text = TWO.replace('devices = "cpu"', 'devices = ["cuda"]')
    suite = load_suite(str(write_suite(text)), ["naive", "sdpa"])
    with pytest.raises(BadInput, match="no sweep runs on cpu; its sweeps' devices: cuda"):
        suite.jobs_on("cpu")


@pytest.mark.parametrize("name", ["models", "decode"])
def test_model_suites_have_cpu_and_gpu_plans(name):
    suite = load_suite(str(SUITES / f"{name}.toml"), sorted(all_backends()))
    for device in ("cpu", "cuda"):
        jobs = suite.jobs_on(device)
        assert jobs and {c.device for c, _ in jobs} == {device}
    # the GPU runs bf16, the CPU variant fp32
    assert {c.dtype for c, _ in suite.jobs_on("cuda")} == {"bfloat16"}
    assert {c.dtype for c, _ in suite.jobs_on("cpu")} == {"float32"}


def _per_head(case):
    return (case.head_dim, case.head_dim_v, case.mask, case.heads_q // case.heads_kv)


def test_models_cpu_variants_keep_each_models_per_head_shape():
    suite = load_suite(str(SUITES / "models.toml"), sorted(all_backends()))
    sweeps = {s.name: s for s in suite.sweeps}
    gpu = [n for n in sweeps if n.endswith("-gpu")]
    assert len(gpu) == 7
    for name in gpu:
        big, small = sweeps[name], sweeps[name.removesuffix("-gpu") + "-cpu"]
        big_cases, small_cases = big.cases(), small.cases()
        assert {_per_head(c) for c in small_cases} == {_per_head(c) for c in big_cases}, name
        # the CPU variant measures lengths the model uses, with no more heads or batch
        assert {(c.seq_q, c.seq_k) for c in small_cases} <= {(c.seq_q, c.seq_k)
                                                             for c in big_cases}, name
        assert max(c.heads_q * c.batch for c in small_cases) <= min(
            c.heads_q * c.batch for c in big_cases), name
        assert {c.mode for c in big_cases} == {"fwd", "fwd_bwd"}, name


def test_decode_runs_every_exact_backend_that_accepts_nq_ne_nk():
    backends = all_backends()
    suite = load_suite(str(SUITES / "decode.toml"), sorted(backends))
    wanted = {n for n, b in backends.items()
              if b.semantics == EXACT and b.caps.cross_attention and b.caps.dense}
    for device in ("cpu", "cuda"):
        jobs = suite.jobs_on(device)
        assert {b for _, b in jobs} >= wanted, device
        assert {c.seq_q for c, _ in jobs} == {1, 4, 16}
        assert all(c.mask == "causal" and c.heads_q == 4 * c.heads_kv for c, _ in jobs)
    lengths = {dev: sorted({c.seq_k for c, _ in suite.jobs_on(dev)}) for dev in ("cpu", "cuda")}
    assert (lengths["cpu"][0], lengths["cpu"][-1]) == (1024, 32768)
    assert (lengths["cuda"][0], lengths["cuda"][-1]) == (1024, 131072)
