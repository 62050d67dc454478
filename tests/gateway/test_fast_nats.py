"""The fast path over a real `nats-server -js`: plans armed by request on each node's subject,
one signed broadcast trigger for the whole site, each agent process's report heard; a replayed,
unsigned or stale message changes nothing."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import time

import nats

from agents.fasttrigger import TriggerGuard
from agents.natsconnect import NatsOptions as AgentNatsOptions
from agents.natslink import NatsLink
from agents.protocol import GpuCap
from agents.protocol_fast import FAST_TRIGGER_SUBJECT, ArmCommand, ArmedDepth, FastTrigger
from agents.service import AgentNode
from agents.service import create_app as agent_app
from agents.simulated import SimulatedBackend
from flexgate.serve import ServerThread
from gateway.agentclient.natsbus import NatsAgentClient, NatsOptions
from gateway.agentclient.natsfast import NatsFast
from gateway.clock import SystemClock
from tests.conftest import wait_for
from tests.gateway.conftest import AGENT_TOKEN
from tests.gateway.test_nats import nats_server  # noqa: F401 (the fixture)
from tests.natsserver import NATS_TOKEN

SECRET = "fast-secret-0123456789abcdef"
NAMES = ["node-a", "node-b", "node-c"]


@contextlib.contextmanager
def farm(tmp_path, url):
    """Three simulated nodes in one process, on one NATS connection (as bench/farm.py)."""
    nodes = {
        n: AgentNode(n, SimulatedBackend(8, node_id=n), tmp_path / "agents" / n, sample_hz=0)
        for n in NAMES
    }
    guard = TriggerGuard(SECRET, 2.0)
    link = NatsLink(
        list(nodes.values()),
        AgentNatsOptions(url, token=NATS_TOKEN),
        AGENT_TOKEN,
        telemetry_period_s=5.0,
        fast=guard,
    )
    app = agent_app(list(nodes.values()), AGENT_TOKEN, prefixed=True, links=[link], fast=guard)
    with ServerThread(app):
        yield nodes, guard


def limits(node: AgentNode) -> list[float]:
    return [node.backend.enforced_limit_w(g) for g in range(8)]


def armed(generation: int, cap_w: float) -> ArmCommand:
    caps = [GpuCap(gpu=g, cap_w=cap_w) for g in range(4)]
    return ArmCommand(generation=generation, depths=[ArmedDepth(depth_pct=20, caps=caps)])


def signed(seq: int, secret: str = SECRET, sent_at_s: float | None = None):
    body = (
        FastTrigger(
            seq=seq,
            sent_at_s=time.time() if sent_at_s is None else sent_at_s,
            depth_pct=20,
            duration_s=30,
        )
        .model_dump_json()
        .encode()
    )
    return body, hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def test_armed_by_request_and_fired_by_one_broadcast(tmp_path, nats_server):  # noqa: F811
    with farm(tmp_path, nats_server.url) as (nodes, _):
        before = {n: limits(node) for n, node in nodes.items()}
        reports = []

        async def run():
            client = NatsAgentClient(
                NatsOptions(nats_server.url, token=NATS_TOKEN),
                AGENT_TOKEN,
                timeout_s=2.0,
                retries=0,
                lease_s=30.0,
            )
            await client.connect()
            fast = NatsFast(client, SystemClock())
            await fast.start(lambda fired, at: reports.append(fired))
            try:
                errors = await fast.arm_many([(n, n, armed(5, 400.0)) for n in NAMES])
                stale = await fast.arm_many([("node-a", "node-a", armed(4, 300.0))])
                body, sig = signed(7)
                await fast.trigger(body, sig, NAMES)
                await asyncio.to_thread(
                    wait_for, lambda: sum(r.applied for r in reports) == 3, "the report"
                )
                return errors, stale
            finally:
                await client.close()

        errors, stale = asyncio.run(run())
        assert errors == [None, None, None]
        assert "status 409" in stale[0]
        assert nodes["node-a"].controller.armed[20.0][0].cap_w == 400.0
        for n, node in nodes.items():
            assert limits(node) == [400.0] * 4 + before[n][4:]
        (report,) = reports  # one process: one report for its three nodes
        assert (report.seq, report.nodes, report.applied, report.failed_gpus) == (7, 3, 3, 0)


def test_unsigned_replayed_or_stale_triggers_change_nothing(tmp_path, nats_server):  # noqa: F811
    with farm(tmp_path, nats_server.url) as (nodes, guard):
        for node in nodes.values():
            node.controller.arm(armed(1, 400.0))
        before = {n: limits(node) for n, node in nodes.items()}

        async def publish(*messages):
            nc = await nats.connect(nats_server.url, token=NATS_TOKEN)
            try:
                for body, sig in messages:
                    headers = {"Flexgate-Signature": sig} if sig else None
                    await nc.publish(FAST_TRIGGER_SUBJECT, body, headers=headers)
                await nc.flush()
            finally:
                await nc.close()

        first = signed(10)
        asyncio.run(publish(first))
        wait_for(
            lambda: all(limits(n)[3] == 400.0 for n in nodes.values()), "the first trigger applied"
        )
        for node in nodes.values():
            node.controller.restore_all()
        asyncio.run(
            publish(
                first,  # replayed
                signed(9),  # older
                (signed(11)[0], None),  # unsigned
                signed(12, secret="another-secret-0123456789"),
                signed(13, sent_at_s=time.time() - 60),  # too old
            )
        )
        wait_for(lambda: guard.refused == 5, "the five refused")
        assert {n: limits(node) for n, node in nodes.items()} == before
        assert all(node.controller.fast is None for node in nodes.values())
        asyncio.run(publish(signed(14)))
        wait_for(
            lambda: all(n.controller.fast is not None for n in nodes.values()), "the next applied"
        )
        assert nodes["node-c"].controller.fast.plan_id == "fast-14"
