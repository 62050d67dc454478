"""Shared fixtures: where ../shared is, and the example files."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared"
EXAMPLES = ROOT / "examples"


@pytest.fixture
def shared() -> Path:
    """The design folder beside the clone (CI always has it; a user's clone may not)."""
    if not (SHARED / "data" / "h200_pfi_table.csv").exists():
        pytest.skip(f"../shared is not beside this clone ({SHARED} missing)")
    return SHARED
