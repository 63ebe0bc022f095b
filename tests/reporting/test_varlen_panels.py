"""The packed-batch and paged-decode panels (reporting/panels.py, plots.padding_chart and
plots.page_size_chart) on small runs built here: the series and axis values they draw, and
that a run without a lengths or page_size axis draws neither."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd
import pytest

from attnbench.core import lengths
from attnbench.core.case import Case
from attnbench.core.record import Record
from attnbench.reporting import panels, plots, report
from attnbench.reporting.report import build_report
from attnbench.runs import record_files

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
DENSE_RUN = sorted((FIXTURES / "runs").iterdir())[0]
VARLEN = ("fixed(64)", "uniform(8,64)")
ROOF = 10.0  # GB/s the paged run's records are held to


def _row(case: Case, backend: str, status: str = "ok", ms: float | None = None,
         **extra) -> dict:
    values = dict(extra)
    if ms is not None:
        values |= {"time_ms_median": ms, "time_ms_ci_low": 0.9 * ms,
                   "time_ms_ci_high": 1.1 * ms, "samples_ms": [ms] * 6, "n_samples": 6,
                   "tflops": case.flops / (ms * 1e-3) / 1e12,
                   "gbps": case.bytes / (ms * 1e-3) / 1e9}
    rec = Record.new(case, backend, status, "" if status == "ok" else "not here", **values)
    return rec.to_row()


def _write(folder: Path, suite: str, rows: list[dict], ceilings: dict | None = None) -> Path:
    folder.mkdir(parents=True)
    for r in rows:
        r |= {"run_id": folder.name, "suite": suite, "format_version": 2}
    (folder / record_files.RECORDS).write_text("".join(json.dumps(r) + "\n" for r in rows))
    meta = {"run_id": folder.name, "suite": suite, "format_version": 2,
            "environment": {"device": "cpu", "device_name": "test cpu"},
            "ceilings": ceilings or {}}
    (folder / record_files.META).write_text(json.dumps(meta))
    return folder


def _padding(spec: str, seq: int) -> float:
    return lengths.summary(lengths.draw(spec, 1, seq, 0))["padding_frac"]


def varlen_rows() -> list[dict]:
    """sdpa (packed) and sdpa_padded over two distributions and two masks at 256 tokens;
    sdpa is unsupported on causal, without the documents' columns, as a real run says."""
    rows = []
    for mask in ("none", "causal"):
        for i, spec in enumerate(VARLEN):
            case = Case(batch=1, heads_q=2, heads_kv=2, seq_q=256, seq_k=256, head_dim=8,
                        head_dim_v=8, mask=mask, lengths=spec)
            docs = {f"lengths_{k}": v for k, v in
                    lengths.summary(lengths.draw(spec, 1, 256, 0)).items()}
            rows.append(_row(case, "sdpa_padded", ms=2.0 + 3 * i, **docs))
            if mask == "causal":
                rows.append(_row(case, "sdpa", "unsupported"))
            else:
                rows.append(_row(case, "sdpa", ms=1.5 + i, **docs))
    return rows


def paged_rows() -> list[dict]:
    """sdpa and naive over two page sizes and three layouts of one cache, and sdpa without
    a page table; naive is unavailable on fragmented pages."""
    rows = []
    for layout in ("contiguous", "shuffled", "fragmented"):
        for j, size in enumerate((16, 32)):
            case = Case(batch=2, heads_q=2, heads_kv=1, seq_q=1, seq_k=64, head_dim=8,
                        head_dim_v=8, mask="causal", page_size=size, pages=layout)
            for backend, ms in (("sdpa", 0.10 + 0.01 * j), ("naive", 0.20)):
                if backend == "naive" and layout == "fragmented":
                    rows.append(_row(case, backend, "unavailable"))
                    continue
                row = _row(case, backend, ms=ms)
                rows.append(row | {"frac_bandwidth": row["gbps"] / ROOF})
    flat = Case(batch=2, heads_q=2, heads_kv=1, seq_q=1, seq_k=64, head_dim=8, head_dim_v=8,
                mask="causal")
    row = _row(flat, "sdpa", ms=0.05)
    return rows + [row | {"frac_bandwidth": row["gbps"] / ROOF}]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("runs")
    return {"varlen": _write(base / "2026-01-01-varlen-test", "varlen", varlen_rows()),
            "paged": _write(base / "2026-01-01-paged-test", "paged_decode", paged_rows())}


def _frame(run: Path) -> pd.DataFrame:
    return record_files.load_results(run)


def _svg_texts(path: Path) -> list[str]:
    return [t.strip() for t in re.findall(r"<text[^>]*>([^<]*)</text>", path.read_text())]


