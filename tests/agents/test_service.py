"""The agent's HTTP API on a real uvicorn server on loopback, with simulated GPUs."""

import httpx
import pytest

from agents.service import AgentNode, create_app
from agents.simulated import SimulatedBackend
from flexgate.serve import ServerThread
from tests.promtext import samples

TOKEN = "test-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def node(tmp_path, node_id="node-01", gpus=4):
    return AgentNode(
        node_id,
        SimulatedBackend(gpus, node_id=node_id),
        tmp_path / node_id,
        sample_hz=20,
    )


@pytest.fixture
def agent(tmp_path):
    one = node(tmp_path)
    with (
        ServerThread(create_app([one], TOKEN)) as url,
        httpx.Client(base_url=url, timeout=10) as client,
    ):
        yield client, one


def caps(generation=1, lease_s=60.0, **by_gpu):
    return {
        "plan_id": "plan-1",
        "generation": generation,
        "lease_s": lease_s,
        "caps": [{"gpu": int(k[1:]), "cap_w": v} for k, v in by_gpu.items()],
    }


def test_health_and_inventory(agent):
    client, _ = agent
    assert client.get("/health").json()["backend"] == "sim"
    gpus = client.get("/v1/gpus").json()["gpus"]
    assert len(gpus) == 4
    assert set(gpus[0]) == {
        "power_capped",
        "energy_j",
        "persistence_mode",
        "index",
        "uuid",
        "name",
        "min_limit_w",
        "max_limit_w",
        "default_limit_w",
        "enforced_limit_w",
        "power_w",
        "sensor",
    }
    assert (gpus[0]["min_limit_w"], gpus[0]["max_limit_w"]) == (200.0, 700.0)
    # The simulated GPUs read their power as it is: no lag to take out of the phases.
    assert gpus[0]["sensor"] == {
        "field": "instant",
        "update_s": 0.0,
        "average_s": 0.0,
        "lag_s": 0.0,
    }
    assert gpus[0]["persistence_mode"] is True


def test_caps_apply_read_back_and_restore(agent):
    client, one = agent
    answer = client.put("/v1/caps", json=caps(g0=450.0, g1=900.0), headers=AUTH)
    assert answer.status_code == 200, answer.text
    results = {r["gpu"]: r for r in answer.json()["results"]}
    assert results[0]["enforced_w"] == 450.0
    assert results[1] == results[1] | {"enforced_w": 700.0, "clamped": True, "error": None}
    assert one.backend.enforced_limit_w(0) == 450.0
    restored = client.delete("/v1/caps", headers=AUTH)
    assert restored.status_code == 200
    assert one.backend.enforced_limit_w(0) == 700.0


def test_the_lease_runs_out_and_the_limit_comes_back(agent):
    import time

    client, one = agent
    client.put("/v1/caps", json=caps(lease_s=0.3, g2=300.0), headers=AUTH)
    assert one.backend.enforced_limit_w(2) == 300.0
    deadline = time.monotonic() + 5
    while one.backend.enforced_limit_w(2) != 700.0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert one.backend.enforced_limit_w(2) == 700.0


def test_stale_generation_is_409_and_changes_nothing(agent):
    client, one = agent
    client.put("/v1/caps", json=caps(generation=8, g0=450.0), headers=AUTH)
    stale = client.put("/v1/caps", json=caps(generation=7, g0=300.0), headers=AUTH)
    assert stale.status_code == 409
    assert "generation 7 is older" in stale.json()["detail"]
    assert one.backend.enforced_limit_w(0) == 450.0


