"""Exceptions shared across the harness."""


class NotSupported(Exception):
    """A backend cannot compute this call; the message lists every reason."""

    def __init__(self, backend: str, reasons: list[str]):
        self.backend = backend
        self.reasons = list(reasons)
        super().__init__(f"backend {backend!r} does not support this call: " + "; ".join(reasons))


class BadInput(Exception):
    """User input at fault (suite file, CLI value, device).

    The CLI turns it into a single line on stderr and exit code 2.
    """


LINE_LIMIT = 299  # an error line never grows past this, whatever value it echoes


def shown(value, limit: int = 80) -> str:
    """``repr(value)`` for an error line, elided in the middle past ``limit`` characters (a
    100,000-character bad value is named, not echoed)."""
    text = repr(value)
    if len(text) <= limit:
        return text
    half = (limit - 5) // 2
    return f"{text[:half]} ... {text[-half:]}"


def line(message: str, limit: int = LINE_LIMIT) -> str:
    """``message`` as one line of at most ``limit`` characters (its end elided)."""
    text = " ".join(str(message).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


class PeerLost(Exception):
    """Under torchrun: another rank died before the run's merge. The CLI says it in one line
    (exit 1); every rank's records are kept and ``--resume`` completes the run."""
