"""Minimal reproductions of two upstream faults attnbench records as ``wrong``.

Only torch is used, so the script can go into an upstream bug report as it is.

1. torch.compile(flex_attention) on the CPU disagrees with eager flex_attention given the
   same BlockMask, on AVX2 hosts. On an AVX-512 host, lower the dispatch level to see it:
       ATEN_CPU_CAPABILITY=avx2 python scripts/repro_upstream_faults.py
2. The CPU flash SDPA kernel returns NaN for a negative scale with is_causal and Nq = Nk.

Inductor's on-disk cache is not keyed by ATEN_CPU_CAPABILITY: code compiled at one level is
reused at the other (and is wrong there too), so the script compiles into a fresh cache.

Prints one line per check; exits 0 whatever it finds (it reports, it does not judge).
"""

from __future__ import annotations

import os
import tempfile

os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="repro-inductor-")

import torch  # noqa: E402  (after the cache directory is chosen)
import torch.nn.functional as F  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402
from torch.nn.attention.flex_attention import create_block_mask, flex_attention  # noqa: E402


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def bottom_right_causal(off: int):
    def causal(b, h, q_idx, kv_idx):
        return kv_idx <= q_idx + off

    return causal


def flex_compiled_vs_eager() -> None:
    compiled = torch.compile(flex_attention, dynamic=False)
    # (Hq, Hkv, Nq, Nk, D, Dv)
    for hq, hkv, nq, nk, d, dv in [(4, 4, 24, 40, 16, 8), (4, 2, 24, 40, 16, 16),
                                   (4, 2, 40, 40, 16, 8), (4, 4, 40, 40, 16, 16)]:
        gen = torch.Generator().manual_seed(0)
        q = torch.randn(1, hq, nq, d, generator=gen)
        k = torch.randn(1, hkv, nk, d, generator=gen)
        v = torch.randn(1, hkv, nk, dv, generator=gen)
        mask = create_block_mask(bottom_right_causal(nk - nq), None, None, nq, nk,
                                 device="cpu")
        gqa = hq != hkv
        eager = flex_attention(q, k, v, block_mask=mask, enable_gqa=gqa)
        got = compiled(q, k, v, block_mask=mask, enable_gqa=gqa)
        print(f"flex compiled vs eager (Hq,Hkv,Nq,Nk,D,Dv)={(hq, hkv, nq, nk, d, dv)}: "
              f"relative error {rel(got, eager):.3g}")


def sdpa_negative_causal_scale() -> None:
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 33, 32, generator=gen) for _ in range(3))
    for kernel in (SDPBackend.FLASH_ATTENTION, SDPBackend.MATH):
        with sdpa_kernel(kernel):
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=-0.125)
        print(f"sdpa {kernel.name} is_causal scale=-0.125: "
              f"{'NaN in output' if out.isnan().any() else 'finite'}")


if __name__ == "__main__":
    print(f"torch {torch.__version__}, CPU capability "
          f"{torch.backends.cpu.get_cpu_capability()}")
    flex_compiled_vs_eager()
    sdpa_negative_causal_scale()
