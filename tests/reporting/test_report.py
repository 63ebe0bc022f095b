"""The report on a synthetic run whose numbers are known: winners, crossovers, exponents,
statuses marked, file names, escaping, several runs, the published index."""

import json
import re
from pathlib import Path

import pandas as pd
import pytest

from attnbench.core.case import Case
from attnbench.core.errors import BadInput
from attnbench.core.record import Record
from attnbench.reporting import findings, tables
from attnbench.reporting.report import Report, build_report
from attnbench.runs import dataset
from attnbench.runs.suite import declared_comparisons, load_suite
from attnbench.stats import intervals, ratios

SIZES = [256, 512, 1024, 2048, 4096, 8192]
# Per-round jitter of each backend (medians stay exact: the middle two factors are 1.0).
JITTER = {"base": [0.99, 1.0, 1.01, 0.995, 1.005, 1.0, 0.998, 1.002],
          "fast": [1.004, 0.996, 1.0, 1.008, 0.992, 1.0, 1.001, 0.999],
          "lin": [1.01, 0.99, 1.0, 1.0, 1.003, 0.997, 1.006, 0.994]}
SUITE = """
name = "synth"
backends = ["base"]
[axes]
seq_len = 256

[[comparison]]
name = "fast-vs-base"
text = "fast and lin (a knob sweep) against base, joined on shape"
baseline = "base"
backends = ["fast", "lin", "other"]
pair = "shape"
"""
XSS = "<script>alert(1)</script> | **not bold** [x](http://evil.example)"


def _row(run_id, backend, n, status="ok", reason="", time=None, mem=None, pair=True,
         semantics="exact", err=3e-7, err_soft=None, **knobs):
    case = Case(batch=1, heads_q=2, heads_kv=2, seq_q=n, seq_k=n, head_dim=64, head_dim_v=64,
                **knobs)
    values = {"semantics": semantics}
    if time is not None:
        samples = [time * f for f in JITTER[backend]]
        iv = intervals.median_interval(samples)
        values |= {"time_ms_median": time, "time_ms_ci_low": iv.low, "time_ms_ci_high": iv.high,
                   "samples_ms": samples, "tflops": case.flops / (time * 1e-3) / 1e12,
                   "input_bytes": 3 * 2 * n * 64 * 4, "peak_mem_bytes": mem,
                   "err_impl_out_rel": err,
                   "err_vs_softmax_out_rel": err if err_soft is None else err_soft}
        if pair:
            values["pair_group"] = f"g{n}"
    return Record.new(case, backend, status, reason, **values).to_row() | {"run_id": run_id,
                                                                            "suite": "synth"}


def synthetic_records(run_id="synth-run"):
    """base ~ N^2 (oom at 8K), fast ~ N (overtakes base at 1448), lin ~ N with feature_map
    elu (overtakes at 3000) and favor (at 2000; wrong at 4K); other unsupported throughout."""
    rows = []
    for n in SIZES:
        if n < 8192:
            rows.append(_row(run_id, "base", n, time=1e-6 * n * n, mem=8.0 * n * n))
        else:
            rows.append(_row(run_id, "base", n, "oom", "out of memory: tried to allocate 2 GiB"))
        rows.append(_row(run_id, "fast", n, time=1.448e-3 * n, mem=1000.0 * n))
        rows.append(_row(run_id, "lin", n, time=3e-3 * n, mem=500.0 * n, pair=False,
                         semantics="approximate", err_soft=0.05))
        if n == 4096:
            rows.append(_row(run_id, "lin", n, "wrong", "out relative L2 error 0.5 above the "
                             "float32 tolerance 1e-04", time=2e-3 * n, mem=400.0 * n,
                             pair=False, semantics="approximate", err=0.5, err_soft=0.5,
                             feature_map="favor"))
        else:
            rows.append(_row(run_id, "lin", n, time=2e-3 * n, mem=400.0 * n, pair=False,
                             semantics="approximate", err_soft=0.02, feature_map="favor"))
        rows.append(_row(run_id, "other", n, "unsupported", XSS))
    return rows


