"""triton_flash over packed variable-length batches (``_triton_varlen``): forward and dq, dk,
dv against an independent float64 reference computed document by document, through the
Triton interpreter on CPU (``TRITON_INTERPRET=1``, set below at collection as in
tests/implementations/test_triton_flash.py) or compiled on CUDA when the variable is
explicitly ``0``.

The interpreter runs 16 x 16 tiles (``INTERPRETER_CONFIG``), so lengths of 16 and 32 are the
block-size multiples, 1, 7 and 23 are not, and a row holding one document spans the batch.
"""

from __future__ import annotations

import os

ON_GPU = os.environ.get("TRITON_INTERPRET", "").strip() == "0"
if not ON_GPU:
    os.environ["TRITON_INTERPRET"] = "1"

import math  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

pytest.importorskip("triton")

from attnbench.core import lengths  # noqa: E402
from attnbench.core.case import Case  # noqa: E402
from attnbench.core.reference import case_reference  # noqa: E402
from attnbench.core.registry import get_backend  # noqa: E402

DEVICE = "cuda" if ON_GPU else "cpu"
if ON_GPU and not torch.cuda.is_available():
    pytest.skip("TRITON_INTERPRET=0 asks for the compiled kernels, but no CUDA GPU is present",
                allow_module_level=True)
BACKEND = get_backend("triton_flash")
FP32_TOL = 2e-5 if ON_GPU else 2e-6  # as test_triton_flash.py: 3xTF32 on a GPU


def TV():
    from attnbench.implementations import triton_flash

    triton_flash.kernels()  # fixes interpreter or compiled before the varlen module loads
    from attnbench.implementations import _triton_varlen

    return _triton_varlen


def per_document(q, k, v, go, rows, causal, scale):
    """Float64 out, dq, dk, dv: every document of every row on its own, softmax written out
    (no mask tensor of the whole row, no code shared with the kernels or core/reference)."""
    q, k, v, go = (t.detach().double() for t in (q, k, v, go))
    outs = [torch.zeros_like(t) for t in (go, q, k, v)]
    group = q.shape[1] // k.shape[1]
    for b, row in enumerate(rows):
        start = 0
        for n in row:
            s = slice(start, start + n)
            start += n
            qd, kd, vd = (t[b, :, s].clone().requires_grad_(True) for t in (q, k, v))
            kr, vr = kd.repeat_interleave(group, 0), vd.repeat_interleave(group, 0)
            scores = qd @ kr.transpose(-1, -2) * scale  # (Hq, n, n)
            if causal:
                scores = scores.masked_fill(torch.ones(n, n).triu(1).bool(), -math.inf)
            o = torch.softmax(scores, -1) @ vr  # (Hq, n, Dv)
            grads = torch.autograd.grad(o, (qd, kd, vd), go[b, :, s])
            for dst, src in zip(outs, (o.detach(), *grads)):
                dst[b, :, s] = src
    return dict(zip(("out", "dq", "dk", "dv"), outs))


def rel(a, ref):
    return float((a.detach().double().cpu() - ref.cpu()).norm() / ref.norm())


def run_kernel(rows, n, causal, hq=4, hkv=2, d=16, dv=8, dtype=torch.float32, scale=0.3,
               seed=0, poison=None):
    """The packed kernels' out and grads on random (B, H, N, D) rows, and the inputs."""
    K = TV()
    g = torch.Generator().manual_seed(seed)
    B = len(rows)
    q, k, v, go = (torch.randn(*s, generator=g).to(DEVICE, dtype) for s in
                   ((B, hq, n, d), (B, hkv, n, d), (B, hkv, n, dv), (B, hq, n, dv)))
    if poison is not None:  # NaN keys and values in tokens no other document may read
        k[poison], v[poison] = float("nan"), float("nan")
    q, k, v = (t.requires_grad_(True) for t in (q, k, v))
    out = K.attention(q, k, v, K.Packing.of_rows(rows, n), K.Plan(scale, causal))
    out.backward(go)
    got = {"out": out, "dq": q.grad, "dk": k.grad, "dv": v.grad}
    return got, (q, k, v, go)


# (rows of document lengths, row length): 1, block multiples (16, 32) and not (7, 23), a row
# that is one document, many one-token documents
LAYOUTS = [
    (((1, 16, 7), (24,)), 24),
    (((32,),), 32),
    (((1, 1, 23, 1, 1, 5), (16, 16)), 32),
]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("rows,n", LAYOUTS)
def test_fp32_matches_each_document_on_its_own(rows, n, causal):
    got, (q, k, v, go) = run_kernel(rows, n, causal)
    ref = per_document(q, k, v, go, rows, causal, 0.3)
    for name in ("out", "dq", "dk", "dv"):
        assert got[name].shape == ref[name].shape, name
        assert rel(got[name], ref[name]) < FP32_TOL, name


