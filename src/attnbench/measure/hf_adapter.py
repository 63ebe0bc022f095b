"""attnbench backends as Hugging Face transformers attention functions.

``register()`` adds ``attnbench_<backend>`` to ``transformers.AttentionInterface`` for each
available backend, so ``AutoModel.from_config(cfg, attn_implementation="attnbench_sdpa")``
runs the model with that backend. Each name is also given transformers' FlashAttention mask
function, which hands the attention call either no mask (no padding) or the 2-D padding mask
(B, Nk); the structured part of the mask is read from the call itself:

* causal: the module's ``is_causal`` (or the call's ``is_causal``);
* sliding window: the call's ``sliding_window`` W (Mistral passes its config's), meaning a
  query sees itself and the W - 1 keys before it, i.e. attnbench's ``window(W-1,0)``;
* padding: each sequence's contiguous run of real tokens is cut out and computed alone
  (left or right padding); query rows at padding positions are returned as zeros;
* GQA: passed through when the backend supports it, else K and V are repeated per group
  (as eager attention does);
* scaling: the case's ``scale``; dropout > 0: refused (no attnbench backend drops
  probabilities), with the reason.

A call a backend cannot run raises ``NotSupported`` with its reasons: ``check_model`` makes
the first call before any timing so a model-level run records why.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util

import torch

from attnbench.core.backend import Backend
from attnbench.core.case import Case, Inputs
from attnbench.core.dtypes import dtype_name
from attnbench.core.errors import NotSupported
from attnbench.core.registry import all_backends
from attnbench.measure import timing

PREFIX = "attnbench_"
# The transformers releases this adapter was tested with (AttentionInterface and
# AttentionMaskInterface with the 5.x call signature: the GPU machine has 5.17, this one 5.24).
TESTED_RANGE = (">=5.0", "<6")
INSTALL = "pip install -e '.[models]'"


def transformers_reason() -> str | None:
    """Why transformers cannot be used here (None when it can)."""
    if importlib.util.find_spec("transformers") is None:
        return f"transformers is not installed; install it with: {INSTALL}"
    version = importlib.metadata.version("transformers")
    major = int(version.split(".")[0])
    if major != 5:
        return (f"transformers {version} is outside the tested range "
                f"{','.join(TESTED_RANGE)}; install it with: {INSTALL}")
    return None


def implementation_name(backend: str) -> str:
    """``attnbench_<backend>``, with "flash" spelt "fa": transformers takes any name holding
    "flash" for a FlashAttention kernel to fetch (``attnbench_sdpa_fa`` is sdpa_flash)."""
    return PREFIX + backend.replace("flash", "fa")


def _contiguous_run(row: torch.Tensor) -> tuple[int, int] | None:
    """(start, end) of the real tokens of a (Nk,) bool row when they form one run."""
    idx = torch.nonzero(row).flatten()
    if idx.numel() == 0:
        return 0, 0
    start, end = int(idx[0]), int(idx[-1]) + 1
    if end - start != idx.numel():
        return None
    return start, end


class ModelAttention:
    """One backend as a transformers attention function; built closures are cached per
    case (the model calls it with the same shapes in every layer)."""

    def __init__(self, backend: Backend):
        self.backend = backend
        self._cases: dict[tuple, Case] = {}  # call signature -> case
        self._built: dict[Case, tuple[list[str], object]] = {}  # case -> (reasons, f)
        # The distinct cases it ran since last cleared (the model's attention shapes), in order.
        self.calls: dict[Case, None] = {}
        self.clock: AttentionClock | None = None  # set while attention's share is measured

    def case_for(self, query, key, value, causal: bool, window: int | None,
                 scaling: float | None) -> Case:
        B, Hq, Nq, D = query.shape  # (B, Hq, Nq, D)
        Hkv, Nk, Dv = key.shape[1], key.shape[2], value.shape[-1]
        mask = f"window({window - 1},0)" if window else ("causal" if causal else "none")
        needs_grad = torch.is_grad_enabled() and any(
            t.requires_grad for t in (query, key, value))
        device = str(query.device) if query.device.type == "cuda" else query.device.type
        return Case(batch=B, heads_q=Hq, heads_kv=Hkv, seq_q=Nq, seq_k=Nk, head_dim=D,
                    head_dim_v=Dv, dtype=dtype_name(query.dtype), device=device, mask=mask,
                    mode="fwd_bwd" if needs_grad else "fwd", scale=scaling)

    def reasons(self, case: Case) -> list[str]:
        """Why the backend cannot run this call; GQA is not one (K/V are repeated)."""
        reasons = self.backend.not_supported_reasons(case)
        if case.heads_q != case.heads_kv:
            plain = self.backend.not_supported_reasons(case.replace(heads_kv=case.heads_q))
            reasons = [r for r in reasons if r in plain]
        return reasons

    def _run(self, case: Case, q, k, v) -> torch.Tensor:
        if case.heads_q != case.heads_kv and not self.backend.caps.gqa:
            group = case.group_size
            k = k.repeat_interleave(group, dim=1)  # (B, Hq, Nk, D)
            v = v.repeat_interleave(group, dim=1)  # (B, Hq, Nk, Dv)
            case = case.replace(heads_kv=case.heads_q)
        built = self._built.get(case)
        if built is None:  # once per shape: the model's layers reuse it, so a call costs
            reasons = self.reasons(case)  # no more Python than eager's
            f = None if reasons else self.backend.build(case, Inputs(q, k, v))
            built = self._built[case] = (reasons, f)
        reasons, f = built
        if reasons:
            raise NotSupported(self.backend.name, reasons)
        return f(q, k, v)  # (B, Hq, Nq, Dv)

    def __call__(self, module, query, key, value, attention_mask, scaling=None, dropout=0.0,
                 sliding_window=None, is_causal=None, **kwargs):
        name = self.backend.name
        if dropout and dropout > 0:
            raise NotSupported(name, [f"attention dropout p={dropout} in training: attnbench "
                                      f"backends do not drop probabilities (set the config's "
                                      f"attention dropout to 0)"])
        causal = bool(is_causal if is_causal is not None else getattr(module, "is_causal", False))
        if attention_mask is not None and attention_mask.dim() != 2:
            raise NotSupported(name, [f"a {attention_mask.dim()}-D attention mask (custom "
                                      f"or packed sequences): only padding is mapped"])
        Nq, Nk = query.shape[2], key.shape[2]
        if attention_mask is not None and Nq != Nk:
            raise NotSupported(name, ["padding with seq_q != seq_k (a KV cache) is not mapped"])
        needs_grad = torch.is_grad_enabled() and any(
            t.requires_grad for t in (query, key, value))
        sig = (query.shape, key.shape, value.shape[-1], query.dtype, query.device, causal,
               sliding_window, scaling, needs_grad)
        case = self._cases.get(sig)
        if case is None:
            case = self._cases[sig] = self.case_for(query, key, value, causal,
                                                    sliding_window, scaling)
        self.calls[case] = None
        clock = self.clock
        if clock is not None:
            query, key, value = _Mark.apply(clock, "end", query, key, value)
            clock.start()
        if attention_mask is None:
            out = self._run(case, query, key, value)  # (B, Hq, Nq, Dv)
        else:
            out = self._padded(case, query, key, value, attention_mask.bool())
        if clock is not None:
            clock.stop()
            (out,) = _Mark.apply(clock, "start", out)
        return out.transpose(1, 2).contiguous(), None  # (B, Nq, Hq, Dv)

    def _padded(self, case: Case, query, key, value, keep: torch.Tensor) -> torch.Tensor:
        """Each sequence's real tokens computed alone; padding rows are zeros."""
        out = query.new_zeros(*query.shape[:3], value.shape[-1])  # (B, Hq, Nq, Dv)
        for b in range(query.shape[0]):
            run = _contiguous_run(keep[b])
            if run is None:
                raise NotSupported(self.backend.name, ["padding that is not one contiguous "
                                                       "run of real tokens per sequence"])
            s, e = run
            if e == s:
                continue
            one = case.replace(batch=1, seq_q=e - s, seq_k=e - s)
            out[b:b + 1, :, s:e] = self._run(one, query[b:b + 1, :, s:e],
                                             key[b:b + 1, :, s:e], value[b:b + 1, :, s:e])
        return out


