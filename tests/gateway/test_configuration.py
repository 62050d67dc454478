"""What the gateway shows an operator it runs on: the store and meter in /health, each node's
GPU backend, and no plan on simulated GPUs outside the lab; events that look like a unit slip
(watts typed as kW) refused unless forced."""

from __future__ import annotations

from gateway.services.configuration import store_doc
from tests.gateway.conftest import API, now_iso, running_site
from tests.promtext import samples


def test_health_names_the_store_and_meter_and_nodes_their_backend(tmp_path):
    with running_site(tmp_path, f"sqlite:///{tmp_path / 'gateway.db'}") as site:
        site.wait(lambda: len(site.api.get("/v1/nodes").json()["nodes"]) == 6, what="nodes")
        health = site.api.get("/health").json()
        config = health["configuration"]
        assert config["store"] == {"dialect": "sqlite", "location": str(tmp_path / "gateway.db")}
        assert config["meter"] == {"source": "estimate", "estimated": True}
        assert config["transport"]["kind"] == "http"
        assert health["backends"] == {"sim": 6}
        assert health["status"] == "ok"  # a simulated site on purpose (FLEXGATE_ALLOW_SIMULATED)
        nodes = site.api.get("/v1/nodes").json()["nodes"]
        assert {n["backend"] for n in nodes} == {"sim"}
        metrics = samples(site.api.get("/metrics").text)
        assert metrics['flexgate_nodes_by_backend{backend="sim"}'] == 6


def test_simulated_gpus_outside_the_lab_warn_and_refuse_events(tmp_path):
    database = f"sqlite:///{tmp_path / 'gateway.db'}"
    with running_site(tmp_path, database, allow_simulated=False) as site:
        site.wait(lambda: site.api.get("/health").json()["backends"] == {"sim": 6}, what="nodes")
        health = site.api.get("/health").json()
        assert health["status"] == "degraded"
        assert any("run simulated GPUs" in r for r in health["degraded"])
        body = {"reduction_kw": 2.0, "start": now_iso(), "duration_s": 60}
        refused = site.api.post("/v1/events", json=body, headers=API)
        assert refused.status_code == 422
        assert "--backend nvml" in refused.json()["detail"]
        assert site.api.get("/v1/events").json()["events"] == []


def test_an_event_far_beyond_the_site_is_refused_unless_forced(site):
    site.wait(lambda: site.api.get("/v1/site").json()["baseline_gpu_kw"] > 0, what="telemetry")
    body = {"reduction_kw": 3000.0, "start": "2030-01-01T00:00:00Z", "duration_s": 600}
    refused = site.api.post("/v1/events", json=body, headers=API)
    assert refused.status_code == 422
    assert refused.json()["detail"].startswith("reduction_kw: 3000 kW is ")
    assert "watts typed as kW" in refused.json()["detail"]
    assert site.api.get("/v1/events").json()["events"] == []
    forced = site.api.post("/v1/events", json=body | {"force": True}, headers=API)
    assert forced.status_code == 201
    assert forced.json()["feasible"] is False


def test_the_store_is_named_with_its_password_masked():
    assert store_doc("postgresql+psycopg://flex:s3cret@db.example:5432/flexgate") == {
        "dialect": "postgresql",
        "location": "postgresql+psycopg://flex:***@db.example:5432/flexgate",
    }
    assert store_doc("sqlite:///.flexgate/gateway.db")["location"] == ".flexgate/gateway.db"
