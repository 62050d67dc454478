"""The jobs' phases on one clock: one vote per job, each agent's clock offset estimated.

Four simulated nodes whose agents' clocks are offset by tens of seconds from the gateway's,
four synchronous jobs each spanning two nodes. The nodes sample at different times (one
stops early), so the raw phases of one job disagree between its nodes; carried to the
gateway's clock with the estimated offsets they agree.
"""

from __future__ import annotations

import asyncio
import cmath
import math

import pytest

from agents.protocol import TelemetryResponse
from agents.service import AgentNode
from agents.simulated import SimulatedBackend
from flexmodel.jobmix import parse_job_mix
from gateway.agentclient.memory import InMemoryAgentClient
from gateway.clock import SteppedClock
from gateway.services.clocks import AgentClocks
from gateway.services.fleet import Fleet
from gateway.settings import GatewaySettings
from gateway.store.db import Store

OFFSETS = {"node-01": 0.0, "node-02": 37.3, "node-03": -12.9, "node-04": 5.55}
PAIRS = {"a": ("node-01", "node-02"), "b": ("node-01", "node-02"), "c": ("node-03", "node-04")}
PAIRS["d"] = ("node-03", "node-04")


def mix():
    jobs = []
    for i, (job, nodes) in enumerate(sorted(PAIRS.items())):
        gpus = [0, 1, 2, 3] if i % 2 == 0 else [4, 5, 6, 7]
        jobs.append(
            {
                "id": job,
                "gpus": 8,
                "power_w": 600.0,
                "throughput": 1000.0,
                "period_s": 1.6 + 0.3 * i,
                "duty": 0.5,
                "comm_power_fraction": 0.3,
                "placement": [{"node": n, "gpus": gpus} for n in nodes],
            }
        )
    return parse_job_mix({"jobs": jobs})


def circular_gap(a: float, b: float) -> float:
    return abs(cmath.phase(cmath.exp(1j * (a - b))))


def test_a_job_on_two_nodes_is_one_vote_on_the_gateways_clock(tmp_path):
    clock = SteppedClock()
    jobs = mix()
    nodes = {}
    for node, offset in OFFSETS.items():
        backend = SimulatedBackend(8, mix=jobs, node_id=node, clock=clock.monotonic, noise_w=2)
        placed = {j.id: j.gpus for j in backend.jobs}
        nodes[f"mem://{node}"] = AgentNode(
            node,
            backend,
            tmp_path / node,
            jobs=placed,
            clock=lambda offset=offset: clock.monotonic() + offset,
            sample_hz=20,  # sampled by the test, on its clock: no thread is started
            window_s=12.0,
        )
    settings = GatewaySettings(
        database_url=f"sqlite:///{tmp_path / 'gateway.db'}",
        lab=True,
        agents=",".join(nodes),
        telemetry_max_age_s=0.01,  # a new round at every tick
    )
    store = Store(settings.database_url)
    fleet = Fleet(settings, store, clock, InMemoryAgentClient(nodes, clock))

    async def run():
        await fleet.discover()
        for tick in range(241):  # 12 s at 20 Hz; node-02 stops sampling 0.8 s early
            for address, agent in nodes.items():
                if not (address.endswith("node-02") and tick > 224):
                    agent.sampler.sample_once()
            clock.step(0.05)
            await fleet.telemetry()
            await asyncio.sleep(0)  # the round runs
        return await fleet.phase_doc(), fleet.last

    try:
        doc, telemetry = asyncio.run(run())
    finally:
        store.close()

    # One vote per job, with the nodes it spans.
    assert sorted(j["job_id"] for j in doc["jobs"]) == sorted(PAIRS)
    assert {j["job_id"]: tuple(j["nodes"]) for j in doc["jobs"]} == PAIRS
    assert doc["order_parameters"]["jobs"] == len(PAIRS)
    # Each agent's clock offset, within its bound.
    for node, offset in OFFSETS.items():
        found = doc["clocks"][node]
        assert abs(found["offset_s"] - offset) <= found["error_s"] + 1e-9
    # One job's phase read on its two nodes: apart raw, together on the gateway's clock.
    now = clock.monotonic()
    raw_gaps = []
    for job, (first, second) in PAIRS.items():
        one, two = (next(j for j in telemetry[n].jobs if j.job_id == job) for n in (first, second))
        assert one.phase_rad is not None
        assert two.phase_rad is not None
        here = fleet.clocks.phase_now(first, one, now)
        there = fleet.clocks.phase_now(second, two, now)
        assert circular_gap(here, there) < 0.1
        if second == "node-02":  # sampled 0.8 s earlier: its raw phases are elsewhere
            raw_gaps.append(circular_gap(one.phase_rad, two.phase_rad))
    assert max(raw_gaps) > 1.0
    # Four jobs: the pairs' phase-locking values stand in for the Rayleigh test.
    assert doc["alarms"]["test"] == "phase-locking-value"


