"""The report's chart panels, one declaration each: adding a panel kind is one ``register``
call here (its drawing function lives in ``plots``).

A ``Panel`` names its kind (the chart file's prefix), says in a caption what it shows,
which records it applies to, how much a reader needs it (``priority``: the size budget
leaves out the least needed kinds first, whole kinds at a time; ``ESSENTIAL`` and above
are never left out), and draws one SVG from a ``View``: one comparison's records of one
dtype and mode. Panels appear in the order they were registered.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from attnbench.reporting import plots

ESSENTIAL = 100  # a panel at or above this priority stays whatever the budget


@dataclass(frozen=True)
class View:
    """What one panel set draws from: a comparison's records of one dtype and mode."""
    name: str  # the comparison's name, for titles
    where: str  # "float32, fwd"
    records: pd.DataFrame
    speedups: pd.DataFrame  # over the baseline, this facet only; empty without one
    lines: list[str]
    palette: plots.Palette
    baseline: str = ""  # with the baseline's fixed fields, as captions say it
    goals: list[dict] = field(default_factory=list)
    ceilings: dict[str, float] = field(default_factory=dict)  # run -> matmul TFLOP/s

    def title(self, what: str) -> str:
        return f"{what}: {self.name} ({self.where})"


@dataclass(frozen=True)
class Panel:
    name: str  # the kind: the chart file's prefix
    label: str  # what the report calls a left-out kind ("throughput")
    caption: Callable[[View], str]
    applies: Callable[[View], bool]
    draw: Callable[[View, Path], plots.Chart | None]
    priority: int  # lower goes first when the report is over its budget

    @property
    def droppable(self) -> bool:
        return self.priority < ESSENTIAL


REGISTRY: dict[str, Panel] = {}


def register(panel: Panel) -> Panel:
    if panel.name in REGISTRY:
        raise ValueError(f"panel {panel.name!r} is registered already")
    REGISTRY[panel.name] = panel
    return panel


def registered() -> list[Panel]:
    """Every panel kind, in the order a panel set shows them."""
    return list(REGISTRY.values())


def least_needed() -> list[str]:
    """The kinds the budget may leave out, least needed first."""
    return [p.name for p in sorted(registered(), key=lambda p: p.priority) if p.droppable]


def label(kind: str) -> str:
    return REGISTRY[kind].label if kind in REGISTRY else kind


def _packed(records: pd.DataFrame) -> bool:
    """Records of packed batches (a lengths axis) that say their padding fraction."""
    return "lengths_padding_frac" in records and records["lengths_padding_frac"].notna().any()


def _paged(records: pd.DataFrame) -> bool:
    """Records of paged decode steps (a page_size axis) with a measured GB/s."""
    return ("page_size" in records and "gbps" in records
            and ((records["page_size"].fillna(0) > 0) & records["gbps"].notna()).any())


def _any(column: str) -> Callable[[View], bool]:
    return lambda v: column in v.records and v.records[column].notna().any()


register(Panel(
    "time", "time", lambda v: "Median time against N, 95% interval bands",
    lambda v: not v.records.empty,
    lambda v, p: plots.time_chart(v.records, v.title("Time"), p, v.lines, v.palette, v.where),
    ESSENTIAL))
register(Panel(
    "speedup", "speedup", lambda v: f"Speedup over {v.baseline} with 95% intervals",
    lambda v: bool(v.baseline) and not v.speedups.empty,
    lambda v, p: plots.speedup_chart(v.speedups, v.title(f"Speedup over {v.baseline}"), p,
                                     v.lines, v.baseline, v.goals, v.palette, v.where),
    ESSENTIAL))
register(Panel(
    "padding", "time against padding",
    lambda v: "Packed against padded: median time (95% interval) and within-document TFLOP/s "
              "against the batch's padding fraction, one column per mask",
    lambda v: _packed(v.records),
    lambda v, p: plots.padding_chart(v.records, v.title("Time vs padding"), p, v.lines,
                                     v.ceilings, v.palette, v.where),
    6))
register(Panel(
    "pagesize", "GB/s against page size",
    lambda v: "Paged decode: GB/s of the KV read against page size, per page layout, with "
              "the copy roof for as much traffic",
    lambda v: _paged(v.records),
    lambda v, p: plots.page_size_chart(v.records, v.title("GB/s vs page size"), p, v.lines,
                                       v.palette, v.where),
    6))
register(Panel(
    "tflops", "throughput", lambda v: "TFLOP/s against N, with the measured matmul ceiling",
    _any("tflops"),
    lambda v, p: plots.tflops_chart(v.records, v.title("Throughput"), p, v.lines, v.ceilings,
                                    v.palette, v.where),
    1))
register(Panel(
    "memory", "memory",
    lambda v: "Peak memory against N, with the inputs+outputs floor and the N^2 score matrix",
    _any("peak_mem_bytes"),
    lambda v, p: plots.memory_chart(v.records, v.title("Memory"), p, v.lines, v.palette,
                                    v.where),
    2))
register(Panel(
    "error", "error", lambda v: "Error against the float64 evaluation, with the dtype's "
                                "tolerance",
    lambda v: any(c.startswith("err_impl_") and v.records[c].notna().any()
                  for c in v.records.columns),
    lambda v, p: plots.error_chart(v.records, v.title("Error"), p, v.lines, v.palette,
                                   v.where),
    4))
register(Panel(
    "pareto", "error against time", lambda v: "Error against time at each N, the Pareto "
                                              "front marked",
    lambda v: "semantics" in v.records and (v.records["semantics"] == "approximate").any(),
    lambda v, p: plots.pareto_chart(v.records, v.title("Error vs time"), p, v.lines,
                                    v.palette, v.where),
    3))
