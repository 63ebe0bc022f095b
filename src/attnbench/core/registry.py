"""Finds backends: built-ins in ``attnbench.implementations``, the entry-point group
``attnbench.backends``, and modules named in ``$ATTNBENCH_PLUGINS`` (comma-separated;
handy for tests and local experiments, and inherited by the isolated worker process).

A module that fails to import does not hide the others: it is listed as an
unavailable backend carrying the import error as its reason.
"""

from __future__ import annotations

import importlib
import os
import pkgutil
from importlib import metadata

from attnbench.core.backend import Backend, Capabilities

ENTRY_POINT_GROUP = "attnbench.backends"
PLUGIN_ENV = "ATTNBENCH_PLUGINS"

_cache: dict[str, Backend] | None = None


class BrokenBackend(Backend):
    """Stands in for a backend module that could not be imported."""

    def __init__(self, name: str, reason: str):
        self.name = name
        self.reason = reason
        self.caps = Capabilities()

    def is_available(self):
        return False, self.reason


def _as_backends(obj) -> list[Backend]:
    if isinstance(obj, Backend):
        return [obj]
    if isinstance(obj, type) and issubclass(obj, Backend):
        return [obj()]
    if isinstance(obj, (list, tuple)):
        return [b for item in obj for b in _as_backends(item)]
    if callable(obj):
        return _as_backends(obj())
    raise TypeError(f"not a backend: {obj!r}")


def _from_module(module_name: str, found: dict[str, Backend]) -> None:
    short = module_name.rsplit(".", 1)[-1]
    try:
        module = importlib.import_module(module_name)
        backends = _as_backends(getattr(module, "BACKENDS", []))
    except Exception as exc:
        found.setdefault(short, BrokenBackend(short, f"{module_name} failed to import: "
                                                     f"{type(exc).__name__}: {exc}"))
        return
    for b in backends:
        found[b.name] = b


def discover() -> dict[str, Backend]:
    found: dict[str, Backend] = {}
    import attnbench.implementations as impl

    for info in sorted(pkgutil.iter_modules(impl.__path__), key=lambda m: m.name):
        if not info.name.startswith("_"):
            _from_module(f"{impl.__name__}.{info.name}", found)
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        try:
            for b in _as_backends(ep.load()):
                found[b.name] = b
        except Exception as exc:
            found.setdefault(ep.name, BrokenBackend(ep.name, f"entry point {ep.value} failed: "
                                                             f"{type(exc).__name__}: {exc}"))
    for module_name in filter(None, os.environ.get(PLUGIN_ENV, "").split(",")):
        _from_module(module_name.strip(), found)
    return found


def all_backends(refresh: bool = False) -> dict[str, Backend]:
    global _cache
    if _cache is None or refresh:
        _cache = discover()
    return _cache


def get_backend(name: str) -> Backend:
    backends = all_backends()
    if name not in backends:
        raise KeyError(f"unknown backend {name!r}; known: {', '.join(sorted(backends))}")
    return backends[name]
