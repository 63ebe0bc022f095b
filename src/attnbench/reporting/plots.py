"""The report's charts: time, speedup, TFLOP/s, memory, error, and error against time.

Every chart draws one line per ``tables.line_columns`` line (a knob sweep or a second run
gets a line of its own), keeps a backend's colour the same across a report (``Palette``),
and marks each point that is not ok with its status along the bottom of the plot, so a
missing point is never silent. Sizes and values that span a decade get log axes. Each
function writes one SVG (text kept as text, coordinates rounded, no date or random id, so the
same records give the same bytes) and returns a ``Chart`` (its file, alt text and status marks), or
None when it has nothing to draw.
"""

from __future__ import annotations

import hashlib
import math
import os
import re
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.ticker import (  # noqa: E402
    FuncFormatter,
    LogLocator,
    NullFormatter,
    NullLocator,
)

from attnbench.core import accuracy  # noqa: E402
from attnbench.reporting import guide_lines  # noqa: E402
from attnbench.reporting import lines as line_groups  # noqa: E402

SVG_RC = {"svg.fonttype": "none",  # text as <text>, not one path per glyph
          "svg.hashsalt": "attnbench",  # ids from this salt, not from a random one
          "font.sans-serif": ["DejaVu Sans", "Arial"],  # each <text> repeats the list
          "path.simplify": True}
SIZE = (6.4, 4.2)
MIB = 2.0 ** 20
ERROR_FLOOR = 1e-12  # errors of exactly 0 are drawn here on log axes
DRAWN = ("ok", "wrong")  # statuses whose measured values are drawn (wrong ones crossed)


@dataclass
class Chart:
    path: Path
    alt: str
    marks: list[tuple[str, int, str]] = field(default_factory=list)  # (line, N, status)


class Palette:
    """(backend, mask) -> colour, run -> line style, the rest of a line (knobs, dtype) ->
    marker. One palette serves a whole report, so a backend on a mask looks the same in
    every chart, and two masks of one backend (window and causal) never share a colour."""

    COLORS = [matplotlib.colors.to_hex(c) for c in plt.get_cmap("tab10").colors]
    STYLES = ["-", "--", ":", "-."]
    MARKERS = ["o", "s", "^", "D", "v", "P", "*", "h", "X", "<"]

    def __init__(self):
        self._seen: dict[str, dict] = {"color": {}, "style": {}, "marker": {}}

    def _pick(self, kind: str, key, options: list):
        seen = self._seen[kind]
        if key not in seen:
            seen[key] = options[len(seen) % len(options)]
        return seen[key]

    def color(self, backend: str, mask: str | None = None) -> str:
        """The colour of a backend's line on ``mask``; without a mask, the colour of its
        first line (what a goal drawn for the backend uses)."""
        if mask is None:
            mine = [c for (b, _), c in self._seen["color"].items() if b == backend]
            if mine:
                return mine[0]
        return self._pick("color", (backend, mask), self.COLORS)

    def of(self, line: dict) -> dict:
        rest = tuple((k, str(v)) for k, v in line.items()
                     if k not in ("backend", "run_id", "dtype", "mode", "mask"))
        return {"color": self.color(str(line.get("backend")), str(line.get("mask", ""))),
                "linestyle": self._pick("style", str(line.get("run_id", "")), self.STYLES),
                "marker": self._pick("marker", rest, self.MARKERS)}


class Lines:
    """The lines of one chart's records: grouping, labels (the columns that vary here),
    styles, and a horizontal dodge when every line sits at one size."""

    def __init__(self, records: pd.DataFrame, lines: list[str], palette: Palette | None):
        self.names = [c for c in lines if c in records.columns]
        self.shown = line_groups.shown(records, self.names)
        self.palette = palette or Palette()
        self.sizes = sorted(set(int(n) for n in records["seq_q"]))
        self.groups = line_groups.groups(records, self.names)
        self.mark_slots: dict[str, int] = {}
        self.written: set[tuple] = set()

    def label(self, line: dict) -> str:
        return line_groups.label(line, self.shown)

    def style(self, line: dict) -> dict:
        return self.palette.of({c: line[c] for c in self.names})

    def x(self, i: int, ns) -> np.ndarray:
        """Sizes as drawn: nudged apart when there is only one size, so intervals of
        different lines do not hide each other."""
        ns = np.asarray(ns, dtype=float)
        if len(self.sizes) != 1 or len(self.groups) < 2:
            return ns
        return ns * 2.0 ** (0.07 * (i - (len(self.groups) - 1) / 2))

    def mark(self, ax, chart: Chart, line: dict, n: int, x: float, status: str) -> None:
        """A status drawn at size n along the bottom of the axes, one row per line."""
        label = self.label(line)
        slot = self.mark_slots.setdefault(label, len(self.mark_slots))
        color = self.style(line)["color"]
        trans = ax.get_xaxis_transform()
        y = 0.035 + 0.075 * (slot % 10)
        ax.plot([x], [y], marker="x", color=color, transform=trans, linestyle="none",
                markersize=7, clip_on=False)
        if (id(ax), label, status) not in self.written:  # the word once per line and status
            self.written.add((id(ax), label, status))
            edge = "right" if n >= max(self.sizes) else "left" if n <= min(self.sizes) \
                else "center"  # the word stays inside the axes at the first and last size
            ax.annotate(status, (x, y), xycoords=trans, xytext=(0, 4.5),
                        textcoords="offset points", fontsize=6.5, color=color, ha=edge,
                        annotation_clip=False)
        chart.marks.append((label, n, status))

    def reserve(self, ax) -> None:
        """Lower the bottom of the y axis so that the rows of status marks sit below the
        data instead of on it."""
        if not self.mark_slots or not ax.has_data():
            return
        frac = min(0.05 + 0.075 * min(len(self.mark_slots), 10), 0.7)
        low, high = ax.get_ylim()
        below = low - (high - low) * frac / (1 - frac)
        if ax.get_yscale() == "linear" and below < 0 <= low and high > low:
            # every drawn quantity (time, speedup, rate, memory) is positive: a linear axis
            # never reads below zero; the room for the marks is made on a log axis instead
            if low == 0:
                return
            ax.set_yscale("log")
            _plain_log_ticks(ax.yaxis)
            ax.set_ylim(low, high)
        if ax.get_yscale() == "log" and low > 0:
            ax.set_ylim(low / (high / low) ** (frac / (1 - frac)), high)
        elif high > low:
            ax.set_ylim(below, high)

    def note(self, chart: Chart, line: dict, rows: pd.DataFrame, status: str) -> None:
        """Statuses of points drawn in place (wrong ones): listed, not drawn again."""
        chart.marks += [(self.label(line), int(n), status) for n in rows["seq_q"]]


