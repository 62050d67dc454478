"""Fast triggers at an agent: signed (HMAC-SHA256 computed here with the standard library,
not with the code under test), replay-protected, and refused with a reason, nothing changed.
Over HTTP on a real uvicorn server with simulated GPUs."""

import hashlib
import hmac
import json
import time

import httpx
import pytest

from agents.fasttrigger import FastRefusedError, TriggerGuard
from agents.service import AgentNode, create_app
from agents.simulated import SimulatedBackend
from flexgate.serve import ServerThread

TOKEN = "test-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
SECRET = "fast-secret-0123456789"


class Wall:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


def body(seq=1, sent_at_s=1_800_000_000.0, depth_pct=20.0, duration_s=30.0, **more):
    doc = {"seq": seq, "sent_at_s": sent_at_s, "depth_pct": depth_pct, "duration_s": duration_s}
    return json.dumps(doc | more).encode()


def signature(data, secret=SECRET):
    return hmac.new(secret.encode(), data, hashlib.sha256).hexdigest()


@pytest.fixture
def guard():
    return TriggerGuard(SECRET, max_age_s=2.0, wall=Wall())


def test_a_signed_fresh_trigger_passes(guard):
    data = body()
    assert guard.check(data, signature(data)).depth_pct == 20.0


@pytest.mark.parametrize(
    ("data", "sig", "status", "words"),
    [
        (body(), None, 401, "signature is missing or wrong"),
        (body(), signature(body(), "another-secret-0123456"), 401, "signature is missing"),
        (body(), signature(body(depth_pct=40.0)), 401, "signature is missing"),
        (body(sent_at_s=1_800_000_000.0 - 2.5), "sign", 409, "beyond the 2 s allowed"),
        (body(sent_at_s=1_800_000_000.0 + 2.5), "sign", 409, "beyond the 2 s allowed"),
        (body(depth_pct=0.0), "sign", 422, "greater than 0"),
        (body(extra=1), "sign", 422, "Extra inputs"),
        (b"{not json", "sign", 422, "malformed"),
    ],
)
def test_bad_triggers_are_refused_naming_why(guard, data, sig, status, words):
    sig = signature(data) if sig == "sign" else sig
    with pytest.raises(FastRefusedError, match=words) as refused:
        guard.check(data, sig)
    assert refused.value.status_code == status
    assert guard.last_seq == {}
    assert guard.refused == 1


def test_a_replayed_or_older_trigger_is_refused(guard):
    first, older = body(seq=7), body(seq=6)
    guard.check(first, signature(first))
    for data in (first, older):
        with pytest.raises(FastRefusedError, match="a replay"):
            guard.check(data, signature(data))
    newer = body(seq=8)
    assert guard.check(newer, signature(newer)).seq == 8


def test_without_a_secret_every_trigger_is_refused():
    data = body()
    with pytest.raises(FastRefusedError, match="FLEXGATE_AGENT_FAST_SECRET is not set"):
        TriggerGuard(None, 2.0).check(data, signature(data))


@pytest.fixture
def agent(tmp_path):
    node = AgentNode("node-01", SimulatedBackend(4, node_id="node-01"), tmp_path, sample_hz=0)
    wall = Wall()
    app = create_app([node], TOKEN, fast=TriggerGuard(SECRET, 2.0, wall=wall))
    with (
        ServerThread(app) as url,
        httpx.Client(base_url=url, timeout=10) as client,
    ):
        yield client, node, wall


ARMED = {
    "generation": 1,
    "depths": [{"depth_pct": 20, "caps": [{"gpu": 0, "cap_w": 400.0}, {"gpu": 2, "cap_w": 450.0}]}],
}


def enforced(client):
    return [g["enforced_limit_w"] for g in client.get("/v1/gpus").json()["gpus"]]


def post_trigger(client, data, sig):
    headers = {"Flexgate-Signature": sig} if sig else {}
    return client.post("/v1/fast/trigger", content=data, headers=headers)


def test_over_http_arm_then_trigger_applies_the_armed_caps(agent):
    client, _, _ = agent
    before = enforced(client)
    assert client.put("/v1/fast/armed", json=ARMED).status_code == 401
    state = client.put("/v1/fast/armed", json=ARMED, headers=AUTH)
    assert state.status_code == 200
    assert state.json()["generation"] == 1
    assert client.get("/v1/fast/armed").json()["depths"][0]["depth_pct"] == 20.0
    assert enforced(client) == before
    data = body()
    answer = post_trigger(client, data, signature(data))
    assert answer.status_code == 200
    assert answer.json()["applied"] is True
    assert enforced(client) == [400.0, before[1], 450.0, before[3]]
    assert client.get("/health").json()["lease_remaining_s"] > 25.0
    assert client.get("/v1/fast/armed").json()["fast_depth_pct"] == 20.0


def test_over_http_bad_triggers_change_nothing(agent):
    client, _, _ = agent
    client.put("/v1/fast/armed", json=ARMED, headers=AUTH)
    before = enforced(client)
    data = body(seq=3)
    assert post_trigger(client, data, None).status_code == 401
    assert post_trigger(client, data, signature(body(seq=4))).status_code == 401
    old = body(seq=5, sent_at_s=1_800_000_000.0 - 10)
    refused = post_trigger(client, old, signature(old))
    assert refused.status_code == 409
    assert "beyond the 2 s allowed" in refused.json()["detail"]
    assert enforced(client) == before
    assert post_trigger(client, data, signature(data)).status_code == 200
    replay = post_trigger(client, data, signature(data))
    assert replay.status_code == 409
    assert "a replay" in replay.json()["detail"]


def test_a_stale_armed_generation_over_http_is_409(agent):
    client, _, _ = agent
    client.put("/v1/fast/armed", json={**ARMED, "generation": 4}, headers=AUTH)
    stale = client.put("/v1/fast/armed", json={**ARMED, "generation": 3}, headers=AUTH)
    assert stale.status_code == 409
    assert "older than the last armed" in stale.json()["detail"]


def test_a_placeholder_or_short_fast_secret_is_refused_at_start():
    from agents.settings import AgentSettings

    for secret in ("changeme", "short"):
        with pytest.raises(ValueError, match="FLEXGATE_AGENT_FAST_SECRET must be a secret"):
            AgentSettings(agent_token=TOKEN, agent_backend="sim", agent_fast_secret=secret)
    settings = AgentSettings(agent_token=TOKEN, agent_backend="sim", agent_fast_secret=SECRET)
    data = body(sent_at_s=time.time())
    assert settings.fast_guard().check(data, signature(data)).seq == 1
