"""The HTTP calls docs/gateway.md and docs/operations.md tell operators to make, run as written
(curl, through a shell) against a real gateway: a documented call that fails fails here."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import EXAMPLES, ROOT
from tests.gateway.conftest import API_TOKEN

DOCS = [ROOT / "docs" / "gateway.md", ROOT / "docs" / "operations.md"]


def documented_curls(page: Path) -> list[str]:
    """Every `curl` command of the page's sh blocks to the gateway's API (port 8000), with its
    continuation lines joined."""
    commands = []
    for block in re.findall(r"```sh\n(.*?)```", page.read_text(encoding="utf-8"), flags=re.S):
        joined = block.replace("\\\n", " ")
        commands += [
            line.strip()
            for line in joined.splitlines()
            if line.strip().startswith("curl") and ":8000/v1/" in line
        ]
    return commands


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
@pytest.mark.parametrize("page", DOCS, ids=lambda p: p.name)
def test_every_documented_call_succeeds_as_written(site, tmp_path, page):
    commands = documented_curls(page)
    assert commands, f"{page.name} documents no call to the gateway's API"
    for name in ("site.json", "compose-site.json"):
        shutil.copy(EXAMPLES / name, tmp_path / name)
    (tmp_path / "examples").mkdir()
    shutil.copy(EXAMPLES / "compose-site.json", tmp_path / "examples" / "compose-site.json")
    port = site.api.base_url.port
    for command in commands:
        here = re.sub(
            r"(http://)?(localhost|127\.0\.0\.1):8000", f"http://127.0.0.1:{port}", command
        )
        result = subprocess.run(
            ["bash", "-c", f"{here} -sS -w '\\n%{{http_code}}'"],
            cwd=tmp_path,
            env={"FLEXGATE_API_TOKEN": API_TOKEN, "PATH": "/usr/bin:/bin"},
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        body, _, status = result.stdout.rpartition("\n")
        assert result.returncode == 0, (command, result.stderr)
        assert status.startswith("2"), (command, status, body)
        json.loads(body)
