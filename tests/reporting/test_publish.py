"""The published index lists tracked or marked runs only and leaves git clean."""

from __future__ import annotations

import pytest


@pytest.mark.slow
def test_publish_lists_only_tracked_or_marked_runs_and_leaves_git_clean(tmp_path):
    import shutil
    import subprocess

    from test_report import write_run

    from attnbench.reporting.publish import build_index
    if shutil.which("git") is None:
        pytest.skip("git is not installed")

    def git(*args):
        return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
                              cwd=tmp_path, check=True, capture_output=True, text=True).stdout

    git("init", "-q")
    (tmp_path / ".gitignore").write_text("/results/*/\n/reports/*/\n")
    write_run(tmp_path, "2026-12-01-synth-cpu", "AMD EPYC")
    build_index(tmp_path / "results", tmp_path / "reports", rebuild=True, every=True)
    git("add", "-A")
    git("add", "-f", "results/2026-12-01-synth-cpu", "reports/2026-12-01-synth-cpu")
    git("commit", "-qm", "published run")
    write_run(tmp_path, "2026-12-02-adhoc-cpu", "AMD EPYC")      # a local run
    write_run(tmp_path, "2026-12-03-marked-cpu", "NVIDIA H200")  # marked for publication
    (tmp_path / "results" / "2026-12-03-marked-cpu" / "PUBLISH").touch()
    build_index(tmp_path / "results", tmp_path / "reports")
    md = (tmp_path / "reports" / "index.md").read_text()
    assert "2026-12-01-synth-cpu](2026-12-01-synth-cpu/index.md)" in md
    assert "adhoc" not in md
    assert "2026-12-03-marked-cpu (no report" in md  # its report folder is ignored: no link
    git("add", "-f", "results/2026-12-03-marked-cpu")
    git("add", "-A")
    git("commit", "-qm", "index with the marked run")
    build_index(tmp_path / "results", tmp_path / "reports")
    assert git("status", "--porcelain") == ""
    everything = build_index(tmp_path / "results", tmp_path / "reports", every=True)
    assert "adhoc" in (everything / "index.md").read_text()
    assert git("status", "--porcelain") == ""


def test_a_replicate_run_without_its_own_report_links_to_its_pooled_report(tmp_path):
    from test_report import write_run

    from attnbench.reporting.publish import build_index
    from attnbench.reporting.report import build_report
    runs = [write_run(tmp_path, f"2026-12-0{i}-rep-r{i}", "AMD EPYC") for i in (1, 2)]
    build_report(runs, tmp_path / "reports" / "2026-12-01-rep-pooled")
    lone = write_run(tmp_path, "2026-12-03-lone-cpu", "AMD EPYC")
    md = (build_index(tmp_path / "results", tmp_path / "reports", every=True)
          / "index.md").read_text()
    for run in runs:
        assert (f"[{run.name} (in the pooled report)](../2026-12-01-rep-pooled/index.md)"
                in md), md
    assert f"{lone.name} (no report" in md
