"""Mask kinds declared by tests, not by core: ``prefix(n)``, ``dilated(d)``, ``keys(n)``,
each written out element by element too (``definition``), to check that a new kind reaches
every reader of the declarations."""

from __future__ import annotations

import re
from contextlib import contextmanager

import torch

from attnbench.core import masks
from attnbench.core.masks import MaskKind, MaskSpec

TOYS = ["prefix(3)", "prefix(0)", "dilated(3)", "keys(4)"]


class Prefix(MaskKind):
    """``prefix(n)``: every query sees the first n keys, the others causally (a prefix LM);
    its count in closed form per row."""

    name = "prefix"
    form = "prefix(n)"

    def parse(self, text):
        m = re.fullmatch(r"prefix\((\d+)\)", text)
        return MaskSpec("prefix", args=(int(m.group(1)),)) if m else None

    def text(self, spec):
        return f"prefix({spec.args[0]})"

    def visible(self, spec, geom, q_idx, k_idx):
        return (k_idx < spec.args[0]) | (k_idx <= q_idx + geom.offset)

    def pairs(self, spec, geom):
        prefix = min(spec.args[0], geom.seq_k)
        return sum(max(min(max(i + geom.offset + 1, 0), geom.seq_k), prefix)
                   for i in range(geom.seq_q))


class Dilated(MaskKind):
    """``dilated(d)``: causal, every d-th key back from the diagonal; counted from its
    predicate (no count of its own)."""

    name = "dilated"
    form = "dilated(d)"

    def parse(self, text):
        m = re.fullmatch(r"dilated\(([1-9]\d*)\)", text)
        return MaskSpec("dilated", args=(int(m.group(1)),)) if m else None

    def text(self, spec):
        return f"dilated({spec.args[0]})"

    def visible(self, spec, geom, q_idx, k_idx):
        back = q_idx + geom.offset - k_idx  # keys behind the diagonal
        return (back >= 0) & (back % spec.args[0] == 0)


class Keys(MaskKind):
    """``keys(n)``: the first n keys for every query; its predicate reads the key alone."""

    name = "keys"
    form = "keys(n)"

    def parse(self, text):
        m = re.fullmatch(r"keys\((\d+)\)", text)
        return MaskSpec("keys", args=(int(m.group(1)),)) if m else None

    def text(self, spec):
        return f"keys({spec.args[0]})"

    def visible(self, spec, geom, q_idx, k_idx):
        return k_idx < spec.args[0]  # (1, Nk)


def definition(text: str, nq: int, nk: int) -> torch.Tensor:
    """The toy masks written out element by element, (nq, nk) boolean."""
    kind, n = re.fullmatch(r"(\w+)\((\d+)\)", text).groups()
    n, off = int(n), nk - nq
    rule = {"prefix": lambda i, j: j < n or j <= i + off,
            "dilated": lambda i, j: j <= i + off and (i + off - j) % n == 0,
            "keys": lambda i, j: j < n}[kind]
    return torch.tensor([[rule(i, j) for j in range(nk)] for i in range(nq)],
                        dtype=torch.bool)


KINDS = (Prefix, Dilated, Keys)


@contextmanager
def registered_toys(*extra: type[MaskKind]):
    """The toy kinds (and ``extra`` ones) declared for the ``with`` block, forgotten after."""
    kinds = KINDS + extra
    for kind in kinds:
        masks.register(kind)
    try:
        yield
    finally:
        for kind in kinds:
            masks.unregister(kind.name)
