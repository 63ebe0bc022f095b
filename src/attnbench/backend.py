"""The old import path of ``attnbench.core.backend``, kept for third-party backends:
``attnbench.backend`` is that very module (not a copy), so patches and isinstance agree."""

import sys

from attnbench.core import backend as _backend

sys.modules[__name__] = _backend
