"""The published index: ``reports/index.md`` and ``reports/index.html``.

One row per run under ``results/`` that holds records: its device, suite, date, commit and
headline (each comparison's winner at its largest size, and the suite's goal verdicts),
linking the run's report (``reports/<run-id>/``). Like a report, the HTML needs nothing else.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from attnbench.reporting import document, tables
from attnbench.reporting.document import Bold, Heading, Link, Para, Table
from attnbench.reporting.report import Report, build_report
from attnbench.runs import dataset, record_files


def published_runs(results: Path) -> list[Path]:
    """Run folders holding records, newest first (run ids start with their date)."""
    runs = [d for d in results.iterdir() if d.is_dir() and (d / record_files.RECORDS).is_file()
            and record_files.read_records(d)]
    return sorted(runs, key=lambda d: (str(record_files.read_meta(d).get("started") or ""), d.name),
                  reverse=True)


def _row(run_dir: Path, reports: Path) -> dict:
    runs = dataset.load([run_dir])  # a merged dataset: its runs side by side
    run = runs[0]
    title = run.run_id if len(runs) == 1 else run_dir.name
    report_dir = reports / run_dir.name
    if (report_dir / "index.html").is_file():
        name = Link(title, f"{run_dir.name}/index.html", f"{run_dir.name}/index.md")
    else:
        name = [title, " (no report: ", Bold(f"attnbench report {run_dir}"), ")"]
    headline = Report(runs, report_dir).headlines()
    devices = " / ".join(dict.fromkeys(r.device for r in runs))
    return {"run": name, "device": devices, "suite": run.suite or "-", "date": run.date,
            "commit": run.commit, "records": tables.status_counts(dataset.combined(runs)),
            "headline": "; ".join(headline) or "-"}


def build_index(results: str | Path = "results", reports: str | Path = "reports",
                rebuild: bool = False) -> Path:
    """Write the index (and, with ``rebuild``, every run's report first)."""
    results, reports = Path(results), Path(reports)
    reports.mkdir(parents=True, exist_ok=True)
    runs = published_runs(results)
    if rebuild:
        for d in runs:
            build_report([d], reports / d.name)
    rows = [_row(d, reports) for d in runs]
    blocks = [
        Heading(1, "attnbench: published runs"),
        Para([f"{len(rows)} run(s) under {results}/, newest first. Each links its report: "
              "comparisons with their charts, winners, exponents, crossovers, claims and the "
              "environment. Headline: each comparison's fastest backend against its baseline "
              "at the largest size measured (95% interval), and the suite's goal verdicts."]),
        Table(pd.DataFrame(rows)),
    ]
    document.write(blocks, reports, "attnbench: published runs")
    return reports
