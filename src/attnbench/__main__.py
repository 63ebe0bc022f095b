"""``python -m attnbench``: the command line, as torchrun starts it (``torchrun ... -m
attnbench run ...``)."""

import sys

try:
    from attnbench.cli import main
except KeyboardInterrupt:  # Ctrl-C before the command line is even read
    print("attnbench: interrupted", file=sys.stderr)
    sys.exit(130)

sys.exit(main())