class AttentionClock:
    """Seconds spent inside attention calls: forwards timed around the call, backwards
    between two autograd marks (the output's gradient arriving, the inputs' leaving).
    Synchronises the GPU at each mark, so it runs in passes of its own, never in the timed
    rounds. Autograd may run an unrelated ready node between the marks: the share is an
    upper bound by that much."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.seconds = 0.0
        self._t0 = None

    def _now(self) -> float:
        if self.cuda:
            torch.cuda.synchronize()
        return timing.clock()  # the loop's clock, which times the step around these marks

    def start(self) -> None:
        self._t0 = self._now()

    def stop(self) -> None:
        if self._t0 is not None:
            self.seconds += self._now() - self._t0
            self._t0 = None


class _Mark(torch.autograd.Function):
    """Identity whose backward starts (role "start") or stops ("end") the clock."""

    @staticmethod
    def forward(ctx, clock, role, *tensors):
        ctx.clock, ctx.role = clock, role
        return tuple(t.view_as(t) for t in tensors)

    @staticmethod
    def backward(ctx, *grads):
        if ctx.role == "start":
            ctx.clock.start()
        else:
            ctx.clock.stop()
        return (None, None, *grads)


_registered: dict[str, ModelAttention] = {}


def register(names: list[str] | None = None) -> dict[str, str]:
    """Register each named (default: every) available backend; returns {backend: reason}
    for those that could not be registered. Requires transformers."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask

    skipped = {}
    backends = all_backends()
    for name in names if names is not None else sorted(backends):
        impl = backends.get(name)
        if impl is None:
            skipped[name] = f"unknown backend; known: {', '.join(sorted(backends))}"
            continue
        ok, why = impl.is_available()
        if not ok:
            skipped[name] = why
            continue
        if name not in _registered:
            _registered[name] = ModelAttention(impl)
            AttentionInterface.register(implementation_name(name), _registered[name])
            AttentionMaskInterface.register(implementation_name(name), flash_attention_mask)
    return skipped


def adapter(name: str) -> ModelAttention:
    """The registered attention function of backend ``name``."""
    return _registered[name]
