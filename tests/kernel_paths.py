"""Both paths of the blocked backends' fp32 forward: the fused kernel (the default where it
builds) and the eager blocked ops (where it does not), each against the same references."""

from attnbench.implementations import _segment_attention as segments

# "fwd-eager": the fp32 forward with the fused kernel switched off.
MODES = ["fwd", "fwd-eager", "fwd_bwd"]


def on_path(mode: str, monkeypatch) -> str:
    """The case mode for a parametrized ``mode``; "fwd-eager" turns the fused path off."""
    if mode == "fwd-eager":
        monkeypatch.setattr(segments, "fused_applies", lambda *args: False)
        return "fwd"
    return mode
