"""`flexgate lab --scenario lock`: an unsafe site loop locks 64 jobs, the default loop keeps
them apart, scattering unlocks them. The three regimes run with the lab's own code at shorter
durations (simulated time on a stepped clock; the lab's figures in docs/sync.md are at its
default durations)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from rich.console import Console

from flexgate.lab.lock import (
    JOBS,
    METER_PERIOD_S,
    PERIOD_S,
    UNSAFE_GAIN,
    UNSAFE_WINDOW_S,
    attractive_delay_s,
    run_lock,
)
from flexgate.lab.report import lock_report
from gateway.settings import GatewaySettings
from tests.test_cli import assert_bad_input, flexgate


@pytest.mark.timeout(400)
def test_an_unsafe_loop_locks_the_default_keeps_apart_scattering_unlocks(tmp_path: Path) -> None:
    result = run_lock(lock_s=120, default_s=20, scatter_s=80, folder=tmp_path, say=lambda _: None)
    threshold = result["threshold"]
    assert JOBS >= 64
    assert threshold == pytest.approx(0.2985, abs=1e-3)
    locked, safe, scattered = result["runs"]
    # The unsafe loop: r1 towards 1, the site's swing towards sqrt(N) times the incoherent one.
    assert locked["order_parameters"]["r1"] > 0.8
    assert locked["swing_ratio"] > 0.5 * np.sqrt(JOBS)
    assert locked["loop"]["verdict"] == "unsafe"
    assert "FLEXGATE_LOOP_UNSAFE" in locked["loop"]["reason"]
    # The default loop on the same jobs: checked safe, the jobs stay apart.
    assert safe["loop"]["verdict"] == "safe"
    assert safe["order_parameters"]["r1"] < threshold
    assert safe["swing_ratio"] < 2.0
    # Scattering switched on the locked site: started by the held alarm, r1 below it.
    episode = scattered["scattering"]["episode"]
    assert "Rayleigh alarm on harmonic 1" in episode["reason"]
    assert scattered["order_parameters"]["r1"] < threshold
    assert result["unlock_s"] is not None
    assert scattered["swing_ratio"] < locked["swing_ratio"] / 2
    # During the event the spread keeps the site's total: the jobs' throughput hardly moves
    # (1.03% on this seeded run since the dependencies were installed afresh on 2026-12-06:
    # the same run at the commit whose CI read under 1% reads 1.03% on them too).
    assert abs(result["scattering_throughput_cost"]) < 0.015
    # The report, its JSON and the PNG.
    assert lock_report(result, tmp_path / "out", Console(width=200)) == 0
    doc = json.loads((tmp_path / "out" / "lab-lock-report.json").read_text())
    assert [r["name"] for r in doc["runs"]] == ["unsafe loop", "default loop", "scattering"]
    assert (tmp_path / "out" / "lab-lock.png").stat().st_size > 10_000


def test_the_unsafe_delay_is_where_the_site_loop_as_it_runs_attracts_most() -> None:
    """At gain 1 the predicted loop takes each sample's whole error: its correction is the
    swing as the window read it, held. It attracts most where the swing's whole lag (the
    dead time, the window's and the hold's halves) is three quarters of a period; the
    integrator model put it at half a period (0.7 s here), where this loop hardly pulls."""
    delay = attractive_delay_s(
        PERIOD_S,
        0.5,
        window_s=UNSAFE_WINDOW_S,
        hold_s=METER_PERIOD_S,
        integral_gain_per_s=UNSAFE_GAIN / METER_PERIOD_S,
    )
    lags_s = delay + (UNSAFE_WINDOW_S - METER_PERIOD_S) / 2 + METER_PERIOD_S / 2
    assert lags_s == pytest.approx(0.75 * PERIOD_S, abs=0.01)


def test_an_unsafe_loop_is_refused_outside_the_lab() -> None:
    with pytest.raises(ValueError, match=r"FLEXGATE_LOOP_UNSAFE .* lock scenario only"):
        GatewaySettings(
            loop_unsafe=True, api_token="a-real-api-token-0123", agent_token="a-real-agent-0123"
        )
    assert GatewaySettings(lab=True, loop_unsafe=True).loop_unsafe is True


def test_the_lock_scenario_refuses_options_that_do_not_apply() -> None:
    assert_bad_input(flexgate("lab", "--scenario", "lock", "--mismatch"), "--mismatch")
    assert_bad_input(flexgate("lab", "--scenario", "lock", "--characterise"), "--characterise")
    assert_bad_input(flexgate("lab", "--scenario", "lock", "--fault", "meter-dropout@5"), "--fault")


@pytest.mark.timeout(600)
def test_the_lock_lab_gives_the_same_answer_beside_four_cpu_burners(tmp_path: Path) -> None:
    """The lab runs on the stepped clock (the simulated GPUs and the gateway's loop both on
    it): four processes burning CPU beside it change nothing it measures (it had exited with
    "still locked" on a busy machine when it ran in real time)."""

    def trajectories(folder: Path) -> list[list[list[float]]]:
        result = run_lock(
            lock_s=8, default_s=2, scatter_s=4, folder=folder, say=lambda _: None, jobs=16
        )
        return [[list(map(float, o)) for o in run.order] for run in result["records"]]

    quiet = trajectories(tmp_path / "quiet")
    burn = "while True: pass"
    burners = [subprocess.Popen([sys.executable, "-c", burn]) for _ in range(4)]
    try:
        busy = trajectories(tmp_path / "busy")
    finally:
        for burner in burners:
            burner.kill()
            burner.wait()
    assert busy == quiet
    assert sum(len(run) for run in quiet) > 50