def write_run(root: Path, run_id="synth-run", device_name="Synthetic CPU", commit="a" * 40,
              declare=True, rows=None, suite_name="synth") -> Path:
    run = root / "results" / run_id
    run.mkdir(parents=True)
    suite = root / f"{run_id}.toml"
    suite.write_text(SUITE if declare else SUITE.split("[[comparison]]")[0])
    with open(run / "records.jsonl", "w") as fh:
        for r in rows or synthetic_records(run_id):
            fh.write(json.dumps(r) + "\n")
    meta = {"run_id": run_id, "suite": suite_name, "suite_path": str(suite),
            "started": "2026-12-01T10:00:00+00:00", "ended": "2026-12-01T10:05:00+00:00",
            "environment": {"device": "cpu", "device_name": device_name,
                            "cpu_capability": "avx512", "git_commit": commit,
                            "torch": "2.13.0+cpu", "threads": 2},
            "ceilings": {"matmul_tflops": {"float32": 0.5}, "copy_gbps": 30.0},
            "claims": [{"text": "fast at least 2.5x faster than base at 4096", "kind": "ratio",
                        "numerator": "base", "denominator": "fast", "source": "test",
                        "where": {"seq_len": 4096}, "expected": [2.5]}]}
    (run / "meta.json").write_text(json.dumps(meta))
    return run


@pytest.fixture
def synth(tmp_path):
    run = write_run(tmp_path)
    report = Report(dataset.load([run]), tmp_path / "rep")
    return run, report


def test_winners_with_margins_and_significance(synth):
    _, report = synth
    df = report.df
    win = findings.winners(df, tables.line_columns(df)).set_index("N")
    default = win[win.get("feature_map", pd.Series("elu", index=win.index)) != "favor"]
    assert default.loc["256", "winner"] == "base" and default.loc["1024", "winner"] == "base"
    assert default.loc["2048", "winner"] == "fast" and default.loc["4096", "winner"] == "fast"
    row = default.loc["2048"]
    assert row["runner-up"] == "base"
    estimate, low, high = map(float, re.findall(r"[\d.]+", row["margin [95% interval]"]))
    assert low <= 4.194 / 2.966 <= high and estimate == pytest.approx(1.414, rel=0.01)
    assert row["significant"] == "yes (paired rounds)"
    at8k = default.loc["8192"]  # base ran out of memory: fast beats lin, base is listed
    assert (at8k["winner"], at8k["runner-up"]) == ("fast", "lin")
    assert "base oom" in at8k["others"] and "other unsupported" in at8k["others"]
    assert at8k["significant"].startswith("yes (bootstrap")  # lin has no shared rounds


def test_crossovers_where_each_backend_overtakes_the_baseline(synth):
    _, report = synth
    (c, recs, sp), = report.planned
    assert c.name == "fast-vs-base" and c.pair == "shape"
    cross = findings.crossovers(sp, tables.line_columns(recs), "base")
    found = {(r["backend"], r.get("feature_map", "elu")): float(r["crossover N"][1:])
             for _, r in cross.iterrows()}
    # exact power laws cross at 1448, 3000 and 2000; the speedups are medians of per-round
    # ratios of jittered samples, so the interpolated lengths are within a percent of those
    assert found == {("fast", "elu"): pytest.approx(1448, rel=0.01),
                     ("lin", "elu"): pytest.approx(3000, rel=0.01),
                     ("lin", "favor"): pytest.approx(2000, rel=0.01)}
    assert set(cross["between"]) == {"1K and 2K", "2K and 4K"}
    assert set(cross["what happens"]) == {"overtakes base"}
    sig = {(r["backend"], r.get("feature_map", "elu")): r["both sides significant"]
           for _, r in cross.iterrows()}
    # favor's 2K side is 1.02x: inside the between-run allowance, so a rerun may flip it
    assert sig == {("fast", "elu"): "yes", ("lin", "elu"): "yes", ("lin", "favor"): "no"}


def test_exponents_of_time_and_memory(synth):
    _, report = synth
    fits = {(line["backend"], line.get("feature_map")): (t.exponent, t.r2, m.exponent)
            for line, t, _, m in findings.exponent_fits(report.df,
                                                        tables.line_columns(report.df))}
    for key, (time_exp, memory_exp) in {("base", "elu"): (2, 2), ("fast", "elu"): (1, 1),
                                        ("lin", "elu"): (1, 1), ("lin", "favor"): (1, 1)}.items():
        t, r2, m = fits[key]
        assert t == pytest.approx(time_exp, abs=1e-6) and m == pytest.approx(memory_exp, abs=1e-6)
        assert r2 == pytest.approx(1.0)
    assert ("other", "elu") not in fits  # never ok


