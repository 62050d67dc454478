"""A node whose agent may not set limits (NVML refuses its sets for permission, as on a node
where the agent does not run as root): after its first refused set the gateway leaves its
GPUs out of plans and quotes, saying why. Real uvicorn servers on loopback, a SQLite file,
the GPUs behind the fake NVML."""

from datetime import UTC, datetime

import httpx

from agents.nvml import NvmlBackend
from agents.service import AgentNode
from agents.service import create_app as agent_app
from flexgate.serve import ServerThread
from gateway.app import create_app
from gateway.settings import GatewaySettings
from tests.agents.fake_nvml import FakeNvml
from tests.conftest import wait_for
from tests.gateway.test_agent_down import job

API_TOKEN = "cannot-cap-api-token-0123"
AGENT_TOKEN = "cannot-cap-agent-token-0123"
AUTH = {"Authorization": f"Bearer {API_TOKEN}"}


def agent(tmp_path, node_id: str, fake: FakeNvml, port: int = 0) -> ServerThread:
    node = AgentNode(node_id, NvmlBackend(nvml=fake), tmp_path / node_id, sample_hz=10)
    return ServerThread(agent_app([node], AGENT_TOKEN), port=port)


def test_a_node_that_may_not_cap_is_left_out_of_plans_and_quotes_with_the_reason(tmp_path):
    allowed = FakeNvml(gpus=2, start_mw=650_000)
    refused = FakeNvml(gpus=2, start_mw=650_000, root=False)
    node_b = agent(tmp_path, "node-b", refused)
    with agent(tmp_path, "node-a", allowed) as url_a, node_b as url_b:
        settings = GatewaySettings(
            database_url=f"sqlite:///{tmp_path / 'gateway.db'}",
            api_token=API_TOKEN,
            agent_token=AGENT_TOKEN,
            agents=f"{url_a},{url_b}",
            reconcile_period_s=0.5,
            dispatch_timeout_s=1.0,
            dispatch_retries=1,
        )
        with ServerThread(create_app(settings)) as url, httpx.Client(base_url=url) as api:
            jobs = [job("node-a", 1.5), job("node-b", 2.5)]
            assert api.put("/v1/jobs", json={"jobs": jobs}, headers=AUTH).status_code == 200
            before = api.post("/v1/quotes", json={"reduction_kw": 0.2}).json()
            assert before["left_out"] == []  # unknown until a set says: counted
            body = {"reduction_kw": 0.3, "start": datetime.now(UTC).isoformat(), "duration_s": 120}
            event = api.post("/v1/events", json=body, headers=AUTH).json()

            def current_plan():
                plan_id = api.get(f"/v1/events/{event['id']}").json()["plan_id"]
                return plan_id and api.get(f"/v1/plans/{plan_id}").json()

            plan = wait_for(
                lambda: (p := current_plan()) and p["uncappable_nodes"] and p,
                "a plan without node-b",
            )
            assert [n["node"] for n in plan["uncappable_nodes"]] == ["node-b"]
            assert "no permission" in plan["uncappable_nodes"][0]["reason"]
            assert plan["unplaced_jobs"] == ["job-node-b"]
            assert plan["unreachable_nodes"] == []
            assert {c["node"]: c["caps"] for c in plan["commands"]}["node-b"] == []
            wait_for(lambda: allowed.limit_mw(0) < 650_000, "node-a's GPUs capped instead")
            assert refused.limit_mw(0) == 650_000

            nodes = {n["node"]: n for n in api.get("/v1/nodes").json()["nodes"]}
            assert nodes["node-a"]["cannot_cap_reason"] is None
            assert "no permission" in nodes["node-b"]["cannot_cap_reason"]
            assert nodes["node-b"]["reachable"] is True

            quote = api.post("/v1/quotes", json={"reduction_kw": 0.2}).json()
            (left,) = quote["left_out"]
            assert left["id"] == "job-node-b"
            assert "node-b" in left["reason"]
            assert "may not set limits" in left["reason"]
            assert "no permission" in left["reason"]

            # The agent restarted with the permission: its restore at start is a set NVML takes,
            # its next answer says so, and the target is planned onto its jobs again.
            node_b.__exit__(None, None, None)
            refused.root = True
            port_b = int(url_b.rsplit(":", 1)[1])
            with agent(tmp_path, "node-b", refused, port_b):
                again = wait_for(
                    lambda: (p := current_plan()) and not p["uncappable_nodes"] and p,
                    "a plan with node-b again",
                )
                assert again["unplaced_jobs"] == []
                wait_for(lambda: refused.limit_mw(0) < 650_000, "node-b's GPUs capped")
