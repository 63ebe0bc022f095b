"""Reading the commit of a checkout never writes to it (no .git/index.lock, no index
refresh racing the user's own git commands)."""

from __future__ import annotations

import os
import shutil
import subprocess
import time

import pytest

from attnbench.runs.environment import git_state


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_git_state_reads_without_locking_the_index(tmp_path):
    def git(*args):
        subprocess.run(["git", "-c", "user.email=t@t", "-c", "user.name=t", *args],
                       cwd=tmp_path, check=True, capture_output=True)

    git("init", "-q")
    (tmp_path / "f").write_text("a\n")
    git("add", "f")
    git("commit", "-qm", "first")
    stamp = time.time() + 5  # the index's stat data is now stale: a plain `git status`
    os.utime(tmp_path / "f", (stamp, stamp))  # would rewrite .git/index through index.lock
    index = tmp_path / ".git" / "index"
    before = (index.stat().st_ino, index.stat().st_mtime_ns)
    commit, dirty = git_state(tmp_path)
    assert commit and len(commit) == 40 and dirty is False
    assert (index.stat().st_ino, index.stat().st_mtime_ns) == before
    assert not (tmp_path / ".git" / "index.lock").exists()