def test_report_files_statuses_and_escaping(synth, tmp_path):
    run, _ = synth
    out = build_report([run], tmp_path / "rep")
    names = sorted(p.name for p in out.glob("*.svg"))
    assert names == sorted(f"{kind}--synth-fast-vs-base--float32-fwd.svg" for kind in
                           ("time", "speedup", "tflops", "memory", "error", "pareto"))
    assert not list(out.glob("*.png"))
    md = (out / "index.md").read_text()
    html = (out / "index.html").read_text()
    # non-ok points are named in the alt text of every chart that would have drawn them
    time_alt = re.search(r"!\[(Median time[^\n]*)\]\(time--", md).group(1)
    assert "base at N=8192: oom" in time_alt and "other at N=256: unsupported" in time_alt
    assert "feature_map=favor lin at N=4096: wrong" in time_alt
    assert "### Crossovers" in md and re.search(r"\| fast \| ~14\d\d \| 1K and 2K \|", md)
    # the declared goal is drawn on the speedup chart
    assert "fast \\>= 2.5x at N = 4096 (test)" in md
    # record strings are escaped in both renderings (the reasons are in the appendix)
    both_html = html + (out / "appendix.html").read_text()
    both_md = md + (out / "appendix.md").read_text()
    assert "<script>" not in both_html and "&lt;script&gt;" in both_html
    assert "\\<script\\>" in both_md and "\\| \\*\\*not bold\\*\\*" in both_md
    # both pages point to the chart files beside them; nothing is embedded or fetched
    assert "base64" not in html
    assert sorted(re.findall(r'<img src="([^"]+)"', html)) == names
    assert sorted(re.findall(r"!\[[^\n]*\]\(([^)]+\.svg)\)", md)) == names
    assert set(re.findall(r'(?:src|href)="([^"#]+)"', html)) <= set(names) | {"appendix.html"}
    assert html.count("<img ") == 6 and 'alt=""' not in html


def test_time_chart_marks_every_point_that_is_not_ok(synth, tmp_path):
    from attnbench.reporting import plots

    _, report = synth
    df = report.df
    chart = plots.time_chart(df, "t", tmp_path / "t.svg", tables.line_columns(df))
    marks = {(label, n, status) for label, n, status in chart.marks}
    assert ("feature_map=elu base", 8192, "oom") in marks
    assert ("feature_map=favor lin", 4096, "wrong") in marks
    assert {("feature_map=elu other", n, "unsupported") for n in SIZES} <= marks


def test_undeclared_runs_are_compared_as_they_ran(tmp_path):
    run = write_run(tmp_path, declare=False)
    report = Report(dataset.load([run]), tmp_path / "rep")
    (c, recs, sp), (alone, alone_recs, _) = report.planned
    assert not c.declared and c.baseline == "base" and c.pair == "case"
    assert set(c.backends) == {"fast", "lin", "other"}
    # same-case pairing only: lin's favor cases, which base never ran, are not in it but
    # on their own, without a baseline
    favor = report.df["feature_map"] == "favor"
    assert len(recs) == len(report.df) - favor.sum()
    assert "favor" not in set(sp["feature_map"])
    assert alone.baseline is None and alone.backends == ("lin",)
    assert set(alone_recs["feature_map"]) == {"favor"}
    assert sp[(sp["backend"] == "fast") & (sp["seq_q"] == 8192)]["baseline_status"].item() == \
        "oom"


def test_several_runs_put_the_device_into_legends_and_tables(tmp_path):
    cpu = write_run(tmp_path, "cpu-run", "AMD EPYC")
    gpu = write_run(tmp_path, "gpu-run", "NVIDIA H200")
    runs = dataset.load([cpu, gpu])
    assert [r.label for r in runs] == ["AMD EPYC (avx512)", "NVIDIA H200 (avx512)"]
    out = build_report([cpu, gpu], tmp_path / "both")
    md = (out / "index.md").read_text()
    assert "| AMD EPYC (avx512) | 256 |" in md and "| NVIDIA H200 (avx512) | 256 |" in md
    alt = re.search(r"!\[(Median time[^\n]*)\]\(time--", md).group(1)
    assert "AMD EPYC (avx512) feature_map=elu base" in alt
    assert "NVIDIA H200 (avx512) feature_map=elu base" in alt
    # two commits on one machine: the run ids tell them apart (the commits are in the
    # environment table), never "@1111111+dirty"
    a = write_run(tmp_path / "c", "a", commit="1" * 40)
    b = write_run(tmp_path / "c", "b", commit="2" * 40)
    assert dataset.labels(dataset.load([a, b])) == ["a", "b"]


