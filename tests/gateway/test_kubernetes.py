"""The gateway follows Kubernetes through the official client: pods asking for GPUs become
jobs (a training job's pods one job), placed with the GPU indices each node's agent reads from
its kubelet (PodResources), tagged by annotations; the watch brings a change at once (the poll
is an hour away); bad input is reported and costs nothing.

There is no Kubernetes here: the API server is tests/gateway/fake_kube_api.py (the list and
watch answers for pods, on loopback) and each kubelet's PodResources service
tests/agents/fake_kubelet.py (gRPC on a unix socket).
"""

from __future__ import annotations

import contextlib

import pytest

from agents.podresources import PodGpuReader, PodResourcesClient
from flexgate.serve import ServerThread
from tests.agents.fake_kubelet import FakePodResources
from tests.conftest import wait_for
from tests.gateway.conftest import API
from tests.gateway.fake_kube_api import TOKEN, FakeKubeApi, pod
from tests.gateway.jobsites import following_site

NODES = ("node-a", "node-b")


def uuid(node: str, index: int) -> str:
    return f"GPU-sim-{node}-{index:02d}"


class Cluster:
    """The fake API server and one fake kubelet per node, set together: `run(pod, gpus)`."""

    def __init__(self, api: FakeKubeApi, kubelets: dict[str, FakePodResources]) -> None:
        self.api, self.kubelets = api, kubelets

    def run(self, doc: dict, indices: list[int]) -> None:
        node, meta = doc["spec"]["nodeName"], doc["metadata"]
        devices = [{"nvidia.com/gpu": [uuid(node, i) for i in indices]}]
        self.kubelets[node].pods.append((meta["namespace"], meta["name"], devices))
        self.api.put(doc)

    def end(self, namespace: str, name: str) -> None:
        for kubelet in self.kubelets.values():
            kubelet.pods = [p for p in kubelet.pods if (p[0], p[1]) != (namespace, name)]
        self.api.delete(namespace, name)


@pytest.fixture
def cluster_site(tmp_path):
    api = FakeKubeApi()
    with contextlib.ExitStack() as stack:
        kubelets = {
            n: stack.enter_context(FakePodResources(str(tmp_path / f"{n}.sock"))) for n in NODES
        }

        def reader(node, backend):
            uuids = {backend.identity(i)[0]: i for i in range(backend.count())}
            client = PodResourcesClient(str(tmp_path / f"{node}.sock"))
            return PodGpuReader(client, uuids, max_age_s=0.1)

        url = stack.enter_context(ServerThread(api.app))
        site = stack.enter_context(
            following_site(
                tmp_path,
                nodes=NODES,
                pods=reader,
                job_source="kubernetes",
                kubernetes_kubeconfig=api.kubeconfig(url, tmp_path),
                kubernetes_watch_s=2.0,
                job_source_poll_s=3600.0,
                job_source_timeout_s=3.0,
                telemetry_max_age_s=0.1,
            )
        )
        yield Cluster(api, kubelets), site


def test_pods_become_jobs_placed_by_their_kubelets_and_the_watch_follows_them(cluster_site):
    cluster, site = cluster_site
    tags = {"flexgate.io/tier": "2", "flexgate.io/pfi": "1.6"}
    cluster.run(pod("llama-0", "node-a", 4, owner="llama", annotations=tags), [0, 1, 2, 3])
    cluster.run(pod("llama-1", "node-b", 4, owner="llama", annotations=tags), [4, 5, 6, 7])
    cluster.run(pod("web", "node-a", 0), [])  # asks for no GPU: not the gateway's
    jobs = site.wait_jobs({"ml/llama"})
    assert jobs["ml/llama"]["placement"] == [
        {"node": "node-a", "gpus": [0, 1, 2, 3]},
        {"node": "node-b", "gpus": [4, 5, 6, 7]},
    ]
    assert (jobs["ml/llama"]["gpus"], jobs["ml/llama"]["tier"], jobs["ml/llama"]["pfi"]) == (
        8,
        2,
        1.6,
    )
    (info,) = site.api.get("/v1/jobs").json()["source"]["jobs"]
    assert (info["user"], info["account"]) == ("trainer", "ml")
    assert cluster.api.watches >= 1
    assert cluster.api.tokens == {f"Bearer {TOKEN}"}

    event = site.start_event(reduction_kw=1.0)
    first = site.plan(event)
    assert [j["id"] for j in first["jobs"]] == ["ml/llama"]
    # A pod of no controller starts: its own job, known through the watch.
    cluster.run(pod("solo", "node-a", 2, deadline_s=3600), [5, 6])
    jobs = site.wait_jobs({"ml/llama", "ml/solo"})
    assert jobs["ml/solo"]["placement"] == [{"node": "node-a", "gpus": [5, 6]}]
    assert jobs["ml/solo"]["tier"] == 1  # no annotation: the site's default tier
    assert 3590 < jobs["ml/solo"]["remaining_s"] <= 3600
    second = site.plan(event, other_than=first["id"])
    assert sorted(j["id"] for j in second["jobs"]) == ["ml/llama", "ml/solo"]
    # The training job ends: re-planned without it, its GPUs back at their original limit.
    cluster.end("ml", "llama-0")
    cluster.end("ml", "llama-1")
    site.wait_jobs({"ml/solo"})
    third = site.plan(event, other_than=second["id"])
    assert [j["id"] for j in third["jobs"]] == ["ml/solo"]
    wait_for(lambda: site.limits("node-b") == [700.0] * 8, "node-b's GPUs restored")


