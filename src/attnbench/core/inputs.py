"""The ``inputs`` axis: what a case's Q, K and V look like.

``randn`` is every entry a standard normal (what FlashAttention's, xformers' and PyTorch's
tests draw). On it softmax attention is nearly uniform, which says little about approximate
attention on a trained model's attention. The other kinds:

* ``minilm(layer)``: Q, K, V captured from all-MiniLM-L6-v2 (``core/inputs_captured.py``);
* structured synthetic distributions at any N, each one documented knob or two:

  - ``peaked(t)``: queries scaled by ``t``: a softmax ``t`` times sharper, low attention
    entropy;
  - ``sinks(n, m)``: the first ``n`` keys are attention sinks: every query shares a component
    along one direction that those keys point along, so their logit is ``m`` on average;
  - ``lowrank(r)``: Q and K live in an ``r``-dimensional subspace of the head dimension,
    scaled so each entry still has unit variance;
  - ``outliers(c, m)``: ``c`` channels of Q and K are ``m`` times larger, the "massive
    activations" that stress bf16/fp16 kernels (Sun et al. 2024 report 100x and more).

The defaults imitate all-MiniLM-L6-v2's measured properties at N = 256 (print them with
``python -m attnbench.core.inputs_properties``): peaked(2) its middle layer's entropy,
sinks(1,5) that layer's sink mass, outliers(2,4) its first layer's kurtosis; lowrank(8) is
lower than the model's effective key rank (about 24 of 32) on purpose.

A spec is a string, ``name`` or ``name(a, b)``; knobs left out take their defaults.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

# name -> (knob names, defaults, kind of each knob)
SYNTHETIC = {
    "peaked": (("t",), (2.0,), (float,)),
    "sinks": (("n", "m"), (1, 5.0), (int, float)),
    "lowrank": (("r",), (8,), (int,)),
    "outliers": (("c", "m"), (2, 4.0), (int, float)),
}
CAPTURED = {"minilm": (("layer",), (None,), (int,))}
KINDS = ("randn", *CAPTURED, *SYNTHETIC)
FORMS = "randn, minilm(layer), peaked(t), sinks(n,m), lowrank(r), outliers(c,m)"

_SPEC = re.compile(r"^\s*([a-z_]+)\s*(?:\(([^()]*)\))?\s*$")


@dataclass(frozen=True)
class InputsSpec:
    kind: str
    knobs: tuple = ()

    @property
    def captured(self) -> bool:
        return self.kind in CAPTURED

    def __str__(self) -> str:
        if not self.knobs:
            return self.kind
        return f"{self.kind}({','.join(_fmt(x) for x in self.knobs)})"


def _fmt(x) -> str:
    return f"{x:g}" if isinstance(x, float) else str(x)


def parse(text: str) -> InputsSpec:
    """The spec of ``text``; ValueError names the allowed forms."""
    m = _SPEC.match(str(text))
    if not m or m.group(1) not in KINDS:
        raise ValueError(f"unknown inputs {text!r}; allowed: {FORMS}")
    kind, args = m.group(1), m.group(2)
    raw = [a.strip() for a in args.split(",")] if args and args.strip() else []
    if kind == "randn":
        if raw:
            raise ValueError(f"inputs {text!r}: randn takes no knobs")
        return InputsSpec("randn")
    names, defaults, types = (CAPTURED | SYNTHETIC)[kind]
    if len(raw) > len(names):
        raise ValueError(f"inputs {text!r}: {kind} takes {', '.join(names)}")
    knobs = []
    for i, (name, default, typ) in enumerate(zip(names, defaults, types)):
        if i < len(raw):
            try:
                value = typ(raw[i]) if typ is float else int(raw[i])
            except ValueError:
                raise ValueError(f"inputs {text!r}: {name} must be "
                                 f"{'a number' if typ is float else 'an integer'}") from None
        elif default is None:
            raise ValueError(f"inputs {text!r}: {kind} needs {name}")
        else:
            value = default
        if (typ is int and value < (0 if kind == "minilm" else 1)) or (
                typ is float and not (math.isfinite(value) and value > 0)):
            raise ValueError(f"inputs {text!r}: {name} must be positive")
        knobs.append(value)
    return InputsSpec(kind, tuple(knobs))


def check_shape(spec: InputsSpec, head_dim: int, seq_k: int) -> None:
    """ValueError when a synthetic spec cannot be drawn at this shape."""
    if spec.kind == "lowrank" and spec.knobs[0] > head_dim:
        raise ValueError(f"inputs {spec}: rank {spec.knobs[0]} exceeds head_dim {head_dim}")
    if spec.kind == "outliers" and spec.knobs[0] > head_dim:
        raise ValueError(f"inputs {spec}: {spec.knobs[0]} channels exceed head_dim {head_dim}")
    if spec.kind == "sinks" and spec.knobs[0] >= seq_k:
        raise ValueError(f"inputs {spec}: {spec.knobs[0]} sinks need seq_k > {spec.knobs[0]}")


def shape_synthetic(spec: InputsSpec, q: torch.Tensor, k: torch.Tensor, scale: float,
                    gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Q and K of a synthetic spec made from standard-normal ``q`` (B, Hq, Nq, D) and ``k``
    (B, Hkv, Nk, D), float32; ``gen`` draws the structure (directions, channels, bases).
    V stays standard normal: these distributions shape the attention weights."""
    import torch  # here: parsing a spec (at suite load) needs no torch

    D = q.shape[-1]
    if spec.kind == "peaked":
        return q * spec.knobs[0], k
    if spec.kind == "sinks":
        n, margin = spec.knobs
        u = torch.randn(D, generator=gen, device=q.device)
        u = u / u.norm()  # (D,)
        a = math.sqrt(margin / scale)  # logit of a sink: (q + a u) . (a u) * scale ~ margin
        q = q + a * u
        k = k.clone()
        k[:, :, :n, :] = a * u
        return q, k
    if spec.kind == "lowrank":
        r = spec.knobs[0]
        basis = torch.linalg.qr(torch.randn(D, r, generator=gen, device=q.device))[0]  # (D, r)
        proj = basis.T * math.sqrt(D / r)  # (r, D): unit variance per entry after mixing
        return q[..., :r] @ proj, k[..., :r] @ proj
    if spec.kind == "outliers":
        c, m = spec.knobs
        channels = torch.randperm(D, generator=gen, device=q.device)[:c]
        gain = torch.ones(D, device=q.device)
        gain[channels] = m
        return q * gain, k * gain
    raise ValueError(f"inputs {spec} is not synthetic")
