"""`flexgate lab` and `flexgate mock-vtn` as a user runs them (real servers on loopback)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from flexgate.lab.mockvtn import check_scenario
from flexgate.serve import free_port
from tests.conftest import ROOT
from tests.test_cli import assert_bad_input, flexgate, write


@pytest.mark.timeout(180)
def test_lab_meets_the_target_end_to_end(tmp_path: Path) -> None:
    result = flexgate("lab", "--nodes", "2", "--duration", "15", "--out", tmp_path, timeout=150)
    assert result.returncode == 0, result.stdout + result.stderr
    plot = tmp_path / "lab-site-power.png"
    assert f"plot: {plot}" in result.stdout.replace("\n", "")
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    report = json.loads((tmp_path / "lab-report.json").read_text())
    assert report["met"] is True
    assert report["achieved_kw"] == pytest.approx(report["requested_kw"], rel=0.05)
    # The event came from openleadr's VTN, was answered optIn, planned and carried out.
    assert report["event"]["opt"] == "in"
    assert report["event"]["status"] == "completed"
    assert report["event"]["id"].startswith("oadr-")
    assert report["plan"]["feasible"] is True
    assert report["sync"]["verdict"] == "safe"
    for name in ("requested at the meter", "throughput kept", "control delay against T/2"):
        assert name in result.stdout


@pytest.mark.timeout(180)
def test_lab_exits_1_when_the_site_cannot_meet_the_target(tmp_path: Path) -> None:
    # 95% of the GPU-attributable power is more than caps down to 200 W of 700 W can shed.
    result = flexgate(
        "lab",
        "--nodes",
        "1",
        "--reduction",
        "0.95",
        "--duration",
        "12",
        "--out",
        tmp_path,
        timeout=150,
    )
    assert result.returncode == 1, result.stdout + result.stderr
    report = json.loads((tmp_path / "lab-report.json").read_text())
    assert report["met"] is False
    assert report["achieved_kw"] < 0.95 * report["requested_kw"]
    assert "outside 5%" in result.stdout


@pytest.mark.parametrize(
    ("scenario", "fragment"),
    [
        ({}, "non-empty 'events'"),
        ({"events": [], "vtn": 1}, "non-empty 'events'"),
        ({"events": [{"signal_name": "SIMPLE"}], "colour": 1}, "unknown field(s) ['colour']"),
        ({"events": [{"signal_name": "SIMPLE", "signal_type": "level"}]}, "missing 'intervals'"),
        (
            {"events": [{"signal_name": "SIMPLE", "signal_type": "level", "intervals": [{}]}]},
            "positive 'duration_s'",
        ),
        ({"events": [{"signal_name": "X", "when": 3}]}, "unknown field(s) ['when']"),
    ],
)
def test_a_bad_scenario_is_refused_naming_the_problem(scenario, fragment) -> None:
    with pytest.raises(ValueError, match=re.escape(fragment)):
        check_scenario(scenario)


def test_mock_vtn_refuses_a_bad_scenario_file(tmp_path: Path) -> None:
    path = write(tmp_path, "scenario.json", {"events": [{"signal_name": "SIMPLE"}]})
    assert_bad_input(flexgate("mock-vtn", "--scenario", path), "missing 'signal_type'")
    assert_bad_input(flexgate("mock-vtn", "--scenario", tmp_path / "nope.json"), "no such file")
    assert_bad_input(flexgate("mock-vtn", "--scenario", write(tmp_path, "x.json", "{")), "x.json")


@pytest.mark.timeout(120)
def test_mock_vtn_issues_its_scenario_to_a_gateway_and_prints_both_sides(tmp_path: Path) -> None:
    """Two real processes: `flexgate mock-vtn` and `flexgate gateway --lab` (no agents, so
    the site can shed nothing and the gateway opts out, with its reason, and reports 0 kW)."""
    scenario = {
        "vtn_id": "MOCK_VTN",
        "poll_s": 1,
        "report_s": 1,
        "events": [
            {
                "signal_name": "LOAD_DISPATCH",
                "signal_type": "delta",
                "start_offset_s": 3,
                "ramp_up_s": 2,
                "startafter_s": 1,
                "intervals": [{"duration_s": 5, "value": -1.5}],
            }
        ],
    }
    path = write(tmp_path, "scenario.json", scenario)
    vtn_port, gw_port = free_port(), free_port()
    command = [sys.executable, "-m", "flexgate.cli"]
    vtn = subprocess.Popen(
        [*command, "mock-vtn", "--scenario", str(path), "--port", str(vtn_port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        cwd=ROOT,
    )
    env = {
        **os.environ,
        "FLEXGATE_DATABASE_URL": f"sqlite:///{tmp_path / 'gw.db'}",
        "FLEXGATE_VTN_URL": f"http://127.0.0.1:{vtn_port}/OpenADR2/Simple/2.0b",
        "FLEXGATE_VEN_NAME": "flexgate-cli",
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
            if "report from 'flexgate-cli': shed_kw" in line and any(
                "answered" in x for x in lines
            ):
                break
    finally:
        for process in (gateway, vtn):
            process.terminate()
            process.wait(10)
        vtn.stdout.close()
    text = "\n".join(lines)
    assert "VTN: registered VEN 'flexgate-cli'" in text
    assert "sent LOAD_DISPATCH/delta event" in text
    assert "[-1.5]" in text
    assert "answered optOut" in text  # nothing placed: the site can shed 0 kW
    assert "report from 'flexgate-cli': facility_kw = 0.0 kW" in text


@pytest.mark.timeout(400)
def test_lab_characterises_jobs_told_no_pfi_then_meets_the_target(tmp_path: Path) -> None:
    result = flexgate(
        "lab",
        "--nodes",
        "2",
        "--duration",
        "15",
        "--characterise",
        "--out",
        tmp_path,
        timeout=380,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    found = json.loads((tmp_path / "lab-characterise.json").read_text())
    assert found["probe"]["status"] == "completed"
    measured = [row for row in found["estimates"] if row["pfi"] is not None]
    assert measured, found["estimates"]
    for row in measured:  # each estimate against the truth on its own grid
        assert abs(row["error"]) <= 3 * row["pfi_stderr"] + 0.05, row
    kept = found["throughput"]
    assert kept["kept"] <= kept["oracle_kept"] + 1e-3  # the oracle is the ceiling
    assert "measured PFI against the truth" in result.stdout
