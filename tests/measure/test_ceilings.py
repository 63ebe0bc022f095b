"""Device ceilings (measure/ceilings.py): the matmul rate, the copy roof, narrow dtypes."""

from __future__ import annotations

import pytest

from attnbench.measure.ceilings import copy_roof


@pytest.mark.parametrize("rates,tried,best", [
    # TFLOP/s by size: larger matmuls run faster (AMX bf16), so the ceiling is the best size
    ({256: 0.2, 512: 0.4, 1024: 0.49, 2048: 0.9, 4096: 0.8}, [256, 512, 1024, 2048, 4096], 0.9),
    # a slow dtype (bf16 without native support): 1024^3 would take 0.43 s, not started
    ({256: 0.005, 512: 0.005}, [256, 512], 0.005),
])
def test_matmul_ceiling_is_the_best_rate_over_the_sizes_it_can_afford(monkeypatch, rates,
                                                                       tried, best):
    from types import SimpleNamespace

    from attnbench.measure import ceilings

    seen = []

    def fake_measure(fn, device, budget):
        size = fn.__defaults__[0].shape[0]  # the closure's bound (size, size) operand
        seen.append(size)
        return SimpleNamespace(min_ms=2 * size**3 / (rates[size] * 1e12) * 1e3)

    monkeypatch.setattr(ceilings, "measure", fake_measure)
    monkeypatch.setattr(ceilings, "SIZES", {"cpu": (256, 512, 1024, 2048, 4096)})
    assert ceilings.matmul_tflops("float32", "cpu") == pytest.approx(best)
    assert seen == tried


def test_copy_roof_holds_a_record_to_the_copy_of_its_own_size():
    ladder = {"copy_gbps": 10.0,
              "copy_gbps_by_bytes": {str(2**20): 40.0, str(8 * 2**20): 25.0,
                                     str(128 * 2**20): 10.0}}
    assert copy_roof(ladder, 3 * 2**20) == 40.0  # in-cache: the 1 MiB copy's roof
    assert copy_roof(ladder, 16 * 2**20) == 25.0  # a copy of 8 MiB moves 16 MiB
    assert copy_roof(ladder, 2**30) == 10.0  # streaming
    assert copy_roof(ladder, 1000) == 40.0  # smaller than every copy: the fastest roof
    assert copy_roof({"copy_gbps": 10.0}, 1000) == 10.0  # runs from before the ladder
    assert copy_roof({}, 1000) is None


def test_a_narrow_dtype_is_judged_against_the_faster_of_its_matmul_and_float32s():
    """On a host without native bf16 torch's bf16 matmul ran 110x slower than fp32, while
    sdpa's bf16 kernels compute in fp32: the bf16 record's roof is the fp32 rate then, and
    where bf16 is the faster (a GPU, AMX) it stays bf16's; fp32 is never judged by bf16."""
    from attnbench.measure.ceilings import matmul_roof
    avx2 = {"matmul_tflops": {"bfloat16": 0.0013, "float32": 0.147}}
    assert matmul_roof(avx2, "bfloat16") == 0.147
    amx = {"matmul_tflops": {"bfloat16": 2.05, "float32": 0.32}}
    assert matmul_roof(amx, "bfloat16") == 2.05
    assert matmul_roof(amx, "float32") == 0.32
    assert matmul_roof({"matmul_tflops": {}}, "float16") is None
