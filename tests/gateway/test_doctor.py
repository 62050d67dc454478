"""`flexgate doctor --gateway` on a real gateway's settings: a real gateway on loopback (its
SQLite file), agents on the fake NVML (one with another token), a meter that is dead and one
that answers, and the OpenADR 3.1 mock VTN with its OAuth2 token service (a wrong client
secret). Nothing the doctor does may change a limit or the store."""

import json

import pytest
from fastapi import FastAPI

from agents.nvml import NvmlBackend
from agents.service import AgentNode
from agents.service import create_app as agent_app
from flexgate.cli import main
from flexgate.lab.mockvtn31 import MockVtn31
from flexgate.serve import ServerThread, free_port
from gateway.app import create_app
from gateway.settings import GatewaySettings
from tests.agents.fake_nvml import FakeNvml

API_TOKEN = "doctor-api-token-0123456789"
AGENT_TOKEN = "doctor-agent-token-0123456789"
OTHER_TOKEN = "another-agent-token-0123456789"
CLIENT_ID, CLIENT_SECRET = "site-ven", "site-ven-secret-0123456789abcdef"


def agent(tmp_path, node_id, fake, token=AGENT_TOKEN):
    node = AgentNode(node_id, NvmlBackend(nvml=fake), tmp_path / node_id, sample_hz=0)
    return ServerThread(agent_app([node], token))


def meter_app(power_kw):
    app = FastAPI()

    @app.get("/meter")
    def meter() -> dict:
        return {"facility_power_kw": power_kw}

    return app


@pytest.fixture
def site(tmp_path, monkeypatch):
    """Two agents (node-b with a token the gateway does not have), the mock VTN, a meter, and
    the gateway's environment pointing at them; a real gateway made its store first."""
    fakes = {"node-a": FakeNvml(gpus=2), "node-b": FakeNvml(gpus=2)}
    vtn = MockVtn31({CLIENT_ID: CLIENT_SECRET})
    with (
        agent(tmp_path, "node-a", fakes["node-a"]) as url_a,
        agent(tmp_path, "node-b", fakes["node-b"], OTHER_TOKEN) as url_b,
        ServerThread(vtn.app) as vtn_url,
        ServerThread(meter_app(850.0)) as meter_url,
    ):
        env = {
            "FLEXGATE_DATABASE_URL": f"sqlite:///{tmp_path / 'gateway.db'}",
            "FLEXGATE_API_TOKEN": API_TOKEN,
            "FLEXGATE_AGENT_TOKEN": AGENT_TOKEN,
            "FLEXGATE_AGENTS": f"{url_a},{url_b}",
            "FLEXGATE_METER_URL": f"{meter_url}/meter",
            "FLEXGATE_OPENADR": "3.1",
            "FLEXGATE_VTN_URL": vtn_url,
            "FLEXGATE_VTN_ALLOW_HTTP": "true",
            "FLEXGATE_VTN_CLIENT_ID": CLIENT_ID,
            "FLEXGATE_VTN_CLIENT_SECRET": CLIENT_SECRET,
            "FLEXGATE_READ_PUBLIC": "true",
        }
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        with ServerThread(create_app(GatewaySettings(calibrate=False, vtn_url=""))):
            pass  # the gateway makes its store at start, as on a site
        yield fakes, vtn, tmp_path / "gateway.db"


def doctor(capsys, *argv):
    code = main(["doctor", "--json", *argv])
    return code, {c["check"]: c for c in json.loads(capsys.readouterr().out)}


def test_the_wrong_agent_token_fails_naming_the_agent(site, capsys):
    fakes, _, db = site
    stored = db.read_bytes()
    code, checks = doctor(capsys, "--gateway")
    assert code == 1
    assert checks["gateway settings"]["status"] == "ok", checks["gateway settings"]
    assert checks["store"]["status"] == "ok"
    assert "schema version" in checks["store"]["detail"]
    assert checks["agent node-a"]["status"] == "warn"  # may it set limits: its first cap says
    assert "token taken" in checks["agent node-a"]["detail"]
    assert checks["agent node-b"]["status"] == "fail"
    assert "refuses the gateway's token" in checks["agent node-b"]["detail"]
    assert checks["meter"]["status"] == "ok"
    assert checks["meter"]["power_kw"] == 850.0
    assert checks["meter"]["plausible"] is True
    assert checks["vtn"]["status"] == "ok"
    assert "token for" in checks["vtn"]["detail"]
    assert all(fake.calls == [] for fake in fakes.values())  # no limit was touched
    assert db.read_bytes() == stored  # nor the store


def test_a_dead_meter_and_a_wrong_vtn_secret_fail(site, capsys, monkeypatch):
    _, vtn, _ = site
    monkeypatch.setenv("FLEXGATE_METER_URL", f"http://127.0.0.1:{free_port()}/meter")
    monkeypatch.setenv("FLEXGATE_VTN_CLIENT_SECRET", "not-the-secret-0123456789")
    code, checks = doctor(capsys, "--gateway")
    assert code == 1
    assert checks["meter"]["status"] == "fail"
    assert "no reading" in checks["meter"]["detail"]
    assert checks["vtn"]["status"] == "fail"
    assert CLIENT_ID in checks["vtn"]["detail"]
    assert "not-the-secret" not in json.dumps(checks)  # a secret is never shown
    assert vtn.grants == 0


