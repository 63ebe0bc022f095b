"""The backend contract: capabilities as data, availability, and the timed closure.

A backend implements :meth:`Backend.build`, which does all setup (parameters, layout
conversion, compilation) and returns a differentiable ``f(q, k, v) -> out``. The base
class turns that into the zero-argument closure that is timed, for each mode:

* ``fwd``      ``f(q, k, v)`` without autograd;
* ``bwd``      the forward runs once, untimed; the closure is the backward only;
* ``fwd_bwd``  one closure doing forward and backward.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from attnbench.core import lengths as lengths_axis
from attnbench.core import masks as masks_mod
from attnbench.core import paging
from attnbench.core import params as params_mod
from attnbench.core.case import MODES, Case, Inputs

ALL_DTYPES = ("float64", "float32", "float16", "bfloat16")
ALL_MASKS = masks_mod.BUILT_IN  # the mask kinds that ship (core/masks/: one module each)

# What a backend claims to compute (docs/design.md, "Semantics").
EXACT = "exact"  # the case's softmax attention
APPROXIMATE = "approximate"  # approximates it (err_vs_softmax is its approximation error)
DIFFERENT = "different"  # another function altogether (err_vs_softmax left empty)


@dataclass(frozen=True)
class Capabilities:
    """What a backend accepts. Tests and the runner read this data; nothing is hard-coded."""

    devices: tuple[str, ...] = ("cpu", "cuda")
    dtypes: tuple[str, ...] = ALL_DTYPES
    masks: tuple[str, ...] = ("none", "causal", "window")  # declared mask kinds (core/masks/)
    any_mask: bool = False  # also every other declared kind, built from its ``visible``
    modes: tuple[str, ...] = MODES
    head_dim_min: int = 1
    head_dim_max: int = 4096
    gqa: bool = True  # heads_q != heads_kv
    cross_attention: bool = True  # seq_q != seq_k
    dv_differs: bool = True  # head_dim_v != head_dim
    requires: tuple[str, ...] = ()  # importable modules needed at all
    lengths: bool = False  # packed variable-length batches (a case's ``lengths``)
    dense: bool = True  # False: packed batches only (a baseline defined by its padding)
    paged: bool = False  # a paged KV cache (a case's ``page_size``, core/paging.py)

    def __post_init__(self):
        masks_mod.check_listing(self.masks)

    def reasons(self, case: Case) -> list[str]:
        out = []
        dev = torch.device(case.device).type
        if dev not in self.devices:
            out.append(f"device {dev} not supported (supports {', '.join(self.devices)})")
        if case.dtype not in self.dtypes:
            out.append(f"dtype {case.dtype} not supported (supports {', '.join(self.dtypes)})")
        if case.mask_spec.kind not in self.masks and not self.any_mask:
            out.append(f"mask {case.mask} not supported (supports {', '.join(self.masks)})")
        if case.mode not in self.modes:
            out.append(f"mode {case.mode} not supported (supports {', '.join(self.modes)})")
        if not (self.head_dim_min <= case.head_dim <= self.head_dim_max):
            out.append(f"head_dim {case.head_dim} outside "
                       f"[{self.head_dim_min}, {self.head_dim_max}]")
        if not self.gqa and case.heads_q != case.heads_kv:
            out.append("grouped-query attention (heads_q != heads_kv) not supported")
        if not self.cross_attention and case.seq_q != case.seq_k:
            out.append("cross-attention (seq_q != seq_k) not supported")
        if not self.dv_differs and case.head_dim_v != case.head_dim:
            out.append("head_dim_v != head_dim not supported")
        if not case.lengths and not self.dense:
            out.append("needs a packed batch (a lengths axis): it is the padded baseline of "
                       "one")
        if case.page_size and not self.paged:
            out.append(f"page_size {case.page_size}, pages {case.pages}: not yet implemented "
                       f"for a paged cache")
        elif case.page_size and case.lengths and lengths_axis.unavailable_reason(case.lengths):
            out.append(lengths_axis.unavailable_reason(case.lengths))
        elif case.page_size:  # its lengths are context lengths, not a packed batch
            pass
        elif case.lengths and not self.lengths:
            out.append(f"lengths {case.lengths}: not yet implemented for packed batches")
        elif case.lengths and lengths_axis.unavailable_reason(case.lengths):
            out.append(lengths_axis.unavailable_reason(case.lengths))
        return out


@dataclass
class Prepared:
    """The timed closure and how to read outputs back from what it returns."""

    fn: Callable[[], Any]
    outputs: Callable[[Any], dict[str, torch.Tensor]]
    extras: dict[str, Any] = field(default_factory=dict)  # e.g. kernel name, compile seconds


class Backend:
    name: str = ""
    description: str = ""
    caps: Capabilities = Capabilities()
    semantics: str = EXACT
    # The parameters this backend reads on every case, declared once with their limits
    # (core/params.py; the built-in ones in core/knobs.py): suites are checked against
    # them, a case holds their values (``Case.param``), and a line of its records may be
    # named by them (``reads_knob``).
    params: dict[str, params_mod.Param] = {}

    # ---- availability and support -------------------------------------
    def is_available(self) -> tuple[bool, str]:
        """Whether this backend can run on this machine at all, and if not, why."""
        for module in self.caps.requires:
            if importlib.util.find_spec(module) is None:
                return False, f"module {module!r} is not installed"
            try:
                importlib.import_module(module)
            except Exception as exc:  # a broken install is as unavailable as a missing one
                first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
                return False, f"module {module!r} fails to import: {type(exc).__name__}: {first}"
        return True, ""

    def not_supported_reasons(self, case: Case) -> list[str]:
        """Readable reasons this case cannot run here; an empty list means supported."""
        return self.caps.reasons(case) + self.param_reasons(case) + self.extra_reasons(case)

    def param_reasons(self, case: Case) -> list[str]:
        """Its declared parameters whose values on ``case`` are not allowed."""
        values = {n: self.param(case, n) for n in self.params}
        return params_mod.reasons(self.name, self.params, values)

    def param(self, case: Case, name: str):
        """The value of its declared parameter ``name`` on ``case``, else its default."""
        return case.param(name, self.params[name].default)

    def reads_knob(self, knob: str, mask: str) -> bool:
        """Whether the case knob ``knob`` changes what this backend computes on a case with
        ``mask``: its declared parameters, the block knobs on a block-sparse mask, the scale."""
        return knob in self.params or knob == "scale" or (
            knob in Case.BLOCK_GEOMETRY and str(mask).startswith("block_sparse"))

    def extra_reasons(self, case: Case) -> list[str]:
        """Backend-specific limits that capabilities data cannot express."""
        return []

    # ---- computation ----------------------------------------------------
    def build(self, case: Case, inputs: Inputs) -> Callable[[torch.Tensor, torch.Tensor,
                                                             torch.Tensor], torch.Tensor]:
        """Do all setup and return a differentiable ``f(q, k, v) -> out`` (B, Hq, Nq, Dv)."""
        raise NotImplementedError

    # Modules besides the backend's own whose code decides its numbers (e.g. its kernels).
    code_modules: tuple[str, ...] = ()
    # Other source files that decide them (C++ kernels built at run time).
    code_files: tuple[Path, ...] = ()

    def code_hash(self) -> str:
        """Short hash of the backend's source (its module and ``code_modules``), so a
        comparison across commits can tell when the backend itself changed."""
        h = hashlib.sha256()
        for name in (type(self).__module__, *self.code_modules):
            try:  # read the file without importing it (kernel modules import lazily)
                spec = importlib.util.find_spec(name)
                h.update(Path(spec.origin).read_bytes())
            except (AttributeError, OSError, TypeError, ImportError, ValueError):
                h.update(name.encode())
        for path in self.code_files:
            try:
                h.update(Path(path).read_bytes())
            except OSError:
                h.update(str(path).encode())
        return h.hexdigest()[:12]

    def work_flops(self, case: Case) -> float:
        """FLOPs this backend performs for the case: the rate (tflops) is computed from it.
        Exact backends do the visible pairs' work; others override (computed tiles,
        feature maps, additive scores)."""
        return case.flops

    def approximation(self, case: Case) -> str:
        """How this backend departs from the case's softmax attention (e.g. the block layout
        it keeps); empty when it computes the case exactly. Only approximate backends."""
        return ""

    def impl_reference(self, case: Case, inputs: Inputs):
        """Float64 evaluation of the function this backend claims to compute.

        ``None`` means the case's exact softmax reference (exact backends).
        """
        return None

    def prepare(self, case: Case, inputs: Inputs) -> Prepared:
        """All setup, outside timing; returns the zero-argument closure for ``case.mode``."""
        f = self.build(case, inputs)
        return wrap_mode(f, case, inputs)

    def __repr__(self) -> str:
        return f"<backend {self.name}>"


def wrap_mode(f, case: Case, inputs: Inputs) -> Prepared:
    """The timed closure of each mode around a differentiable attention function."""
    prepared = _mode_closure(f, case, inputs)
    if case.page_size:  # a paged case's records say what its cache and page table were
        prepared.extras.update(paging.record_columns(case))
    elif case.lengths:  # a packed case's records say what its documents were
        prepared.extras.update(lengths_axis.record_columns(case))
    return prepared


def _mode_closure(f, case: Case, inputs: Inputs) -> Prepared:
    if case.mode == "fwd":

        def run_fwd():
            with torch.no_grad():
                return f(inputs.q, inputs.k, inputs.v)

        return Prepared(run_fwd, lambda out: {"out": out})

    q, k, v = (t.detach().requires_grad_(True) for t in (inputs.q, inputs.k, inputs.v))
    go = inputs.grad_out

    def grads_of(out):
        return torch.autograd.grad(out, (q, k, v), go, retain_graph=case.mode == "bwd")

    if case.mode == "bwd":
        with torch.enable_grad():
            out = f(q, k, v)  # untimed forward; the closure is the backward alone
        fixed_out = out.detach()

        def run_bwd():
            return grads_of(out)

        return Prepared(run_bwd, lambda g: {"out": fixed_out, "dq": g[0], "dk": g[1],
                                            "dv": g[2]})

    def run_fwd_bwd():
        with torch.enable_grad():
            out = f(q, k, v)
            return (out.detach(), *grads_of(out))

    return Prepared(run_fwd_bwd, lambda r: {"out": r[0], "dq": r[1], "dk": r[2], "dv": r[3]})