def test_bad_pods_and_a_failing_api_cost_nothing(cluster_site):
    cluster, site = cluster_site
    cluster.run(pod("good", "node-a", 2, annotations={"flexgate.io/tier": "3"}), [0, 1])
    # Two controllers' pods that one annotation names a single job (a JobSet's, say).
    sweep = {"flexgate.io/job": "sweep"}
    cluster.run(pod("sweep-a-0", "node-a", 1, owner="sweep-a", annotations=sweep), [7])
    cluster.run(pod("sweep-b-0", "node-b", 1, owner="sweep-b", annotations=sweep), [7])
    jobs = site.wait_jobs({"ml/good", "ml/sweep"})
    assert jobs["ml/sweep"]["placement"] == [
        {"node": "node-a", "gpus": [7]},
        {"node": "node-b", "gpus": [7]},
    ]
    cluster.run(pod("bad-tier", "node-a", 1, annotations={"flexgate.io/tier": "high"}), [2])
    cluster.api.put(pod("unreported", "node-b", 2))  # its kubelet says nothing of it
    cluster.run(
        pod("split-0", "node-b", 1, owner="split", annotations={"flexgate.io/pfi": "1.2"}), [4]
    )
    cluster.run(
        pod("split-1", "node-b", 1, owner="split", annotations={"flexgate.io/pfi": "2"}), [5]
    )
    # A pod of a job whose GPU count cannot be read: the whole job is left out.
    broken = pod("half-1", "node-b", 1, owner="half")
    broken["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = "1.5"
    cluster.run(pod("half-0", "node-b", 1, owner="half"), [3])
    cluster.run(broken, [2])
    problems = wait_for(
        lambda: p if len(p := site.api.get("/v1/jobs").json()["source"]["problems"]) == 4 else None,
        "four problems reported",
        seconds=20,
    )
    text = " | ".join(problems)
    assert "job 'ml/bad-tier': annotation flexgate.io/tier: the tier 'high'" in text
    assert "pod ml/unreported: the agent of node 'node-b' reports no GPUs for it" in text
    assert "its pods disagree on flexgate.io/pfi: 1.2, 2" in text
    assert "job 'ml/half': pod ml/half-1 cannot be read: container 'main' asks for '1.5'" in text
    assert set(site.jobs()) == {"ml/good", "ml/sweep"}
    assert site.api.get("/health").json()["status"] == "degraded"

    for breaks, words in (
        (lambda: setattr(cluster.api, "fail_with", 403), "HTTP 403"),
        (
            lambda: (
                setattr(cluster.api, "fail_with", None),
                setattr(cluster.api, "garbage", True),
            ),
            "not a pod list",
        ),
    ):
        breaks()
        assert site.api.post("/v1/jobs/refresh", headers=API).status_code == 202
        wait_for(
            lambda w=words: w in (site.api.get("/health").json()["job_source"]["fault"] or ""),
            f"'{words}' in /health",
        )
        assert set(site.jobs()) == {"ml/good", "ml/sweep"}
    cluster.api.garbage = False
    assert site.api.post("/v1/jobs/refresh", headers=API).status_code == 202
    wait_for(lambda: site.api.get("/health").json()["job_source"]["fault"] is None, "recovery")