def n_label(n: int) -> str:
    return f"{n // 1024}K" if n >= 1024 and n % 1024 == 0 else str(n)


def _x_axis(ax, sizes: list[int], rectangular: bool = False) -> None:
    if not sizes:
        return
    if len(sizes) == 1 or max(sizes) / min(sizes) >= 10:
        ax.set_xscale("log", base=2)
    ax.set_xticks(sizes)
    ax.set_xticklabels([n_label(n) for n in sizes])
    ax.xaxis.set_minor_locator(NullLocator())
    if len(sizes) == 1:
        ax.set_xlim(sizes[0] / 1.6, sizes[0] * 1.6)
    ax.set_xlabel("sequence length N" + (" (queries)" if rectangular else ""))


def _y_axis(ax, values, label: str, force_log: bool = False) -> None:
    v = np.asarray([x for x in values if x is not None and np.isfinite(x) and x > 0])
    if not v.size:  # only status marks: no value to read, so no scale (never a negative one)
        ax.set_ylim(0, 1)
        ax.set_yticks([])
        ax.set_ylabel(label)
        return
    if force_log or (v.size and v.max() / v.min() >= 10):
        ax.set_yscale("log")
        if v.size and v.max() / v.min() < 1e4:
            _plain_log_ticks(ax.yaxis)
    ax.set_ylabel(label)


MAX_FILE_NAME = 150  # bytes; file systems allow 255, and _finish adds a '.' and '.tmp'


def chart_file_name(stem: str, suffix: str = ".svg") -> str:
    """``stem + suffix``, shortened past MAX_FILE_NAME (a suite named with 226 characters
    must not fail the report) with a hash of the whole stem, so names stay distinct."""
    name = stem + suffix
    if len(name.encode()) <= MAX_FILE_NAME:
        return name
    digest = hashlib.sha256(stem.encode()).hexdigest()[:10]
    keep = MAX_FILE_NAME - len(suffix) - len(digest) - 2
    return f"{stem.encode()[:keep].decode('utf-8', 'ignore')}--{digest}{suffix}"


def _finish(fig, ax_or_axes, path: Path, title: str) -> None:
    """Grid, one legend below the plots (it never hides a point), title, file."""
    axes = list(np.ravel(ax_or_axes))
    for ax in axes:
        ax.grid(True, which="major", alpha=0.3)
    entries: dict = {}
    for ax in axes:
        handles, labels = ax.get_legend_handles_labels()
        entries |= {lab: h for lab, h in zip(labels, handles) if lab not in entries}
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    if entries:
        fig.legend(entries.values(), entries.keys(), fontsize=9, frameon=False,
                   loc="upper center", bbox_to_anchor=(0.5, 0.0),
                   ncol=2 if len(entries) > 3 else 1)
    tmp = path.with_name(f".{path.name}.tmp")  # atomic: a reader never sees half a chart
    with matplotlib.rc_context(SVG_RC):
        fig.savefig(tmp, bbox_inches="tight", pad_inches=0.15, format="svg",
                    metadata={"Date": None, "Creator": None})
    plt.close(fig)
    tmp.write_text(compact_svg(tmp.read_text(encoding="utf-8")), encoding="utf-8")
    os.replace(tmp, path)


GROUP_ID = re.compile(r'<g id="[A-Za-z]+(?:_[A-Za-z]+)*_\d+">')  # labels nothing refers to
NUMBER = re.compile(r"-?\d+\.\d+")
COORDINATES = re.compile(r'(\s(?:d|x|y|x1|x2|y1|y2|width|height|transform)=")([^"]*)(")')


def _round(match: re.Match) -> str:
    text = f"{float(match.group(0)):.1f}".rstrip("0").rstrip(".")
    return "0" if text == "-0" else text


def _numbers(value: str) -> str:
    """Rounded, and a path's commands joined without line breaks (``M 1 2 L 3 4``)."""
    value = NUMBER.sub(_round, value)
    return re.sub(r"\s+", " ", value).strip() if "\n" in value else value


def compact_svg(text: str) -> str:
    """Coordinates to a tenth of a point (a 100th of a pixel would not show) and no
    comments: what a chart needs and nothing else."""
    text = re.sub(r"<!--.*?-->\s*", "", text, flags=re.S)
    text = GROUP_ID.sub("<g>", text)
    text = re.sub(r"\n[ ]+", "\n", text)
    text = re.sub(r' transform="rotate\(-?0 [-\d. ]+\)"', "", text)  # unrotated text
    text = COORDINATES.sub(lambda m: m.group(1) + _numbers(m.group(2)) + m.group(3), text)
    for _ in range(3):  # a group without attributes around one element, or around nothing
        text = re.sub(r"<g>\n(<(?:use|path|text)\b[^>]*/>)\n</g>", r"\1", text)
        text = re.sub(r"<g>\n</g>\n", "", text)
    return _style_classes(text)


