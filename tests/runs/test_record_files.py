"""Damaged record files: every reader of records.jsonl checks each line for being a record.

A line that is not one (valid JSON of another shape, text that is not JSON, bytes that are
not UTF-8) is one line on stderr naming file and line, exit 2, nothing rewritten. A last line
cut off by a kill is reported once and ignored, and a resume runs its pair again so that
each pair ends up in the file exactly once. compare and report name a run with no records."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from attnbench.cli import main
from attnbench.core.errors import BadInput
from attnbench.runs import dataset, rank_folders
from attnbench.runs.record_files import META, RECORDS, load_results, read_records

TINY = """
name = "tiny"
backends = ["naive"]
[timing]
warmup_s = 0.0
budget_s = 0.002
min_reps = 2
max_reps = 3
[axes]
heads_q = 1
head_dim = 8
seq_len = [16, 24, 32]
"""

# (name, the damaged line's bytes, what the error line says it is)
DAMAGED = [
    ("list", b"[1, 2]", "(a JSON list)"),
    ("null", b"null", "(JSON null)"),
    ("string", b'"x"', "(a JSON string)"),
    ("empty-object", b"{}", "(an object without key, backend, status)"),
    ("status-only", b'{"status": "ok"}', "(an object without key, backend)"),
    ("key-not-a-string", b'{"key": 7, "backend": "naive", "status": "ok"}', "its key is 7"),
    ("not-json", b'{"key": "k", "backend"', "(not JSON: "),
    ("not-utf8", b'\xff\xfe{"key": "k"}', "(byte 0xff at column 1 is not UTF-8)"),
]
CUT_OFF = "the last line was cut off, probably by a kill; it is ignored and its pair " \
          "will run again"


def cli(*argv) -> int:
    return main(list(argv))


def run(*argv) -> int:
    return main(["run", "--no-isolate", "--no-progress", "--no-report", *argv])


def one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert err.startswith("attnbench: error: ") and "\n" not in err, err
    assert "Traceback" not in err
    return err


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def measured(tmp_path_factory) -> Path:
    """A real three-pair run (naive at N 16, 24 and 32), measured once."""
    root = tmp_path_factory.mktemp("damaged")
    suite = root / "tiny.toml"
    suite.write_text(TINY)
    assert run("--suite", str(suite), "--out", str(root / "results"), "--run-id", "A") == 0
    assert len(read_records(root / "results" / "A")) == 3
    return root / "results" / "A"


@pytest.fixture
def results(measured, tmp_path) -> Path:
    """A fresh copy of the measured run under ``results/`` (also the published tree)."""
    out = tmp_path / "results"
    shutil.copytree(measured, out / "A")
    (out / "A" / "PUBLISH").touch()
    return out


def damage(run_dir: Path, line: bytes, at: int = 2) -> None:
    """Put ``line`` in the middle of the run's records file (after ``at`` records)."""
    path = run_dir / RECORDS
    lines = path.read_bytes().splitlines(keepends=True)
    lines.insert(at, line + b"\n")
    path.write_bytes(b"".join(lines))


def check_refused(err: str, run_dir: Path, says: str) -> None:
    assert f"{run_dir / RECORDS}:3: not a record " in err, err
    assert says in err, err
    assert "allowed: one JSON object per line with key, backend, status" in err
    assert "(nothing was changed)" in err


CLI_READERS = {
    "report": lambda out, tmp: ["report", str(out / "A"), "--out", str(tmp / "rep")],
    "compare-base": lambda out, tmp: ["compare", str(out / "A"), str(out / "B")],
    "compare-new": lambda out, tmp: ["compare", str(out / "B"), str(out / "A")],
    "merge": lambda out, tmp: ["merge", str(out / "A"), str(out / "B"), "--out",
                               str(tmp / "merged")],
    "publish": lambda out, tmp: ["publish", "--results", str(out), "--reports",
                                 str(tmp / "rep")],
    "resume": lambda out, tmp: ["run", "--no-isolate", "--no-progress", "--no-report",
                                "--resume", "A", "--out", str(out)],
}


@pytest.mark.parametrize("name,line,says", DAMAGED, ids=[d[0] for d in DAMAGED])
@pytest.mark.parametrize("command", sorted(CLI_READERS))
def test_a_damaged_line_is_one_error_line_exit_2_and_nothing_changed(
        results, tmp_path, capsys, command, name, line, says):
    shutil.copytree(results / "A", results / "B")
    (results / "B" / META).write_text(
        (results / "B" / META).read_text().replace('"run_id": "A"', '"run_id": "B"'))
    damage(results / "A", line)
    before = snapshot(results)
    assert cli(*CLI_READERS[command](results, tmp_path)) == 2
    check_refused(one_line_error(capsys), results / "A", says)
    assert snapshot(results) == before
    assert not (tmp_path / "rep").exists() and not (tmp_path / "merged").exists()


@pytest.mark.parametrize("name,line,says", DAMAGED, ids=[d[0] for d in DAMAGED])
@pytest.mark.parametrize("reader", ["load_results", "load_results-file", "dataset",
                                    "read_records"])
def test_library_readers_refuse_a_damaged_line(results, reader, name, line, says):
    import attnbench

    run_dir = results / "A"
    damage(run_dir, line)
    read = {"load_results": lambda: attnbench.load_results(run_dir),
            "load_results-file": lambda: load_results(run_dir / RECORDS),
            "dataset": lambda: dataset.load([run_dir]),
            "read_records": lambda: read_records(run_dir)}[reader]
    with pytest.raises(BadInput) as exc:
        read()
    check_refused(str(exc.value), run_dir, says)


