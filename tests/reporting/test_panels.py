"""The report's panel registry (reporting/panels.py) on the fixture runs: a panel registered
in one declaration appears in the report, the size budget leaves kinds out by priority, and
the pages it counts are slim (merged row headers, one table per rate, one winners table
over pooled runs, the clock beside time only where records carry one)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pandas as pd
import pytest

from attnbench.reporting import document, panels, plots, report, tables
from attnbench.reporting.report import build_report

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
RUNS = sorted((FIXTURES / "runs").iterdir())


def _fake(priority: int) -> panels.Panel:
    return panels.Panel(
        "fake", "fake things", lambda v: f"A fake panel of {v.name}",
        lambda v: "time_ms_median" in v.records,
        lambda v, p: plots.time_chart(v.records, v.title("Fake"), p, v.lines, v.palette,
                                      v.where),
        priority)


@pytest.fixture
def registry(monkeypatch):
    """The registry, restored after the test."""
    monkeypatch.setattr(panels, "REGISTRY", dict(panels.REGISTRY))
    return panels.REGISTRY


def test_a_registered_panel_appears_in_the_report(registry, tmp_path):
    panels.register(_fake(50))
    out = build_report([RUNS[0]], tmp_path / "r")
    fakes = sorted(p.name for p in out.glob("fake--*.svg"))
    assert fakes == ["fake--tiny-naive-vs-sdpa--float32-fwd.svg"]
    md, html = (out / "index.md").read_text(), (out / "index.html").read_text()
    assert f"]({fakes[0]})" in md and f'<img src="{fakes[0]}"' in html
    assert "A fake panel of naive-vs-sdpa" in md
    assert fakes[0] in json.loads((out / report.MANIFEST).read_text())["files"]
    order = [md.index(f"{kind}--tiny") for kind in ("time", "speedup", "fake")]
    assert order == sorted(order)  # shown in the order registered


def test_a_panel_that_does_not_apply_is_not_drawn(registry, tmp_path):
    drawn = []
    panels.register(panels.Panel("never", "never", lambda v: "", lambda v: False,
                                 lambda v, p: drawn.append(p), 50))
    out = build_report([RUNS[0]], tmp_path / "r")
    assert drawn == [] and not list(out.glob("never--*"))


def test_a_name_is_registered_once(registry):
    with pytest.raises(ValueError, match="'time' is registered already"):
        panels.register(panels.Panel("time", "", str, bool, lambda v, p: None, 1))


def test_the_budget_leaves_out_the_least_needed_kind_first(registry, tmp_path, monkeypatch):
    assert panels.least_needed() == ["tflops", "memory", "pareto", "error", "padding",
                                     "pagesize"]
    panels.register(_fake(0))
    assert panels.least_needed()[0] == "fake"
    whole = build_report([RUNS[0]], tmp_path / "whole")
    svgs = {p.name: p.stat().st_size for p in whole.glob("*.svg")}
    fake = sum(v for k, v in svgs.items() if k.startswith("fake--"))
    monkeypatch.setattr(report, "CHART_BUDGET", sum(svgs.values()) - fake)
    out = build_report([RUNS[0]], tmp_path / "cut")
    kinds = {p.name.split("--")[0] for p in out.glob("*.svg")}
    assert "fake" not in kinds and {"tflops", "memory", "time", "speedup"} <= kinds
    assert "1 chart(s) left out to keep the report small (1 fake things)" in \
        (out / "index.md").read_text()
    monkeypatch.setattr(report, "CHART_BUDGET", 1)  # essential kinds stay whatever it says
    out = build_report([RUNS[0]], tmp_path / "none")
    assert {p.name.split("--")[0] for p in out.glob("*--*.svg")} == {"time", "speedup"}


def test_html_tables_merge_repeated_row_headers_and_drop_optional_tags():
    frame = pd.DataFrame({"a": [1, 1, 2, 2], "b": ["x", "x", "x", "y"], "v": [1, 2, 3, 4]})
    html = document._html_table(document.Table(frame.set_index(["a", "b"])))
    assert "scope=" not in html and "</td>" not in html and "</tr>" not in html.split(
        "<tbody>")[1]
    rows = html.split("<tbody>")[1].split("</tbody>")[0].split("<tr>")[1:]
    assert rows == ["<th rowspan=2>1<th rowspan=2>x<td>1", "<td>2",
                    "<th rowspan=2>2<th>x<td>3", "<th>y<td>4"]
    # a level's span ends where a level to its left changes, even on an equal value
    assert document._spans([("p", "x"), ("q", "x")]) == [[1, 1], [1, 1]]


def test_a_share_of_a_ceiling_is_folded_into_its_rate():
    rates = pd.DataFrame({"64": ["0.5 ~", "oom"], "128": ["0.7", ""]}, index=["a", "b"])
    shares = pd.DataFrame({"64": ["25% ~", "oom"], "128": ["35%", ""]}, index=["a", "b"])
    assert tables.folded(rates, shares).values.tolist() == [["0.5 ~ (25%)", "0.7 (35%)"],
                                                            ["oom", ""]]


@pytest.fixture(scope="module")
def pooled(tmp_path_factory):
    return build_report(RUNS, tmp_path_factory.mktemp("pool") / "both")


def test_the_appendix_has_one_table_per_rate(pooled):
    appendix = (pooled / "appendix.md").read_text()
    assert "### Throughput (TFLOP/s of the work each backend performs), in brackets: " \
           "fraction of the measured matmul rate (%)" in appendix
    assert "### Fraction of the measured" not in appendix
    assert re.search(r"\| \d[\d.]* (~ )?\(\d+(\.\d+)?%\) ", appendix)


def test_pooled_runs_get_one_winners_table_row_per_problem(pooled):
    md = (pooled / "index.md").read_text()
    assert md.count("## Winners per problem") == 1
    section = md.split("## Winners per problem")[1].split("\n## ")[0]
    rows = [ln for ln in section.splitlines() if ln.startswith("| ") and "---" not in ln]
    header, rows = rows[0], rows[1:]
    assert "won in" in header and "run_id" not in header
    assert len(rows) == 3  # one per size of the tiny suite, not one per size and run
    assert all(re.search(r"\| \d of 2 runs \|", r) for r in rows)
    assert all(re.search(r"\| (yes|no|n/a) \|", r) for r in rows)
    assert "pooled over 2 runs, Hartung-Knapp" in section


def _with_clock(src: Path, dst: Path, mhz: float | None) -> Path:
    shutil.copytree(src, dst)
    lines = (dst / "records.jsonl").read_text().splitlines()
    recs = [json.loads(ln) for ln in lines if ln.strip()]
    with open(dst / "records.jsonl", "w") as fh:
        for r in recs:
            if mhz is not None:
                r["cpu_mhz_begin"] = mhz
            fh.write(json.dumps(r) + "\n")
    return dst


def test_the_clock_is_shown_beside_time_only_where_records_carry_it(tmp_path):
    run = _with_clock(RUNS[0], tmp_path / "results" / RUNS[0].name, 2445.0)
    md = (build_report([run], tmp_path / "r") / "index.md").read_text()
    section = md.split("### Time and clock")[1].split("\n## ")[0]
    assert "cpu_mhz_begin" in section and re.search(r"\| [\d.]+ .*at 2445 MHz \|", section)
    plain = (build_report([RUNS[0]], tmp_path / "p") / "index.md").read_text()
    assert "Time and clock" not in plain and " MHz" not in plain
    assert tables.clock_column(pd.DataFrame({"gpu_sm_mhz": [None], "cpu_mhz_begin": [2.0]})
                               ) == "cpu_mhz_begin"
    assert tables.clock_column(pd.DataFrame({"gpu_sm_mhz": [None]})) is None