def test_no_key_of_another_document_is_read():
    # row 0 holds documents of 8 and 16 tokens: NaN in the first's keys and values may
    # reach nothing of the second, in the forward or the backward
    rows, n = ((8, 16),), 24
    poison = (slice(0, 1), slice(None), slice(0, 8))
    got, (q, k, v, go) = run_kernel(rows, n, causal=False, poison=poison)
    clean = {kk: t.detach().clone() for kk, t in (("k", k), ("v", v))}
    clean["k"][poison], clean["v"][poison] = 0.0, 0.0
    ref = per_document(q, clean["k"], clean["v"], go, rows, False, 0.3)
    for name in ("out", "dq", "dk", "dv"):
        tail = got[name][:, :, 8:]
        assert torch.isfinite(tail).all(), name
        assert rel(tail, ref[name][:, :, 8:]) < FP32_TOL, name


def test_token_major_interface_with_cu_seqlens():
    K = TV()
    g = torch.Generator().manual_seed(1)
    docs = (5, 16, 1, 18)
    T, hq, hkv, d = sum(docs), 2, 1, 32
    q = torch.randn(T, hq, d, generator=g).to(DEVICE)  # (T, Hq, D)
    k = torch.randn(T, hkv, d, generator=g).to(DEVICE)  # (T, Hkv, D)
    v = torch.randn(T, hkv, d, generator=g).to(DEVICE)
    cu = torch.tensor([0, 5, 21, 22, 40], dtype=torch.int32)
    out = K.varlen_attention(q, k, v, cu, causal=True)  # (T, Hq, D)
    assert out.shape == (T, hq, d)

    def rows_major(t):  # (T, H, D) -> (1, H, T, D)
        return t.permute(1, 0, 2).unsqueeze(0)

    ref = per_document(rows_major(q), rows_major(k), rows_major(v),
                       torch.zeros(1, hq, T, d), (docs,), True, 1 / math.sqrt(d))
    assert rel(rows_major(out), ref["out"]) < FP32_TOL


def test_low_precision_is_within_twice_the_naive_error():
    # FlashAttention's criterion, as for the dense kernel: at most twice the error of the
    # same-dtype naive block-diagonal attention against float64, plus a small slack
    dtype = torch.bfloat16
    rows, n = ((1, 16, 7), (24,)), 24
    got, (q, k, v, go) = run_kernel(rows, n, True, dtype=dtype)
    ref = per_document(q, k, v, go, rows, True, 0.3)
    qn, kn, vn = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    from attnbench.core.heads import repeat_kv

    doc = torch.cat([torch.repeat_interleave(torch.arange(len(r)), torch.tensor(r))[None]
                     for r in rows])  # (B, N) document ids
    allowed = (doc[:, :, None] == doc[:, None, :]) & torch.ones(n, n).tril().bool()
    s = (qn * 0.3) @ repeat_kv(kn, 2).transpose(-1, -2)  # (B, Hq, N, N) in bf16
    s = s.masked_fill(~allowed[:, None].to(DEVICE), -math.inf)
    o = torch.softmax(s, -1) @ repeat_kv(vn, 2)
    o.backward(go)
    base = {"out": o, "dq": qn.grad, "dk": kn.grad, "dv": vn.grad}
    for name in ("out", "dq", "dk", "dv"):
        assert rel(got[name], ref[name]) <= 2 * rel(base[name], ref[name]) + 1e-3, name


# ---- the backend ----------------------------------------------------------------------------
def varlen_case(spec, mask, mode="fwd_bwd", n=40, batch=2, seed=3):
    return Case(batch=batch, heads_q=4, heads_kv=2, seq_q=n, seq_k=n, head_dim=16,
                head_dim_v=8, mask=mask, mode=mode, lengths=spec, seed=seed, device=DEVICE)


@pytest.mark.parametrize("mask", ["none", "causal"])
def test_backend_runs_a_packed_case_against_the_case_reference(mask):
    case = varlen_case("uniform(1,24)", mask)
    assert BACKEND.caps.lengths
    assert BACKEND.not_supported_reasons(case) == []
    x = case.make_inputs()
    prepared = BACKEND.prepare(case, x)
    got = prepared.outputs(prepared.fn())
    ref = case_reference(case, x).as_dict()
    dense = case_reference(case.replace(lengths=""), x).out
    for name in ("out", "dq", "dk", "dv"):
        assert rel(got[name], ref[name]) < FP32_TOL, name
    assert float((got["out"].double().cpu() - dense.cpu()).abs().max()) > 1e-3
    kernel = prepared.extras["kernel"]
    assert kernel.startswith(f"triton_flash[varlen-{mask}] fwd=M16N16")
    assert set(prepared.extras["triton_config"]) == {"fwd", "dkdv", "dq"}
    assert prepared.extras["lengths_count"] == sum(
        len(r) for r in lengths.draw(case.lengths, case.batch, case.seq_q, case.seed))