def test_an_agent_that_may_not_cap_fails_with_the_reason(site, capsys, tmp_path, monkeypatch):
    refused = FakeNvml(gpus=2, root=False)
    with agent(tmp_path, "node-c", refused) as url:
        import httpx

        body = {"plan_id": "p", "generation": 1, "lease_s": 60, "caps": [{"gpu": 0, "cap_w": 450}]}
        httpx.put(f"{url}/v1/caps", json=body, headers={"Authorization": f"Bearer {AGENT_TOKEN}"})
        monkeypatch.setenv("FLEXGATE_AGENTS", url)
        code, checks = doctor(capsys, "--gateway")
    assert code == 1
    assert checks["agent node-c"]["status"] == "fail"
    assert "may not set limits" in checks["agent node-c"]["detail"]
    assert checks["agent node-c"]["can_cap"] is False


def test_the_one_shot_meter_read(site, capsys, monkeypatch):
    code, checks = doctor(capsys, "--meter")
    assert code == 0
    assert list(checks) == ["meter"]
    assert checks["meter"]["power_kw"] == 850.0
    assert "read_at" in checks["meter"]
    monkeypatch.setenv("FLEXGATE_METER_MAX_KW", "500")
    code, checks = doctor(capsys, "--meter")
    assert code == 1
    assert "above the site's maximum" in checks["meter"]["detail"]


def test_without_a_flag_the_gateways_environment_means_its_checks(site, capsys):
    _, checks = doctor(capsys)
    assert "store" in checks
    assert "nvml" not in checks


def test_a_store_of_another_schema_fails(site, capsys):
    import sqlite3

    _, _, db = site
    with sqlite3.connect(db) as connection:
        connection.execute("UPDATE schema_version SET version = 999")
    code, checks = doctor(capsys, "--gateway")
    assert code == 1
    assert checks["store"]["status"] == "fail"
    assert "999" in checks["store"]["detail"]


def test_nats_with_the_wrong_token_fails_and_the_right_one_passes(site, capsys, monkeypatch):
    from tests.natsserver import NATS_TOKEN, NatsServer

    _, _, db = site
    server = NatsServer(db.parent / "nats").start()
    try:
        monkeypatch.setenv("FLEXGATE_TRANSPORT", "nats")
        monkeypatch.setenv("FLEXGATE_AGENTS", "")
        monkeypatch.setenv("FLEXGATE_NATS_URL", server.url)
        monkeypatch.setenv("FLEXGATE_NATS_TOKEN", NATS_TOKEN)
        _, checks = doctor(capsys, "--gateway")
        assert checks["nats"]["status"] == "ok"
        monkeypatch.setenv("FLEXGATE_NATS_TOKEN", "not-the-nats-token-0123456789")
        code, checks = doctor(capsys, "--gateway")
        assert code == 1
        assert checks["nats"]["status"] == "fail"
        assert "not-the-nats-token" not in checks["nats"]["detail"]
    finally:
        server.stop()


def test_an_openadr_20b_vtn_is_checked_for_an_answer(site, capsys, monkeypatch):
    with ServerThread(FastAPI()) as url:  # any HTTP answer: the VEN's registration judges more
        monkeypatch.setenv("FLEXGATE_OPENADR", "2.0b")
        monkeypatch.setenv("FLEXGATE_VTN_URL", f"{url}/OpenADR2/Simple/2.0b")
        for name in ("VTN_CLIENT_ID", "VTN_CLIENT_SECRET", "VTN_ALLOW_HTTP"):
            monkeypatch.delenv(f"FLEXGATE_{name}")
        monkeypatch.setenv("FLEXGATE_VTN_ALLOW_UNSIGNED", "true")
        _, checks = doctor(capsys, "--gateway")
        assert checks["vtn"]["status"] == "ok", checks["gateway settings"]
    monkeypatch.setenv("FLEXGATE_VTN_URL", f"http://127.0.0.1:{free_port()}/OpenADR2/Simple/2.0b")
    code, checks = doctor(capsys, "--gateway")
    assert code == 1
    assert checks["vtn"]["status"] == "fail"
    assert "does not answer" in checks["vtn"]["detail"]


def test_over_nats_the_agents_are_asked_and_no_bucket_is_made(site, capsys, monkeypatch):
    """The doctor asks each agent's health over NATS; it neither makes nor fits the gateway's
    desired-state bucket (JetStream), which only a running gateway owns."""
    import asyncio

    import nats
    from nats.js.errors import NotFoundError

    from agents.protocol import DESIRED_BUCKET
    from tests.natsserver import NATS_TOKEN, NatsServer

    _, _, db = site
    server = NatsServer(db.parent / "nats").start()
    try:
        monkeypatch.setenv("FLEXGATE_TRANSPORT", "nats")
        monkeypatch.setenv("FLEXGATE_AGENTS", "node-x")  # no agent of that name answers
        monkeypatch.setenv("FLEXGATE_NATS_URL", server.url)
        monkeypatch.setenv("FLEXGATE_NATS_TOKEN", NATS_TOKEN)
        code, checks = doctor(capsys, "--gateway")
        assert code == 1
        assert checks["nats"]["status"] == "ok"
        assert checks["agent node-x"]["status"] == "fail"
        assert "does not answer" in checks["agent node-x"]["detail"]

        async def bucket_exists() -> bool:
            nc = await nats.connect(server.url, token=NATS_TOKEN)
            try:
                await nc.jetstream().stream_info(f"KV_{DESIRED_BUCKET}")
                return True
            except NotFoundError:
                return False
            finally:
                await nc.close()

        assert asyncio.run(bucket_exists()) is False
    finally:
        server.stop()
