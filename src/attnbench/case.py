"""The old import path of ``attnbench.core.case``, kept for third-party backends:
``attnbench.case`` is that very module (not a copy), so patches and isinstance agree."""

import sys

from attnbench.core import case as _case

sys.modules[__name__] = _case
