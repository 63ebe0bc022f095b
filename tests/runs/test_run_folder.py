"""Run folders (runs/run_folder.py): slugs from suite names, one folder per run."""

from __future__ import annotations

from run_command import TINY, run

from attnbench.runs.run_folder import new_run_dir, slug


def test_suite_names_become_slugs_inside_out(tmp_path):
    path = tmp_path / "evil.toml"
    path.write_text(TINY.replace('name = "tiny"', 'name = "../../../../tmp/X/' + "y" * 300
                                 + '"'))
    out = tmp_path / "results"
    assert run("--suite", str(path), "--out", str(out), "--backends", "naive") == 0
    (run_dir,) = list(out.iterdir())
    assert run_dir.parent == out and len(run_dir.name) < 100
    assert slug("../../x y/z") == "x-y-z"


def test_two_runs_in_the_same_second_get_two_folders(tmp_path):
    a = new_run_dir(tmp_path, "20261130-120000-quick-cpu", explicit=False)
    b = new_run_dir(tmp_path, "20261130-120000-quick-cpu", explicit=False)
    assert a != b and b.name.endswith("-2")
