"""The report's layout on small fixture runs (tests/fixtures/): SVG charts written once and
shared by both pages, the same bytes from the same records, the size budget, answers first
with one collapsed line for what is not shown, the appendix, sources by English title, the
pooled ceiling band, 'too noisy to say', refusing to replace another report, and the index
of pooled reports, runs and model runs."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
import pytest

from attnbench.cli import main
from attnbench.reporting import interval_text, panels, plots, report, sources
from attnbench.reporting.model_report import summary, write_model_report
from attnbench.reporting.publish import build_index
from attnbench.reporting.report import build_report
from attnbench.stats.intervals import Interval

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
RUNS = sorted((FIXTURES / "runs").iterdir())
MODEL_RUN = FIXTURES / "models" / "2026-12-01-model-steps-cpu"


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = tmp_path_factory.mktemp("rep") / "one"
    build_report([RUNS[0]], out)
    return out


def test_fixtures_are_small():
    for run in [*RUNS, MODEL_RUN]:
        assert sum(p.stat().st_size for p in run.iterdir()) < 150_000, run


def test_charts_are_svg_files_both_pages_share(built):
    charts = sorted(p.name for p in built.glob("*.svg"))
    assert charts and not list(built.glob("*.png"))
    html = (built / "index.html").read_text()
    md = (built / "index.md").read_text()
    assert "base64" not in html and "data:image" not in html
    assert sorted(re.findall(r'<img src="([^"]+)"', html)) == charts
    assert sorted(re.findall(r"\]\(([^)\s]+\.svg)\)", md)) == charts
    for name in charts:
        svg = (built / name).read_text()
        assert "<text" in svg and "<dc:date>" not in svg  # text kept as text, no date
        paths = re.findall(r' d="([^"]*)"', svg)
        assert paths and not any(re.search(r"\d\.\d\d", d) for d in paths)


def test_coordinates_are_rounded_and_comments_gone():
    svg = ('<svg width="1pt"><!-- made by --><defs></defs>\n<g id="axes_1">\n'
           '<path d="M 12.345678 -0.04 \nL 3 4.96" style="a"/>\n</g>\n</svg>')
    out = plots.compact_svg(svg)
    assert 'd="M 12.3 0 L 3 5"' in out and "<!--" not in out and 'id="axes_1"' not in out


def test_same_records_give_the_same_bytes(tmp_path):
    a, b = build_report(RUNS, tmp_path / "a"), build_report(RUNS, tmp_path / "b")
    names = sorted(p.name for p in a.iterdir())
    assert names == sorted(p.name for p in b.iterdir())
    assert [p for p in names if p.endswith(".svg")]
    for name in names:
        assert (a / name).read_bytes() == (b / name).read_bytes(), name


def test_past_the_budget_throughput_then_memory_charts_are_left_out(tmp_path, monkeypatch):
    whole = build_report([RUNS[0]], tmp_path / "whole")
    assert sum(p.stat().st_size for p in whole.iterdir()) <= report.REPORT_BUDGET
    kinds = {p.name.split("--")[0] for p in whole.glob("*.svg")}
    assert {"tflops", "memory", "time"} <= kinds
    sizes = {p.name: p.stat().st_size for p in whole.glob("*.svg")}
    no_tflops = sum(v for k, v in sizes.items() if not k.startswith("tflops"))
    monkeypatch.setattr(report, "CHART_BUDGET", no_tflops)  # tflops alone must go
    out = build_report([RUNS[0]], tmp_path / "cut")
    left = {p.name.split("--")[0] for p in out.glob("*.svg")}
    assert "tflops" not in left and "memory" in left
    n = sum(1 for k in sizes if k.startswith("tflops"))
    md = (out / "index.md").read_text()
    assert f"{n} chart(s) left out to keep the report small ({n} throughput)" in md
    assert "tflops--" not in md and "tflops--" not in (out / "index.html").read_text()
    monkeypatch.setattr(report, "CHART_BUDGET", 1)  # every kind that may go goes, no other
    out = build_report([RUNS[0]], tmp_path / "cut2")
    assert {p.name.split("--")[0] for p in out.glob("*.svg")} == kinds - set(
        panels.least_needed())
    assert {"time", "speedup"} <= kinds - set(panels.least_needed())
    monkeypatch.setattr(report, "CHART_BUDGET", 10**9)  # the pages count against the total
    monkeypatch.setattr(report, "REPORT_BUDGET", no_tflops + 1)
    out = build_report([RUNS[0]], tmp_path / "cut3")
    assert "tflops" not in {p.name.split("--")[0] for p in out.glob("*.svg")}


def test_the_page_opens_on_answers_and_keeps_the_rest_aside(built):
    md = (built / "index.md").read_text()
    order = [md.index(h) for h in ("## Answers", "## Claims decided", "## Winners per problem",
                                   "## Comparison naive-vs-sdpa")]
    assert order == sorted(order)
    answers = md.split("## Answers")[1].split("\n## ")[0]
    assert "naive-vs-sdpa:" in answers and "accuracy: exact backends within" in answers
    # the claim measured nowhere is one collapsed line, not a row of the claims table
    assert md.count("<details>") == 1
    details = md.split("<details>")[1].split("</details>")[0]
    assert "1 claim(s) not measured" in details and "naive is 1000x faster" in details
    claims = md.split("## Claims decided")[1].split("\n## ")[0]
    assert "1000x" not in claims and "sdpa is at least as fast" in claims
    html = (built / "index.html").read_text()
    assert html.count("<details>") == 1 and "<summary>Not shown: 1 claim(s)" in html
    # the long tables are in the appendix, linked from the page
    assert "Tables by metric" not in md and "[appendix](appendix.md)" in md
    appendix = (built / "appendix.md").read_text()
    assert "## Tables by metric" in appendix and "## Runs and environment" in appendix
    assert 'href="index.html"' in (built / "appendix.html").read_text()


def test_sources_are_cited_by_english_title(built):
    assert sources.cite("issue 26 goal") == "attnbench goal"
    assert sources.cite("Wang et al. 2020; 000_7334e9e5ff8d2acf.txt, section 12.5") == (
        "Wang et al. 2020; \"Transformers and attention, part 13: Q/K/V, Bahdanau's "
        "attention as one formula\", section 12.5")
    cited = sources.cite("003_5b56d55fa636903b.txt (KV Cache 设置为半精度 fp16/bf16)")
    assert "half precision" in cited and not re.search(r"[\u4e00-\u9fff]", cited)
    assert not re.search(r"[\u4e00-\u9fff]", sources.cite("a 未知 b"))
    md = (built / "index.md").read_text() + (built / "index.html").read_text()
    assert "000_7334e9e5ff8d2acf" not in md and "issue 26" not in md
    assert "Transformers and attention, part 13" in md


@pytest.mark.parametrize("value,low,high,noisy", [
    (1.0, 0.5, 1.9, False), (1.0, 0.5, 2.5, True), (2.0, -0.1, 2.5, True),
    (1.0, 1.0, 1.0, False), (0.0, 0.0, 1.0, True)])
def test_an_interval_wider_than_its_value_is_too_noisy_to_say(value, low, high, noisy):
    assert interval_text.too_noisy(value, low, high) == noisy
    text = interval_text.half_width_text(value, low, high)
    assert (text == " (too noisy to say)") == noisy and "6831" not in text


def test_a_ratio_and_a_table_cell_say_too_noisy():
    assert interval_text.ratio_text(Interval(1.2, 0.1, 83.2, 0.95, 2, "")) == \
        "too noisy to say (1.2x)"
    assert interval_text.ratio_text(Interval(1.2, 1.1, 1.3, 0.95, 2, "")) == "1.2x [1.1, 1.3]"
    from attnbench.reporting.tables import _format
    row = {"time_ms_median": 0.01, "time_ms_ci_low": 0.009, "time_ms_ci_high": 0.693}
    assert "too noisy to say" in _format(row, "time_ms_median")


def test_pooled_ceilings_are_one_line_with_a_band():
    fig, ax = plt.subplots()
    plots._ceiling(ax, {"a": 1.0, "b": 1.2, "c": 1.1})
    lines = [ln for ln in ax.get_lines() if "ceiling" in str(ln.get_label())]
    assert len(lines) == 1 and lines[0].get_ydata()[0] == pytest.approx(1.1)
    assert "median of 3 runs" in lines[0].get_label() and len(ax.patches) == 1
    plt.close(fig)


def test_no_baseline_points_are_not_plotted(tmp_path):
    sp = pd.DataFrame([
        {"backend": "fast", "seq_q": 64, "seq_k": 64, "status": "ok", "speedup": 2.0,
         "speedup_low": 1.9, "speedup_high": 2.1, "significant": True,
         "baseline_status": "ok"},
        {"backend": "fast", "seq_q": 128, "seq_k": 128, "status": "ok", "speedup": None,
         "speedup_low": None, "speedup_high": None, "significant": None,
         "baseline_status": "missing"}])
    chart = plots.speedup_chart(sp, "s", tmp_path / "s.svg", ["backend"], "base")
    assert chart.marks == [] and "no baseline" not in chart.alt


@pytest.mark.slow
def test_report_of_several_runs_never_replaces_the_first_runs_own(tmp_path, monkeypatch,
                                                                   capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["report", str(RUNS[0])]) == 0
    own = Path("reports") / RUNS[0].name
    before = (own / "index.md").read_bytes()
    assert main(["report", str(RUNS[0]), str(RUNS[1])]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--force" in err and "--name" in err
    assert (own / "index.md").read_bytes() == before
    assert main(["report", str(RUNS[0]), str(RUNS[1]), "--name", "both"]) == 0
    assert main(["report", str(RUNS[0]), str(RUNS[1])]) == 2
    assert main(["report", str(RUNS[0]), str(RUNS[1]), "--force"]) == 0
    assert (own / "index.md").read_bytes() != before
    assert main(["report", str(RUNS[0]), str(RUNS[1])]) == 0  # the same runs again


@pytest.mark.slow
def test_index_lists_pooled_reports_then_runs_then_model_runs(tmp_path):
    results, reports = tmp_path / "results", tmp_path / "reports"
    for run in RUNS:
        shutil.copytree(run, results / run.name)
    shutil.copytree(MODEL_RUN, results / "models" / MODEL_RUN.name)
    build_report([results / r.name for r in RUNS], reports / "tiny-pooled")
    build_index(results, reports, rebuild=True)
    md = (reports / "index.md").read_text()
    order = [md.index(h) for h in ("## Pooled reports", "## Runs", "## Model runs")]
    assert order == sorted(order)
    assert "[tiny-pooled](tiny-pooled/index.md)" in md
    assert f"[{MODEL_RUN.name}]({MODEL_RUN.name}/index.md)" in md
    assert "2 runs: " in md and "goals pooled over 2 runs" in md
    rows = [ln for ln in md.splitlines() if ln.startswith("| [")]
    assert len(rows) == 4
    headlines = [ln.rstrip(" |").rsplit(" | ", 1)[1] for ln in rows]
    assert all(len(h.replace("\\", "")) <= 120 for h in headlines), headlines
    assert (reports / MODEL_RUN.name / "index.html").is_file()


def test_a_model_run_gets_an_html_report_with_charts_and_a_table(tmp_path):
    md = write_model_report(MODEL_RUN, tmp_path / "m")
    html = (tmp_path / "m" / "index.html").read_text()
    charts = sorted(p.name for p in (tmp_path / "m").glob("*.svg"))
    assert len(charts) == 2  # one per (model, batch, N)
    assert sorted(re.findall(r'<img src="([^"]+)"', html)) == charts
    text = md.read_text()
    assert text.index("## Answers") < text.index("## Models")
    answers = text[text.index("## Answers"):text.index("## Models")]
    # the fixture's minilm step has no margin whose interval excludes 1: no winner named
    assert "minilm batch 2, N = 256, train: no exact backend differs from sdpa" in answers
    table = summary(MODEL_RUN)
    assert "train vs sdpa" in table.splitlines()[0] and "minilm b2 N=256" in table
    assert len(table.splitlines()) == 1 + 6 + 5  # header, minilm's and llama3's backends


def test_answers_name_each_crossover_by_its_line_and_drop_unsignificant_ones():
    import pandas as pd

    from attnbench.reporting.answers import crossover_text

    rows = []
    for dtype, ups, sig in [("float32", [0.5, 0.8, 1.5, 2.0], True),
                            ("bfloat16", [0.9, 1.1, 0.95, 1.05], False)]:
        for n, up in zip([128, 256, 512, 1024], ups):
            rows.append({"backend": "fast", "dtype": dtype, "mode": "fwd", "seq_q": n,
                         "seq_k": n, "speedup": up, "significant": sig})
    said = crossover_text(pd.DataFrame(rows), ["dtype", "mode", "backend"], "base")
    assert said.count("overtakes base") == 1
    assert "float32" in said and "bfloat16" not in said
    assert "between 256 and 512" in said


def test_answers_name_block_layouts_that_are_dense_here():
    import pandas as pd

    from attnbench.reporting.answers import dense_layout_text

    df = pd.DataFrame({"backend": ["block_sparse", "block_sparse", "sdpa"],
                       "seq_q": [256, 4096, 256], "layout_density": [1.0, 0.2, None]})
    said = dense_layout_text(df)
    assert said.startswith("dense here (exact): block_sparse at N = 256:")
    assert "4K" not in said and "sdpa" not in said
    assert dense_layout_text(df.drop(columns="layout_density")) == ""


def test_the_index_headline_names_no_winner_without_a_significant_margin():
    from types import SimpleNamespace

    import pandas as pd

    from attnbench.reporting.answers import short_headline

    c = SimpleNamespace(baseline="sdpa")
    sp = pd.DataFrame({"backend": ["flex"], "seq_q": [1], "speedup": [1.7],
                       "significant": [False]})
    assert short_headline([(c, None, sp)], None) == "flex and sdpa not told apart at N=1 (1.7x)"
    sp["significant"] = True
    assert short_headline([(c, None, sp)], None) == "flex 1.7x faster than sdpa at N=1"
