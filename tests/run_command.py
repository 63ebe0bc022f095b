"""`attnbench run` in process on a tiny suite, and the one-line error it must print."""

from __future__ import annotations

from pathlib import Path

from attnbench.cli import main

TINY = """
name = "tiny"
backends = ["naive", "sdpa"]
[timing]
warmup_s = 0.0
budget_s = 0.002
min_reps = 2
max_reps = 3
[axes]
heads_q = 1
head_dim = 8
seq_len = [16, 32]
"""


def run(*argv) -> int:
    return main(["run", "--no-isolate", "--no-progress", "--no-report", *argv])


def one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert err.startswith("attnbench: error: ") and "\n" not in err, err
    assert "Traceback" not in err
    return err


def files_under(path: Path) -> set[Path]:
    return {p for p in path.rglob("*")} if path.exists() else set()