def test_the_offset_comes_from_the_quickest_answer():
    clocks = AgentClocks()
    # The agent's clock is 100 s ahead; slow answers (queued) are off by up to half their trip.
    clocks.observe("n", 10.0, 110.9, 12.0)  # 2 s round trip, stamped late: off by 0.9 s
    clocks.observe("n", 20.0, 120.02, 20.04)  # 40 ms
    clocks.observe("n", 30.0, 131.0, 33.0)  # 3 s
    found = clocks.offset("n")
    assert found is not None
    assert found.offset_s == pytest.approx(100.0, abs=found.error_s)
    assert found.error_s == pytest.approx(0.02)
    assert clocks.offset("elsewhere") is None


def test_a_bad_timestamp_is_ignored():
    clocks = AgentClocks()
    clocks.observe("n", 10.0, math.nan, 10.1)
    clocks.observe("n", 10.0, 50.0, 9.0)  # answered before asked
    assert clocks.offset("n") is None


def test_a_published_summary_bounds_the_offset_and_the_quickest_gives_it():
    """Over NATS nobody asks: a summary's stamp is at least the agent's offset short by its
    way through the broker, so the quickest summary gives the offset; reading one summary
    again (every telemetry round does, until the next arrives) counts it once."""
    clocks = AgentClocks()
    # The agent's clock is 100 s ahead: each summary arrives `way` after it was stamped.
    for published, way in ((10.0, 0.030), (11.0, 0.0005), (12.0, 0.080)):
        clocks.observe_published("n", 100.0 + published, published + way)
    for _ in range(40):  # the slowest one, read at every round
        clocks.observe_published("n", 112.0, 12.08)
    found = clocks.offset("n")
    assert found is not None
    assert found.offset_s == pytest.approx(100.0 - 0.0005)
    assert found.error_s is None  # a one-way stamp: no bound
    clocks.observe_published("n", math.inf, 13.0)
    assert clocks.offset("n") == found


def test_the_fleet_takes_the_quickest_of_the_summaries_kept_for_it(tmp_path):
    """The fleet's reading of kept (published) telemetry: a summary held up on its way, as a
    busy gateway holds it up, does not move the agent's offset."""

    class Published(InMemoryAgentClient):
        def __init__(self, nodes, clock):
            super().__init__(nodes, clock)
            self.kept: tuple[float, TelemetryResponse] | None = None

        def kept_telemetry(self, addresses):
            return [self.kept for _ in addresses]

    clock = SteppedClock()
    node = AgentNode("node-01", SimulatedBackend(2), tmp_path / "node", sample_hz=0)
    client = Published({"mem://node-01": node}, clock)
    settings = GatewaySettings(
        database_url=f"sqlite:///{tmp_path / 'gateway.db'}",
        lab=True,
        agents="mem://node-01",
        telemetry_max_age_s=0.01,
    )
    store = Store(settings.database_url)
    fleet = Fleet(settings, store, clock, client)

    async def run():
        await fleet.discover()
        for way in (0.002, 0.060, 0.045):  # published every second, 37.3 s ahead
            published = clock.monotonic()
            clock.step(way)
            summary = node.telemetry().model_copy(update={"agent_time_s": published + 37.3})
            client.kept = (clock.monotonic(), summary)
            for _ in range(3):
                await fleet.telemetry()
                clock.step(0.02)
            clock.step(1.0 - way - 0.06)
        return await fleet.phase_doc()

    try:
        doc = asyncio.run(run())
    finally:
        store.close()
    assert doc["clocks"]["node-01"] == {"offset_s": pytest.approx(37.3 - 0.002), "error_s": None}