@pytest.mark.parametrize(
    ("body", "words"),
    [
        (caps(g9=400.0), "GPU 9 does not exist"),
        (caps(g0=-5.0), "greater than 0"),
        ({**caps(g0=400.0), "colour": "red"}, "colour"),
        ({"plan_id": "p", "generation": 1, "caps": []}, "lease_s"),
        (
            '{"plan_id": "p", "generation": 1, "lease_s": 10, "caps": [{"gpu": 0, "cap_w": NaN}]}',
            "cap_w",
        ),
    ],
)
def test_bad_commands_are_422_naming_the_problem_and_change_nothing(agent, body, words):
    client, one = agent
    kwargs = (
        {"content": body, "headers": AUTH | {"content-type": "application/json"}}
        if isinstance(body, str)
        else {"json": body, "headers": AUTH}
    )
    answer = client.put("/v1/caps", **kwargs)
    assert answer.status_code == 422, answer.text
    assert words in answer.text
    assert one.backend.enforced_limit_w(0) == 700.0
    assert one.controller.generation is None


def test_every_route_that_changes_a_limit_needs_the_token(agent):
    """Enumerated from the OpenAPI document, so a new route cannot slip through."""
    client, one = agent
    spec = client.get("/openapi.json").json()
    writes = [
        (m.upper(), path)
        for path, ops in spec["paths"].items()
        for m in ops
        if m in ("put", "post", "patch", "delete")
    ]
    assert ("PUT", "/v1/caps") in writes
    assert ("DELETE", "/v1/caps") in writes
    for method, path in writes:
        for headers in (
            {},
            {"Authorization": "Bearer wrong-token-0123456789"},
            {"Authorization": TOKEN},
        ):
            answer = client.request(method, path, json=caps(g0=300.0), headers=headers)
            assert answer.status_code == 401, (method, path, headers)
            assert answer.headers["www-authenticate"] == "Bearer"
    assert one.backend.enforced_limit_w(0) == 700.0


def test_telemetry_and_metrics(agent):
    import time

    client, _ = agent
    client.put("/v1/caps", json=caps(g0=450.0), headers=AUTH)
    time.sleep(0.5)
    doc = client.get("/v1/telemetry").json()
    assert doc["node_id"] == "node-01"
    assert len(doc["gpus"]) == 4
    assert doc["gpus"][0]["power_w"]
    assert doc["actuation_delay"]["count"] >= 1
    assert [j["job_id"] for j in doc["jobs"]] == []  # no job mix: nothing per job
    metrics = samples(client.get("/metrics").text)
    labels = 'Hostname="node-01",UUID="GPU-sim-node-01-00",gpu="0"'
    assert f"DCGM_FI_DEV_POWER_USAGE{{{labels}}}" in metrics
    assert metrics[f"DCGM_FI_DEV_ENFORCED_POWER_LIMIT{{{labels}}}"] == 450.0
    assert metrics["flexgate_agent_generation"] == 1


def test_one_process_hosts_many_nodes_under_their_prefix(tmp_path):
    nodes = [node(tmp_path, f"sim-{i}", gpus=2) for i in range(3)]
    with (
        ServerThread(create_app(nodes, TOKEN, prefixed=True)) as url,
        httpx.Client(base_url=url, timeout=10) as client,
    ):
        answer = client.put("/nodes/sim-1/v1/caps", json=caps(g1=350.0), headers=AUTH)
        assert answer.status_code == 200
        assert client.get("/nodes/sim-1/health").json()["node_id"] == "sim-1"
        assert nodes[1].backend.enforced_limit_w(1) == 350.0
        assert nodes[0].backend.enforced_limit_w(1) == 700.0
    # Stopping the process restores every node.
    assert nodes[1].backend.enforced_limit_w(1) == 700.0


def test_metrics_escape_label_values(tmp_path):
    """A node id with a quote and a backslash (a hostname nobody checked) still gives text
    Prometheus's parser reads back to the same value."""
    odd = 'rack"7\\node'
    one = AgentNode(odd, SimulatedBackend(1, node_id="n"), tmp_path / "n", sample_hz=0)
    metrics = samples(one.metrics())
    labels = 'Hostname="rack"7\\node",UUID="GPU-sim-n-00",gpu="0"'
    assert f"DCGM_FI_DEV_ENFORCED_POWER_LIMIT{{{labels}}}" in metrics
