"""The site loop on the estimate reads the agents' power sensors (issue 34, item 6: the one
sensor model): each agent reports its GPUs' sensor in `/health`, and the estimate's path is
the agents' averaging behind the slowest sensor's lag."""

from __future__ import annotations

import asyncio

import pytest

from agents.service import AgentNode
from agents.simulated import SimulatedBackend
from flexmodel.jobmix import parse_job_mix
from gateway.agentclient.memory import InMemoryAgentClient
from gateway.clock import SteppedClock
from gateway.services.fleet import Fleet
from gateway.services.jobbook import JobBook
from gateway.services.overhead import Overhead
from gateway.services.site import SitePower
from gateway.settings import GatewaySettings
from gateway.store.db import Store
from tests.gateway.conftest import AGENT_TOKEN, API_TOKEN, site_jobs


@pytest.mark.parametrize(("lags", "expected"), [((0.1, 0.55), 0.55), ((None, None), 0.0)])
def test_the_estimates_path_carries_the_slowest_agents_sensor_lag(tmp_path, lags, expected):
    jobs = site_jobs()
    mix = parse_job_mix({"jobs": jobs})
    names = sorted({p.node for j in mix.jobs for p in j.placement})[:2]
    nodes = {
        f"mem://{n}": AgentNode(
            n, SimulatedBackend(8, mix=mix, node_id=n), tmp_path / n, sample_hz=0, sensor_lag_s=lag
        )
        for n, lag in zip(names, lags, strict=True)
    }
    clock = SteppedClock()
    settings = GatewaySettings(
        database_url=f"sqlite:///{tmp_path / 'gateway.db'}",
        api_token=API_TOKEN,
        agent_token=AGENT_TOKEN,
        agents=",".join(nodes),
        allow_simulated=True,
    )
    store = Store(settings.database_url)
    try:
        fleet = Fleet(settings, store, clock, InMemoryAgentClient(nodes, clock))
        overhead = Overhead(settings, store, clock)
        site = SitePower(settings, clock, fleet, JobBook(store, clock, overhead), overhead)
        asyncio.run(fleet.discover())
        health = nodes[f"mem://{names[0]}"].health()
        path = site.meter_path()
    finally:
        store.close()
    assert health.sensor is not None  # every agent says what its sensor is
    assert path.dead_s == pytest.approx(expected)
    assert path.source == f"estimate (the agents' sensor lag {expected:g} s)"
