"""The agent reports each Kubernetes pod's GPUs from the kubelet's PodResources API (a fake
kubelet speaking gRPC on a unix socket), as this node's GPU indices, in its telemetry."""

from __future__ import annotations

import httpx

from agents.podresources import PodGpuReader, PodResourcesClient
from agents.service import AgentNode, create_app
from agents.simulated import SimulatedBackend
from flexgate.serve import ServerThread
from tests.agents.fake_kubelet import FakePodResources

TOKEN = "agent-token-0123456789abcdef"


def reader(socket_path, backend, **options):
    uuids = {backend.identity(i)[0]: i for i in range(backend.count())}
    return PodGpuReader(PodResourcesClient(str(socket_path)), uuids, **options)


def test_the_agent_reports_each_pods_gpus_as_its_indices(tmp_path):
    socket_path = tmp_path / "kubelet.sock"
    with FakePodResources(str(socket_path)) as kubelet:
        kubelet.pods = [
            ("ml", "train-0", [{"nvidia.com/gpu": ["GPU-sim-node-01-02", "GPU-sim-node-01-00"]}]),
            ("ml", "train-1", [{"nvidia.com/gpu": ["5"]}, {"nvidia.com/gpu": ["GPU-elsewhere"]}]),
            ("web", "nginx", [{"example.com/nic": ["eth1"]}]),  # no GPU: not reported
        ]
        backend = SimulatedBackend(8, node_id="node-01")
        node = AgentNode(
            "node-01", backend, tmp_path / "state", sample_hz=0, pods=reader(socket_path, backend)
        )
        with (
            ServerThread(create_app([node], TOKEN)) as url,
            httpx.Client(base_url=url, timeout=10) as api,
        ):
            telemetry = api.get("/v1/telemetry").json()
            assert telemetry["pods_error"] is None
            assert telemetry["pods"] == [
                {"namespace": "ml", "name": "train-0", "gpus": [0, 2], "unknown_devices": []},
                {
                    "namespace": "ml",
                    "name": "train-1",
                    "gpus": [5],
                    "unknown_devices": ["GPU-elsewhere"],
                },
            ]
            kubelet.stop()
            node.pods.max_age_s = 0.0  # read again now
            telemetry = api.get("/v1/telemetry").json()
            assert telemetry["pods"] is None
            assert "PodResources" in telemetry["pods_error"]
            assert telemetry["gpus"]  # the rest of the telemetry is unharmed


def test_an_agent_without_a_kubelet_reports_no_pods(tmp_path):
    node = AgentNode("node-01", SimulatedBackend(2, node_id="node-01"), tmp_path, sample_hz=0)
    telemetry = node.telemetry()
    assert telemetry.pods is None
    assert telemetry.pods_error is None


def test_the_kubelet_is_asked_at_most_once_per_max_age(tmp_path):
    socket_path = tmp_path / "kubelet.sock"
    now = [0.0]
    with FakePodResources(str(socket_path)) as kubelet:
        backend = SimulatedBackend(2, node_id="n")
        pods = reader(socket_path, backend, max_age_s=1.0, clock=lambda: now[0])
        for _ in range(5):
            pods.read()
        assert kubelet.calls == 1
        now[0] = 1.0
        pods.read()
        assert kubelet.calls == 2
        pods.close()
