"""An agent SIGKILLed mid-event: its share of the target moves to the nodes that answer, and
back when it returns (docs/reliability.md)."""

import os
import signal
import time
from datetime import UTC, datetime

import httpx

from flexgate.serve import ServerThread, free_port
from gateway.app import create_app
from gateway.settings import GatewaySettings
from tests.agents.fake_agent import ORIGINAL_MW, TOKEN, driver_limits, start_agent
from tests.conftest import wait_for

API_TOKEN = "agent-down-api-token-0123"
AUTH = {"Authorization": f"Bearer {API_TOKEN}"}
NODES = ("node-a", "node-b", "node-c")


def job(node: str, pfi: float) -> dict:
    return {
        "id": f"job-{node}",
        "gpus": 2,
        "power_w": 650.0,
        "throughput": 1e4,
        "pfi": pfi,
        "placement": [{"node": node, "gpus": [0, 1]}],
    }


def test_a_dead_agents_share_is_replanned_onto_the_others_and_back(tmp_path, recovery):
    ports = {n: free_port() for n in NODES}
    drivers = {n: tmp_path / f"{n}.json" for n in NODES}
    agents = {n: start_agent(ports[n], tmp_path / n, drivers[n], n) for n in NODES}
    settings = GatewaySettings(
        database_url=f"sqlite:///{tmp_path / 'gateway.db'}",
        api_token=API_TOKEN,
        agent_token=TOKEN,
        agents=",".join(f"http://127.0.0.1:{p}" for p in ports.values()),
        allow_simulated=True,  # the agents run simulated GPUs
        lease_s=30.0,
        reconcile_period_s=0.5,
        recovery_ramp_s=0.2,
        recovery_steps=1,
        dispatch_timeout_s=1.0,
        dispatch_retries=1,
    )
    try:
        with ServerThread(create_app(settings)) as url, httpx.Client(base_url=url) as api:
            jobs = [job("node-a", 1.5), job("node-b", 2.0), job("node-c", 2.5)]
            assert api.put("/v1/jobs", json={"jobs": jobs}, headers=AUTH).status_code == 200
            body = {"reduction_kw": 0.8, "start": datetime.now(UTC).isoformat(), "duration_s": 120}
            event = api.post("/v1/events", json=body, headers=AUTH).json()

            def plan(plan_id):
                return api.get(f"/v1/plans/{plan_id}").json()

            def answered_plan(plan_id):
                doc = plan(plan_id)
                return doc if all(c["status"] != "pending" for c in doc["commands"]) else None

            def current_plan():
                return plan(api.get(f"/v1/events/{event['id']}").json()["plan_id"])

            def capped(node):
                return all(mw < ORIGINAL_MW for mw in driver_limits(drivers[node]))

            wait_for(lambda: capped("node-c"), "the most flexible job capped")
            first = current_plan()
            assert first["unreachable_nodes"] == []
            before = {n: driver_limits(drivers[n]) for n in ("node-a", "node-b")}
            others_mw = sum(map(sum, before.values()))

            os.kill(agents["node-c"].pid, signal.SIGKILL)
            agents["node-c"].wait(10)
            killed = time.monotonic()
            replanned = wait_for(
                lambda: (p := current_plan())["unreachable_nodes"] == ["node-c"] and p,
                "a plan without node-c",
            )
            wait_for(
                lambda: sum(sum(driver_limits(drivers[n])) for n in before) < others_mw,
                "the other nodes capped deeper",
            )
            moved_s = time.monotonic() - killed
            assert replanned["feasible"] is True
            assert replanned["unplaced_jobs"] == ["job-node-c"]
            assert abs(replanned["expected_facility_kw"] - 0.8) < 1e-6
            answered = wait_for(lambda: answered_plan(replanned["id"]), "the answers")
            assert {c["node"]: c["status"] for c in answered["commands"]} == {
                "node-a": "acked",
                "node-b": "acked",
                "node-c": "failed",
            }
            assert {c["node"]: c["caps"] for c in answered["commands"]}["node-c"] == []

            agents["node-c"] = start_agent(
                ports["node-c"], tmp_path / "node-c", drivers["node-c"], "node-c"
            )
            back = time.monotonic()
            again = wait_for(
                lambda: (p := current_plan())["unreachable_nodes"] == [] and p, "node-c planned"
            )
            wait_for(lambda: capped("node-c"), "node-c capped again")
            # The plan's commands reach the nodes independently: node-c's can land before the
            # others' (CI once read node-a's second GPU still at 628.6 W of its 650 W then).
            wait_for(
                lambda: {n: driver_limits(drivers[n]) for n in ("node-a", "node-b")} == before,
                "node-a and node-b back at their caps from before node-c went down",
            )
            returned_s = time.monotonic() - back
            assert again["unplaced_jobs"] == []
            recovery("agent down: its share on the other nodes after the SIGKILL", moved_s)
            recovery("agent down: its share back after it answers", returned_s)
    finally:
        for agent in agents.values():
            agent.terminate()
            agent.wait(10)