def _style_classes(text: str) -> str:
    """Inline styles used three times or more become classes in one <style>, named in
    order of first use."""
    counts: dict[str, int] = {}
    for style in re.findall(r' style="([^"]*)"', text):
        counts[style] = counts.get(style, 0) + 1
    names = {style: f"s{i}" for i, style in enumerate(s for s, n in counts.items() if n >= 3)}
    if not names:
        return text
    text = re.sub(r' style="([^"]*)"',
                  lambda m: f' class="{names[m.group(1)]}"' if m.group(1) in names
                  else m.group(0), text)
    css = "".join(f".{name}{{{style}}}" for style, name in names.items())
    return text.replace("<defs>", f'<defs>\n<style type="text/css">{css}</style>', 1)


def _plain_log_ticks(axis) -> None:
    """Log ticks at 1, 2, 5 per decade written as plain numbers (no 3x10^0 clutter)."""
    axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    axis.set_minor_formatter(NullFormatter())


def _alt(what: str, lines: Lines, facet: str, marks: list, extra: str = "") -> str:
    labels = "; ".join(lines.label(line) for line, _ in lines.groups)
    text = f"{what}, {facet}: {labels}." if facet else f"{what}: {labels}."
    if extra:
        text += f" {extra}"
    if marks:
        text += " Marked: " + "; ".join(f"{lab} at N={n}: {s}" for lab, n, s in marks) + "."
    return text


def _rectangular(records: pd.DataFrame) -> bool:
    return bool((records["seq_q"] != records["seq_k"]).any())


def _band(ax, x, low, high, color) -> None:
    if len(x) > 1:
        ax.fill_between(x, low, high, color=color, alpha=0.15, linewidth=0)


def _wrong(ax, x, y, color) -> None:
    ax.scatter(x, y, marker="X", s=70, color="#c00000", edgecolors=color, zorder=5)
    for xi, yi in zip(x, y):
        ax.annotate("wrong", (xi, yi), xytext=(5, 4), textcoords="offset points", fontsize=7,
                    color="#c00000")


def time_chart(records: pd.DataFrame, title: str, path: Path, lines: list[str],
               palette: Palette | None = None, facet: str = "") -> Chart | None:
    """Median time against N, its 95% interval as whiskers and a band."""
    if records.empty:
        return None
    ls = Lines(records, lines, palette)
    fig, ax = plt.subplots(figsize=SIZE)
    chart = Chart(path, "")
    values = []
    for i, (line, g) in enumerate(ls.groups):
        st = ls.style(line)
        has = g["status"].isin(DRAWN) & g["time_ms_median"].notna() \
            if "time_ms_median" in g else pd.Series(False, index=g.index)
        ok = g[has & (g["status"] == "ok")]
        if not ok.empty:
            x, y = ls.x(i, ok["seq_q"]), ok["time_ms_median"].to_numpy(float)
            low = ok.get("time_ms_ci_low", ok["time_ms_median"]).fillna(ok["time_ms_median"])
            high = ok.get("time_ms_ci_high", ok["time_ms_median"]).fillna(ok["time_ms_median"])
            low, high = low.to_numpy(float), high.to_numpy(float)
            ax.errorbar(x, y, yerr=[np.clip(y - low, 0, None), np.clip(high - y, 0, None)],
                        label=ls.label(line), capsize=2, markersize=5, **st)
            _band(ax, x, low, high, st["color"])
            values += [*low, *high]
        else:
            ax.plot([], [], label=ls.label(line) + " (no ok point)", **st)
        wrong = g[has & (g["status"] == "wrong")]
        if not wrong.empty:
            _wrong(ax, ls.x(i, wrong["seq_q"]), wrong["time_ms_median"], st["color"])
            ls.note(chart, line, wrong, "wrong")
            values += list(wrong["time_ms_median"])
        for _, r in g[~has].iterrows():
            ls.mark(ax, chart, line, int(r["seq_q"]), float(ls.x(i, [r["seq_q"]])[0]),
                    r["status"])
    _x_axis(ax, ls.sizes, _rectangular(records))
    _y_axis(ax, values, "median time (ms), 95% interval")
    ls.reserve(ax)
    _finish(fig, ax, path, title)
    chart.alt = _alt("Median time in milliseconds against sequence length, with 95% interval "
                     "bands", ls, facet, chart.marks)
    return chart


