"""Comments say why in a line: no code comment, docstring, shell script or suite cites a
published run folder, a dated run id, a tracker number or a seed file's hash name (the
history of a tuning lives in docs/tuning-log.md and in commit messages)."""

from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

FORBIDDEN = {
    "a results/ run folder": re.compile(r"\bresults/(?:models/)?\d{4}-"),
    "a dated run id": re.compile(r"\b20\d\d-\d\d-\d\d-[a-z]"),
    "a tracker number": re.compile(r"\bissues?[ -]#?\d+|(?<![\w/&])#\d+\b", re.IGNORECASE),
    "a seed file's hash name": re.compile(r"\b\d{3}_[0-9a-f]{16}\b"),
}


def python_comments(text: str) -> list[tuple[int, str]]:
    """Comments and docstrings (string statements) of a Python source, with their line."""
    out = []
    tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
    previous = tokenize.NEWLINE
    for tok in tokens:
        if tok.type == tokenize.COMMENT:
            out.append((tok.start[0], tok.string))
        elif tok.type == tokenize.STRING and previous in (tokenize.NEWLINE, tokenize.NL,
                                                          tokenize.INDENT, tokenize.DEDENT):
            out.append((tok.start[0], tok.string))  # a string statement: a docstring
        if tok.type not in (tokenize.COMMENT, tokenize.NL):
            previous = tok.type
    return out


CPP_COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.DOTALL)


def cpp_comments(text: str) -> list[tuple[int, str]]:
    return [(text.count("\n", 0, m.start()) + 1, m.group()) for m in CPP_COMMENT.finditer(text)]


def hash_comments(text: str) -> list[tuple[int, str]]:
    """Shell and TOML: every line (a suite's descriptions and sources are its text)."""
    return list(enumerate(text.splitlines(), 1))


def sources() -> list[tuple[Path, callable]]:
    found = []
    for folder in ("src", "implementations", "scripts", "benchmarks", "tests"):
        found += [(p, python_comments) for p in (ROOT / folder).rglob("*.py")]
    for pattern in ("*.cpp", "*.h", "*.cu"):
        found += [(p, cpp_comments) for p in (ROOT / "implementations").rglob(pattern)]
    found += [(p, hash_comments) for p in (ROOT / "scripts").rglob("*.sh")]
    found += [(p, hash_comments) for p in (ROOT / "suites").glob("*.toml")]
    return sorted(found)


def offences(text: str, reader) -> list[str]:
    hits = []
    for line, comment in reader(text):
        for what, pattern in FORBIDDEN.items():
            m = pattern.search(comment)
            if m:
                hits.append(f"line {line}: {what} ({m.group()!r})")
    return hits


@pytest.mark.parametrize("text,reader,bad", [
    ("x = 1  # ran 2x faster (results/2026-12-02-goals-r1)\n", python_comments, True),
    ('def f():\n    """See issue 26."""\n', python_comments, True),
    ("x = 1  # the seed 003_5b56d55fa636903b says so\n", python_comments, True),
    ("x = 1  # fixed in #12\n", python_comments, True),
    ('path = "results/2026-12-01-run"  # a string, not a comment\n', python_comments, False),
    ("x = 1  # upstream: triton-lang/triton#9171\n", python_comments, False),
    ("int x;  // (2026-12-03-family-cpu-xeon-heap)\n", cpp_comments, True),
    ('const char* s = "issue 4";  // quoted in code, not a comment\n', cpp_comments, False),
    ('description = "the goals of issue 26"\n', hash_comments, True),
    ("# writes $OUT/all/results/$RUN_ID\n", hash_comments, False),
])
def test_the_scanner_finds_what_it_should(text, reader, bad):
    assert bool(offences(text, reader)) == bad


def test_no_comment_cites_a_run_folder_a_tracker_number_or_a_seed_file():
    files = sources()
    assert len(files) > 50, "the scan found too few files to be looking in the right place"
    this = Path(__file__).resolve()
    bad = {}
    for path, reader in files:
        if path.resolve() == this:
            continue  # this file's own examples
        hits = offences(path.read_text(encoding="utf-8"), reader)
        if hits:
            bad[str(path.relative_to(ROOT))] = hits
    assert not bad, "\n".join(f"{p}: {h}" for p, hits in bad.items() for h in hits)
