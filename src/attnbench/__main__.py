"""``python -m attnbench``: the command line, as torchrun starts it (``torchrun ... -m
attnbench run ...``)."""

import sys

from attnbench.cli import main

sys.exit(main())
