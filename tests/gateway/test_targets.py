"""Targets held, re-planned around a lost node and released, with agents in this process.

No network and no waiting: the in-memory agent client calls simulated agents directly and the
clock moves only when the test steps it, so a recovery ramp of minutes takes milliseconds.
"""

from __future__ import annotations

import asyncio
import json

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
from gateway.services.targets import Targets
from gateway.settings import GatewaySettings
from gateway.store import repo
from gateway.store.db import Store
from tests.gateway.conftest import AGENT_TOKEN, API_TOKEN, site_jobs

RAMP_S = 120.0


class Site:
    def __init__(self, tmp_path, **options):
        jobs = site_jobs()
        mix = parse_job_mix({"jobs": jobs})
        names = sorted({p.node for j in mix.jobs for p in j.placement})
        self.nodes = {
            f"mem://{n}": AgentNode(
                n, SimulatedBackend(8, mix=mix, node_id=n), tmp_path / n, sample_hz=0
            )
            for n in names
        }
        self.clock = SteppedClock()
        self.client = InMemoryAgentClient(self.nodes, self.clock)
        settings = GatewaySettings(
            database_url=f"sqlite:///{tmp_path / 'gateway.db'}",
            api_token=API_TOKEN,
            agent_token=AGENT_TOKEN,
            agents=",".join(self.nodes),
            allow_simulated=True,  # the agents run simulated GPUs
            recovery_ramp_s=RAMP_S,
            recovery_steps=2,
            **options,
        )
        self.settings = settings
        self.store = Store(settings.database_url)
        self.fleet = Fleet(settings, self.store, self.clock, self.client)
        overhead = Overhead(settings, self.store, self.clock)
        self.book = JobBook(self.store, self.clock, overhead)
        power = SitePower(settings, self.clock, self.fleet, self.book, overhead)
        self.targets = Targets(
            settings, self.store, self.clock, self.client, self.fleet, self.book, power
        )
        self.jobs = jobs
        self.originals = self.limits()

    def limits(self) -> dict[str, list[float]]:
        return {
            a: [n.backend.enforced_limit_w(g) for g in range(n.backend.count())]
            for a, n in self.nodes.items()
        }

    async def plan(self) -> dict:
        assert self.targets.plan_id is not None
        return await self.targets.plan_doc(self.targets.plan_id)

    async def step(self, seconds: float) -> None:
        """Move the clock and let every woken task run to its next wait."""
        self.clock.step(seconds)
        for _ in range(20):
            await asyncio.sleep(0)


@pytest.fixture
def site(tmp_path):
    site = Site(tmp_path)
    yield site
    site.store.close()


def test_a_lost_node_is_planned_around_and_gets_its_share_back(site):
    async def run():
        await site.book.replace(site.jobs, "test")
        await site.targets.hold(10.0, "ev-1")
        held = site.limits()
        assert held != site.originals
        first = await site.plan()
        assert first["unreachable_nodes"] == []
        assert {c["status"] for c in first["commands"]} == {"acked"}

        lost = "mem://node-01"
        site.client.unplug(lost)
        await site.targets.reconcile()
        around = await site.plan()
        assert around["unreachable_nodes"] == ["node-01"]
        # One definition, stated the same everywhere: the plan, the nodes, and why.
        listed = {n["node"]: n for n in await site.fleet.node_docs()}
        assert listed["node-01"]["reachable"] is False
        assert "no agent answers" in listed["node-01"]["unreachable_reason"]
        assert all(listed[n]["reachable"] for n in ("node-02", "node-03"))
        assert around["requested_facility_kw"] == pytest.approx(10.0)
        others = [a for a in site.nodes if a != lost]
        assert any(site.limits()[a] != held[a] for a in others)  # they took its share

        site.client.plug(lost)
        await site.targets.reconcile()
        assert (await site.plan())["unreachable_nodes"] == []
        assert site.limits() == held

    asyncio.run(run())


def test_a_release_steps_the_caps_back_on_the_clock(site):
    async def run():
        await site.book.replace(site.jobs, "test")
        await site.targets.hold(10.0, "ev-1")
        held = site.limits()
        site.targets.release()
        await site.step(0)
        assert site.limits() == held  # nothing moves before the clock does
        await site.step(RAMP_S / 2)
        assert (await site.plan())["requested_facility_kw"] == pytest.approx(5.0)
        assert site.limits() not in (held, site.originals)
        await site.step(RAMP_S / 2)
        assert site.limits() == site.originals
        assert not site.targets.holding
        assert not site.targets.recovering

    asyncio.run(run())


def test_a_new_target_calls_off_a_release(site):
    async def run():
        await site.book.replace(site.jobs, "test")
        await site.targets.hold(10.0, "ev-1")
        site.targets.release()
        await site.step(RAMP_S / 2)
        await site.targets.hold(8.0, "ev-2")
        await site.step(RAMP_S)
        assert (await site.plan())["requested_facility_kw"] == pytest.approx(8.0)
        assert site.targets.holding

    asyncio.run(run())


