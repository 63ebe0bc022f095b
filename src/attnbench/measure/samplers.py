"""Per-group samplers: what the timing loop reads beside the times (device state, energy).

A sampler plugs into the one timing loop (``timing.measure_interleaved``) instead of adding
a loop of its own: ``begin()`` after the warm-up, ``per_call(i)`` (optional) after each
timed call of closure ``i``, and ``end(timings)`` after the last round, which returns one
dict of record fields per closure (the group's fields are the same in each; per-call
figures such as energy differ by the closure's time).

Samplers are registered by name with a factory that, for a device, returns a sampler, a
one-line reason why it cannot run there (said once per run in meta.json, never per record),
or None where it does not apply (a GPU sampler on a CPU run).
The built-in ones live in ``measure/device_state.py``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Protocol

# Modules whose import registers the built-in samplers (imported on first use, so that the
# registry itself imports nothing heavy).
BUILTIN = ("attnbench.measure.device_state",)


class Sampler(Protocol):
    name: str

    def begin(self) -> None: ...

    def end(self, timings: list) -> list[dict]: ...


# device -> a sampler, or why it cannot run there, or None where it does not apply
Factory = Callable[[object], "Sampler | str | None"]

_FACTORIES: dict[str, Factory] = {}
_MADE: dict[tuple[str, str], object] = {}  # (name, device): a sampler or its reason


def register(name: str, factory: Factory) -> None:
    """Add (or replace) a sampler; the next ``for_device`` asks its factory again."""
    _FACTORIES[name] = factory
    for key in [k for k in _MADE if k[0] == name]:
        del _MADE[key]


def unregister(name: str) -> None:
    _FACTORIES.pop(name, None)
    for key in [k for k in _MADE if k[0] == name]:
        del _MADE[key]


def _load_builtins() -> None:
    for module in BUILTIN:
        importlib.import_module(module)


def _made(name: str, device) -> object:
    key = (name, str(device))
    if key not in _MADE:  # once per process: a missing library is not asked for per group
        try:
            _MADE[key] = _FACTORIES[name](device)
        except Exception as exc:  # a sampler that cannot start costs only its fields
            _MADE[key] = f"{type(exc).__name__}: {exc}".splitlines()[0]
    return _MADE[key]


def for_device(device) -> list[Sampler]:
    """The samplers that can run on ``device``, in registration order."""
    _load_builtins()
    made = (_made(n, device) for n in list(_FACTORIES))
    return [s for s in made if s is not None and not isinstance(s, str)]


def unavailable(device) -> dict[str, str]:
    """What cannot be read on ``device`` and why (for meta.json, once per run): a sampler
    that does not run, by name; a part a running sampler cannot read (its ``unreadable``),
    as 'name.part'."""
    _load_builtins()
    out = {}
    for name in list(_FACTORIES):
        made = _made(name, device)
        if isinstance(made, str):
            out[name] = made
        elif made is not None:
            out |= {f"{name}.{k}": v for k, v in getattr(made, "unreadable", {}).items()}
    return out


def reset() -> None:
    """Forget the samplers made so far (tests; a process that changed its device)."""
    _MADE.clear()


class Group:
    """The samplers of one measured group, as the timing loop drives them. A sampler that
    raises loses its fields for this group (said in ``sampler_error``), never the times."""

    def __init__(self, samplers: list[Sampler]):
        self.samplers = list(samplers)
        self.calls = [getattr(s, "per_call", None) for s in self.samplers]
        self.errors: list[str] = []

    def _guard(self, what: str, fn, *args):
        try:
            return fn(*args)
        except Exception as exc:
            self.errors.append(f"{what}: {type(exc).__name__}: {exc}".splitlines()[0])
            return None

    def begin(self) -> None:
        for s in self.samplers:
            self._guard(s.name, s.begin)

    def per_call(self, index: int) -> None:
        for s, call in zip(self.samplers, self.calls):
            if call is not None:
                self._guard(s.name, call, index)

    def end(self, timings: list) -> list[dict]:
        fields: list[dict] = [{} for _ in timings]
        for s in self.samplers:
            got = self._guard(s.name, s.end, timings)
            for into, more in zip(fields, got or []):
                into.update(more)
        if self.errors:
            for into in fields:
                into["sampler_error"] = "; ".join(dict.fromkeys(self.errors))
        return fields