def test_work_is_the_within_document_pairs():
    case = varlen_case("lognormal(8,1)", "causal", mode="fwd")
    rows = lengths.draw(case.lengths, case.batch, case.seq_q, case.seed)
    pairs = lengths.document_pairs(rows, causal=True)
    assert BACKEND.work_flops(case) == case.flops
    assert case.visible_pairs * case.batch == pairs
    assert TV().Packing.of_rows(rows, case.seq_q).pairs(True) == pairs
    assert case.flops < case.replace(lengths="").flops


def test_cpu_without_interpreter_reports_unavailable(monkeypatch):
    from attnbench.implementations import triton_flash

    monkeypatch.setattr(triton_flash, "interpreter_mode", lambda: False)
    case = varlen_case("fixed(8)", "none").replace(device="cpu")
    assert BACKEND.not_supported_reasons(case) == [triton_flash.CPU_REASON]
    if not torch.cuda.is_available():
        assert BACKEND.is_available() == (False, triton_flash.CPU_REASON)


# ---- the packing --------------------------------------------------------------------------
def test_packing_refuses_a_document_across_rows():
    K = TV()
    with pytest.raises(ValueError, match="crosses a row of 8 tokens"):
        K.Packing([0, 6], [6, 4], 8)
    with pytest.raises(ValueError, match="hold 7 tokens, the row 8"):
        K.Packing.of_rows(((3, 4),), 8)


def test_block_list_covers_every_block_once_longest_first():
    K = TV()
    p = K.Packing.of_rows(((1, 40, 7), (48,)), 48)
    for causal in (False, True):
        blocks = p.blocks(16, causal, "cpu").tolist()
        want = {(0, 1, 0), (1, 40, 0), (1, 40, 16), (1, 40, 32), (41, 7, 0),
                (48, 48, 0), (48, 48, 16), (48, 48, 32)}
        assert len(blocks) == len(want) and set(map(tuple, blocks)) == want
        assert blocks[-1] == [0, 1, 0]  # the one-token document has the least work
    assert p.blocks(16, False, "cpu")[0].tolist()[1] == 48
    assert K.Packing.of_cu_seqlens(torch.tensor([0, 3, 10])).lengths == (3, 7)


def _nvidia_backend_present() -> bool:
    try:
        from triton.backends import backends

        return "nvidia" in backends
    except Exception:
        return False


@pytest.mark.slow
@pytest.mark.skipif(not _nvidia_backend_present(), reason="Triton's NVIDIA backend is missing")
def test_varlen_kernels_compile_for_hopper_without_a_gpu():
    """The interpreter accepts code the compiler rejects: compile the three kernels for sm_90
    (ptxas included, in a fresh process without the interpreter) with the untuned GPU
    configuration, causal, d = 128 in bf16, and check they fit an H100 without spilling."""
    from attnbench.implementations import _triton_flash_meta as M

    got = M.sm90_metadata("attnbench.implementations._triton_varlen", ("fwd", "dkdv", "dq"),
                          128, 128, "bfloat16", (0.1, True))
    assert set(got) == {"fwd", "dkdv", "dq"}
    for name, m in got.items():
        assert m["shared_bytes"] <= 227 * 1024, name
        assert m["spill_bytes"] == 0, name


def test_tuning_takes_the_dense_tile_of_the_longest_document(monkeypatch):
    # on a GPU, a dense call of the longest document's length tuned in this process gives
    # its tiles, with no candidate timed; the CPU path is faked to the CUDA branch
    from attnbench.implementations import _triton_flash_kernels as F

    K = TV()
    monkeypatch.setattr(K, "INTERPRET", False)
    monkeypatch.setattr(K, "_TUNED", {})
    rows, n = ((100, 28), (128,)), 128
    q, k, v = torch.zeros(2, 4, n, 64), torch.zeros(2, 2, n, 64), torch.zeros(2, 2, n, 64)
    packing, plan = K.Packing.of_rows(rows, n), K.Plan(0.1, True)
    tiles = {"fwd": K.Config(64, 32), "dkdv": K.Config(32, 64), "dq": K.Config(64, 64)}
    for name, cfg in tiles.items():
        monkeypatch.setitem(F._TUNED, (name, 64, 64, "torch.float32", "causal", True, 128, 128),
                            cfg)
    monkeypatch.setattr(F, "fastest", lambda *a, **kw: pytest.fail("a candidate was timed"))

    class Cuda:  # q.device.type == "cuda" without a GPU; nothing is launched
        type = "cuda"

    monkeypatch.setattr(K, "forward", lambda *a, **kw: (torch.zeros(2, 4, n, 64),
                                                        torch.zeros(2, 4, n)))
    monkeypatch.setattr(F, "_delta", lambda o, do: torch.zeros(2, 4, n))
    go = torch.zeros(2, 4, n, 64)
    monkeypatch.setattr(torch.Tensor, "device", property(lambda self: Cuda()))
    got = K.tune(q, k, v, go, packing, plan)
    monkeypatch.undo()  # torch.Tensor.device first of all
    assert got == tiles