def test_a_declared_comparison_speaks_for_its_own_suite_only(tmp_path):
    mine = write_run(tmp_path, "mine")
    theirs = write_run(tmp_path, "theirs", "NVIDIA H200", declare=False, suite_name="other")
    report = Report(dataset.load([mine, theirs]), tmp_path / "rep")
    by_name = {c.name: recs for c, recs, _ in report.planned}
    assert set(by_name["fast-vs-base"]["run_id"]) == {"Synthetic CPU (avx512)"}
    inferred = [recs for c, recs, _ in report.planned if not c.declared]
    # the other suite's run: its backends on the cases they share, then lin's favor cases
    assert len(inferred) == 2
    assert set(pd.concat(inferred)["run_id"]) == {"NVIDIA H200 (avx512)"}


def test_significance_paired_and_not():
    a = {"samples_ms": [1.0, 1.1, 0.9, 1.05, 0.95, 1.0], "pair_group": "g"}
    b = {"samples_ms": [2.0, 2.2, 1.8, 2.1, 1.9, 2.0], "pair_group": "g"}
    d = ratios.difference(b, a)
    assert d.is_paired and d.significant and d.interval.estimate == pytest.approx(2.0)
    same = {"samples_ms": [1.02, 0.97, 1.01, 0.99, 1.0, 1.03]}
    d = ratios.difference(same, a)
    assert not d.is_paired and not d.significant and d.interval.contains(1.0)
    assert d.describe() == "no (bootstrap)"


@pytest.mark.parametrize("table,expected", [
    ('name = "x"\nbaseline = "base"\nbackends = ["base"]', "lists the baseline 'base'"),
    ('name = "x"\nbaseline = "base"\nbackends = ["fast"]\npair = "mask"', "allowed: case, shape"),
    ('name = "x"\nbaseline = "base"\nbackends = ["fast"]\nbaseline_where = { mask = "causal" }',
     'allowed only with pair = "shape"'),
    ('name = "x y"\nbaseline = "base"\nbackends = ["fast"]', "comparison[0].name = 'x y'"),
    ('name = "x"\nbaseline = "base"\nbackends = ["fast"]\nwhere = { colour = 1 }',
     "comparison[0].where.colour = 1: unknown key"),
    ('name = "x"\nbaseline = "base"\nbackends = ["fastest"]', "unknown backend"),
    ('name = "x"\nbaseline = "base"\nbackends = ["fast"]\nmetric = "t"',
     "comparison[0].metric = 't': unknown key"),
])
def test_comparison_declarations_are_validated(write_suite, table, expected):
    text = f'backends = ["base"]\n[axes]\nseq_len = 8\n[[comparison]]\n{table}\n'
    with pytest.raises(BadInput) as err:
        load_suite(str(write_suite(text)), ["base", "fast"])
    assert expected in str(err.value) and "\n" not in str(err.value)


def test_shipped_suites_declare_their_comparisons():
    family = {c.name: c for c in load_suite("suites/family.toml").comparisons}
    window = family["window-vs-causal"]
    assert (window.baseline, window.pair) == ("sdpa", "shape")
    assert window.baseline_where == {"mask": ["causal"]}
    assert window.backends_where == {"mask": ["window(255,0)"], "mode": ["fwd"]}
    declared, note = declared_comparisons({"suite": "family",
                                               "suite_path": "suites/family.toml"})
    assert note == "" and "family-window-vs-causal" in {c.slug for c in declared}


def test_published_index_lists_every_run_with_its_headline(tmp_path):
    from attnbench.reporting.publish import build_index

    write_run(tmp_path, "2026-12-01-synth-cpu", "AMD EPYC")
    write_run(tmp_path, "2026-12-02-synth-h200", "NVIDIA H200")
    (tmp_path / "results" / "no-records").mkdir()
    build_index(tmp_path / "results", tmp_path / "reports", rebuild=True)
    md = (tmp_path / "reports" / "index.md").read_text()
    html = (tmp_path / "reports" / "index.html").read_text()
    assert "[2026-12-01-synth-cpu](2026-12-01-synth-cpu/index.md)" in md
    assert 'href="2026-12-02-synth-h200/index.html"' in html
    assert "no-records" not in md
    assert "fast 2.83x faster than base at N=4K; goals: 1 holds" in md
    assert (tmp_path / "reports" / "2026-12-01-synth-cpu" / "index.html").is_file()
