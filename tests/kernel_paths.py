"""Both paths of the blocked backends' fp32 forward: the fused kernel (the default where it
builds) and the eager blocked ops (where it does not), each against the same references."""

import pytest

from attnbench.implementations import _native
from attnbench.implementations import _segment_attention as segments

# Where the C++ kernels cannot be built at all (no compiler, no AVX2, switched off), their
# tests skip with the reason; where they can, a failed build fails those tests.
needs_native = pytest.mark.skipif(bool(_native._why_not()),
                                  reason=f"native kernels not built here: {_native._why_not()}")

# "fwd-eager": the fp32 forward with the fused kernel switched off.
MODES = ["fwd", "fwd-eager", "fwd_bwd"]


def on_path(mode: str, monkeypatch) -> str:
    """The case mode for a parametrized ``mode``; "fwd-eager" turns the fused path off."""
    if mode == "fwd-eager":
        monkeypatch.setattr(segments, "fused_applies", lambda *args: False)
        return "fwd"
    return mode
