"""The published index: ``reports/index.md`` and ``reports/index.html``.

One row per run meant for publication (``is_published``: its records are tracked by git,
or its folder holds a ``PUBLISH`` marker; outside a git work tree, every run) that holds
records: its device, suite, date, commit and headline (each comparison's winner at its
largest size, and the suite's goal verdicts), linking the run's report
(``reports/<run-id>/``) unless git ignores it. Ad-hoc runs never enter it, so a local run
followed by ``attnbench publish`` leaves ``git status`` clean; ``--all`` writes every run's
index to ``reports/all-runs/`` (ignored by git) instead. Like a report, the HTML needs
nothing else.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pandas as pd

from attnbench.reporting import document, tables
from attnbench.reporting.document import Bold, Heading, Link, Para, Table
from attnbench.reporting.report import Report, build_report
from attnbench.runs import dataset, record_files

MARKER = "PUBLISH"  # an empty file in a run folder: publish it though git does not track it
ALL_RUNS = "all-runs"  # the ad-hoc index's folder under reports/


def _git(args: list[str], where: Path) -> subprocess.CompletedProcess | None:
    """``git`` run in ``where``; None where git or a work tree is missing."""
    try:
        return subprocess.run(["git", *args], cwd=where, capture_output=True, text=True,
                              timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None


def _in_work_tree(where: Path) -> bool:
    done = _git(["rev-parse", "--is-inside-work-tree"], where)
    return bool(done and done.returncode == 0 and done.stdout.strip() == "true")


def is_published(run_dir: Path) -> bool:
    """Meant for publication: marked with ``PUBLISH``, or its records tracked by git (every
    run, outside a git work tree: nothing there to keep clean)."""
    if (run_dir / MARKER).is_file():
        return True
    if not _in_work_tree(run_dir):
        return True
    done = _git(["ls-files", "--error-unmatch", record_files.RECORDS], run_dir)
    return bool(done and done.returncode == 0)


def git_ignored(path: Path) -> bool:
    """Whether git ignores ``path`` (a tracked file never is); False outside a work tree."""
    where = path.parent if path.parent.is_dir() else Path.cwd()
    if not _in_work_tree(where):
        return False
    done = _git(["check-ignore", "-q", path.name], where)
    return bool(done and done.returncode == 0)


def published_runs(results: Path, every: bool = False) -> list[Path]:
    """Run folders holding records and meant for publication (``every``: all of them),
    newest first (run ids start with their date)."""
    runs = [d for d in results.iterdir() if d.is_dir() and (d / record_files.RECORDS).is_file()
            and record_files.read_records(d) and (every or is_published(d))]
    return sorted(runs, key=lambda d: (str(record_files.read_meta(d).get("started") or ""), d.name),
                  reverse=True)


def _row(run_dir: Path, reports: Path, prefix: str = "", every: bool = False) -> dict:
    runs = dataset.load([run_dir])  # a merged dataset: its runs side by side
    run = runs[0]
    title = run.run_id if len(runs) == 1 else run_dir.name
    report_dir = reports / run_dir.name
    html = report_dir / "index.html"
    if html.is_file() and (every or not git_ignored(html)):
        name = Link(title, f"{prefix}{run_dir.name}/index.html",
                    f"{prefix}{run_dir.name}/index.md")
    else:
        name = [title, " (no report: ", Bold(f"attnbench report {run_dir}"), ")"]
    headline = Report(runs, report_dir).headlines()
    devices = " / ".join(dict.fromkeys(r.device for r in runs))
    return {"run": name, "device": devices, "suite": run.suite or "-", "date": run.date,
            "commit": run.commit, "records": tables.status_counts(dataset.combined(runs)),
            "headline": "; ".join(headline) or "-"}


def build_index(results: str | Path = "results", reports: str | Path = "reports",
                rebuild: bool = False, every: bool = False) -> Path:
    """Write the index of published runs to ``reports/`` (``every``: of all runs, to
    ``reports/all-runs/``); with ``rebuild``, each listed run's report first. Returns the
    folder written."""
    results, reports = Path(results), Path(reports)
    reports.mkdir(parents=True, exist_ok=True)
    runs = published_runs(results, every)
    if rebuild:
        for d in runs:
            build_report([d], reports / d.name)
    out, prefix = (reports / ALL_RUNS, "../") if every else (reports, "")
    out.mkdir(exist_ok=True)
    rows = [_row(d, reports, prefix, every) for d in runs]
    which = "every run" if every else "the published runs (tracked by git or marked PUBLISH)"
    blocks = [
        Heading(1, f"attnbench: {'all runs' if every else 'published runs'}"),
        Para([f"{len(rows)} run(s) under {results}/: {which}, newest first. Each links its "
              "report: "
              "comparisons with their charts, winners, exponents, crossovers, claims and the "
              "environment. Headline: each comparison's fastest backend against its baseline "
              "at the largest size measured (95% interval), and the suite's goal verdicts."]),
        Table(pd.DataFrame(rows)),
    ]
    document.write(blocks, out, f"attnbench: {'all runs' if every else 'published runs'}")
    return out
