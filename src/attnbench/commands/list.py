"""``attnbench list``: every backend, available or not, with the reason and capabilities."""

from __future__ import annotations

import dataclasses
import json


def add_parser(sub) -> None:
    ls = sub.add_parser("list", help="list backends with availability and reasons")
    ls.add_argument("--json", action="store_true")
    ls.set_defaults(func=run)


def run(args) -> int:
    from attnbench.api import list_backends
    from attnbench.core.registry import all_backends

    rows = list_backends()
    if args.json:
        for row in rows:
            row["capabilities"] = dataclasses.asdict(all_backends()[row["name"]].caps)
        print(json.dumps(rows, indent=2))
        return 0
    width = max(len(r["name"]) for r in rows) if rows else 10
    for r in rows:
        state = "available" if r["available"] else "unavailable"
        line = f"{r['name']:<{width}}  {state:<11}  {r['semantics']:<11}  {r['description']}"
        print(line)
        if not r["available"]:
            print(f"{'':<{width}}  reason: {r['reason']}")
    return 0