def speedup_chart(speedups: pd.DataFrame, title: str, path: Path, lines: list[str],
                  baseline: str, goals: list[dict] | None = None,
                  palette: Palette | None = None, facet: str = "") -> Chart | None:
    """The baseline's time over each backend's, with its 95% interval; filled markers where
    the interval excludes 1 (significant), hollow where it does not."""
    if speedups.empty:
        return None
    ls = Lines(speedups, lines, palette)
    fig, ax = plt.subplots(figsize=SIZE)
    chart = Chart(path, "")
    values = [1.0]
    ax.axhline(1.0, color="#444444", linewidth=1, label=f"baseline: {baseline}")
    for i, (line, g) in enumerate(ls.groups):
        st = ls.style(line)
        has = g["speedup"].notna() if "speedup" in g else pd.Series(False, index=g.index)
        ok = g[has]
        if not ok.empty:
            x, y = ls.x(i, ok["seq_q"]), ok["speedup"].to_numpy(float)
            low, high = ok["speedup_low"].to_numpy(float), ok["speedup_high"].to_numpy(float)
            ax.errorbar(x, y, yerr=[np.clip(y - low, 0, None), np.clip(high - y, 0, None)],
                        label=ls.label(line), capsize=3, markersize=6, **st)
            _band(ax, x, low, high, st["color"])
            faint = ~ok["significant"].astype(bool).to_numpy()
            if faint.any():
                ax.scatter(x[faint], y[faint], marker=st["marker"], s=40, color="white",
                           edgecolors=st["color"], zorder=4)
            values += [*low, *high]
        else:
            ax.plot([], [], label=ls.label(line) + " (no ratio)", **st)
        for _, r in g[~has].iterrows():
            if r["status"] == "ok" and r.get("baseline_status") == "missing":
                continue  # nothing to divide by here: the time chart shows the point
            why = r["status"] if r["status"] != "ok" else f"baseline {r.get('baseline_status')}"
            ls.mark(ax, chart, line, int(r["seq_q"]), float(ls.x(i, [r["seq_q"]])[0]), why)
    for goal in goals or []:
        color = ls.palette.color(goal["backend"])
        ns = goal.get("sizes") or []
        for bound in [b for b in (goal["low"], goal.get("high")) if b is not None]:
            if ns:
                for n in ns:
                    ax.plot([n / 1.3, n * 1.3], [bound, bound], linestyle="--", color=color,
                            linewidth=1.5)
            else:
                ax.axhline(bound, linestyle="--", color=color, linewidth=1)
            values.append(bound)
        ax.plot([], [], linestyle="--", color=color, label=f"goal: {goal['text']}")
    _x_axis(ax, ls.sizes, _rectangular(speedups))
    _y_axis(ax, values, f"speedup over {baseline.split(' (')[0]} (x)")
    ls.reserve(ax)
    _finish(fig, ax, path, title)
    extra = ("Filled markers: significant (the interval covers 95% and excludes 1); hollow: "
             "not (it includes 1, or fewer rounds than 95% needs).")
    if goals:
        extra += " Dashed: " + "; ".join(g["text"] for g in goals) + "."
    chart.alt = _alt(f"Speedup over {baseline} against sequence length, with 95% intervals",
                     ls, facet, chart.marks, extra)
    return chart


def tflops_chart(records: pd.DataFrame, title: str, path: Path, lines: list[str],
                 ceilings: dict[str, float], palette: Palette | None = None,
                 facet: str = "") -> Chart | None:
    """TFLOP/s of the work each backend performs, and the run's measured matmul ceiling."""
    if records.empty or "tflops" not in records or records["tflops"].isna().all():
        return None
    ls = Lines(records, lines, palette)
    fig, ax = plt.subplots(figsize=SIZE)
    chart = Chart(path, "")
    values = []
    for i, (line, g) in enumerate(ls.groups):
        st = ls.style(line)
        ok = g[(g["status"] == "ok") & g["tflops"].notna()]
        if not ok.empty:
            ax.plot(ls.x(i, ok["seq_q"]), ok["tflops"], label=ls.label(line), **st)
            values += list(ok["tflops"])
        else:
            ax.plot([], [], label=ls.label(line) + " (no ok point)", **st)
        for _, r in g[~g.index.isin(ok.index)].iterrows():
            ls.mark(ax, chart, line, int(r["seq_q"]), float(ls.x(i, [r["seq_q"]])[0]),
                    r["status"])
    values += _ceiling(ax, ceilings)
    _x_axis(ax, ls.sizes, _rectangular(records))
    _y_axis(ax, values, "TFLOP/s (work the backend performs)")
    ls.reserve(ax)
    _finish(fig, ax, path, title)
    extra = ("No ceiling was measured for this dtype." if not ceilings else
             "Horizontal line: the matmul rate measured at the start of the run." if
             len(ceilings) == 1 else f"Horizontal line: the median of the matmul rates "
             f"measured at the start of the {len(ceilings)} runs, the band their range.")
    chart.alt = _alt("Throughput in TFLOP/s against sequence length", ls, facet, chart.marks,
                     extra)
    return chart


def _ceiling(ax, ceilings: dict[str, float]) -> list[float]:
    """The measured matmul ceiling: one line, and over several runs their median with their
    range as a band (one line per run would hatch the plot)."""
    if not ceilings:
        return []
    v = sorted(ceilings.values())
    mid = float(np.median(v))
    if len(v) == 1:
        label = f"measured matmul ceiling: {mid:.3g} TFLOP/s"
    else:
        label = (f"measured matmul ceiling, median of {len(v)} runs: {mid:.3g} TFLOP/s "
                 f"(range {v[0]:.3g}-{v[-1]:.3g})")
        ax.axhspan(v[0], v[-1], color="#222222", alpha=0.12, linewidth=0)
    ax.axhline(mid, color="#222222", linestyle="--", linewidth=1.2, label=label)
    return [v[0], v[-1]]


