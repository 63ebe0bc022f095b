"""The benchmark case: one point of a sweep, with its key, counts and inputs."""

from __future__ import annotations

import ast
import dataclasses
import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING

from attnbench.core import block_layouts, knobs, paging, pretrained
from attnbench.core import inputs as inputs_kinds
from attnbench.core import lengths as lengths_axis
from attnbench.core import params as params_mod
from attnbench.core.dtypes import canonical_dtype, element_size, torch_dtype
from attnbench.core.masks import Geometry, MaskSpec

if TYPE_CHECKING:  # a case is made, keyed and counted without torch (a suite's load and
    import torch  # size check); its tensors (inputs, layout) import it where they are made

MODES = ("fwd", "bwd", "fwd_bwd")
_UNDECLARED = object()
# A key's core fields (``Case.key``); a mask may hold "-" (window(-1,2)).
_KEY_HEAD = re.compile(r"b(\d+)-hq(\d+)-hkv(\d+)-q(\d+)-k(\d+)-d(\d+)-dv(\d+)-(\w+)-"
                       r"(cpu|cuda(?::\d+)?)-(.+)-(fwd_bwd|fwd|bwd)-s(\d+)")


def _key_value(name: str, raw: str):
    """A knob's value as a key writes it, read back."""
    kind = knobs.BUILT_IN[name].kind if name in knobs.BUILT_IN else {
        "scale": float, "page_size": int}.get(name, str)
    return ast.literal_eval(raw) if kind is tuple else kind(raw)


def _canonical(params) -> tuple:
    """A case's parameters as sorted (name, value) pairs: a built-in one at its declared
    default left out, a plugin's value as its text reads back (so one set has one key)."""
    if isinstance(params, str):
        params = params_mod.parse(params)
    out = {}
    for name, value in (params.items() if isinstance(params, Mapping) else params):
        if name == "block_pairs":
            value = tuple(tuple(int(x) for x in p) for p in value)
        elif name not in knobs.BUILT_IN:
            value = params_mod.parse(f"{name}={value}")[name]
        if name not in knobs.BUILT_IN or value != knobs.BUILT_IN[name].default:
            out[name] = value
    return tuple(sorted(out.items()))


@functools.cache
def _knob_split(cls) -> re.Pattern:
    names = "|".join(sorted(cls.knob_fields(), key=len, reverse=True))
    return re.compile(rf"-(?=(?:{names})=)")


# FLOPs of a mode as a multiple of the forward pass (FlashAttention's convention).
MODE_FLOP_FACTOR = {"fwd": 1.0, "bwd": 2.5, "fwd_bwd": 3.5}


@dataclass(frozen=True)
class Inputs:
    q: torch.Tensor  # (B, Hq, Nq, D)
    k: torch.Tensor  # (B, Hkv, Nk, D)
    v: torch.Tensor  # (B, Hkv, Nk, Dv)
    grad_out: torch.Tensor | None = None  # (B, Hq, Nq, Dv), backward modes only
    info: dict = field(default_factory=dict)  # what a record says about them (source, hash)

    @property
    def nbytes(self) -> int:
        ts = [self.q, self.k, self.v] + ([self.grad_out] if self.grad_out is not None else [])
        return sum(t.numel() * t.element_size() for t in ts)


