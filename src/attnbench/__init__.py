"""attnbench: benchmark and profile attention backends against a float64 reference."""

from attnbench.api import (
           ApproximationWarning,
           attention,
           case_for,
           list_backends,
           load_results,
           reference,
)
from attnbench.core.case import Case, Inputs
from attnbench.core.errors import BadInput, NotSupported

__all__ = ["attention", "reference", "list_backends", "load_results", "case_for", "Case",
           "Inputs", "NotSupported", "BadInput", "ApproximationWarning"]
__version__ = "0.1.0"
