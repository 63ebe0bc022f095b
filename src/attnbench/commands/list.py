"""``attnbench list``: every backend, available or not, with the reason and capabilities."""

from __future__ import annotations

import dataclasses
import json
import os
import sys


def add_parser(sub) -> None:
    ls = sub.add_parser("list", help="list backends with availability, reasons and "
                                     "capabilities")
    ls.add_argument("--json", action="store_true")
    ls.set_defaults(func=run)


def capabilities_text(caps, params=()) -> str:
    """One line of what a backend accepts (``Capabilities`` and its declared parameters), as
    ``list`` prints it."""
    parts = [f"devices {', '.join(caps.devices)}", f"dtypes {', '.join(caps.dtypes)}",
             f"masks {', '.join(caps.masks)}", f"modes {', '.join(caps.modes)}",
             f"head_dim {caps.head_dim_min}-{caps.head_dim_max}"]
    limits = {"no GQA": caps.gqa, "no seq_q != seq_k": caps.cross_attention,
              "no head_dim_v != head_dim": caps.dv_differs}
    parts += [what for what, allowed in limits.items() if not allowed]
    if params:
        parts.append(f"knobs {', '.join(params)}")
    if caps.requires:
        parts.append(f"needs {', '.join(caps.requires)}")
    return "; ".join(parts)


def _lines(rows: list[dict], caps: dict) -> list[str]:
    width = max(len(r["name"]) for r in rows) if rows else 10
    out = []
    for r in rows:
        state = "available" if r["available"] else "unavailable"
        out.append(f"{r['name']:<{width}}  {state:<11}  {r['semantics']:<11}  "
                   f"{r['description']}")
        if not r["available"]:
            out.append(f"{'':<{width}}  reason: {r['reason']}")
        out.append(f"{'':<{width}}  supports: {capabilities_text(*caps[r['name']])}")
    return out


def run(args) -> int:
    from attnbench.api import list_backends
    from attnbench.core.registry import all_backends

    rows = list_backends()
    caps = {r["name"]: (all_backends()[r["name"]].caps, all_backends()[r["name"]].params)
            for r in rows}
    if args.json:
        for row in rows:
            cap, params = caps[row["name"]]
            row["capabilities"] = dataclasses.asdict(cap) | {"knobs": list(params)}
        text = json.dumps(rows, indent=2)
    else:
        text = "\n".join(_lines(rows, caps))
    try:
        print(text)
        sys.stdout.flush()
    except BrokenPipeError:  # `attnbench list --json | head`: the reader had enough
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no error at exit
    return 0
