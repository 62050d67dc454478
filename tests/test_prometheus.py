"""A real Prometheus (Debian's `prometheus`) scrapes real agents and the gateway on loopback,
from a scrape config this test writes; the result is read back through Prometheus's HTTP API.

Skips when the binary is missing; with FLEXGATE_REQUIRE_PROMETHEUS=1 (.ci/run installs it)
fails.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from urllib.parse import urlsplit

import httpx
import pytest

from agents.service import AgentNode
from agents.service import create_app as agent_app
from agents.simulated import SimulatedBackend
from flexgate.serve import ServerThread, free_port
from gateway.app import create_app
from gateway.settings import GatewaySettings
from tests.conftest import wait_for

AGENT_TOKEN = "prometheus-agent-token-0123"
API_TOKEN = "prometheus-api-token-01234"
NODES = ("node-a", "node-b")


def prometheus_binary() -> str:
    found = shutil.which("prometheus")
    if found is None:
        if os.environ.get("FLEXGATE_REQUIRE_PROMETHEUS") == "1":
            pytest.fail("FLEXGATE_REQUIRE_PROMETHEUS=1 but no prometheus is installed")
        pytest.skip("no prometheus here (Debian package prometheus; CI installs it)")
    return found


def scrape_config(agents: dict[str, str], gateway: str) -> str:
    def target(url: str) -> str:
        return urlsplit(url).netloc

    jobs = [
        "  - job_name: agents",
        "    static_configs:",
        f"      - targets: [{', '.join(repr(target(u)) for u in agents.values())}]",
        "  - job_name: gateway",
        "    static_configs:",
        f"      - targets: ['{target(gateway)}']",
    ]
    return "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n" + "\n".join(
        jobs
    )


@contextlib.contextmanager
def prometheus(tmp_path, config: str):
    binary = prometheus_binary()
    (tmp_path / "prometheus.yml").write_text(config + "\n")
    port = free_port()
    with (tmp_path / "prometheus.log").open("wb") as log:
        process = subprocess.Popen(
            [
                binary,
                f"--config.file={tmp_path / 'prometheus.yml'}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:

        def ready():
            assert process.poll() is None, (tmp_path / "prometheus.log").read_text()[-2000:]
            try:
                return httpx.get(f"{url}/-/ready", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(ready, "Prometheus ready", seconds=30, every_s=0.1)
        yield url
    finally:
        process.terminate()
        process.wait(15)


def query(url: str, expression: str) -> list[dict]:
    answer = httpx.get(f"{url}/api/v1/query", params={"query": expression}, timeout=5).json()
    assert answer["status"] == "success", answer
    return answer["data"]["result"]


def test_prometheus_scrapes_agents_with_dcgm_names_and_the_gateway(tmp_path):
    prometheus_binary()
    nodes = {
        n: AgentNode(n, SimulatedBackend(2, node_id=n), tmp_path / n, sample_hz=10) for n in NODES
    }
    with contextlib.ExitStack() as stack:
        agents = {
            n: stack.enter_context(ServerThread(agent_app([a], AGENT_TOKEN)))
            for n, a in nodes.items()
        }
        settings = GatewaySettings(
            database_url=f"sqlite:///{tmp_path / 'gateway.db'}",
            api_token=API_TOKEN,
            agent_token=AGENT_TOKEN,
            agents=",".join(agents.values()),
            allow_simulated=True,  # the agents run simulated GPUs
        )
        gateway = stack.enter_context(ServerThread(create_app(settings)))
        body = {"plan_id": "p", "generation": 1, "lease_s": 600}
        cap = httpx.put(
            f"{agents['node-a']}/v1/caps",
            json=body | {"caps": [{"gpu": 1, "cap_w": 450.0}]},
            headers={"Authorization": f"Bearer {AGENT_TOKEN}"},
        )
        assert cap.status_code == 200, cap.text
        url = stack.enter_context(prometheus(tmp_path, scrape_config(agents, gateway)))

        up = wait_for(
            lambda: (r := query(url, "up == 1")) and len(r) == 3 and r,
            "every target scraped and up",
            seconds=30,
            every_s=0.2,
        )
        assert {s["metric"]["job"] for s in up} == {"agents", "gateway"}

        limits = {
            (s["metric"]["Hostname"], s["metric"]["gpu"]): float(s["value"][1])
            for s in query(url, "DCGM_FI_DEV_ENFORCED_POWER_LIMIT")
        }
        assert limits == {
            ("node-a", "0"): 700.0,
            ("node-a", "1"): 450.0,
            ("node-b", "0"): 700.0,
            ("node-b", "1"): 700.0,
        }
        power = query(url, "sum by (Hostname) (DCGM_FI_DEV_POWER_USAGE)")
        assert {s["metric"]["Hostname"] for s in power} == set(NODES)
        assert all(float(s["value"][1]) > 0 for s in power)
        assert {s["metric"]["UUID"] for s in query(url, "DCGM_FI_DEV_POWER_MGMT_LIMIT_MIN")} == {
            f"GPU-sim-{n}-0{g}" for n in NODES for g in (0, 1)
        }
        generation = query(url, 'flexgate_agent_generation{instance=~".*"}')
        assert sorted(float(s["value"][1]) for s in generation) == [-1.0, 1.0]
        known = query(url, "flexgate_agents_known")
        assert [float(s["value"][1]) for s in known] == [2.0]
        assert known[0]["metric"]["job"] == "gateway"