@dataclass(frozen=True)
class Case:
    batch: int = 1
    heads_q: int = 8
    heads_kv: int = 8
    seq_q: int = 1024
    seq_k: int = 1024
    head_dim: int = 64
    head_dim_v: int = 64
    dtype: str = "float32"
    device: str = "cpu"
    mask: str = "none"
    mode: str = "fwd"
    seed: int = 0
    scale: float | None = None  # None means 1/sqrt(head_dim)
    inputs: str = "randn"  # what q, k, v look like (core/inputs.py); randn stays out of keys
    lengths: str = ""  # packed documents per row (core/lengths.py); "" (dense) stays out of keys
    page_size: int = 0  # a paged KV cache's tokens per page (core/paging.py); 0: contiguous
    pages: str = ""  # the page table's layout (core/paging.py); "" without paging
    # The backends' parameters (declared by them: core/knobs.py, a plugin's own module),
    # as sorted (name, value) pairs without those at their declared defaults; given as a
    # mapping, as core/params.py's text ("alpha=2"), or by name (``Case(block_size=32)``).
    # Read with ``param``, which applies the declared default.
    params: tuple = ()

    def __post_init__(self):
        object.__setattr__(self, "dtype", canonical_dtype(self.dtype))
        object.__setattr__(self, "mask", str(MaskSpec.parse(self.mask)))
        object.__setattr__(self, "params", _canonical(self.params))
        if self.mode not in MODES:
            raise ValueError(f"unknown mode {self.mode!r}; allowed: {', '.join(MODES)}")
        for name in ("batch", "heads_q", "heads_kv", "seq_q", "seq_k", "head_dim",
                     "head_dim_v", "block_size"):
            if self.column(name) <= 0:
                raise ValueError(f"{name} must be a positive integer, got {self.column(name)}")
        if self.heads_q % self.heads_kv:
            raise ValueError(
                f"heads_q ({self.heads_q}) must be a multiple of heads_kv ({self.heads_kv})")
        object.__setattr__(self, "inputs", str(inputs_kinds.parse(self.inputs)))
        if self.lengths:
            object.__setattr__(self, "lengths", str(lengths_axis.parse(self.lengths)))
        object.__setattr__(self, "pages", paging.check(self.page_size, self.pages))

    def column(self, name: str):
        """What a record's column ``name`` holds for this case: a field, or a built-in
        parameter's value (its default when not given); None for any other name."""
        if name in self.__dataclass_fields__ and name != "params":
            return getattr(self, name)
        return self.param(name, None)

    # ---- backend parameters ---------------------------------------------
    @cached_property
    def _params(self) -> dict:
        return dict(self.params)

    def param(self, name: str, default=_UNDECLARED):
        """The value of backend parameter ``name`` on this case: the one it was given, else
        the declared default (core/knobs.py's, or ``default``: a plugin's declaration)."""
        if name in self._params:
            return self._params[name]
        if name in knobs.BUILT_IN:
            return knobs.BUILT_IN[name].default
        if default is _UNDECLARED:
            raise KeyError(f"{name!r} is no parameter this case was given or core declares")
        return default

    def with_params(self, **values) -> Case:
        """This case with backend parameters set (built-in or a plugin's)."""
        return dataclasses.replace(self, params=self._params | values)

    @property
    def own_params(self) -> dict:
        """The parameters no built-in backend declares (a plugin's), as given."""
        return {n: v for n, v in self.params if n not in knobs.BUILT_IN}

    # ---- identity -------------------------------------------------------
    CORE_FIELDS = ("batch", "heads_q", "heads_kv", "seq_q", "seq_k", "head_dim", "head_dim_v",
                   "dtype", "device", "mask", "mode", "seed")

    # Knobs of the attention problem itself; the other knobs are backend parameters
    # (``Backend.params``), part of a record's identity only on the backend that reads them.
    PROBLEM_KNOBS = ("scale", "inputs", "lengths", "page_size", "pages")
    # A block_sparse(...) mask's geometry: the problem's on those masks, a parameter elsewhere.
    BLOCK_GEOMETRY = tuple(knobs.BLOCK)

    @classmethod
    def knob_fields(cls) -> tuple[str, ...]:
        """The names a key writes after the core fields, in its order: the built-in
        parameters, the problem's knobs, then a plugin's parameters as ``params=...``."""
        return (*knobs.BUILT_IN, *cls.PROBLEM_KNOBS, "params")

    @classmethod
    def columns(cls) -> tuple[str, ...]:
        """The case's columns in a record, in order (``to_dict``)."""
        return cls.CORE_FIELDS + cls.knob_fields()

    @classmethod
    def problem_knobs(cls, mask: str) -> tuple[str, ...]:
        """The knobs that are part of the problem on a case with ``mask``."""
        block = str(mask).startswith("block_sparse")
        return cls.PROBLEM_KNOBS + (cls.BLOCK_GEOMETRY if block else ())

    @classmethod
    def problem_of(cls, key: str, mask: str) -> str:
        """The problem part of a case key, written now or before backend parameters were
        given per backend (then every knob was in every backend's key): the key with its
        backend-parameter knobs dropped. What records of different backends join on."""
        keep = cls.problem_knobs(mask)
        first, *rest = _knob_split(cls).split(str(key))
        return "-".join([first, *(k for k in rest if k.split("=", 1)[0] in keep)])

    @classmethod
    def identity_of(cls, key: str, mask: str, reads) -> str:
        """A recorded key as its backend's records are keyed now: the problem, plus the
        knobs ``reads(name)`` says that backend reads (a key written when every knob was
        in every backend's key loses the others)."""
        keep = cls.problem_knobs(mask)
        first, *rest = _knob_split(cls).split(str(key))
        return "-".join([first, *(k for k in rest if k.split("=", 1)[0] in keep
                                  or reads(k.split("=", 1)[0]))])

    @classmethod
    def from_key(cls, key: str) -> Case:
        """The case a key names (``key`` read back): what proves keys written before the
        parameters left the case's fields still name the same case."""
        match = _KEY_HEAD.fullmatch(_knob_split(cls).split(key, 1)[0])
        if not match:
            raise ValueError(f"not a case key: {key!r}")
        *ints, dtype, device, mask, mode, seed = match.groups()
        names = ("batch", "heads_q", "heads_kv", "seq_q", "seq_k", "head_dim", "head_dim_v")
        fields = dict(zip(names, map(int, ints))) | dict(
            dtype=dtype, device=device, mask=mask, mode=mode, seed=int(seed))
        for part in _knob_split(cls).split(key)[1:]:
            name, raw = part.split("=", 1)
            fields[name] = _key_value(name, raw)
        return cls(**fields)

    @cached_property
    def problem(self) -> str:
        return self.problem_of(self.key, self.mask)

    @cached_property
    def key(self) -> str:
        """Stable string identity, used for resume and for joins across runs."""
        parts = [f"b{self.batch}", f"hq{self.heads_q}", f"hkv{self.heads_kv}",
                 f"q{self.seq_q}", f"k{self.seq_k}", f"d{self.head_dim}", f"dv{self.head_dim_v}",
                 self.dtype, self.device, self.mask, self.mode, f"s{self.seed}"]
        parts += [f"{name}={self._params[name]}" for name in knobs.BUILT_IN
                  if name in self._params]  # the order they had as fields; defaults left out
        for name in self.PROBLEM_KNOBS:
            value = getattr(self, name)
            if value != self.__dataclass_fields__[name].default:
                parts.append(f"{name}={value}")
        if self.own_params:
            parts.append(f"params={params_mod.text(self.own_params)}")
        return "-".join(str(p).replace(" ", "") for p in parts)

    def to_dict(self) -> dict:
        """The columns of a record: every built-in parameter at its value (defaults too),
        a plugin's as core/params.py's text."""
        d = {name: getattr(self, name) for name in self.CORE_FIELDS}
        d |= {name: self.param(name) for name in knobs.BUILT_IN}
        d["block_pairs"] = [list(p) for p in d["block_pairs"]]
        d |= {name: getattr(self, name) for name in self.PROBLEM_KNOBS}
        d["params"] = params_mod.text(self.own_params)
        return d

    def replace(self, **changes) -> Case:
        """This case with fields changed; a backend parameter's name sets that parameter."""
        return dataclasses.replace(self, **changes)

    # ---- derived --------------------------------------------------------
    @cached_property
    def mask_spec(self) -> MaskSpec:
        """The mask on this case's lengths: a window bound past them is cut to their reach."""
        return MaskSpec.parse(self.mask).clamped(self.seq_q, self.seq_k)

    @property
    def inputs_spec(self) -> inputs_kinds.InputsSpec:
        return inputs_kinds.parse(self.inputs)

    def inputs_problem(self) -> str | None:
        """Why this shape cannot hold its inputs (a captured model's head count and length,
        a rank above head_dim...), or None. Not raised by the constructor, so that a case
        can be re-shaped freely (the runner blanks lengths to group cases)."""
        if self.page_size:  # a decode step: lengths are its context lengths, one per sequence
            if paging.shape_problem(self):
                return paging.shape_problem(self)
        elif self.lengths and lengths_axis.shape_problem(self.lengths, self.seq_q, self.seq_k,
                                                       self.mask):
            return lengths_axis.shape_problem(self.lengths, self.seq_q, self.seq_k, self.mask)
        spec = self.inputs_spec
        try:
            if spec.captured:
                pretrained.check_shape(spec.knobs[0], self.heads_q, self.heads_kv,
                                            self.seq_q, self.seq_k, self.head_dim,
                                            self.head_dim_v)
            else:
                inputs_kinds.check_shape(spec, self.head_dim, self.seq_k)
        except ValueError as exc:
            return str(exc)
        return None

    @property
    def torch_dtype(self) -> torch.dtype:
        return torch_dtype(self.dtype)

    @property
    def group_size(self) -> int:
        return self.heads_q // self.heads_kv

    @property
    def softmax_scale(self) -> float:
        return self.scale if self.scale is not None else self.head_dim ** -0.5

    @cached_property
    def block_layout(self) -> torch.Tensor | None:
        """Boolean (n_q_blocks, n_k_blocks) layout for block_sparse masks, else None."""
        spec = self.mask_spec
        if spec.kind != "block_sparse":
            return None
        return self.layout_named(spec.layout)

    def layout_named(self, name: str) -> torch.Tensor:
        """Boolean (n_q_blocks, n_k_blocks) layout ``name`` with this case's block knobs."""
        return block_layouts.make_layout(name, self.seq_q, self.seq_k,
                                         self.param("block_size"), **self.layout_knobs)

    @property
    def layout_knobs(self) -> dict:
        """The block knobs a layout reads, as ``make_layout`` takes them."""
        p = self.param
        return dict(band=p("block_band"), global_blocks=p("block_global"),
                    random_blocks=p("block_random"), seed=self.seed, pairs=p("block_pairs"),
                    stride=p("block_stride"))

    @cached_property
    def visible_pairs(self) -> int:
        if self.page_size:  # a paged decode step: each sequence's context
            return paging.visible_pairs_per_sequence(self)
        if self.lengths:  # a packed batch: pairs within each document, per row
            return lengths_axis.visible_pairs_per_row(self.lengths, self.batch, self.seq_q,
                                                      self.seed, self.mask == "causal")
        return self.mask_spec.pairs(self.mask_geometry)  # as the mask's kind counts them

    @property
    def mask_geometry(self) -> Geometry:
        """What this case's mask is laid over; a block layout by its knobs, so that it is
        counted once per geometry and never copied to be counted."""
        return Geometry(self.seq_q, self.seq_k, self.param("block_size"),
                        layout_knobs=tuple(self.layout_knobs.items()))

    @property
    def density(self) -> float:
        return self.visible_pairs / (self.seq_q * self.seq_k)

    def _flops_for(self, pairs: int) -> float:
        # QK^T costs 2*D per pair, PV costs 2*Dv per pair: 4*pairs*D when Dv == D.
        fwd = 2.0 * self.batch * self.heads_q * pairs * (self.head_dim + self.head_dim_v)
        return fwd * MODE_FLOP_FACTOR[self.mode]

    @property
    def flops(self) -> float:
        """FLOPs of this mode counting only the visible query-key pairs."""
        return self._flops_for(self.visible_pairs)

    @property
    def flops_dense(self) -> float:
        """Dense-equivalent FLOPs (all seq_q x seq_k pairs), a common axis for approximations."""
        return self._flops_for(self.seq_q * self.seq_k)

    @property
    def bytes(self) -> float:
        """Minimum memory traffic: each input read once, each output written once."""
        e = element_size(self.dtype)
        q = self.batch * self.heads_q * self.seq_q * self.head_dim
        kv = self.batch * self.heads_kv * self.seq_k * (self.head_dim + self.head_dim_v)
        if self.page_size:  # the KV a paged decode step reads: its contexts, not the pool
            kv = paging.kv_read_bytes(self) / e
        o = self.batch * self.heads_q * self.seq_q * self.head_dim_v
        fwd = q + kv + o
        bwd = (q + kv + 2 * o) + (q + kv)  # read q,k,v,o,dO; write dq,dk,dv
        return e * {"fwd": fwd, "bwd": bwd, "fwd_bwd": fwd + bwd}[self.mode]

    @property
    def needs_grad(self) -> bool:
        return self.mode in ("bwd", "fwd_bwd")

    def make_inputs(self, device: str | torch.device | None = None) -> Inputs:
        """Deterministic inputs from ``seed`` and ``inputs``, the same values in every dtype.
        On a GPU they are drawn there (drawing 16K tokens x 2048 on the CPU took seconds per
        case), so GPU and CPU cases with one seed hold different values. Captured inputs
        raise RuntimeError with the install command when the model is missing."""
        import torch

        from attnbench.core import inputs_captured

        B, Hq, Hkv, Nq, Nk, D, Dv = (self.batch, self.heads_q, self.heads_kv, self.seq_q,
                                     self.seq_k, self.head_dim, self.head_dim_v)
        dev = torch.device(device or self.device)
        draw_on = dev if dev.type == "cuda" else torch.device("cpu")
        gen = torch.Generator(device=draw_on).manual_seed(self.seed)
        spec = self.inputs_spec
        if self.inputs_problem():
            raise ValueError(self.inputs_problem())

        def make(*shape):
            return torch.randn(*shape, generator=gen, device=draw_on)

        def cast(t):
            return t.to(device=dev, dtype=self.torch_dtype)

        info: dict = {}
        if spec.captured:
            why = inputs_captured.unavailable_reason()
            if why:
                raise RuntimeError(why)
            q, k, v, info = inputs_captured.captured_qkv(spec.knobs[0], B, Hq, Hkv, Nq, Nk,
                                                         self.seed)
        else:
            q = make(B, Hq, Nq, D)
            k = make(B, Hkv, Nk, D)
            v = make(B, Hkv, Nk, Dv)
        grad_out = make(B, Hq, Nq, Dv) if self.needs_grad else None  # drawn last: q, k, v
        # do not depend on it
        if spec.kind in inputs_kinds.SYNTHETIC:  # structure from its own stream, so q, k
            structure = torch.Generator(device=draw_on).manual_seed(self.seed + 1_000_003)
            q, k = inputs_kinds.shape_synthetic(spec, q, k, self.softmax_scale, structure)
        return Inputs(cast(q), cast(k), cast(v),
                      None if grad_out is None else cast(grad_out), info)


_generated_init = Case.__init__


def _init(self, *args, **fields):
    """A built-in parameter given by name (``Case(block_size=32)``, a record's columns)
    joins the case's ``params``."""
    named = {n: fields.pop(n) for n in [n for n in fields if n in knobs.BUILT_IN]}
    if named:
        given = _canonical(fields.get("params", ()))
        fields["params"] = dict(given) | named
    _generated_init(self, *args, **fields)


Case.__init__ = _init
