"""The published index: ``reports/index.md`` and ``reports/index.html``.

Three lists, one line each with a short headline, linking the report: the pooled reports
(a report folder built from two or more runs that are all under results/), then the runs
meant for publication (``is_published``: records tracked by git, or a ``PUBLISH`` marker in
the folder; outside a git work tree, every run), then the model runs (``results/models/``).
Ad-hoc runs never enter it, so a local run followed by ``attnbench publish`` leaves ``git
status`` clean; ``--all`` writes every run's index to ``reports/all-runs/`` (ignored by
git) instead.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pandas as pd

from attnbench.reporting import document, model_report
from attnbench.reporting.document import Bold, Heading, Link, Para, Table
from attnbench.reporting.report import Report, build_report, runs_of
from attnbench.runs import dataset, record_files

MARKER = "PUBLISH"  # an empty file in a run folder: publish it though git does not track it
ALL_RUNS = "all-runs"  # the ad-hoc index's folder under reports/
MODELS = "models"  # model runs' folder under results/


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


def _has_report(report_dir: Path, every: bool) -> bool:
    html = report_dir / "index.html"
    return html.is_file() and (every or not git_ignored(html))


def _link(title: str, report_dir: Path, prefix: str, every: bool, how: str,
          pooled: Path | None = None) -> object:
    """A link to the run's own report; else to the pooled report it is part of (replicate
    runs publish their records and one pooled report); else how to make one."""
    for target, text in ((report_dir, title), (pooled, f"{title} (in the pooled report)")):
        if target is not None and _has_report(target, every):
            return Link(text, f"{prefix}{target.name}/index.html",
                        f"{prefix}{target.name}/index.md")
    return [title, " (no report: ", Bold(how), ")"]


def _row(run_dir: Path, reports: Path, prefix: str = "", every: bool = False,
         pooled: Path | None = None) -> dict:
    runs = dataset.load([run_dir])  # a merged dataset: its runs side by side
    run = runs[0]
    title = run.run_id if len(runs) == 1 else run_dir.name
    report_dir = reports / run_dir.name
    return {"report": _link(title, report_dir, prefix, every, f"attnbench report {run_dir}",
                            pooled),
            "device": " / ".join(dict.fromkeys(r.device for r in runs)),
            "suite": run.suite or "-", "date": run.date,
            "headline": Report(runs, report_dir).short_headline()}


def _header_runs(report_dir: Path) -> list[str]:
    """The runs named in a report's title line, for reports written before their manifest
    listed them."""
    try:
        with open(report_dir / "index.md", encoding="utf-8") as fh:
            first = fh.readline()
    except OSError:
        return []
    head = "# attnbench report: "
    return [n.strip() for n in first[len(head):].split(",")] if first.startswith(head) else []


def pooled_reports(results: Path, reports: Path) -> list[tuple[Path, list[Path]]]:
    """Report folders built from two or more runs that are all under ``results``: (the
    folder, its runs), newest run first."""
    found = []
    for d in sorted(p for p in reports.iterdir() if p.is_dir()) if reports.is_dir() else []:
        names = runs_of(d) or _header_runs(d)
        runs = [results / n for n in names]
        if len(runs) >= 2 and all((r / record_files.RECORDS).is_file() for r in runs):
            found.append((d, runs))
    return sorted(found, key=lambda f: (max(r.name for r in f[1]), f[0].name), reverse=True)


def _pooled_row(report_dir: Path, run_dirs: list[Path], prefix: str, every: bool) -> dict:
    runs = dataset.load(run_dirs)
    return {"report": _link(report_dir.name, report_dir, prefix, every,
                            "attnbench report " + " ".join(map(str, run_dirs))),
            "device": " / ".join(dict.fromkeys(r.device for r in runs)),
            "suite": " / ".join(dict.fromkeys(r.suite or "-" for r in runs)),
            "date": max(r.date for r in runs),
            "headline": f"{len(runs)} runs: " + Report(runs, report_dir).short_headline()}


def model_runs(results: Path, every: bool = False) -> list[Path]:
    folder = results / MODELS
    if not folder.is_dir():
        return []
    return sorted((d for d in folder.iterdir() if d.is_dir()
                   and (d / record_files.RECORDS).is_file() and (every or is_published(d))),
                  reverse=True)


def _model_row(run_dir: Path, reports: Path, prefix: str, every: bool) -> dict:
    meta = record_files.read_meta(run_dir)
    env = meta.get("env") or meta.get("environment") or {}
    return {"report": _link(run_dir.name, reports / run_dir.name, prefix, every,
                            f"attnbench model --report {run_dir}"),
            "device": env.get("device_name") or "-", "suite": meta.get("suite") or "-",
            "date": str(meta.get("started") or run_dir.name)[:10],
            "headline": model_report.short_headline(run_dir)}


def build_index(results: str | Path = "results", reports: str | Path = "reports",
                rebuild: bool = False, every: bool = False) -> Path:
    """Write the index to ``reports/`` (``every``: of all runs, to ``reports/all-runs/``);
    with ``rebuild``, each listed report first. Returns the folder written."""
    results, reports = Path(results), Path(reports)
    reports.mkdir(parents=True, exist_ok=True)
    runs = published_runs(results, every)
    models = model_runs(results, every)
    pooled = pooled_reports(results, reports)
    if rebuild:
        for d in runs:
            build_report([d], reports / d.name)
        for d, members in pooled:
            build_report(members, d)
        for d in models:
            model_report.write_model_report(d, reports / d.name)
    pooled_in = {m.name: d for d, members in pooled for m in members}
    out, prefix = (reports / ALL_RUNS, "../") if every else (reports, "")
    out.mkdir(exist_ok=True)
    which = "every run" if every else "the published runs (tracked by git or marked PUBLISH)"
    title = f"attnbench: {'all runs' if every else 'published runs'}"
    blocks = [
        Heading(1, title),
        Para([f"{which.capitalize()} under {results}/, newest first, each with its headline "
              "and a link to its report: answers first (the fastest backend and by how much, "
              "where it crosses over, how accurate), then claims, winners and each "
              "comparison with its charts."]),
    ]
    for heading, rows in (
            ("Pooled reports", [_pooled_row(d, m, prefix, every) for d, m in pooled]),
            ("Runs", [_row(d, reports, prefix, every, pooled_in.get(d.name)) for d in runs]),
            ("Model runs", [_model_row(d, reports, prefix, every) for d in models])):
        if rows:
            blocks += [Heading(2, heading), Table(pd.DataFrame(rows))]
    document.write(blocks, out, title)
    return out
