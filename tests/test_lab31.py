"""`flexgate lab --openadr 3.1` and `flexgate mock-vtn --openadr 3.1` as a user runs them
(real processes and servers on loopback)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from flexgate.serve import free_port
from tests.conftest import ROOT
from tests.test_cli import assert_bad_input, flexgate


@pytest.mark.timeout(200)
def test_lab_over_openadr_31_meets_the_target_end_to_end(tmp_path: Path) -> None:
    """A 30 s event: its settled half (what the lab judges) holds three of the loop's windows.
    At 15 s it held one and a half, and on a loaded machine (the loop's delay p99 over 1 s) the
    last correction of the ramp still showed in it: +5.6% once against the 5% bound."""
    result = flexgate(
        "lab",
        "--openadr",
        "3.1",
        "--nodes",
        "2",
        "--duration",
        "30",
        "--out",
        tmp_path,
        timeout=170,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads((tmp_path / "lab-report.json").read_text())
    assert report["met"] is True
    assert report["event"]["id"].startswith("oadr3-")  # from the 3.1 mock VTN
    assert report["event"]["opt"] == "in"
    assert report["event"]["status"] == "completed"
    assert "notified" in result.stdout  # by webhook
    assert "report 'flexgate" in result.stdout  # and reported at the interval's end


def test_mock_vtn_31_refuses_a_20b_scenario() -> None:
    assert_bad_input(
        flexgate("mock-vtn", "--openadr", "3.1", "--scenario", "x.json"), "2.0b scenario"
    )


@pytest.mark.timeout(120)
def test_mock_vtn_31_issues_an_event_to_a_31_gateway_and_prints_both_sides(tmp_path: Path):
    """Two real processes: `flexgate mock-vtn --openadr 3.1` and `flexgate gateway --lab`
    with FLEXGATE_OPENADR=3.1 (no agents, so the site can shed nothing: the VEN tells the VTN
    in a report why it does not act on the event)."""
    vtn_port, gw_port = free_port(), free_port()
    command = [sys.executable, "-m", "flexgate.cli"]
    vtn = subprocess.Popen(
        [*command, "mock-vtn", "--openadr", "3.1", "--port", str(vtn_port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        cwd=ROOT,
    )
    env = {
        **os.environ,
        "FLEXGATE_DATABASE_URL": f"sqlite:///{tmp_path / 'gw.db'}",
        "FLEXGATE_OPENADR": "3.1",
        "FLEXGATE_VTN_URL": f"http://127.0.0.1:{vtn_port}",
        "FLEXGATE_VTN_CLIENT_ID": "flexgate-lab-ven",
        "FLEXGATE_VTN_CLIENT_SECRET": "flexgate-lab-ven-secret",
        "FLEXGATE_VEN_NAME": "flexgate-cli",
        "FLEXGATE_VEN_CALLBACK_URL": f"http://127.0.0.1:{gw_port}/openadr3/notifications",
    }
    gateway = subprocess.Popen(
        [*command, "gateway", "--lab", "--port", str(gw_port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
        cwd=ROOT,
    )
    lines: list[str] = []
    try:
        deadline = time.monotonic() + 60
        assert vtn.stdout is not None
        while time.monotonic() < deadline:
            line = vtn.stdout.readline()
            lines.append(line.strip())
            # The VEN answers the notification first and reports after: either may print first.
            if any("issued event" in x for x in lines) and any(
                "report 'not acted on" in x for x in lines
            ):
                break
    finally:
        for process in (gateway, vtn):
            process.terminate()
            process.wait(10)
        vtn.stdout.close()
    text = "\n".join(lines)
    assert "VTN: ven 2 'flexgate-cli' created" in text
    assert "notifications of EVENT CREATE: 200" in text
    assert "issued event" in text
    assert "report 'not acted on: " in text  # nothing placed: the site can shed 0 kW
