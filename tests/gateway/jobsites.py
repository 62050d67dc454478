"""A site whose gateway follows a job source: simulated agents and a gateway on real uvicorn
servers, the gateway's `FLEXGATE_JOB_SOURCE` set, no job mix put."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from agents.podresources import PodGpuReader
from agents.service import AgentNode
from agents.service import create_app as agent_app
from agents.simulated import SimulatedBackend
from flexgate.serve import ServerThread
from gateway.app import create_app
from gateway.settings import GatewaySettings
from tests.conftest import wait_for
from tests.gateway.conftest import AGENT_TOKEN, API, API_TOKEN, now_iso


class FollowingSite:
    def __init__(self, api: httpx.Client, nodes: dict[str, AgentNode]) -> None:
        self.api, self.nodes = api, nodes

    def jobs(self) -> dict[str, dict]:
        return {j["id"]: j for j in self.api.get("/v1/jobs").json()["jobs"]}

    def wait_jobs(self, ids: set[str], seconds: float = 15.0) -> dict[str, dict]:
        """The job mix once it holds exactly these jobs."""
        found: dict[str, dict] = {}

        def holds() -> bool:
            found.clear()
            found.update(self.jobs())
            return set(found) == ids

        wait_for(holds, f"the job mix to hold {sorted(ids)}", seconds)
        return found

    def limits(self, node: str) -> list[float]:
        backend = self.nodes[node].backend
        return [backend.enforced_limit_w(g) for g in range(backend.count())]

    def start_event(self, reduction_kw: float) -> str:
        answer = self.api.post(
            "/v1/events",
            headers=API,
            json={"reduction_kw": reduction_kw, "start": now_iso(), "duration_s": 600},
        )
        assert answer.status_code == 201, answer.text
        return answer.json()["id"]

    def plan(self, event_id: str, other_than: str | None = None) -> dict:
        """The event's current plan, once every node acked it (and it is not `other_than`)."""

        def acked():
            plan_id = self.api.get(f"/v1/events/{event_id}").json()["plan_id"]
            if plan_id is None or plan_id == other_than:
                return None
            plan = self.api.get(f"/v1/plans/{plan_id}").json()
            return plan if all(c["status"] != "pending" for c in plan["commands"]) else None

        return wait_for(acked, f"a new acked plan of {event_id}", 20.0)


@contextlib.contextmanager
def following_site(
    tmp_path: Path,
    nodes: tuple[str, ...] = ("node-01",),
    pods: Callable[[str, SimulatedBackend], PodGpuReader] | None = None,
    **changes,
):
    """`pods(node, backend)`: each agent's reader of its kubelet's PodResources."""
    agents = {}
    for n in nodes:
        backend = SimulatedBackend(8, node_id=n, noise_w=3.0)
        reader = pods(n, backend) if pods else None
        agents[n] = AgentNode(n, backend, tmp_path / "agents" / n, pods=reader)
    with ServerThread(agent_app(list(agents.values()), AGENT_TOKEN, prefixed=True)) as agents_url:
        settings = GatewaySettings(
            **{
                "database_url": f"sqlite:///{tmp_path / 'gateway.db'}",
                "api_token": API_TOKEN,
                "agent_token": AGENT_TOKEN,
                "agents": ",".join(f"{agents_url}/nodes/{n}" for n in agents),
                "allow_simulated": True,  # the agents run simulated GPUs
                "lease_s": 5.0,
                "reconcile_period_s": 0.5,
                "recovery_ramp_s": 0.2,
                "recovery_steps": 1,
                "job_source": "slurm",
                "job_source_poll_s": 0.2,
                "job_source_timeout_s": 2.0,
                **changes,
            }
        )
        with (
            ServerThread(create_app(settings)) as url,
            httpx.Client(base_url=url, timeout=20) as api,
        ):
            yield FollowingSite(api, agents)


class ScriptedSqueue:
    """An `squeue` on PATH of its own that answers what the test says: a JSON document, text
    that is not JSON, a failure, or nothing for `delay_s` (the controller that does not answer
    and answers garbage, which a real Slurm cannot be made to do on cue)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        script = folder / "squeue"
        script.write_text(
            "#!/bin/sh\n"
            'here="$(dirname "$0")"\n'
            '[ -f "$here/delay" ] && sleep "$(cat "$here/delay")"\n'
            'if [ -f "$here/fail" ]; then cat "$here/fail" >&2; exit 1; fi\n'
            'cat "$here/answer"\n'
        )
        script.chmod(0o755)
        self.answer_jobs([])

    @staticmethod
    def document(jobs: list[dict]) -> str:
        """`squeue --json`'s answer listing these jobs."""
        return json.dumps({"meta": {}, "errors": [], "jobs": jobs})

    def answer_jobs(self, jobs: list[dict]) -> None:
        self.answer_text(self.document(jobs))

    def answer_text(self, text: str) -> None:
        for name in ("fail", "delay"):
            (self.folder / name).unlink(missing_ok=True)
        tmp = self.folder / "answer.tmp"
        tmp.write_text(text)
        tmp.replace(self.folder / "answer")

    def fail(self, message: str) -> None:
        (self.folder / "delay").unlink(missing_ok=True)
        (self.folder / "fail").write_text(message + "\n")

    def delay(self, seconds: float) -> None:
        """No answer for `seconds`, then the last answer."""
        (self.folder / "fail").unlink(missing_ok=True)
        (self.folder / "delay").write_text(f"{seconds}\n")


def squeue_job(
    job_id: int,
    gres: tuple[str, ...] = ("gpu:4(IDX:0-3)",),
    nodes: tuple[str, ...] = ("node-01",),
    comment: str = "",
    state: str = "RUNNING",
    time_limit: int = 60,
    user: str = "alice",
    account: str = "ml",
) -> dict:
    """One job as `squeue --json` of Slurm 22.05 shows it (the fields the source reads)."""
    start = int(time.time()) - 5
    return {
        "job_id": job_id,
        "job_state": state,
        "user_name": user,
        "account": account,
        "comment": comment,
        "nodes": ",".join(nodes),
        "gres_detail": list(gres),
        "start_time": start,
        "end_time": start + 60 * time_limit,
        "time_limit": time_limit,
        "job_resources": {"allocated_nodes": [{"nodename": n} for n in nodes]},
    }
