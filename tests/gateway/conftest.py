"""A whole site on loopback: simulated agents and a gateway, on real uvicorn servers."""

from __future__ import annotations

import contextlib
import copy
import gc
import json
import os
from datetime import UTC, datetime

import aiohttp
import httpx
import pytest
from sqlalchemy import create_engine, text

from agents.service import AgentNode
from agents.service import create_app as agent_app
from agents.simulated import SimulatedBackend
from flexgate import specschema31
from flexgate.serve import ServerThread
from flexmodel.jobmix import parse_job_mix
from gateway.app import create_app
from gateway.run import tune_collector
from gateway.settings import GatewaySettings
from tests.conftest import EXAMPLES, wait_for

API_TOKEN = "api-token-0123456789abcdef"
AGENT_TOKEN = "agent-token-0123456789abcdef"
#: .ci/run sets this, so CI fails rather than skips when PostgreSQL does not answer.
REQUIRED_POSTGRES = os.environ.get("FLEXGATE_TEST_POSTGRES_URL")
POSTGRES = REQUIRED_POSTGRES or "postgresql+psycopg://postgres@127.0.0.1:5432/test"
API = {"Authorization": f"Bearer {API_TOKEN}"}


def site_jobs() -> list[dict]:
    """The example site's jobs on two 8-GPU nodes (node-01, node-02) of the example."""
    jobs = json.loads((EXAMPLES / "site.json").read_text())["jobs"]
    return [
        copy.deepcopy(j)
        for j in jobs
        if j["placement"][0]["node"] in ("node-01", "node-02", "node-03")
    ]


def postgres_available() -> bool:
    engine = create_engine(POSTGRES)
    try:
        with engine.connect() as connection:
            connection.execute(text("select 1"))
        return True
    except Exception:
        return False
    finally:
        engine.dispose()


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request, tmp_path):
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'gateway.db'}"
    if not postgres_available():
        if REQUIRED_POSTGRES:
            pytest.fail(f"FLEXGATE_TEST_POSTGRES_URL is set but {POSTGRES} does not answer")
        pytest.skip(f"no PostgreSQL server answers at {POSTGRES} (CI always runs these)")
    engine = create_engine(POSTGRES)
    with engine.begin() as connection:  # a clean database for each test
        connection.execute(text("drop schema public cascade; create schema public"))
    engine.dispose()
    return POSTGRES


class Site:
    def __init__(self, api: httpx.Client, nodes: dict[str, AgentNode], settings: GatewaySettings):
        self.api, self.nodes, self.settings = api, nodes, settings

    def limits(self) -> dict[str, list[float]]:
        return {
            name: [n.backend.enforced_limit_w(g) for g in range(n.backend.count())]
            for name, n in self.nodes.items()
        }

    def acked_plan(self, plan_id: str) -> dict:
        """The plan once every node answered (it is stored before its commands go out)."""

        def answered():
            plan = self.api.get(f"/v1/plans/{plan_id}").json()
            return plan if all(c["status"] != "pending" for c in plan["commands"]) else None

        return self.wait(answered, what=f"the answers to {plan_id}")

    def event_caps(self, event_id: str) -> dict[str, list[float]]:
        """The limits once every node has acked the event's plan (they are set by then)."""
        plan_id = self.wait(
            lambda: self.api.get(f"/v1/events/{event_id}").json()["plan_id"],
            what=f"the plan of {event_id}",
        )
        self.acked_plan(plan_id)
        return self.limits()

    def wait(self, check, seconds: float = 15.0, what: str = "the site"):
        return wait_for(check, what, seconds)


def start_site(tmp_path, database_url, **overrides):
    jobs = site_jobs()
    mix = parse_job_mix({"jobs": jobs})
    names = sorted({p.node for j in mix.jobs for p in j.placement})
    nodes = {
        n: AgentNode(
            n,
            SimulatedBackend(8, mix=mix, node_id=n, noise_w=3.0),
            tmp_path / "agents" / n,
            sample_hz=20,
        )
        for n in names
    }
    return jobs, nodes, agent_app(list(nodes.values()), AGENT_TOKEN, prefixed=True)