@pytest.mark.parametrize("name,line,says", DAMAGED, ids=[d[0] for d in DAMAGED])
@pytest.mark.parametrize("where", ["run", "rank"])
def test_folding_rank_folders_refuses_a_damaged_line_and_folds_nothing(
        results, name, line, says, where):
    run_dir = results / "A"
    rank = run_dir / rank_folders.RANKS / "1"
    rank.mkdir(parents=True)
    (rank / RECORDS).write_bytes((run_dir / RECORDS).read_bytes())
    (run_dir / RECORDS).write_bytes(b"".join(
        (run_dir / RECORDS).read_bytes().splitlines(keepends=True)[:2]))
    damaged = run_dir if where == "run" else rank
    damage(damaged, line)
    before = snapshot(run_dir)
    with pytest.raises(BadInput) as exc:
        rank_folders.fold(run_dir)
    check_refused(str(exc.value), damaged, says)
    assert snapshot(run_dir) == before


def test_a_cut_off_last_line_is_reported_once_and_ignored(results, tmp_path, capsys):
    path = results / "A" / RECORDS
    data = path.read_bytes()
    path.write_bytes(data[:-40])  # killed in the middle of writing the last record
    assert cli("report", str(results / "A"), "--out", str(tmp_path / "rep")) == 0
    err = capsys.readouterr().err
    assert err.count(CUT_OFF) == 1 and f"{path}: " in err, err
    assert len(read_records(results / "A")) == 2
    assert path.read_bytes() == data[:-40]  # a report rewrites nothing


def test_a_cut_off_last_line_in_a_rank_folder_is_reported_and_its_pair_left_out(
        results, capsys):
    run_dir = results / "A"
    rank = run_dir / rank_folders.RANKS / "1"
    rank.mkdir(parents=True)
    lines = (run_dir / RECORDS).read_bytes().splitlines(keepends=True)
    (run_dir / RECORDS).write_bytes(lines[0])
    (rank / RECORDS).write_bytes(b"".join(lines[1:])[:-30])  # its last record cut off
    assert rank_folders.fold(run_dir) == 1
    assert CUT_OFF in capsys.readouterr().err
    assert len(read_records(run_dir)) == 2 and (run_dir / RECORDS).read_bytes().endswith(b"\n")


def raw_pairs(run_dir: Path) -> list[tuple[str, str]]:
    """Every line of the records file as (key, backend): duplicates stay visible."""
    rows = [json.loads(x) for x in (run_dir / RECORDS).read_text().splitlines()]
    return [(r["key"], r["backend"]) for r in rows]


def test_resume_after_a_cut_off_last_line_has_every_pair_exactly_once(measured, results,
                                                                       capsys):
    path = results / "A" / RECORDS
    path.write_bytes(path.read_bytes()[:-25])
    capsys.readouterr()
    assert run("--resume", "A", "--out", str(results)) == 0
    assert capsys.readouterr().err.count(CUT_OFF) == 1
    assert sorted(raw_pairs(results / "A")) == sorted(raw_pairs(measured))
    assert path.read_bytes().endswith(b"\n")


def test_resume_keeps_a_complete_last_line_that_lost_only_its_newline(measured, results,
                                                                       capsys):
    path = results / "A" / RECORDS
    data = path.read_bytes()
    path.write_bytes(data[:-1])  # killed between the record and its newline
    assert run("--resume", "A", "--out", str(results)) == 0
    assert CUT_OFF not in capsys.readouterr().err
    assert path.read_bytes() == data  # nothing to run again, nothing lost
    assert sorted(raw_pairs(results / "A")) == sorted(raw_pairs(measured))


def no_records(path: Path, with_file: bool = True) -> Path:
    """A run killed before its first record: meta.json, and an empty records.jsonl."""
    path.mkdir(parents=True)
    (path / META).write_text(json.dumps({"run_id": path.name, "suite": "tiny"}))
    if with_file:
        (path / RECORDS).write_text("")
    return path


@pytest.mark.parametrize("side", ["base", "new"])
@pytest.mark.parametrize("with_file", [True, False], ids=["empty-records", "meta-only"])
def test_compare_with_a_run_without_records_says_so(results, tmp_path, capsys, side,
                                                    with_file):
    empty = no_records(tmp_path / "E", with_file)
    a = [str(results / "A"), str(empty)]
    assert cli("compare", *(a if side == "new" else a[::-1])) == 2
    err = one_line_error(capsys)
    assert f"{empty}: run E holds no record yet" in err and "--resume E" in err


@pytest.mark.parametrize("with_file", [True, False], ids=["empty-records", "meta-only"])
def test_report_on_a_run_without_records_says_so(tmp_path, capsys, with_file):
    empty = no_records(tmp_path / "E", with_file)
    assert cli("report", str(empty), "--out", str(tmp_path / "rep")) == 2
    assert f"{empty}: run E holds no record yet" in one_line_error(capsys)
    assert not (tmp_path / "rep").exists()


def test_a_pair_missing_from_the_new_run_prints_as_missing(results, tmp_path, capsys):
    new = tmp_path / "new"
    shutil.copytree(results / "A", new)
    lines = (new / RECORDS).read_bytes().splitlines(keepends=True)
    gone = json.loads(lines.pop(0))
    (new / RECORDS).write_bytes(b"".join(lines))
    assert cli("compare", str(results / "A"), str(new), "--fail-on-regression",
               "--threshold", "100") == 1
    out = capsys.readouterr().out
    assert f"  MISSING {gone['backend']} {gone['key']} (base: ok)" in out
    assert "-> nan" not in out and f"REGRESSION {gone['backend']} {gone['key']}" not in out
