"""Every page the code cites is in the repository: a user's clone has no design folder beside
it, so a docstring or help text that sends them to MODEL.md, CONTRACT.md or ARCHITECTURE.md
sends them nowhere. `docs/...` pages cited must exist."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUTSIDE = re.compile(r"\b(MODEL|CONTRACT|ARCHITECTURE|STYLE)\.md\b")
CITED = re.compile(r"\bdocs/[\w./-]+\.md\b")


def tracked(pattern: str) -> list[Path]:
    out = subprocess.run(["git", "ls-files", pattern], cwd=ROOT, capture_output=True, text=True)
    return [ROOT / name for name in out.stdout.split()]


def test_no_file_cites_a_page_outside_the_repository():
    found = [
        f"{path.relative_to(ROOT)}:{n}"
        for path in tracked("*.py") + tracked("*.md")
        if path.name not in (Path(__file__).name, "test_cli.py")  # these name them to forbid
        for n, line in enumerate(path.read_text().splitlines(), start=1)
        if OUTSIDE.search(line)
    ]
    assert found == []


def test_every_docs_page_cited_exists():
    missing = {
        f"{path.relative_to(ROOT)}: {page}"
        for path in tracked("*.py") + tracked("*.md") + tracked("Makefile")
        for page in CITED.findall(path.read_text())
        if not (ROOT / page).exists()
    }
    assert missing == set()