def memory_chart(records: pd.DataFrame, title: str, path: Path, lines: list[str],
                 palette: Palette | None = None, facet: str = "") -> Chart | None:
    """Peak memory including the inputs, with the inputs+output floor and one N x N score
    matrix above it."""
    if records.empty or "peak_mem_bytes" not in records or records["peak_mem_bytes"].isna().all():
        return None
    ls = Lines(records, lines, palette)
    fig, ax = plt.subplots(figsize=SIZE)
    chart = Chart(path, "")
    values = []
    for i, (line, g) in enumerate(ls.groups):
        st = ls.style(line)
        totals = g.apply(guide_lines.footprint_bytes, axis=1)
        ok = g[(g["status"] == "ok") & totals.notna()]
        if not ok.empty:
            y = totals[ok.index].to_numpy(float) / MIB
            ax.plot(ls.x(i, ok["seq_q"]), y, label=ls.label(line), **st)
            values += list(y)
        else:
            ax.plot([], [], label=ls.label(line) + " (no ok point)", **st)
        for _, r in g[~g.index.isin(ok.index)].iterrows():
            ls.mark(ax, chart, line, int(r["seq_q"]), float(ls.x(i, [r["seq_q"]])[0]),
                    r["status"])
    shapes = records.drop_duplicates(["batch", "heads_q", "heads_kv", "head_dim",
                                      "head_dim_v", "dtype", "mode", "seq_q", "seq_k"])
    keys = ["batch", "heads_q", "heads_kv", "head_dim", "head_dim_v", "dtype", "mode"]
    groups = list(shapes.groupby(keys, sort=False))
    for key, s in groups:
        s = s.sort_values("seq_q")
        floor = s.apply(guide_lines.memory_floor_bytes, axis=1).to_numpy(float) / MIB
        scores = s.apply(guide_lines.score_matrix_bytes, axis=1).to_numpy(float) / MIB
        which = "" if len(groups) == 1 else f" (B={key[0]}, Hq={key[1]}, D={key[3]})"
        ax.plot(s["seq_q"], floor, color="#555555", linestyle="--", linewidth=1,
                label="floor: inputs + outputs" + which)
        ax.plot(s["seq_q"], floor + scores, color="#555555", linestyle=":", linewidth=1.2,
                label=f"floor + one B·Hq·N² score matrix ({key[5]})" + which)
        values += [*floor, *(floor + scores)]
    _x_axis(ax, ls.sizes, _rectangular(records))
    _y_axis(ax, values, "peak memory incl. inputs (MiB)")
    ls.reserve(ax)
    _finish(fig, ax, path, title)
    chart.alt = _alt("Peak memory in MiB, inputs included, against sequence length", ls, facet,
                     chart.marks, "Dashed: the inputs plus outputs floor; dotted: the floor "
                                  "plus one materialized score matrix.")
    return chart


def error_chart(records: pd.DataFrame, title: str, path: Path, lines: list[str],
                palette: Palette | None = None, facet: str = "") -> Chart | None:
    """Relative L2 error against the float64 evaluation, per output tensor, with the dtype's
    tolerance (above it a record is wrong)."""
    tensors = [t for t in accuracy.TENSORS
               if f"err_impl_{t}_rel" in records and records[f"err_impl_{t}_rel"].notna().any()]
    if records.empty or not tensors:
        return None
    ls = Lines(records, lines, palette)
    fig, axes = plt.subplots(1, len(tensors), figsize=(max(SIZE[0], 3.6 * len(tensors)),
                                                       SIZE[1]), squeeze=False)
    chart = Chart(path, "")
    dtypes = sorted(set(records["dtype"]))
    for ax, tensor in zip(axes[0], tensors):
        col = f"err_impl_{tensor}_rel"
        values = []
        for i, (line, g) in enumerate(ls.groups):
            st = ls.style(line)
            has = g["status"].isin(DRAWN) & g[col].notna()
            ok = g[has & (g["status"] == "ok")]
            if not ok.empty:
                y = np.maximum(ok[col].to_numpy(float), ERROR_FLOOR)
                ax.plot(ls.x(i, ok["seq_q"]), y, label=ls.label(line), **st)
                values += list(y)
            else:
                ax.plot([], [], label=ls.label(line) + " (no ok point)", **st)
            wrong = g[has & (g["status"] == "wrong")]
            if not wrong.empty:
                y = np.maximum(wrong[col].to_numpy(float), ERROR_FLOOR)
                _wrong(ax, ls.x(i, wrong["seq_q"]), y, st["color"])
                if tensor == tensors[0]:
                    ls.note(chart, line, wrong, "wrong")
                values += list(y)
            if tensor == tensors[0]:
                for _, r in g[~has].iterrows():
                    why = r["status"] if r["status"] != "wrong" else "wrong (NaN/Inf)"
                    ls.mark(ax, chart, line, int(r["seq_q"]),
                            float(ls.x(i, [r["seq_q"]])[0]), why)
        for dtype in dtypes:
            tol = accuracy.tolerance(dtype, tensor)
            ax.axhline(tol, color="#c00000", linestyle="--", linewidth=1,
                       label=f"{dtype} tolerance {tol:.0e}")
            values.append(tol)
        _x_axis(ax, ls.sizes, _rectangular(records))
        _y_axis(ax, values, f"{tensor}: relative L2 error vs float64", force_log=True)
        ax.set_title(tensor, fontsize=9)
    ls.reserve(axes[0][0])
    _finish(fig, axes[0], path, title)
    chart.alt = _alt("Relative L2 error against the float64 evaluation, per output tensor, "
                     "with the dtype's tolerance as a dashed line", ls, facet, chart.marks)
    return chart


def pareto_front(points: list[tuple[float, float]]) -> list[int]:
    """Indices of the points no other point beats in both time and error (both lower is
    better), in order of time."""
    order = sorted(range(len(points)), key=lambda i: (points[i][0], points[i][1]))
    front, best = [], math.inf
    for i in order:
        if points[i][1] < best:
            front.append(i)
            best = points[i][1]
    return front