def test_the_plan_as_answered_is_the_plan_its_schema_describes_built_once_per_fan_out(site):
    """`plan_json` (what `GET /v1/plans/{id}` sends, cached per fan-out) is exactly the plan
    document validated by the API's `Plan` schema, with a failed node's answer and a fresh
    shed figure; a new fan-out's answers show at once."""
    from gateway.api.schemas.plans import Plan
    from gateway.units import rounded

    async def answered() -> tuple[dict, dict]:
        plan_id = site.targets.plan_id
        as_sent = json.loads(await site.targets.plan_json(plan_id))
        schema = Plan.model_validate(rounded(await site.targets.plan_doc(plan_id)))
        return as_sent, schema.model_dump(mode="json")

    async def run():
        await site.book.replace(site.jobs, "test")
        await site.targets.hold(10.0, "ev-1")
        sent, described = await answered()
        assert sent == described
        assert {c["status"] for c in sent["commands"]} == {"acked"}
        site.client.unplug("mem://node-01")
        await site.targets.reconcile()
        sent, described = await answered()
        assert sent == described
        assert sent["unreachable_nodes"] == ["node-01"]
        assert json.loads(await site.targets.plan_json(site.targets.plan_id)) == sent
        # What is shed now is measured, not what the plan expected of the model.
        shed = (await site.targets.site.doc())["shed_facility_kw"]
        assert sent["achieved_facility_kw"] == pytest.approx(shed, abs=1e-3)
        assert sent["expected_facility_kw"] != sent["achieved_facility_kw"]

    asyncio.run(run())


def test_a_renewal_that_says_nothing_new_is_not_stored_but_shows_in_the_plan(site):
    """Each node's answer is stored when it says something new (the first answer to a plan,
    a node that fails or comes back); a renewal that only says the same again shows in the
    current plan (its answer time) but adds no row: 10,000 nodes renewed every 15 s would
    store 58 million a day."""
    from sqlmodel import func, select

    from gateway.store.models import CommandRow

    def stored(plan_id: str) -> int:
        with site.store.session() as s:
            found = select(func.count()).where(CommandRow.plan_id == plan_id)
            return s.exec(found.select_from(CommandRow)).one()

    async def run():
        await site.book.replace(site.jobs, "test")
        await site.targets.hold(10.0, "ev-1")
        nodes, plan_id = len(site.nodes), site.targets.plan_id
        assert stored(plan_id) == nodes
        first = {c["node"]: c["acked_at"] for c in (await site.plan())["commands"]}
        for _ in range(3):
            await site.step(1.0)
            await site.targets.reconcile()
        assert stored(plan_id) == nodes  # renewals that said the same: none stored
        renewed = {c["node"]: c["acked_at"] for c in (await site.plan())["commands"]}
        assert all(renewed[n] > first[n] for n in first)  # the plan shows the last answers
        site.client.unplug("mem://node-01")
        await site.targets.reconcile()
        assert stored(plan_id) == nodes + 1  # node-01's failure, and nothing else
        with site.store.session() as s:
            latest = {c.node: c for c in repo.latest_commands(s, plan_id=plan_id)}
        assert latest["node-01"].status == "failed"
        assert {c.status for n, c in latest.items() if n != "node-01"} == {"acked"}
        replanned = site.targets.plan_id  # around the lost node: every answer is its first
        assert replanned != plan_id
        assert stored(replanned) == nodes

    asyncio.run(run())


def test_a_re_plan_sends_each_node_its_planned_caps_and_counts_its_fan_outs(site):
    """The caps of a node whose caps did not move are kept from the plan before; every node's
    desired state is still exactly what the new plan says. A fan-out that fails still ends:
    the count of those finished catches up with those sent."""

    def planned() -> dict[str, list[tuple[int, float]]]:
        commands = (site.targets.last_plan or {})["commands"]
        return {c["node"]: [(x["gpu"], x["cap_w"]) for x in c["caps"]] for c in commands}

    def desired() -> dict[str, list[tuple[int, float]]]:
        return {n: [(c.gpu, c.cap_w) for c in caps] for n, caps in site.targets.desired.items()}

    async def run():
        await site.book.replace(site.jobs, "test")
        await site.targets.hold(10.0, "ev-1")
        first = desired()
        await site.targets.hold(14.0, "ev-1")
        assert desired() == planned() != first
        assert site.targets.fan_outs == site.targets.fan_outs_finished == 2

        async def broken(node, address, command):
            raise RuntimeError("transport gone")

        site.client.put_caps = broken
        with pytest.raises(RuntimeError, match="transport gone"):
            await site.targets.hold(12.0, "ev-1")
        assert site.targets.fan_outs == site.targets.fan_outs_finished == 3

    asyncio.run(run())


def test_a_restarted_gateway_ramps_from_the_caps_the_agents_still_hold(tmp_path):
    """A gateway stopped mid-event: its successor, under a ramp-up limit, holds the stored
    plan's reduction at once (no rebound to nothing, then a shed again) and releases it at the
    limit's pace."""
    limits = {"ramp_down_kw_per_min": 60.0, "ramp_up_kw_per_min": 6.0}
    first = Site(tmp_path, **limits)

    async def hold() -> None:
        await first.book.replace(first.jobs, "test")
        for _ in range(8):  # 5 kW a step at 60 kW/min and 5 s steps: 40 kW in eight
            await first.targets.hold(40.0, "ev-1")
            await first.step(first.settings.meter_period_s)
        assert first.targets.last_plan["requested_facility_kw"] == pytest.approx(40.0)

    asyncio.run(hold())
    first.store.close()
    successor = Site(tmp_path, **limits)

    async def resume() -> list[float]:
        await successor.fleet.discover()
        await successor.targets.hold(40.0, "ev-1")
        planned = [successor.targets.last_plan["requested_facility_kw"]]
        successor.targets.release()
        for _ in range(5):
            await successor.step(successor.settings.meter_period_s)
            kw = successor.targets.last_plan["requested_facility_kw"]
            if kw != planned[-1]:
                planned.append(kw)
        return planned

    try:
        planned = asyncio.run(resume())
    finally:
        successor.store.close()
    assert planned[0] == pytest.approx(40.0)
    step_kw = 6.0 * successor.settings.meter_period_s / 60.0
    assert planned[1:4] == pytest.approx([40.0 - step_kw * k for k in (1, 2, 3)])
