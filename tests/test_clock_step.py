"""Leases survive a step of the wall clock: they count on the monotonic clock, at the agent
that lets them run out and at the gateway that renews them (docs/reliability.md).

The wall clock is stepped in-process: the gateway's clock (passed in), and `time.time` and the
`datetime.now` that APScheduler reads itself, jump by an hour, while the monotonic clock runs
on. A lease counted on the wall clock would run out at once on a step forward, or hold for
hours on a step back.
"""

import time
from datetime import datetime, timedelta

import apscheduler.schedulers.base
import httpx
import pytest

from agents.service import AgentNode, create_app
from agents.simulated import SimulatedBackend
from flexgate.serve import ServerThread
from gateway.clock import SystemClock
from tests.conftest import wait_for
from tests.gateway.conftest import API, now_iso, running_site

TOKEN = "clock-step-token-0123456789"
HOUR_S = 3600.0


class WallClock(SystemClock):
    """The system's clocks with the wall clock stepped by `step(seconds)`: the gateway's
    clock, and the process's `time.time` and APScheduler's `datetime.now`."""

    def __init__(self, monkeypatch):
        self.offset_s = 0.0
        real_time, clock = time.time, self

        class Stepped(datetime):
            @classmethod
            def now(cls, tz=None):
                return datetime.now(tz) + timedelta(seconds=clock.offset_s)

        monkeypatch.setattr(time, "time", lambda: real_time() + self.offset_s)
        monkeypatch.setattr(apscheduler.schedulers.base, "datetime", Stepped)

    def now(self) -> datetime:
        return super().now() + timedelta(seconds=self.offset_s)

    def step(self, seconds: float) -> None:
        self.offset_s += seconds


@pytest.mark.parametrize("step_s", [HOUR_S, -HOUR_S])
def test_an_agent_lease_runs_out_on_time_whatever_the_wall_clock_does(
    tmp_path, monkeypatch, step_s
):
    clock = WallClock(monkeypatch)
    node = AgentNode("node-01", SimulatedBackend(2, node_id="node-01"), tmp_path / "node-01")
    original = node.backend.enforced_limit_w(0)
    with ServerThread(create_app([node], TOKEN)) as url:
        command = {
            "plan_id": "p",
            "generation": 1,
            "lease_s": 1.5,
            "caps": [{"gpu": 0, "cap_w": 300}],
        }
        answer = httpx.put(
            f"{url}/v1/caps", json=command, headers={"Authorization": f"Bearer {TOKEN}"}
        )
        assert answer.status_code == 200, answer.text
        applied = time.monotonic()
        clock.step(step_s)
        time.sleep(0.5)
        assert node.backend.enforced_limit_w(0) == 300.0  # a step forward ends nothing
        wait_for(lambda: node.backend.enforced_limit_w(0) == original, "the lease to run out")
        assert time.monotonic() - applied < 1.5 + 3.0  # a step back holds nothing for hours


def test_the_gateway_renews_leases_across_a_step_back(tmp_path, monkeypatch):
    clock = WallClock(monkeypatch)
    database = f"sqlite:///{tmp_path / 'gateway.db'}"
    with running_site(tmp_path, database, clock=clock, lease_s=2.0) as site:
        originals = site.limits()
        body = {"reduction_kw": 5.0, "start": now_iso(), "duration_s": 600}
        created = site.api.post("/v1/events", json=body, headers=API)
        assert created.status_code == 201, created.text
        held = site.event_caps(created.json()["id"])
        assert held != originals
        clock.step(-HOUR_S)
        time.sleep(3 * 2.0)  # three leases: only renewals keep the caps
        assert site.limits() == held
        assert all(n.controller.lease_remaining_s() > 0 for n in site.nodes.values())
