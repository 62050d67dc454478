"""`can_cap` on the agent's /health: unknown until the first set, then what NVML said, and
false for good (until a restart) once NVML refused a set for permission. A real uvicorn server
on loopback, the GPUs behind the fake NVML."""

import httpx
import pytest

from agents.nvml import NvmlBackend
from agents.service import AgentNode, create_app
from flexgate.serve import ServerThread
from tests.agents.fake_nvml import FakeNvml

TOKEN = "test-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def caps(generation, **by_gpu):
    return {
        "plan_id": f"plan-{generation}",
        "generation": generation,
        "lease_s": 60.0,
        "caps": [{"gpu": int(k[1:]), "cap_w": v} for k, v in by_gpu.items()],
    }


@pytest.fixture
def serve(tmp_path):
    def start(fake):
        node = AgentNode("node-01", NvmlBackend(nvml=fake), tmp_path / "state", sample_hz=0)
        return ServerThread(create_app([node], TOKEN))

    return start


def test_a_refused_set_makes_can_cap_false_with_the_reason_and_it_stays(serve):
    fake = FakeNvml(gpus=2, root=False)
    with serve(fake) as url, httpx.Client(base_url=url, timeout=10) as client:
        health = client.get("/health").json()
        assert (health["can_cap"], health["can_cap_reason"]) == (None, None)
        answer = client.put("/v1/caps", json=caps(1, g0=450.0), headers=AUTH)
        assert answer.status_code == 200  # the command was taken; the GPU refused its cap
        assert "no permission" in answer.json()["results"][0]["error"]
        assert answer.json()["can_cap"] is False
        health = client.get("/health").json()
        assert health["status"] == "ok"  # the existing field keeps its meaning
        assert health["can_cap"] is False
        assert "no permission" in health["can_cap_reason"]
        # Sticky: a later accepted set (permission granted underneath) does not clear it.
        fake.root = True
        answer = client.put("/v1/caps", json=caps(2, g1=450.0), headers=AUTH)
        assert answer.json()["results"][0]["error"] is None
        assert fake.limit_mw(1) == 450_000
        assert client.get("/health").json()["can_cap"] is False


def test_an_accepted_set_makes_can_cap_true(serve):
    fake = FakeNvml(gpus=2)
    with serve(fake) as url, httpx.Client(base_url=url, timeout=10) as client:
        assert client.get("/health").json()["can_cap"] is None
        client.put("/v1/caps", json=caps(1, g0=450.0), headers=AUTH).raise_for_status()
        health = client.get("/health").json()
        assert (health["can_cap"], health["can_cap_reason"]) == (True, None)


def test_a_restart_forgets_the_refusal(serve):
    fake = FakeNvml(gpus=2, root=False)
    with serve(fake) as url, httpx.Client(base_url=url, timeout=10) as client:
        client.put("/v1/caps", json=caps(1, g0=450.0), headers=AUTH)
        assert client.get("/health").json()["can_cap"] is False
    fake.root = True  # the agent now runs with the permission
    with serve(fake) as url, httpx.Client(base_url=url, timeout=10) as client:
        # The original it saved before the refused set is restored at start: a set NVML took.
        health = client.get("/health").json()
        assert (health["can_cap"], health["can_cap_reason"]) == (True, None)
