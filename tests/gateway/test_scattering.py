"""Phase scattering in the live gateway: a locked fleet is spread apart, then let go.

Sixteen identical jobs (T = 2 s, d = 1/2) on four simulated nodes, started in step: their
ids are chosen so that the simulated backend's starting phases (drawn from the id) lie within
2% of a cycle of each other, and at one period nothing pulls them apart. The gateway's
services run on a stepped clock with the in-memory agent client; the agents sample their
GPUs at 20 Hz and estimate each job's phase, the fleet watches them every reconciliation.
"""

from __future__ import annotations

import asyncio
import zlib
from pathlib import Path
from typing import Any

import pytest

from agents.service import AgentNode
from agents.simulated import SimulatedBackend
from flexmodel.jobmix import parse_job_mix
from flexmodel.phases import rayleigh_threshold
from gateway.agentclient.memory import InMemoryAgentClient
from gateway.clock import SteppedClock
from gateway.services.fleet import Fleet
from gateway.services.jobbook import JobBook
from gateway.services.overhead import Overhead
from gateway.services.scattering import Scatterer
from gateway.services.site import SitePower
from gateway.services.targets import Targets
from gateway.services.tracking import Tracker
from gateway.settings import GatewaySettings
from gateway.store.db import Store

NODES = 4
JOBS_PER_NODE = 4
RECONCILE_S = 2.0
SAMPLE_S = 0.05


def in_step_ids(count: int) -> list[str]:
    """Job ids whose simulated starting phases lie within 2% of a cycle."""
    found = (f"lock-{k}" for k in range(100_000))
    return [i for i in found if zlib.crc32(i.encode()) / 2**32 < 0.02][:count]


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


class Site:
    """The gateway's services and four simulated nodes on one stepped clock."""

    def __init__(self, folder: Path, **settings: Any) -> None:
        self.clock = SteppedClock()
        self.jobs = locked_jobs()
        mix = parse_job_mix({"jobs": self.jobs})
        self.nodes = {}
        for n in range(NODES):
            name = f"node-{n + 1:02d}"
            backend = SimulatedBackend(
                8, mix=mix, node_id=name, clock=self.clock.monotonic, noise_w=2.0
            )
            self.nodes[f"mem://{name}"] = AgentNode(
                name,
                backend,
                folder / name,
                jobs={j.id: j.gpus for j in backend.jobs},
                clock=self.clock.monotonic,
                sample_hz=20,  # sampled by the test: no thread
                window_s=12.0,
            )
        self.settings = GatewaySettings(
            database_url=f"sqlite:///{folder / 'gateway.db'}",
            lab=True,
            agents=",".join(self.nodes),
            telemetry_max_age_s=0.5 * RECONCILE_S,
            **settings,
        )
        s, clock = self.settings, self.clock
        self.store = Store(s.database_url)
        client = InMemoryAgentClient(self.nodes, clock)
        self.fleet = Fleet(s, self.store, clock, client)
        overhead = Overhead(s, self.store, clock)
        self.book = JobBook(self.store, clock, overhead)
        power = SitePower(s, clock, self.fleet, self.book, overhead, None)
        self.targets = Targets(s, self.store, clock, client, self.fleet, self.book, power)
        tracker = Tracker(s, clock, power, self.targets, self.book, self.fleet)
        self.scatterer = Scatterer(s, clock, self.fleet, self.targets, tracker)

    async def start(self) -> None:
        await self.book.replace(self.jobs, "test")
        await self.fleet.discover()

    async def run_for(self, seconds: float) -> list[dict[str, Any]]:
        """Sample the GPUs; every reconciliation period watch the phases and let the
        scatterer act (as `Reconciler.reconcile` does). What `/v1/sync` shows, each time."""
        seen = []
        per_round = round(RECONCILE_S / SAMPLE_S)
        for tick in range(round(seconds / SAMPLE_S)):
            for agent in self.nodes.values():
                agent.sampler.sample_once()
            self.clock.step(SAMPLE_S)
            if (tick + 1) % per_round == 0:
                await self.fleet.telemetry()
                await asyncio.sleep(0)
                await self.fleet.watch_phases()
                await self.scatterer.step()
                await self.targets.reconcile()
                order = (await self.fleet.phase_doc())["order_parameters"]
                seen.append({"order": order, "scattering": self.scatterer.doc()})
        return seen

    def limits(self) -> set[float]:
        return {n.backend.enforced_limit_w(g) for n in self.nodes.values() for g in range(8)}

    def throughput(self) -> float:
        return sum(sum(n.backend.job_throughput().values()) for n in self.nodes.values())


def test_a_locked_fleet_is_scattered_until_it_unlocks_then_let_go(tmp_path):
    site = Site(tmp_path)
    threshold = rayleigh_threshold(NODES * JOBS_PER_NODE)
    uncapped = site.throughput()

    async def run():
        await site.start()
        locked = await site.run_for(20.0)
        episode = site.scatterer.episode
        assert episode is not None, locked[-1]
        spread_limits, cost = site.limits(), site.throughput()
        stated = episode.throughput_cost_fraction
        unlocked = await site.run_for(240.0)
        return locked, episode, spread_limits, cost, stated, unlocked

    try:
        locked, episode, spread_limits, cost, stated, unlocked = asyncio.run(run())
    finally:
        site.store.close()
    # In step from the start: the alarm is held over three windows, then scattering starts.
    assert locked[2]["order"]["r1"] > 0.9
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
    assert site.limits() == {700.0}
    # Jobs at one period keep their phase differences once apart: still unlocked.
    assert unlocked[-1]["order"]["r1"] < threshold


def test_scattering_switched_off_leaves_a_locked_fleet_alone(tmp_path):
    site = Site(tmp_path, scatter="off")

    async def run():
        await site.start()
        return await site.run_for(20.0)

    try:
        seen = asyncio.run(run())
    finally:
        site.store.close()
    assert seen[-1]["order"]["r1"] > 0.9
    assert site.fleet.alarm.streak[0] >= 3
    assert seen[-1]["scattering"] == {"mode": "off", "active": False, "episode": None, "ended": []}
    assert site.limits() == {700.0}


def test_a_spread_that_could_only_narrow_is_refused():
    with pytest.raises(ValueError, match="FLEXGATE_SCATTER_MAX_SPREAD"):
        GatewaySettings(lab=True, scatter_spread=0.1, scatter_max_spread=0.05)
    with pytest.raises(ValueError, match="scatter"):
        GatewaySettings(lab=True, scatter="sometimes")
