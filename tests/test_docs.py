"""The design document is in the repository and cited by its path."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_design_doc_is_in_the_repo_and_cited():
    assert (ROOT / "docs" / "design.md").exists()
    for path in (ROOT / "src").rglob("*.py"):
        assert not re.search(r"(?<!docs/)DESIGN\.md", path.read_text()), path
