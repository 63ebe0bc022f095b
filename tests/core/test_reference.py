"""The float64 reference against hand-computed values and brute-force definitions."""

import math

import pytest
import torch

import attnbench
from attnbench.core.masks import MaskSpec
from attnbench.core.reference import chunk_rows, softmax_reference


def brute_force(q, k, v, allowed=None, scale=None):
    """Per-(head, row) loops: the definition, with GQA by head index // group."""
    B, Hq, Nq, D = q.shape
    Hkv = k.shape[1]
    scale = scale or 1 / math.sqrt(D)
    out = torch.zeros(B, Hq, Nq, v.shape[-1], dtype=torch.float64)
    for b in range(B):
        for h in range(Hq):
            hk = h // (Hq // Hkv)
            for i in range(Nq):
                s = (k[b, hk].double() @ q[b, h, i].double()) * scale  # (Nk,)
                if allowed is not None:
                    s = s.masked_fill(~allowed[i], -math.inf)
                if torch.isinf(s).all():
                    continue
                out[b, h, i] = torch.softmax(s, 0) @ v[b, hk].double()
    return out


def band(nq, nk, left, right):
    off = nk - nq
    i = torch.arange(nq)[:, None]
    j = torch.arange(nk)[None, :]
    return (j >= i + off - left) & (j <= i + off + right)


def test_seed_article_three_tokens():
    # "Transformers and Attention 13", section 7: x1=[1,0], x2=[0,1], x3=[1,1], W = I, d_k = 2.
    x = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]], dtype=torch.float64)[None, None]
    out = attnbench.reference(x, x, x)[0, 0]
    weights = torch.softmax(x[0, 0] @ x[0, 0].T / math.sqrt(2), dim=-1)
    assert torch.allclose(weights[0], torch.tensor([0.401, 0.198, 0.401], dtype=torch.float64),
                          atol=1e-3)
    assert torch.allclose(weights[2], torch.tensor([0.248, 0.248, 0.503], dtype=torch.float64),
                          atol=1.5e-3)
    expected = torch.tensor([[0.802, 0.599], [0.599, 0.802], [0.752, 0.752]],
                            dtype=torch.float64)
    assert torch.allclose(out, expected, atol=1.5e-3)
    # and exactly the formula, not just to three digits
    assert torch.allclose(out, weights @ x[0, 0], atol=1e-12)


def test_causal_and_window_bottom_right_cross_attention():
    torch.manual_seed(0)
    for nq, nk in [(5, 9), (9, 5), (7, 7), (1, 6)]:
        q = torch.randn(1, 2, nq, 8, dtype=torch.float64)
        k = torch.randn(1, 2, nk, 8, dtype=torch.float64)
        v = torch.randn(1, 2, nk, 8, dtype=torch.float64)
        for left, right, kw in [(math.inf, 0, {"causal": True}), (2, 1, {"window": (2, 1)}),
                                (0, 0, {"window": (0, 0)})]:
            expect = brute_force(q, k, v, band(nq, nk, left, right))
            got = attnbench.reference(q, k, v, **kw)
            assert torch.allclose(got, expect, atol=1e-12), (nq, nk, kw)


def test_causal_bottom_right_semantics_by_hand():
    # seq_q=2, seq_k=4: off = 2, so query 0 sees keys 0..2 and query 1 sees all four keys.
    q = torch.zeros(1, 1, 2, 4, dtype=torch.float64)
    k = torch.zeros(1, 1, 4, 4, dtype=torch.float64)
    v = torch.arange(4, dtype=torch.float64).reshape(1, 1, 4, 1)
    out = attnbench.reference(q, k, v, causal=True)
    assert out.flatten().tolist() == pytest.approx([1.0, 1.5])  # means of 0..2 and 0..3


def test_gqa_and_dv_differs():
    torch.manual_seed(1)
    q = torch.randn(2, 6, 7, 8, dtype=torch.float64)
    k = torch.randn(2, 2, 11, 8, dtype=torch.float64)
    v = torch.randn(2, 2, 11, 5, dtype=torch.float64)
    got = attnbench.reference(q, k, v, causal=True)
    assert got.shape == (2, 6, 7, 5)
    assert torch.allclose(got, brute_force(q, k, v, band(7, 11, math.inf, 0)), atol=1e-12)


