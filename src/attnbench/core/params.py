"""Backend parameters as data: each backend declares the case knobs it reads, with their type
and limits, and this module is the one place their values are checked (a suite's load and a
backend's ``not_supported_reasons`` read the same declaration). Torch-free, so a suite loads
without it."""

from __future__ import annotations

from dataclasses import dataclass

INT64_MAX = 2**63 - 1


@dataclass(frozen=True)
class Param:
    """One parameter: its Python type, default, and the values allowed (``choices``, or an
    integer ``minimum``); ``doc`` says what it changes."""

    kind: type
    default: object
    choices: tuple = ()
    minimum: int | None = None
    doc: str = ""

    def allowed(self) -> str:
        if self.choices:
            return ", ".join(str(c) for c in self.choices)
        if self.kind is int:
            return ("an integer" if self.minimum is None else
                    "a positive integer" if self.minimum == 1 else f"an integer >= {self.minimum}")
        return f"a {self.kind.__name__}"

    def problem(self, value) -> str | None:
        """Why ``value`` is not allowed, or None."""
        if self.kind is int:
            if isinstance(value, bool) or not isinstance(value, int) or abs(value) > INT64_MAX:
                return f"allowed: {self.allowed()}"
            if self.minimum is not None and value < self.minimum:
                return f"allowed: {self.allowed()}"
        elif self.kind is str and not isinstance(value, str):
            return f"must be a string; allowed: {self.allowed()}"
        if self.choices and value not in self.choices:
            return f"allowed: {self.allowed()}"
        return None


def reasons(owner: str, params: dict[str, Param], values: dict) -> list[str]:
    """One line per declared parameter whose value in ``values`` is not allowed."""
    out = []
    for name, param in params.items():
        if name in values:
            why = param.problem(values[name])
            if why:
                out.append(f"{name} {values[name]!r}: not allowed by {owner}; {why}")
    return out


def parse(text: str) -> dict:
    """``"alpha=2,mode=x"`` (a case's ``params``) -> {"alpha": 2, "mode": "x"}."""
    out: dict = {}
    for part in filter(None, text.split(",")):
        name, _, raw = part.partition("=")
        out[name] = _value(raw)
    return out


def text(values: dict) -> str:
    """The canonical text of parameter values: sorted by name, so one set has one key."""
    return ",".join(f"{n}={values[n]}" for n in sorted(values))


def _value(raw: str):
    for kind in (int, float):
        try:
            return kind(raw)
        except ValueError:
            pass
    return raw
