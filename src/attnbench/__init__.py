"""attnbench: benchmark and profile attention backends against a float64 reference."""

# The public names are imported when first used (PEP 562), so that ``attnbench run`` starts
# without torch, pandas and matplotlib loaded before its command line is read: a Ctrl-C or a
# bad option during start-up is then answered by the CLI in one line, not a traceback.
_PUBLIC = {"attention": "attnbench.api", "reference": "attnbench.api",
           "list_backends": "attnbench.api", "load_results": "attnbench.api",
           "case_for": "attnbench.api", "ApproximationWarning": "attnbench.api",
           "Case": "attnbench.core.case", "Inputs": "attnbench.core.case",
           "NotSupported": "attnbench.core.errors", "BadInput": "attnbench.core.errors"}

__all__ = ["attention", "reference", "list_backends", "load_results", "case_for", "Case",
           "Inputs", "NotSupported", "BadInput", "ApproximationWarning"]
__version__ = "0.1.0"


def __getattr__(name: str):
    if name in _PUBLIC:
        import importlib

        value = getattr(importlib.import_module(_PUBLIC[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'attnbench' has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + list(_PUBLIC))
