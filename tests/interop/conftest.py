"""The reference VTN (`refvtn`) each interop test module runs, one per module."""

from __future__ import annotations

import pytest

from tests.interop import refvtn


@pytest.fixture(scope="module")
def vtn(tmp_path_factory):
    if not refvtn.source_dir().exists():
        pytest.skip(f"the reference VTN is not at {refvtn.source_dir()} (../shared absent)")
    with refvtn.running(tmp_path_factory.mktemp("refvtn")) as vtn:
        yield vtn