def test_padding_chart_draws_each_backend_against_its_padding_fraction(runs, tmp_path):
    df = _frame(runs["varlen"])
    fwd = df[df["mode"] == "fwd"]
    chart = plots.padding_chart(fwd, "Time vs padding", tmp_path / "p.svg",
                                ["dtype", "mask", "mode", "backend", "lengths"])
    low, high = _padding(VARLEN[0], 256), _padding(VARLEN[1], 256)
    assert low == 0.0 and 0.2 < high < 0.9
    alt = chart.alt
    # one line per backend and mask, each point at its distribution's padding fraction
    assert f"sdpa_padded none (padded): {low:.2f} -> 2 ms, {high:.2f} -> 5 ms" in alt
    assert f"sdpa none (packed): {low:.2f} -> 1.5 ms, {high:.2f} -> 2.5 ms" in alt
    assert f"sdpa_padded causal (padded): {low:.2f} -> 2 ms, {high:.2f} -> 5 ms" in alt
    assert "sdpa causal (packed): no ok point" in alt
    # the unsupported causal sdpa is marked at both fractions, taken from sdpa_padded's rows
    assert [m[2] for m in chart.marks] == ["unsupported", "unsupported"]
    assert f"{VARLEN[1]} at 256 tokens: {high:.3f}" in alt
    texts = _svg_texts(tmp_path / "p.svg")
    assert {"mask none", "mask causal", *VARLEN, "padding fraction of the batch",
            "TFLOP/s within documents"} <= set(texts)
    assert "sdpa_padded none (padded)" in texts and "sdpa none (packed)" in texts


def test_page_size_chart_draws_each_layout_with_the_copy_roof(runs, tmp_path):
    df = _frame(runs["paged"])
    chart = plots.page_size_chart(df, "GB/s vs page size", tmp_path / "g.svg",
                                  ["dtype", "mask", "mode", "backend", "page_size", "pages"])
    case = Case(batch=2, heads_q=2, heads_kv=1, seq_q=1, seq_k=64, head_dim=8, head_dim_v=8,
                mask="causal", page_size=16, pages="contiguous")
    g16, g32 = case.bytes / 0.10e-3 / 1e9, case.bytes / 0.11e-3 / 1e9
    for layout in ("contiguous", "shuffled", "fragmented"):
        assert (f"sdpa {layout}, cache 64: page 16 -> {g16:.3g} GB/s, page 32 -> "
                f"{g32:.3g} GB/s") in chart.alt
    assert "naive shuffled, cache 64: page 16 ->" in chart.alt
    assert "Copy roof (grey dashed): cache 64: 10 GB/s" in chart.alt
    assert "sdpa without a page table, cache 64:" in chart.alt
    assert sorted(set(m[1:] for m in chart.marks)) == [(16, "unavailable"),
                                                        (32, "unavailable")]
    texts = _svg_texts(tmp_path / "g.svg")
    assert {"16", "32", "page size (tokens)", "copy roof 10 GB/s", "sdpa fragmented",
            "naive fragmented (no ok point)", "copy roof for as much traffic"} <= set(texts)


@pytest.mark.parametrize("run,kind", [("varlen", "padding"), ("paged", "pagesize")])
def test_each_run_gets_its_panel_in_both_pages(runs, tmp_path, run, kind):
    out = build_report([runs[run]], tmp_path / "r")
    drawn = sorted(p.name for p in out.glob(f"{kind}--*.svg"))
    assert drawn, f"no {kind} panel"
    md, html = (out / "index.md").read_text(), (out / "index.html").read_text()
    for name in drawn:
        assert f"]({name})" in md and f'<img src="{name}"' in html
    other = {"padding": "pagesize", "pagesize": "padding"}[kind]
    assert not list(out.glob(f"{other}--*"))


def test_a_run_without_those_axes_draws_neither(tmp_path):
    out = build_report([DENSE_RUN], tmp_path / "r")
    assert not list(out.glob("padding--*")) and not list(out.glob("pagesize--*"))
    assert list(out.glob("time--*.svg"))  # the run itself was drawn


def test_the_panels_do_not_apply_without_their_columns(runs):
    paged, varlen = _frame(runs["paged"]), _frame(runs["varlen"])
    kinds = {p.name: p for p in panels.registered()}

    def view(records):
        return panels.View("c", "float32, fwd", records, pd.DataFrame(), [], plots.Palette())

    assert kinds["padding"].applies(view(varlen)) and not kinds["padding"].applies(view(paged))
    assert kinds["pagesize"].applies(view(paged)) and not kinds["pagesize"].applies(view(varlen))
    assert plots.padding_chart(paged, "t", Path("unused.svg"), ["backend"]) is None
    assert plots.page_size_chart(varlen, "t", Path("unused.svg"), ["backend"]) is None


def test_the_worst_document_is_folded_with_its_length_in_the_error_table(tmp_path):
    case = Case(batch=1, heads_q=2, heads_kv=2, seq_q=256, seq_k=256, head_dim=8,
                head_dim_v=8, lengths="fixed(73)")
    rows = [_row(case, "sdpa", ms=1.0, err_impl_out_rel=1e-7, err_doc_out_rel=3.5e-6,
                 err_doc_out_len=37, err_doc_out_row=0, err_doc_out_doc=3)]
    out = build_report([_write(tmp_path / "2026-01-01-docs", "varlen", rows)], tmp_path / "r")
    appendix = (out / "appendix.md").read_text()
    assert "Error of the worst document against its float64 evaluation (1), in brackets: " \
           "length of the worst document (tokens)" in appendix
    assert "3.5e-06 (37)" in appendix
    assert report.FOLDED["err_doc_out_len"] == "err_doc_out_rel"
