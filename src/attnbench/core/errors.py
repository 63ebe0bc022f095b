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


class PeerLost(Exception):
    """Under torchrun: another rank died before the run's merge. The CLI says it in one line
    (exit 1); every rank's records are kept and ``--resume`` completes the run."""
