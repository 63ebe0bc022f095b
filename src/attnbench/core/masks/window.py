"""``window(left,right)``: a query sees ``left`` keys behind its diagonal and ``right``
ahead (bottom-right aligned, masks/band.py); ``inf`` for a whole side."""

from __future__ import annotations

import re
from dataclasses import replace

from attnbench.core.masks.band import Band, clamp
from attnbench.core.masks.kind import INF, INT64_MAX, MaskSpec, register

_WINDOW = re.compile(r"^window\(\s*(-?\d+|inf)\s*,\s*(-?\d+|inf)\s*\)$")


def _fmt(x: float) -> str:
    return "inf" if x == INF else str(int(x))


@register
class Window(Band):
    name = "window"
    form = "window(left,right)"

    def parse(self, text: str) -> MaskSpec | None:
        m = _WINDOW.match(text)
        if not m:
            return None
        left, right = (INF if g == "inf" else int(g) for g in m.groups())
        if left < 0 or right < 0:
            raise ValueError(f"window bounds must be >= 0, got {text!r}")
        for bound in (left, right):
            if bound != INF and bound > INT64_MAX:
                raise ValueError(f"window bound beyond int64; allowed: at most "
                                 f"{INT64_MAX}, or inf for the whole side")
        return MaskSpec("window", left, right)

    def text(self, spec: MaskSpec) -> str:
        return f"window({_fmt(spec.left)},{_fmt(spec.right)})"

    def clamped(self, spec: MaskSpec, seq_q: int, seq_k: int) -> MaskSpec:
        """A finite bound at or past what the sequences can reach means the whole side, so
        it is cut to that reach (``seq_k - 1`` keys back, ``seq_q - 1`` ahead): the same
        visible pairs, bounds any tensor holds."""
        left, right = clamp(spec.left, spec.right, seq_q, seq_k)
        return replace(spec, left=left, right=right)