def pareto_chart(records: pd.DataFrame, title: str, path: Path, lines: list[str],
                 palette: Palette | None = None, facet: str = "") -> Chart | None:
    """Error against exact softmax over time, one panel per size; the Pareto front (nothing
    both faster and more accurate) joined by a step line and ringed."""
    col = "err_vs_softmax_out_rel"
    if records.empty or col not in records:
        return None
    usable = records[(records["status"] == "ok") & records[col].notna()
                     & records["time_ms_median"].notna()]
    sizes = sorted(set(int(n) for n in usable["seq_q"]))
    if not sizes:
        return None
    ls = Lines(records, lines, palette)
    cols = min(len(sizes), 3)
    rows = math.ceil(len(sizes) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.9 * cols, 3.5 * rows), squeeze=False)
    chart = Chart(path, "")
    fronts = []
    for ax, n in zip(axes.ravel(), sizes):
        points, styles = [], []
        for line, g in ls.groups:
            for _, r in g[g["seq_q"] == n].iterrows():
                if r["status"] == "ok" and pd.notna(r[col]) and pd.notna(r["time_ms_median"]):
                    points.append((float(r["time_ms_median"]), max(float(r[col]), ERROR_FLOOR)))
                    styles.append((line, ls.style(line)))
        for (x, y), (line, st) in zip(points, styles):
            ax.plot([x], [y], linestyle="none", marker=st["marker"], color=st["color"],
                    markersize=7, label=ls.label(line))
        front = pareto_front(points)
        fx = [points[i][0] for i in front]
        fy = [points[i][1] for i in front]
        ax.plot(fx, fy, color="#222222", linewidth=1, drawstyle="steps-post", zorder=1)
        ax.scatter(fx, fy, s=160, facecolors="none", edgecolors="#222222", linewidths=1.2,
                   zorder=2)
        fronts.append(f"N={n}: " + ", ".join(ls.label(styles[i][0]) for i in front))
        ax.set_xscale("log")
        ax.set_yscale("log")
        _plain_log_ticks(ax.xaxis)
        ax.set_title(f"N = {n_label(n)}", fontsize=9)  # with what is not ok, below
        ax.set_xlabel("median time (ms)")
        ax.set_ylabel("relative L2 error vs exact softmax")
        ax.grid(True, which="major", alpha=0.3)
        missing = [(line, r) for line, g in ls.groups for _, r in g[g["seq_q"] == n].iterrows()
                   if r["status"] != "ok"]
        for line, r in missing:
            chart.marks.append((ls.label(line), n, r["status"]))
        if missing:
            note = textwrap.fill("not ok: " + ", ".join(f"{ls.label(line)} {r['status']}"
                                                        for line, r in missing), 55)
            ax.set_title(f"N = {n_label(n)}\n{note}", fontsize=7.5)
    for ax in axes.ravel()[len(sizes):]:
        ax.set_visible(False)
    axes[0][0].plot([], [], color="#222222", marker="o", fillstyle="none", markersize=10,
                    linewidth=1, label="Pareto front (nothing faster and more accurate)")
    _finish(fig, axes.ravel()[:len(sizes)], path, title)
    chart.alt = _alt("Error against exact softmax over median time, one panel per sequence "
                     "length, the Pareto front ringed and joined", ls, facet, chart.marks,
                     "Front: " + "; ".join(fronts) + ".")
    return chart


# ---- packed batches and paged caches ------------------------------------------------------
PADDED_SUFFIX = "_padded"  # a backend that pads every document to the longest (the baseline)
LAYOUT_STYLES = {"contiguous": "-", "shuffled": "--", "fragmented": ":"}


def is_padded(backend: str) -> bool:
    """Whether a varlen backend pads the batch to its longest document instead of packing."""
    return str(backend).endswith(PADDED_SUFFIX)


def _filled(records: pd.DataFrame, column: str) -> pd.Series:
    """``column`` with gaps filled from a record of the same case (a backend that did not
    run, unsupported, still has the case's documents or cache)."""
    values = records[column] if column in records else pd.Series(np.nan, index=records.index)
    known = records.assign(_v=values).dropna(subset=["_v"]).drop_duplicates("key")
    return values.fillna(records["key"].map(dict(zip(known["key"], known["_v"]))))


def _status_row(ax, x: float, slot: int, status: str, color: str, written: set) -> None:
    """A point that is not ok: a cross with its status along the bottom, one row per line."""
    trans = ax.get_xaxis_transform()
    y = 0.035 + 0.075 * (slot % 10)
    ax.plot([x], [y], marker="x", color=color, transform=trans, linestyle="none",
            markersize=7, clip_on=False)
    if (id(ax), slot, status) not in written:
        written.add((id(ax), slot, status))
        ax.annotate(status, (x, y), xycoords=trans, xytext=(4, 3), textcoords="offset points",
                    fontsize=6.5, color=color, annotation_clip=False)


def _room_below(ax, rows: int) -> None:
    """Lower the bottom of a log y axis so that ``rows`` rows of status marks sit below the
    data."""
    if not rows or not ax.has_data() or ax.get_yscale() != "log":
        return
    frac = min(0.05 + 0.075 * min(rows, 10), 0.7)
    low, high = ax.get_ylim()
    if low > 0:
        ax.set_ylim(low / (high / low) ** (frac / (1 - frac)), high)


def _tokens_label(n: int) -> str:
    return f"{n_label(int(n))} tokens"