def test_rows_without_keys_are_zero():
    q = torch.randn(1, 1, 6, 4, dtype=torch.float64)
    k = torch.randn(1, 1, 3, 4, dtype=torch.float64)
    v = torch.randn(1, 1, 3, 4, dtype=torch.float64)
    out = attnbench.reference(q, k, v, causal=True)  # off = -3: rows 0..2 see nothing
    assert torch.equal(out[0, 0, :3], torch.zeros(3, 4, dtype=torch.float64))
    assert out[0, 0, 3:].abs().sum() > 0


def test_gradients_match_autograd_of_the_definition():
    torch.manual_seed(2)
    q = torch.randn(1, 4, 9, 8, dtype=torch.float64, requires_grad=True)
    k = torch.randn(1, 2, 12, 8, dtype=torch.float64, requires_grad=True)
    v = torch.randn(1, 2, 12, 6, dtype=torch.float64, requires_grad=True)
    go = torch.randn(1, 4, 9, 6, dtype=torch.float64)
    allowed = band(9, 12, 4, 1)
    kk, vv = k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1)
    s = (q @ kk.transpose(-1, -2) / math.sqrt(8)).masked_fill(~allowed, -math.inf)
    out = torch.softmax(s, -1) @ vv
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), go)
    ref = softmax_reference(q, k, v, MaskSpec.parse("window(4,1)"), grad_out=go)
    for got, want in [(ref.out, out), (ref.dq, dq), (ref.dk, dk), (ref.dv, dv)]:
        assert torch.allclose(got, want, atol=1e-10)


def test_chunking_does_not_change_the_result():
    from attnbench.core.reference import chunked_reference, softmax_rows

    torch.manual_seed(3)
    q, k, v = (torch.randn(1, 2, 37, 8, dtype=torch.float64) for _ in range(3))
    go = torch.randn(1, 2, 37, 8, dtype=torch.float64)
    fn = softmax_rows(MaskSpec.parse("causal"), 0.3, 37, 37)
    a = chunked_reference(fn, q, k, v, go, rows_per_chunk=5)
    b = chunked_reference(fn, q, k, v, go, rows_per_chunk=37)
    for name in ("out", "dq", "dk", "dv"):
        assert torch.allclose(getattr(a, name), getattr(b, name), atol=1e-12)


@pytest.mark.parametrize("grads", [False, True])
def test_a_cpu_reference_hands_freed_memory_back_after_every_chunk(monkeypatch, grads):
    """The chunks' temporaries are trimmed after each chunk (core/host_memory.py), so a
    long reference cannot grow the worker's resident memory chunk after chunk."""
    from attnbench.core import reference
    from attnbench.core.host_memory import release_freed

    calls = []
    monkeypatch.setattr(reference, "release_freed", lambda: calls.append(1) or True)
    q, k, v = (torch.randn(1, 2, 37, 8, dtype=torch.float64) for _ in range(3))
    go = torch.randn(1, 2, 37, 8, dtype=torch.float64) if grads else None
    fn = reference.softmax_rows(MaskSpec.parse("causal"), 0.3, 37, 37)
    reference.chunked_reference(fn, q, k, v, go, rows_per_chunk=5)
    assert len(calls) == 8  # ceil(37 / 5) chunks
    assert release_freed() is _glibc()  # found where the C library is glibc


def _glibc() -> bool:
    import platform

    return platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"


PEAK_SCRIPT = """
import torch, attnbench
from attnbench.measure.memory import peak_memory_bytes
torch.manual_seed(0)
q, k, v = (torch.randn(1, 1, {n}, 16) for _ in range(3))
print(peak_memory_bytes(lambda: attnbench.reference(q, k, v), "cpu"))
"""


def test_reference_memory_is_chunked():
    # A full 4096 x 4096 float64 score matrix is 128 MiB, and an unchunked reference holds it
    # and its probabilities (256 MiB); the chunked one stays under one such matrix (rows per
    # chunk are chosen for a 64 MiB budget over ~4 temporaries: ~60 MB measured). Measured in
    # a fresh process, as the runner's worker does: VmHWM is process-wide, and threads left by
    # other tests (compilers, profilers) would be counted too.
    import subprocess
    import sys

    n = 4096
    assert chunk_rows(1, 1, 16384) * 16384 * 8 * 4 <= 64 * 2**20
    out = subprocess.run([sys.executable, "-c", PEAK_SCRIPT.format(n=n)], capture_output=True,
                         text=True, timeout=120, check=True).stdout.strip()
    if out == "None":
        pytest.skip("no /proc peak-memory support here")
    assert int(out) < n * n * 8
