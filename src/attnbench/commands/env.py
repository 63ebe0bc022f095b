"""``attnbench env``: the environment a run records."""

from __future__ import annotations

import json


def add_parser(sub) -> None:
    e = sub.add_parser("env", help="print the environment a run would record")
    e.add_argument("--device", default="auto")
    e.set_defaults(func=run)


def run(args) -> int:
    from attnbench.runs.environment import collect
    from attnbench.runs.overrides import resolve_device

    print(json.dumps(collect(resolve_device(args.device)), indent=2))
    return 0