def padding_chart(records: pd.DataFrame, title: str, path: Path, lines: list[str],
                  ceilings: dict[str, float] | None = None, palette: Palette | None = None,
                  facet: str = "") -> Chart | None:
    """A packed batch's cost against its padding fraction: one column per mask, median time
    (95% interval) above, within-document TFLOP/s (the work of the pairs inside documents,
    for every backend, so padding shows as lost rate) below; one line per backend and batch
    size, padded backends hollow. Each distribution is a dotted guide at its fraction."""
    if records.empty or "lengths" not in records:
        return None
    d = records[records["lengths"].fillna("").astype(str) != ""].copy()
    if d.empty:
        return None
    d["_pad"] = _filled(d, "lengths_padding_frac")
    d["_tokens"] = d["batch"].astype(int) * d["seq_q"].astype(int)
    if d["_pad"].isna().all():
        return None
    palette = palette or Palette()
    masks = list(dict.fromkeys(d["mask"].astype(str)))
    sizes = sorted(set(d["_tokens"]))
    names = [c for c in lines if c in d.columns and c not in ("lengths", "mask")]
    shown = line_groups.shown(d, names)
    rate = "tflops" in d and d["tflops"].notna().any()
    fig, axes = plt.subplots(2 if rate else 1, len(masks), squeeze=False, sharex=True,
                             figsize=(max(SIZE[0], 3.7 * len(masks)), 6.6 if rate else SIZE[1]))
    chart = Chart(path, "")
    series, written = [], set()
    for col, mask in enumerate(masks):
        m = d[d["mask"].astype(str) == mask]
        slots: dict[str, int] = {}
        time_values, rate_values = [], []
        for line, g in line_groups.groups(m.assign(_tokens=m["_tokens"]), names + ["_tokens"]):
            backend, tokens = str(line["backend"]), int(line["_tokens"])
            base = line_groups.label(line, shown)
            label = (f"{base} ({'padded' if is_padded(backend) else 'packed'})"
                     + (f", {_tokens_label(tokens)}" if len(sizes) > 1 else ""))
            st = palette.of({**{c: line[c] for c in names}, "mask": mask, "tokens": tokens})
            face = "white" if is_padded(backend) else st["color"]
            g = g.sort_values("_pad")
            ok = g[(g["status"] == "ok") & g["_pad"].notna() & g["time_ms_median"].notna()] \
                if "time_ms_median" in g else g.iloc[0:0]
            if len(masks) > 1:  # colours are per backend and mask, as in the other charts
                label = label.replace(" (", f" {mask} (", 1)
            label_m = label
            if not ok.empty:
                x, y = ok["_pad"].to_numpy(float), ok["time_ms_median"].to_numpy(float)
                low = ok.get("time_ms_ci_low", ok["time_ms_median"]).fillna(
                    ok["time_ms_median"]).to_numpy(float)
                high = ok.get("time_ms_ci_high", ok["time_ms_median"]).fillna(
                    ok["time_ms_median"]).to_numpy(float)
                axes[0][col].errorbar(x, y, yerr=[np.clip(y - low, 0, None),
                                                  np.clip(high - y, 0, None)],
                                      label=label, capsize=2, markersize=6,
                                      markerfacecolor=face, **st)
                time_values += [*low, *high]
                if rate:
                    r = ok[ok["tflops"].notna()]
                    axes[1][col].plot(r["_pad"], r["tflops"], markersize=6,
                                      markerfacecolor=face, **st)
                    rate_values += list(r["tflops"])
                series.append(f"{label_m}: " + ", ".join(
                    f"{p:.2f} -> {t:.4g} ms" for p, t in zip(x, y)))
            else:
                axes[0][col].plot([], [], label=label + " (no ok point)",
                                  markerfacecolor=face, **st)
                series.append(f"{label_m}: no ok point")
            for _, r in g[~g.index.isin(ok.index)].iterrows():
                if pd.isna(r["_pad"]):
                    chart.marks.append((label_m, int(r["seq_q"]), r["status"]))
                    continue
                slot = slots.setdefault(label, len(slots))
                _status_row(axes[0][col], float(r["_pad"]), slot, r["status"], st["color"],
                            written)
                chart.marks.append((label_m, int(r["seq_q"]), r["status"]))
        guides = m.dropna(subset=["_pad"]).drop_duplicates(["lengths", "_tokens"])
        for row_axes in axes:
            ax = row_axes[col]
            for p in sorted(set(guides["_pad"])):
                ax.axvline(p, color="#999999", linestyle=":", linewidth=0.8, zorder=0)
        top = axes[0][col]
        named = {p: " / ".join(dict.fromkeys(
            str(r["lengths"]) + (f" {n_label(int(r['_tokens']))}" if len(sizes) > 1 else "")
            for _, r in g.iterrows())) for p, g in guides.groupby("_pad")}
        above = top.secondary_xaxis("top")  # the distributions above the plot, not on it
        above.set_xticks(list(named))
        above.set_xticklabels(list(named.values()), rotation=90, fontsize=6.5,
                              color="#555555")
        above.tick_params(length=2, pad=1)
        _y_axis(top, time_values, "median time (ms), 95% interval", force_log=True)
        _room_below(top, len(slots))
        top.set_title(f"mask {mask}", fontsize=9, pad=4)
        if rate:
            ax = axes[1][col]
            rate_values += _ceiling(ax, ceilings or {}) if col == 0 else \
                _ceiling_line(ax, ceilings or {})
            _y_axis(ax, rate_values, "TFLOP/s within documents", force_log=True)
        bottom = axes[-1][col]
        bottom.set_xlabel("padding fraction of the batch")
        hi = float(d["_pad"].max())
        bottom.set_xlim(-0.04, max(hi + 0.08, 0.5))
    _finish(fig, axes, path, title)
    what = ("Median time in milliseconds" + (" (top) and TFLOP/s of the within-document "
                                             "work (bottom)" if rate else "")
            + " against the batch's padding fraction, one column per mask")
    dists = "; ".join(f"{r['lengths']} at {_tokens_label(r['_tokens'])}: {r['_pad']:.3f}"
                      for _, r in d.dropna(subset=["_pad"]).drop_duplicates(
                          ["lengths", "_tokens"]).iterrows())
    text = f"{what}, {facet}. " if facet else f"{what}. "
    text += "Padding fractions: " + dists + ". Lines: " + "; ".join(series) + "."
    if chart.marks:
        text += " Marked: " + "; ".join(f"{lab}: {s}" for lab, _, s in
                                        dict.fromkeys(chart.marks)) + "."
    chart.alt = text
    return chart


def _ceiling_line(ax, ceilings: dict[str, float]) -> list[float]:
    """The matmul ceiling again, unlabelled (its legend entry is the first column's)."""
    if not ceilings:
        return []
    v = sorted(ceilings.values())
    ax.axhline(float(np.median(v)), color="#222222", linestyle="--", linewidth=1.2)
    return [v[0], v[-1]]


def _cache_label(seq_k: int, lengths: str) -> str:
    return f"cache {n_label(int(seq_k))}" + (f", contexts {lengths}" if lengths else "")


