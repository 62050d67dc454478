"""The fast path end to end: a gateway arms plans on simulated agents (real uvicorn servers,
HTTP), `POST /v1/fast/trigger` puts every node at its armed caps, the lease brings the
originals back; the event is listed with source `fast` and timed in /metrics."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import re
import time
from types import SimpleNamespace

import httpx
import pytest

from agents.fasttrigger import TriggerGuard
from agents.service import create_app as agent_app
from flexgate.serve import ServerThread
from gateway.agentclient import AgentUnreachableError
from gateway.agentclient.memory import InMemoryAgentClient
from gateway.app import create_app
from gateway.clock import SteppedClock
from gateway.services.fast import FastPath
from gateway.services.fasttriggers import TriggerNotSentError
from gateway.settings import GatewaySettings
from gateway.store import repo
from gateway.store.db import Store
from tests.gateway.conftest import AGENT_TOKEN, API, API_TOKEN, Site, start_site
from tests.promtext import samples

SECRET = "fast-secret-0123456789abcdef"
DEPTHS = (10.0, 20.0, 30.0, 40.0)


@contextlib.contextmanager
def fast_site(
    tmp_path, protect: str | None = None, *, memory: bool = False, gateway_port=0, **extra
):
    """Agents (checking triggers with the site's secret) and a gateway arming 10-40 %: over
    HTTP, or with `memory` the agents in the gateway's process (`InMemoryAgentClient`);
    `gateway_port`: the gateway's (0: any free one); `extra`: more of the gateway's
    settings."""
    jobs, nodes, _ = start_site(tmp_path, None)
    for job in jobs:
        job["protected"] = job["id"] == protect
    agents = agent_app(
        list(nodes.values()), AGENT_TOKEN, prefixed=True, fast=TriggerGuard(SECRET, 2.0)
    )
    with ServerThread(agents) as agents_url:
        addresses = {f"mem://{n}" if memory else f"{agents_url}/nodes/{n}": n for n in nodes}
        settings = GatewaySettings(
            database_url=f"sqlite:///{tmp_path / 'gateway.db'}",
            api_token=API_TOKEN,
            agent_token=AGENT_TOKEN,
            agents=",".join(addresses),
            allow_simulated=True,
            lease_s=5.0,
            fast_depths="40,10,20,30",
            fast_secret=SECRET,
            fast_rearm_s=0.2,
            **extra,
        )
        client = InMemoryAgentClient({a: nodes[n] for a, n in addresses.items()})
        with (
            ServerThread(
                create_app(settings, agents=client if memory else None), port=gateway_port
            ) as url,
            httpx.Client(base_url=url, timeout=20) as api,
        ):
            assert api.put("/v1/jobs", json={"jobs": jobs}, headers=API).status_code == 200
            site = Site(api, nodes, settings)
            site.wait(lambda: armed_everywhere(site), what="plans armed on the agents")
            yield site


def armed_everywhere(site: Site) -> bool:
    doc = site.api.get("/v1/fast/armed").json()
    return doc["generation"] > 0 and doc["armed_nodes"]["40"] > 0


def armed_caps(site: Site, depth: float) -> dict[str, dict[int, float]]:
    """What each agent holds armed at `depth`, read on the agent."""
    return {
        name: {c.gpu: c.cap_w for c in node.controller.armed.get(depth, ())}
        for name, node in site.nodes.items()
    }


def trigger(site: Site, depth_pct=20.0, duration_s=1.0, headers=API):
    return site.api.post(
        "/v1/fast/trigger", json={"depth_pct": depth_pct, "duration_s": duration_s}, headers=headers
    )


def test_plans_are_armed_per_depth_deeper_is_lower_and_within_each_gpus_limits(tmp_path):
    with fast_site(tmp_path) as site:
        doc = site.api.get("/v1/fast/armed").json()
        assert doc["depths_pct"] == list(DEPTHS)
        reductions = [doc["expected_reduction_kw"][f"{d:g}"] for d in DEPTHS]
        assert reductions == sorted(reductions)
        assert reductions[0] > 0
        before = site.limits()
        for shallow, deep in itertools.pairwise(DEPTHS):
            a, b = armed_caps(site, shallow), armed_caps(site, deep)
            for name in a:
                assert all(b[name][g] <= w for g, w in a[name].items())
        for name, node in site.nodes.items():
            floor = node.backend.constraints(0).min_w
            assert all(w >= floor for w in armed_caps(site, 40.0)[name].values())
        assert site.limits() == before  # arming changes no limit


def test_a_protected_jobs_gpus_are_never_armed(tmp_path):
    with fast_site(tmp_path, protect="llama-3.1-70b-pt-x16") as site:
        for depth in DEPTHS:
            caps = armed_caps(site, depth)
            assert caps["node-01"] == {}
            assert caps["node-02"] == {}
            assert caps["node-03"] != {}


@pytest.mark.parametrize("memory", [False, True], ids=["http", "in-memory"])
def test_a_trigger_puts_every_node_at_its_armed_caps_and_the_lease_restores(tmp_path, memory):
    with fast_site(tmp_path, memory=memory) as site:
        before = site.limits()
        caps = armed_caps(site, 30.0)
        answer = trigger(site, 30.0, duration_s=1.5)
        assert answer.status_code == 202, answer.text
        body = answer.json()
        expected = {name: [caps[name].get(g, before[name][g]) for g in range(8)] for name in before}
        assert expected != before
        site.wait(lambda: site.limits() == expected, what="the armed caps enforced")
        events = site.api.get("/v1/events").json()["events"]
        fast = [e for e in events if e["source"] == "fast"]
        assert [e["id"] for e in fast] == [body["event_id"]]
        assert fast[0]["status"] == "triggered"
        assert fast[0]["reduction_kw"] == pytest.approx(body["expected_reduction_kw"])
        assert site.api.get("/v1/fast/armed").json()["holding"] is True
        metrics = samples(site.api.get("/metrics").text)
        assert metrics["flexgate_fast_trigger_to_enforced_seconds_count"] >= 1
        [sent] = site.api.get("/v1/fast/triggers").json()["triggers"]
        assert (sent["seq"], sent["event_id"], sent["renewal"]) == (
            body["seq"],
            fast[0]["id"],
            False,
        )
        site.wait(
            lambda: (
                site.api.get("/v1/fast/triggers").json()["triggers"][0]["reports"]
                == len(site.nodes)
            ),
            what="every node's report",
        )
        sent = site.api.get("/v1/fast/triggers").json()["triggers"][0]
        assert sent["nodes_applied"] == len(site.nodes)
        assert 0.0 <= sent["first_enforced_s"] <= sent["enforced_s"]
        site.wait(lambda: site.limits() == before, what="the originals back at the lease's end")
        site.wait(
            lambda: site.api.get(f"/v1/events/{body['event_id']}").json()["status"] == "completed",
            what="the fast event completed",
        )


@pytest.mark.parametrize(
    ("body", "headers", "status", "words"),
    [
        ({"depth_pct": 15, "duration_s": 5}, API, 422, "15% is not armed (armed: 10, 20, 30, 40"),
        ({"depth_pct": 20, "duration_s": 0}, API, 422, "greater than 0"),
        ({"depth_pct": 20, "duration_s": 5, "x": 1}, API, 422, "Extra inputs"),
        ({"depth_pct": 20, "duration_s": 5}, {}, 401, "FLEXGATE_API_TOKEN"),
    ],
)
def test_bad_triggers_are_refused_and_change_nothing(tmp_path, body, headers, status, words):
    with fast_site(tmp_path) as site:
        before = site.limits()
        answer = site.api.post("/v1/fast/trigger", json=body, headers=headers)
        assert answer.status_code == status
        assert words in str(answer.json()["detail"])
        assert site.limits() == before
        assert [
            e for e in site.api.get("/v1/events").json()["events"] if e["source"] == "fast"
        ] == []


def test_plans_unchanged_are_not_sent_again(tmp_path):
    with fast_site(tmp_path) as site:
        sent = site.api.get("/v1/fast/armed").json()["nodes_sent"]
        generations = {n: node.controller.armed_generation for n, node in site.nodes.items()}
        for _ in range(3):  # the checks run every 0.2 s: a mix that did not move sends nothing
            time.sleep(0.25)
            assert site.api.get("/v1/fast/armed").json()["nodes_sent"] == sent
        assert {
            n: node.controller.armed_generation for n, node in site.nodes.items()
        } == generations


def test_a_change_of_the_mix_re_arms_with_a_higher_generation(tmp_path):
    with fast_site(tmp_path) as site:
        sent = site.api.get("/v1/fast/armed").json()["nodes_sent"]
        old = site.nodes["node-03"].controller.armed_generation
        jobs = site.api.get("/v1/jobs").json()["jobs"]
        for job in jobs:
            job["min_throughput_fraction"] = 0.9  # a tighter floor: shallower caps
        assert site.api.put("/v1/jobs", json={"jobs": jobs}, headers=API).status_code == 200
        site.wait(
            lambda: (site.nodes["node-03"].controller.armed_generation or 0) > old,
            what="node-03 re-armed",
        )
        assert site.api.get("/v1/fast/armed").json()["nodes_sent"] > sent


def test_the_site_loop_holds_while_a_fast_event_lasts():
    clock = SteppedClock()
    settings = GatewaySettings(api_token=API_TOKEN, agent_token=AGENT_TOKEN)
    fast = FastPath(settings, None, clock, None, None, None)
    steps = []

    async def step():
        steps.append(clock.monotonic())

    held = fast.hold(step)
    asyncio.run(held())
    fast.until_s = clock.monotonic() + 5.0
    asyncio.run(held())
    clock.step(5.0)
    asyncio.run(held())
    assert len(steps) == 2


def test_a_restarted_gateway_completes_the_fast_events_that_ended_and_holds_the_others(tmp_path):
    with fast_site(tmp_path) as site:
        short = trigger(site, 20.0, duration_s=0.5).json()["event_id"]
        settings = site.settings
    # The gateway stopped before it ended (its tasks went with it); another starts after.
    time.sleep(0.6)
    with (
        ServerThread(create_app(settings)) as url,
        httpx.Client(base_url=url, timeout=20) as api,
    ):
        wait = Site(api, {}, settings).wait
        wait(lambda: api.get(f"/v1/events/{short}").json()["status"] == "completed", what="done")
        assert api.get("/v1/fast/armed").json()["holding"] is False
        # A trigger now is a new event (the other is over), not a renewal.
        answer = api.post(
            "/v1/fast/trigger", json={"depth_pct": 30.0, "duration_s": 600.0}, headers=API
        ).json()
        assert answer["renewal"] is False
        long = answer["event_id"]
        assert long != short
    with (
        ServerThread(create_app(settings)) as url,
        httpx.Client(base_url=url, timeout=20) as api,
    ):
        assert api.get(f"/v1/events/{long}").json()["status"] == "triggered"
        assert api.get("/v1/fast/armed").json()["holding"] is True
        # A trigger while it lasts renews it, after a restart too.
        again = api.post(
            "/v1/fast/trigger", json={"depth_pct": 30.0, "duration_s": 600.0}, headers=API
        ).json()
        assert (again["event_id"], again["renewal"]) == (long, True)


class BrokerDown:
    """A fast transport whose broker does not answer."""

    async def start(self, on_fired):
        return None

    async def arm_many(self, targets):
        return ["no broker"] * len(targets)

    async def trigger(self, body, signature, addresses):
        raise AgentUnreachableError("the trigger was not published: no broker")


def test_a_trigger_the_broker_cannot_take_is_503_and_records_nothing(tmp_path):
    settings = GatewaySettings(
        database_url=f"sqlite:///{tmp_path / 'gateway.db'}",
        api_token=API_TOKEN,
        agent_token=AGENT_TOKEN,
        fast_depths="20",
        fast_secret=SECRET,
    )
    store = Store(settings.database_url)
    try:
        fleet = SimpleNamespace(nodes={"node-01": "node-01"})
        fast = FastPath(settings, store, SteppedClock(), fleet, None, BrokerDown())
        with pytest.raises(TriggerNotSentError, match="nothing changed: the trigger was not"):
            asyncio.run(fast.trigger(20.0, 5.0))
        assert fast.holding is False
        with store.session() as s:
            assert repo.list_events(s) == []
    finally:
        store.close()


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"fast_depths": "10,abc"}, "FLEXGATE_FAST_DEPTHS must be comma-separated percentages"),
        ({"fast_depths": "10,120", "fast_secret": SECRET}, "each in (0, 100]"),
        ({"fast_depths": "10,20"}, "FLEXGATE_FAST_DEPTHS needs FLEXGATE_FAST_SECRET"),
        ({"fast_depths": "10", "fast_secret": "changeme"}, "FLEXGATE_FAST_SECRET must be a secret"),
    ],
)
def test_fast_settings_that_cannot_work_are_refused_naming_them(changes, words):
    with pytest.raises(ValueError, match=re.escape(words)):
        GatewaySettings(api_token=API_TOKEN, agent_token=AGENT_TOKEN, **changes)