@contextlib.contextmanager
def collector_as_in_the_gateway():
    """The cyclic collector as `flexgate gateway` sets it once started (`tune_collector`),
    for as long as an in-process site runs; as it was afterwards. With the defaults, a site in
    one process (gateway, agents, this test) ran a full collection every 5 s over some 240,000
    objects, 0.6 s of CPU holding every thread: 2 to 5 s on a loaded machine, in which no
    lease is renewed, and the 5 s leases were renewed as late as 0.3 s after they ran out (a
    lapse restores the GPUs until the next renewal: the shed read 9 kW of 10.5 asked)."""
    thresholds = gc.get_threshold()
    tune_collector()
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)
        gc.unfreeze()


@contextlib.contextmanager
def running_site(tmp_path, database_url, http_trace=(), clock=None, gateway_port=0, **changes):
    """Agents and a gateway (short timers; `changes` override settings), the job mix put;
    `http_trace` sees every request of the gateway's own HTTP clients; `clock` is its clock;
    `gateway_port` its port (0: any free one)."""
    jobs, nodes, agents = start_site(tmp_path, database_url)
    with ServerThread(agents) as agents_url:
        settings = GatewaySettings(
            **{
                "database_url": database_url,
                "api_token": API_TOKEN,
                "agent_token": AGENT_TOKEN,
                "agents": ",".join(f"{agents_url}/nodes/{n}" for n in nodes),
                "allow_simulated": True,  # the agents run simulated GPUs
                "lease_s": 5.0,
                "reconcile_period_s": 0.5,
                "recovery_ramp_s": 0.4,
                "recovery_steps": 2,
                **changes,
            }
        )
        with (
            ServerThread(
                create_app(settings, http_trace=http_trace, clock=clock), port=gateway_port
            ) as url,
            httpx.Client(base_url=url, timeout=20) as api,
            collector_as_in_the_gateway(),
        ):
            answer = api.put("/v1/jobs", json={"jobs": jobs}, headers=API)
            assert answer.status_code == 200, answer.text
            yield Site(api, nodes, settings)


class Outbound:
    """Every URL the gateway's HTTP clients (to the agents, to the VTN) ask for, in order:
    pass `trace` to `running_site(http_trace=...)`."""

    def __init__(self) -> None:
        self.urls: list[str] = []
        self.trace = aiohttp.TraceConfig()
        self.trace.on_request_start.append(self._started)

    async def _started(self, _session, _context, params) -> None:
        self.urls.append(str(params.url))


def lease_ends(nodes: dict[str, AgentNode]) -> dict[str, float | None]:
    """Each node's lease end now, on its cap controller's clock (None: no lease)."""
    return {name: n.controller.lease_until for name, n in nodes.items()}


def past_and_renewed(nodes: dict[str, AgentNode], ends: dict[str, float | None]) -> bool:
    """Every node's clock is past the lease end it had (`lease_ends`) and its lease reaches
    beyond it: the caps outlived the old lease because it was renewed. A wait on this, not a
    fixed sleep, for "the caps hold past the lease"."""
    for name, n in nodes.items():
        end = ends[name]
        if end is None or n.controller.clock() <= end or (n.controller.lease_until or 0.0) <= end:
            return False
    return True


@pytest.fixture
def site(tmp_path, database_url):
    with running_site(tmp_path, database_url) as site:
        yield site


def now_iso() -> str:
    return datetime.now(UTC).isoformat()


@pytest.fixture
def spec():
    """The OpenADR 3.1 specification's schema (`openadr3.yaml` in ../shared)."""
    schema = specschema31.load()
    if schema is None:
        pytest.skip(specschema31.why_unavailable() or "the specification's schema is missing")
    return schema
