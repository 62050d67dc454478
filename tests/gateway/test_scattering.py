"""Phase scattering in the live gateway: a locked fleet is spread apart, then let go.

Sixteen identical jobs (T = 2 s, d = 1/2) on four simulated nodes, started in step: their
ids are chosen so that the simulated backend's starting phases (drawn from the id) lie within
2% of a cycle of each other (`flexgate.lab.simsite.in_step_ids`), and at one period nothing pulls
them apart. The gateway's services run on a stepped clock (`flexgate.lab.simsite.SimulatedSite`):
the agents sample their GPUs at 20 Hz and estimate each job's phase, and every
reconciliation period the fleet watches them and the scatterer acts. No event: the caps
scattering sets are its own.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from flexgate.lab.simsite import SimulatedSite, Truth, in_step_ids
from flexmodel.phases import rayleigh_threshold
from gateway.settings import GatewaySettings

NODES = 4
JOBS_PER_NODE = 4
RECONCILE_S = 2.0


def locked_jobs() -> list[dict[str, Any]]:
    ids = iter(in_step_ids(NODES * JOBS_PER_NODE))
    return [
        {
            "id": next(ids),
            "gpus": 2,
            "power_w": 600.0,
            "throughput": 4000.0 + 500.0 * (n * JOBS_PER_NODE + j),
            "pfi": 1.4,
            "period_s": 2.0,
            "duty": 0.5,
            "comm_power_fraction": 0.4,
            "placement": [{"node": f"node-{n + 1:02d}", "gpus": [2 * j, 2 * j + 1]}],
        }
        for n in range(NODES)
        for j in range(JOBS_PER_NODE)
    ]


class Site(SimulatedSite):
    """The locked fleet, its phases sampled, the scatterer on guard."""

    def __init__(self, folder: Path, **settings: Any) -> None:
        jobs = locked_jobs()
        super().__init__(
            jobs,
            Truth(jobs, 1.3, 0.0),
            declared_overhead_factor=1.3,
            meter_period_s=0.5,
            time_constant_s=0.0,
            sample_hz=20.0,
            folder=folder,
            reconcile_period_s=RECONCILE_S,
            telemetry_max_age_s=0.5 * RECONCILE_S,
            **settings,
        )

    async def watch(self, seconds: float) -> list[dict[str, Any]]:
        """What `/v1/sync` shows after each reconciliation period."""
        seen = []
        for _ in range(round(seconds / RECONCILE_S)):
            await self.run_for(RECONCILE_S)
            order = (await self.fleet.phase_doc())["order_parameters"]
            seen.append(
                {
                    "order": order,
                    "scattering": self.scatterer.doc(),
                    "streak": list(self.fleet.alarm.streak),
                }
            )
        return seen

    def caps(self) -> set[float]:
        return {cap for node in self.limits().values() for cap in node}

    def throughput(self) -> float:
        return sum(sum(b.job_throughput().values()) for b in self.backends)


def test_a_locked_fleet_is_scattered_until_it_unlocks_then_let_go(tmp_path):
    site = Site(tmp_path)
    threshold = rayleigh_threshold(NODES * JOBS_PER_NODE)
    uncapped = site.throughput()

    async def run():
        await site.start()
        locked = await site.watch(20.0)
        episode = site.scatterer.episode
        assert episode is not None, locked[-1]
        spread_limits, cost = site.caps(), site.throughput()
        stated = episode.throughput_cost_fraction
        unlocked = await site.watch(240.0)
        return locked, episode, spread_limits, cost, stated, unlocked

    try:
        locked, episode, spread_limits, cost, stated, unlocked = asyncio.run(run())
    finally:
        site.close()
    # In step from the start: the alarm is held over three windows, then scattering starts.
    assert max(s["order"]["r1"] for s in locked if s["order"]) > 0.9
    assert "Rayleigh alarm on harmonic 1" in episode.reason
    assert episode.order_at_start["r1"] > threshold
    # Small per-job offsets: a cap for each job, all near the top; the cost is what it says.
    assert len(spread_limits) >= NODES * JOBS_PER_NODE - 1
    assert min(spread_limits) > 550.0
    measured_fraction = 1.0 - cost / uncapped
    assert measured_fraction == pytest.approx(stated, rel=0.05)
    assert 0.0 < measured_fraction < 0.02
    # The offsets spread the rates: r1 falls below the threshold, the episode ends with its
    # figures, and the caps are released (no event: nothing else holds them).
    assert min(s["order"]["r1"] for s in unlocked) < threshold
    ended = unlocked[-1]["scattering"]
    assert ended["active"] is False
    (record,) = ended["ended"]
    assert record["order_at_end"]["r1"] < threshold
    assert record["ended"] > record["started"]
    assert record["throughput_cost_fraction"] == pytest.approx(measured_fraction, rel=0.05)
    assert site.caps() == {700.0}
    # Jobs at one period keep their phase differences once apart: still unlocked.
    assert unlocked[-1]["order"]["r1"] < threshold


def test_scattering_switched_off_leaves_a_locked_fleet_alone(tmp_path):
    site = Site(tmp_path, scatter="off")

    async def run():
        await site.start()
        return await site.watch(20.0)

    try:
        seen = asyncio.run(run())
    finally:
        site.close()
    assert seen[-1]["order"]["r1"] > 0.9
    assert site.fleet.alarm.streak[0] >= 3
    assert seen[-1]["scattering"] == {"mode": "off", "active": False, "episode": None, "ended": []}
    assert site.caps() == {700.0}


def test_a_spread_that_could_only_narrow_is_refused():
    with pytest.raises(ValueError, match="FLEXGATE_SCATTER_MAX_SPREAD"):
        GatewaySettings(lab=True, scatter_spread=0.1, scatter_max_spread=0.05)
    with pytest.raises(ValueError, match="scatter"):
        GatewaySettings(lab=True, scatter="sometimes")


def test_a_fleet_at_risk_under_an_attracting_loop_is_scattered_before_the_alarm(tmp_path):
    """During an event under a site loop the analysis finds attractive (kept only by the
    lab's FLEXGATE_LOOP_UNSAFE), phases above the threshold start scattering at once, and the
    spread keeps the event's total."""
    # Gain 0.3: attractive by the loop as it runs (at gain 1 the integrator model called it
    # attractive, the closed loop does not).
    site = Site(tmp_path, meter_delay_s=0.6, loop_window_s=0.5, loop_gain=0.3, loop_unsafe=True)

    async def run():
        await site.start()
        await site.tracker.pursue("ev-1", 2.5, None)
        seen = await site.watch(12.0)
        return seen, site.targets.last_plan

    try:
        seen, plan = asyncio.run(run())
    finally:
        site.close()
    assert site.tracker.config.verdict == "unsafe"
    first = next(s for s in seen if s["scattering"]["active"])
    assert first["streak"][0] < site.fleet.alarm.hold  # before the alarm could be held
    reason = first["scattering"]["episode"]["reason"]
    assert reason.startswith("at risk")
    assert "finds unsafe" in reason
    # the event's plans carry the spread, at the same total
    assert plan["tracking"]["event_id"] == "ev-1"
    assert plan["scattering"]["rate_spread"] == site.settings.scatter_spread
    assert abs(plan["scattering"]["power_change_facility_kw"]) < 0.01
