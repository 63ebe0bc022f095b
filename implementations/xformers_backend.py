"""xformers: ``xformers.ops.memory_efficient_attention`` and its individual operators.

* ``xformers`` lets xformers dispatch; ``xformers_<op>`` pins one operator pair
  (``xformers.ops.fmha.<op>.FwOp`` / ``BwOp``): cutlass, flash, flash3, ck, and the
  forward-only triton_splitk.
* Layout: xformers wants BMHK ``(B, N, H, D)``. ``prepare`` converts the inputs once,
  outside the timed closure, and converts outputs/gradients back for the error check.
  GQA uses xformers' 5-D BMGHK layout: query ``(B, Nq, Hkv, G, D)``, key/value
  ``(B, Nk, Hkv, 1, D)`` expanded (stride 0) along the group axis.
* Masks through xformers' bottom-right biases (:func:`bias_spec`): causal is
  ``LowerTriangularFromBottomRightMask``, ``window(L, 0)`` is
  ``LowerTriangularFromBottomRightLocalAttentionMask(L + 1)``, other windows
  ``LocalAttentionFromBottomRightMask(L, R)``. Block-sparse layouts have no bias class.
* A packed batch (``lengths``) runs over all its tokens as one sequence, BMHK
  ``(1, B*N, H, D)`` (BMGHK for GQA as above), with ``BlockDiagonalMask`` (causal:
  ``BlockDiagonalCausalMask``) built from the documents' lengths, so each document attends
  within itself (:func:`varlen_bias_spec`, :func:`packed_q`, :func:`packed_kv`).
* Where xformers is missing, cannot load its compiled ops, or has no operator for a
  case, the record says so with xformers' own reasons on one line.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
import warnings

import torch

from attnbench.core.backend import Backend, Capabilities, wrap_mode
from attnbench.core.case import Inputs
from attnbench.core.errors import NotSupported
from attnbench.core.masks import INF, MaskSpec
from attnbench.implementations._varlen import from_tokens_major, rows_of, tokens_major

INSTALL_HINT = "xformers is not installed (pip install attnbench[xformers])"

# sub-backend suffix -> (module in xformers.ops.fmha, has a backward operator)
OPERATORS = {
    "cutlass": ("cutlass", True),
    "flash": ("flash", True),
    "flash3": ("flash3", True),
    "ck": ("ck", True),
    "triton_splitk": ("triton_splitk", False),
}


# ---- pure helpers (testable without xformers) -------------------------------------
def bias_spec(mask: MaskSpec, seq_q: int, seq_k: int) -> tuple[str, tuple] | None:
    """The xformers attention bias for a mask: (class name in fmha.attn_bias, args).

    None means no bias. Infinite window sides become ``seq_q + seq_k`` (beyond any
    query-key distance).
    """
    if mask.kind == "none":
        return None
    if mask.kind == "block_sparse":
        raise ValueError("xformers has no attention bias for block-sparse layouts")
    left, right = mask.left, mask.right
    if left == INF and right == INF:
        return None
    if right == 0:
        if left == INF:
            return ("LowerTriangularFromBottomRightMask", ())
        return ("LowerTriangularFromBottomRightLocalAttentionMask", (int(left) + 1,))
    far = seq_q + seq_k
    return ("LocalAttentionFromBottomRightMask",
            (far if left == INF else int(left), far if right == INF else int(right)))


def bias_allowed(spec: tuple[str, tuple] | None, seq_q: int, seq_k: int) -> torch.Tensor | None:
    """Boolean (seq_q, seq_k): what a bias lets through, per xformers' documented definition.

    (Their ``materialize``: ``shift = seq_k - seq_q``; causal keeps ``tril(shift)``;
    causal-local with window w also ``triu(shift - w + 1)``; local (wl, wr) keeps
    ``triu(shift - wl)`` and ``tril(shift + wr)``.) Used to test :func:`bias_spec`.
    """
    if spec is None:
        return None
    name, args = spec
    ones = torch.ones(seq_q, seq_k, dtype=torch.bool)
    shift = seq_k - seq_q
    if name == "LowerTriangularFromBottomRightMask":
        return torch.tril(ones, diagonal=shift)
    if name == "LowerTriangularFromBottomRightLocalAttentionMask":
        (w,) = args
        return torch.triu(torch.tril(ones, diagonal=shift), diagonal=shift - w + 1)
    if name == "LocalAttentionFromBottomRightMask":
        wl, wr = args
        return torch.tril(torch.triu(ones, diagonal=shift - wl), diagonal=shift + wr)
    raise ValueError(f"unknown bias {name!r}")


def q_to_xformers(q: torch.Tensor, group: int) -> torch.Tensor:
    """(B, Hq, N, D) -> BMHK (B, N, Hq, D), or BMGHK (B, N, Hkv, G, D) when group > 1 (views)."""
    B, H, N, D = q.shape
    if group == 1:
        return q.transpose(1, 2)  # (B, N, H, D)
    return q.view(B, H // group, group, N, D).permute(0, 3, 1, 2, 4)  # (B, N, Hkv, G, D)


def kv_to_xformers(k: torch.Tensor, group: int) -> torch.Tensor:
    """(B, Hkv, N, D) -> (B, N, Hkv, D), or (B, N, Hkv, 1, D) when group > 1 (views)."""
    x = k.transpose(1, 2)  # (B, N, Hkv, D)
    return x if group == 1 else x.unsqueeze(3)  # (B, N, Hkv, 1, D)


def kv_expand(k: torch.Tensor, group: int) -> torch.Tensor:
    """(B, N, Hkv, 1, D) -> (B, N, Hkv, G, D) with stride 0 along G (no copy)."""
    if group == 1:
        return k
    B, N, G, _, D = k.shape
    return k.expand(B, N, G, group, D)


def q_from_xformers(x: torch.Tensor) -> torch.Tensor:
    """Query-shaped BMHK / BMGHK back to (B, Hq, N, D) (a view)."""
    if x.dim() == 4:
        return x.transpose(1, 2)  # (B, H, N, D)
    B, N, G, Hg, D = x.shape
    return x.permute(0, 2, 3, 1, 4).reshape(B, G * Hg, N, D)  # (B, Hq, N, D)


def kv_from_xformers(x: torch.Tensor) -> torch.Tensor:
    """Key-shaped (B, N, Hkv, D) or (B, N, Hkv, 1, D) back to (B, Hkv, N, D)."""
    if x.dim() == 5:
        x = x.squeeze(3)
    return x.transpose(1, 2)


def varlen_bias_spec(rows, causal: bool) -> tuple[str, list[int]]:
    """The block-diagonal bias of a packed batch: (class name in fmha.attn_bias, the
    documents' lengths over the rows laid end to end), built with ``from_seqlens``."""
    name = "BlockDiagonalCausalMask" if causal else "BlockDiagonalMask"
    return name, [n for row in rows for n in row]


def packed_q(q: torch.Tensor, group: int) -> torch.Tensor:
    """(B, Hq, N, D) -> (1, B*N, Hq, D), or (1, B*N, Hkv, G, D) when group > 1 (a copy)."""
    t = tokens_major(q).unsqueeze(0)  # (1, T, Hq, D)
    _, T, H, D = t.shape
    return t if group == 1 else t.view(1, T, H // group, group, D)


def packed_kv(k: torch.Tensor, group: int) -> torch.Tensor:
    """(B, Hkv, N, D) -> (1, B*N, Hkv, D), or (1, B*N, Hkv, 1, D) when group > 1 (a copy)."""
    t = tokens_major(k).unsqueeze(0)  # (1, T, Hkv, D)
    return t if group == 1 else t.unsqueeze(3)


def from_packed(x: torch.Tensor, batch: int) -> torch.Tensor:
    """(1, B*N, H, D), (1, B*N, Hkv, G, D) or (1, B*N, Hkv, 1, D) back to (B, H', N, D)."""
    return from_tokens_major(x.reshape(x.shape[1], -1, x.shape[-1]), batch)


_NO_OP = re.compile(r"^No operator found for `([^`]+)`")
_OP_NO = re.compile(r"^Operator `([^`]+)` does not support inputs")
_NOT_SUPPORTED = re.compile(r"^`([^`]+)` is not supported because:?$")
_INPUT_LINE = re.compile(r"^(query|key|value|attn_bias|p)\s*:")


def condense_xformers_message(text: str) -> str:
    """xformers' multi-line "No operator found ..." explanation as one line."""
    head = ""
    ops: list[tuple[str, list[str]]] = []
    other: list[str] = []
    for raw in str(text).splitlines():
        line = raw.strip()
        if not line:
            continue
        if m := _NO_OP.match(line):
            head = f"no xformers operator for {m.group(1)}"
        elif m := _OP_NO.match(line):
            head = f"xformers operator {m.group(1)} does not support the inputs"
        elif m := _NOT_SUPPORTED.match(line):
            ops.append((m.group(1), []))
        elif _INPUT_LINE.match(line):
            continue
        elif ops:
            ops[-1][1].append(line)
        else:
            other.append(line)
    parts = [f"{name}: {', '.join(reasons)}" for name, reasons in ops]
    body = "; ".join(parts) if parts else " ".join(other)
    return f"{head}: {body}" if head and body else (head or body or "xformers refused")


# ---- xformers import and availability ----------------------------------------------
def _one_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


def _import_fmha():
    """(xformers.ops.fmha module or None, reason)."""
    if importlib.util.find_spec("xformers") is None:
        return None, INSTALL_HINT
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            fmha = importlib.import_module("xformers.ops.fmha")
        except Exception as exc:
            return None, f"xformers fails to import: {_one_line(exc)}"
    return fmha, ""


def _cpp_problem() -> str:
    """xformers' own reason when its compiled extensions failed to load ('' if fine)."""
    try:
        cpp = importlib.import_module("xformers._cpp_lib")
        exc = getattr(cpp, "_cpp_library_load_exception", None)
    except Exception:
        return ""
    if exc is None:
        return ""
    return f"xformers cannot load its C++/CUDA extensions: {_one_line(exc)}"


class Xformers(Backend):
    """memory_efficient_attention, dispatched by xformers (op=None) or pinned to one operator."""

    def __init__(self, op: str | None = None):
        self.op = op
        self.name = "xformers" if op is None else f"xformers_{op}"
        self.description = ("xformers memory_efficient_attention (xformers picks the operator)"
                            if op is None else
                            f"xformers memory_efficient_attention pinned to fmha.{op}")
        has_bw = True if op is None else OPERATORS[op][1]
        self.caps = Capabilities(
            devices=("cuda",),
            dtypes=("float32", "float16", "bfloat16"),
            masks=("none", "causal", "window"),
            modes=("fwd", "bwd", "fwd_bwd") if has_bw else ("fwd",),
            requires=("xformers",),
            lengths=True,
        )

    def _ops(self, fmha):
        """(FwOp, BwOp or None) of the pinned operator, or None for dispatch."""
        if self.op is None:
            return None
        module = importlib.import_module(f"{fmha.__name__}.{OPERATORS[self.op][0]}")
        fw = module.FwOp
        bw = getattr(module, "BwOp", None) if OPERATORS[self.op][1] else None
        return fw, bw

    def is_available(self):
        fmha, why = _import_fmha()
        if fmha is None:
            return False, why
        cpp = _cpp_problem()
        if self.op is None:
            return True, ""
        try:
            fw, bw = self._ops(fmha)
        except Exception as exc:
            return False, f"xformers has no operator fmha.{self.op}: {_one_line(exc)}"
        for o in (fw, bw):
            if o is not None and not o.is_available():
                return False, (f"xformers operator {o.NAME} is not built"
                               + (f" ({cpp})" if cpp else ""))
        return True, ""

    # ---- computation ------------------------------------------------------------
    def _native(self, fmha, case):
        """The timed function in xformers' layout, and the bias."""
        if case.lengths:  # a packed batch: one sequence of B*N tokens, block-diagonal
            name, seqlens = varlen_bias_spec(rows_of(case), case.mask == "causal")
            bias = getattr(fmha.attn_bias, name).from_seqlens(seqlens)
        else:
            spec = bias_spec(case.mask_spec, case.seq_q, case.seq_k)
            bias = None if spec is None else getattr(fmha.attn_bias, spec[0])(*spec[1])
        group, scale = case.group_size, case.scale  # scale None: xformers' 1/sqrt(D)
        ops = self._ops(fmha)
        op = None if ops is None else (ops if ops[1] is not None else ops[0])
        mea = fmha.memory_efficient_attention if (ops is None or ops[1] is not None) else \
            fmha.memory_efficient_attention_forward

        def xformers_native(q, k, v):  # BMHK / BMGHK in and out
            return mea(q, kv_expand(k, group), kv_expand(v, group), attn_bias=bias,
                       scale=scale, op=op)

        return xformers_native, bias, ops

    def _check(self, fmha, case, native, bias, ops, qn, kn, vn):
        """NotSupported with xformers' reasons when it has no operator for the case."""
        group = case.group_size
        if ops is not None:
            inp = fmha.Inputs(query=qn, key=kv_expand(kn, group), value=kv_expand(vn, group),
                              attn_bias=bias, p=0.0, scale=case.scale)
            reasons = []
            for o in ops if case.needs_grad else ops[:1]:
                if o is not None:
                    reasons += [f"{o.NAME}: {r}" for r in o.not_supported_reasons(inp)]
            if reasons:
                raise NotSupported(self.name, ["xformers: " + "; ".join(reasons)])
            return
        # dispatch: a trial call (forward, and backward in backward modes), untimed
        q, k, v = (t.detach().requires_grad_(case.needs_grad) for t in (qn, kn, vn))
        try:
            with torch.set_grad_enabled(case.needs_grad):
                out = native(q, k, v)
                if case.needs_grad:
                    torch.autograd.grad(out, (q, k, v), torch.ones_like(out))
        except NotImplementedError as exc:
            raise NotSupported(self.name, [condense_xformers_message(str(exc))]) from None

    def build(self, case, inputs):
        fmha, why = _import_fmha()
        if fmha is None:
            raise NotSupported(self.name, [why])
        native, bias, ops = self._native(fmha, case)
        group = case.group_size
        to_q, to_kv, back = self._layout(case)
        self._check(fmha, case, native, bias, ops, to_q(inputs.q, group),
                    to_kv(inputs.k, group), to_kv(inputs.v, group))

        def xformers_attention(q, k, v):  # (B, H, N, D) in and out
            out = native(to_q(q, group), to_kv(k, group), to_kv(v, group))
            return back["q"](out)  # (B, Hq, Nq, Dv)

        return xformers_attention

    @staticmethod
    def _layout(case):
        """(q to xformers, k/v to xformers, {"q", "kv": back to (B, H, N, D)}): views of the
        dense layout, or the packed (1, B*N, ...) copies of a packed batch."""
        if case.lengths:
            back = lambda x: from_packed(x, case.batch)  # noqa: E731
            return packed_q, packed_kv, {"q": back, "kv": back}
        return q_to_xformers, kv_to_xformers, {"q": q_from_xformers, "kv": kv_from_xformers}

    def prepare(self, case, inputs):
        fmha, why = _import_fmha()
        if fmha is None:
            raise NotSupported(self.name, [why])
        native, bias, ops = self._native(fmha, case)
        group = case.group_size
        to_q, to_kv, back = self._layout(case)
        # Native-layout copies, made once here so the timed closure does no transposes.
        qn = to_q(inputs.q, group).contiguous()  # (B, Nq, H, D) | (B, Nq, Hkv, G, D)
        kn = to_kv(inputs.k, group).contiguous()  # (B, Nk, Hkv, D) | (.., Hkv, 1, D)
        vn = to_kv(inputs.v, group).contiguous()  # packed: B = 1, Nq = Nk = B*N
        go = None if inputs.grad_out is None else to_q(inputs.grad_out, group).contiguous()
        self._check(fmha, case, native, bias, ops, qn, kn, vn)
        prepared = wrap_mode(native, case, Inputs(qn, kn, vn, go))
        native_outputs = prepared.outputs

        def outputs(result):
            side = {"out": "q", "dq": "q", "dk": "kv", "dv": "kv"}
            return {n: back[side[n]](t) for n, t in native_outputs(result).items()}

        prepared.outputs = outputs
        if ops is not None:
            prepared.extras["kernel"] = ops[0].NAME
        return prepared


BACKENDS = [Xformers()] + [Xformers(op) for op in OPERATORS]