def page_size_chart(records: pd.DataFrame, title: str, path: Path, lines: list[str],
                    palette: Palette | None = None, facet: str = "") -> Chart | None:
    """Paged decode: achieved GB/s of the KV actually read (and Q, O) against page size, one
    panel per cache, one line per backend and page layout (solid contiguous, dashed
    shuffled, dotted fragmented), the copy roof for as much traffic as a grey dashed line,
    and the same backend without a page table, where measured, as a thin line."""
    if records.empty or "page_size" not in records:
        return None
    paged = records[records["page_size"].fillna(0).astype(int) > 0]
    if paged.empty or "gbps" not in records or records["gbps"].isna().all():
        return None
    palette = palette or Palette()
    d = records.assign(_lengths=records["lengths"].fillna("").astype(str)
                       if "lengths" in records else "")
    caches = list(dict.fromkeys(zip(paged["seq_k"].astype(int),
                                    d.loc[paged.index, "_lengths"])))
    names = [c for c in lines if c in d.columns
             and c not in ("pages", "page_size", "lengths", "seq_k")]
    shown = line_groups.shown(paged, names)
    cols = min(len(caches), 3)
    rows = math.ceil(len(caches) / cols)
    fig, axes = plt.subplots(rows, cols, squeeze=False,
                             figsize=(max(SIZE[0], 3.9 * cols), 3.8 * rows))
    chart = Chart(path, "")
    series, roofs, written = [], [], set()
    sizes = sorted(set(paged["page_size"].astype(int)))
    for ax, (seq_k, lens) in zip(axes.ravel(), caches):
        here = d[(d["seq_k"].astype(int) == seq_k) & (d["_lengths"] == lens)]
        p = here[here["page_size"].fillna(0).astype(int) > 0]
        values, slots = [], {}
        for line, g in line_groups.groups(p, names + ["pages"]):
            layout = str(line["pages"])
            base = line_groups.label(line, shown)
            label = f"{base} {layout}"
            st = dict(palette.of({c: line[c] for c in names}))
            st["linestyle"] = LAYOUT_STYLES.get(layout, st["linestyle"])
            g = g.sort_values("page_size")
            ok = g[(g["status"] == "ok") & g["gbps"].notna()]
            if not ok.empty:
                ax.plot(ok["page_size"], ok["gbps"], label=label, markersize=6, **st)
                values += list(ok["gbps"])
                series.append(f"{label}, {_cache_label(seq_k, lens)}: " + ", ".join(
                    f"page {int(s)} -> {v:.3g} GB/s" for s, v in zip(ok["page_size"],
                                                                       ok["gbps"])))
            else:
                ax.plot([], [], label=label + " (no ok point)", **st)
            for _, r in g[~g.index.isin(ok.index)].iterrows():
                slot = slots.setdefault(base, len(slots))
                _status_row(ax, float(r["page_size"]), slot, r["status"], st["color"],
                            written)
                chart.marks.append((f"{label}, {_cache_label(seq_k, lens)}",
                                    int(r["page_size"]), r["status"]))
        flat = here[(here["page_size"].fillna(0).astype(int) == 0) & (here["status"] == "ok")
                    & here["gbps"].notna()]
        for _, r in flat.iterrows():
            color = palette.color(str(r["backend"]), str(r.get("mask", "")))
            ax.axhline(float(r["gbps"]), color=color, linewidth=0.9, alpha=0.7,
                       label=f"{r['backend']} without a page table")
            values.append(float(r["gbps"]))
            series.append(f"{r['backend']} without a page table, "
                          f"{_cache_label(seq_k, lens)}: {float(r['gbps']):.3g} GB/s")
        roof = _copy_roof(p)
        if roof:
            ax.axhline(roof, color="#555555", linestyle="--", linewidth=1.2,
                       label="copy roof for as much traffic")
            ax.annotate(f"copy roof {roof:.3g} GB/s", (1.0, roof), xycoords=(
                "axes fraction", "data"), xytext=(-3, 3), textcoords="offset points",
                ha="right", fontsize=7, color="#555555")
            values.append(roof)
            roofs.append(f"{_cache_label(seq_k, lens)}: {roof:.3g} GB/s")
        ax.set_xscale("log", base=2)
        ax.set_xticks(sizes)
        ax.set_xticklabels([str(s) for s in sizes])
        ax.xaxis.set_minor_locator(NullLocator())
        ax.set_xlim(sizes[0] / 1.5, sizes[-1] * 1.5)
        ax.set_xlabel("page size (tokens)")
        _y_axis(ax, values, "GB/s (KV read + Q + O)", force_log=True)
        _room_below(ax, len(slots))
        ax.set_title(_cache_label(seq_k, lens), fontsize=9)
    for ax in axes.ravel()[len(caches):]:
        ax.set_visible(False)
    _finish(fig, axes.ravel()[:len(caches)], path, title)
    text = ("Achieved GB/s (KV bytes the contexts hold, read once, plus Q and O) against page "
            "size, one panel per cache, one line per backend and page layout (solid "
            "contiguous, dashed shuffled, dotted fragmented)")
    text += f", {facet}. " if facet else ". "
    text += ("Copy roof (grey dashed): " + "; ".join(roofs) + ". " if roofs else
             "No copy roof was measured. ")
    text += "Lines: " + "; ".join(series) + "."
    if chart.marks:
        text += " Marked: " + "; ".join(f"{lab} at page {n}: {s}" for lab, n, s in
                                        chart.marks) + "."
    chart.alt = text
    return chart


def _copy_roof(records: pd.DataFrame) -> float | None:
    """The copy roof the run held these records to (``frac_bandwidth`` = gbps / roof): their
    median, one value for records of one traffic."""
    if "frac_bandwidth" not in records:
        return None
    ok = records[(records["status"] == "ok") & (records["frac_bandwidth"] > 0)
                 & records["gbps"].notna()]
    return float((ok["gbps"] / ok["frac_bandwidth"]).median()) if not ok.empty else None
