"""Command line: ``attnbench run | profile | model | list | env | build | report | publish |
recommend | compare | merge``.

Each command is a module of ``attnbench.commands`` with its parser and handler; this file
only assembles the parser and dispatches. Exit codes: 0 done; 1 the run finished but a
requested gate failed (``--strict``, ``compare --fail-on-regression``); 2 bad input, reported
as one line without a traceback.
"""

from __future__ import annotations

import argparse
import sys

from attnbench.commands import (
    build,
    compare,
    env,
    merge,
    model,
    profile,
    publish,
    recommend,
    report,
    run,
)
from attnbench.commands import list as list_command
from attnbench.core.errors import BadInput, PeerLost, line

# In the order ``attnbench --help`` lists them.
COMMANDS = (run, profile, model, list_command, env, build, report, publish, recommend, compare,
            merge)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="attnbench", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command.add_parser(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    try:  # (a Ctrl-C while the command's modules load is answered like one later)
        args = build_parser().parse_args(argv)
        return args.func(args)
    except BadInput as exc:
        print(line(f"attnbench: error: {exc}"), file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("attnbench: interrupted", file=sys.stderr)
        return 130
    except PeerLost as exc:  # under torchrun: a rank died, the run can be resumed
        print(f"attnbench: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
