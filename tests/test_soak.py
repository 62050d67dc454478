"""The soak in its bounded CI form: `bench/soak.py` for a few seconds, 50 clients from this
second process, 50 nodes. Any error fails it. The full run (60 s, 1000 nodes) is
`make soak`; its figures are in docs/reliability.md."""

import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT


@pytest.mark.slow
def test_a_short_soak_answers_every_request(tmp_path):
    out = tmp_path / "soak.json"
    command = [sys.executable, "bench/soak.py", "--seconds", "6", "--clients", "50"]
    command += ["--nodes", "50", "--fan-out-s", "3", "--out", str(out)]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["errors"] == 0, report["first_errors"]
    assert report["requests"] > 200
    assert report["memory_under_load"]["fan_outs"] >= 2  # the nodes got their state meanwhile
    assert report["memory_fan_outs_alone"]["fan_outs"] >= 2
    assert set(report["by_kind"]) >= {"quote", "plan", "create", "cancel", "invalid", "site"}
