"""`make compose-lab`: the lab's chain in containers (docker-compose.yml), driven from the host.

`python -m flexgate.lab.compose [--postgres] [--keep] [--out DIR]` builds the images (Docker's
layer cache makes an unchanged tree cost seconds), starts the two simulated agents and the
gateway (and, with `--postgres`, PostgreSQL first), waits on their healthchecks, puts the job
mix in, then starts the mock VTN, whose scenario issues the event once the VEN has registered.
It watches the gateway's published API from the host and prints `flexgate lab`'s report
(flexgate/lab/report.py); exit 0 when the site met the target within 5%. `docker-compose down
--volumes` follows unless `--keep`.

The secrets are taken from the environment (FLEXGATE_API_TOKEN, FLEXGATE_AGENT_TOKEN,
POSTGRES_PASSWORD) or made for this run, and reach docker-compose only through its environment.
`Stack` is also what the compose tests drive their faults with.

The images are built by flexgate.imagebuild, which trusts the host's CA bundle by default (a
TLS-intercepting proxy's) and says in one line, naming FLEXGATE_BUILD_CA, when pip cannot reach
or verify PyPI.

Errors: `ComposeError` (a docker or docker-compose command failed, or a service never became
healthy), with the command's output in the message.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console

# Re-exported: the compose tests and `make compose-lab`'s callers name them here.
from flexgate.imagebuild import BUILD_CA as BUILD_CA
from flexgate.imagebuild import IMAGE as IMAGE
from flexgate.imagebuild import POSTGRES_IMAGE as POSTGRES_IMAGE
from flexgate.imagebuild import ComposeError, build_images, run
from flexgate.lab.mockvtn import read_scenario
from flexgate.lab.report import read_result, report, watch
from flexgate.serve import free_port

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "docker-compose.yml"
SITE = ROOT / "examples" / "compose-site.json"
SCENARIO = ROOT / "examples" / "compose-scenario.json"
AGENTS = ("agent-1", "agent-2")
SECRET_NAMES = ("FLEXGATE_API_TOKEN", "FLEXGATE_AGENT_TOKEN", "POSTGRES_PASSWORD")


def docker(*args: str, timeout_s: float = 120.0) -> str:
    return run(["docker", *args], timeout_s=timeout_s)


def published_port(text: str | None) -> int:
    """FLEXGATE_COMPOSE_PORT, or a port free on loopback now when it is unset."""
    if not text:
        return free_port()
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise ComposeError(f"FLEXGATE_COMPOSE_PORT={text!r}: not a port number (1 to 65535)")
    return int(text)


class Stack:
    """One docker-compose project of docker-compose.yml, its secrets and its published port."""

    def __init__(self, project: str = "flexgate-lab", *, postgres: bool = False) -> None:
        self.project = project
        self.postgres = postgres
        self.port = published_port(os.environ.get("FLEXGATE_COMPOSE_PORT"))
        self.env = {
            **os.environ,
            **{name: os.environ.get(name) or secrets.token_urlsafe(24) for name in SECRET_NAMES},
            "FLEXGATE_COMPOSE_PORT": str(self.port),
        }
        if postgres:
            self.env["FLEXGATE_DATABASE_URL"] = (
                f"postgresql+psycopg://flexgate:{self.env['POSTGRES_PASSWORD']}@postgres/flexgate"
            )
        self.url = f"http://127.0.0.1:{self.port}"

    def compose(self, *args: str, timeout_s: float = 120.0) -> str:
        profile = ["--profile", "postgres"] if self.postgres else []
        command = ["docker-compose", "-f", str(COMPOSE_FILE), "-p", self.project, *profile]
        return run([*command, *args], timeout_s=timeout_s, env=self.env)

    def up(self, *services: str, timeout_s: float = 120.0) -> None:
        """Start the services (and what they depend on) and wait until each is healthy."""
        self.compose("up", "-d", "--no-build", *services)
        self.wait_healthy(*services, timeout_s=timeout_s)

    def container(self, service: str) -> str:
        found = self.compose("ps", "-q", service).strip()
        if not found:
            raise ComposeError(f"{self.project}: no container for {service}")
        return found

    def health(self, service: str) -> str:
        return docker("inspect", "-f", "{{.State.Health.Status}}", self.container(service)).strip()

    def wait_healthy(self, *services: str, timeout_s: float = 120.0) -> None:
        deadline = time.monotonic() + timeout_s
        waiting = list(services)
        while waiting:
            waiting = [s for s in waiting if self.health(s) != "healthy"]
            if waiting and time.monotonic() > deadline:
                logs = self.compose("logs", "--tail", "30", *waiting)
                raise ComposeError(f"not healthy after {timeout_s:g} s: {waiting}\n{logs}")
            if waiting:
                time.sleep(1)

    def kill(self, service: str) -> None:
        """SIGKILL, as a crash or the OOM killer would: nothing runs on the way down."""
        docker("kill", "--signal", "KILL", self.container(service))

    def running(self, service: str) -> bool:
        return (
            docker("inspect", "-f", "{{.State.Running}}", self.container(service)).strip() == "true"
        )

    def start(self, service: str, timeout_s: float = 120.0) -> None:
        docker("start", self.container(service))
        self.wait_healthy(service, timeout_s=timeout_s)

    def agent_get(self, service: str, path: str) -> Any:
        """GET an agent's API from inside its container: agents publish no port."""
        return self.agent_gets(service, path)[0]

    def agent_gets(self, service: str, *paths: str) -> list[Any]:
        """GET several of an agent's paths, in order, in one `docker exec` (on a loaded machine
        each exec takes seconds: answers read together are read at one time)."""
        script = (
            "import json, sys, urllib.request; json.dump([json.load(urllib.request.urlopen("
            f"'http://127.0.0.1:9100' + p, timeout=5)) for p in {list(paths)!r}], sys.stdout)"
        )
        return list(json.loads(docker("exec", self.container(service), "python", "-c", script)))

    def api(self) -> httpx.Client:
        token = self.env["FLEXGATE_API_TOKEN"]
        return httpx.Client(
            base_url=self.url, timeout=20, headers={"Authorization": f"Bearer {token}"}
        )

    def down(self) -> None:
        """Stop and remove the containers, the network and the named volumes."""
        self.compose("down", "--volumes", "--remove-orphans", "--timeout", "10")


def start_lab(stack: Stack, jobs: list[dict[str, Any]], *, vtn: bool = True) -> None:
    """Agents and gateway (PostgreSQL first) healthy, the job mix in, then the mock VTN.

    The VTN issues its scenario as soon as the VEN registers, and the gateway decides to opt in
    against its job mix: so the mix goes in before the VTN starts (the VEN retries until then).
    Without the VTN (`vtn=False`) only operator events reach the site.
    """
    if stack.postgres:
        stack.up("postgres")
    stack.up("gateway", *AGENTS)
    with stack.api() as api:
        api.put("/v1/jobs", json={"jobs": jobs}).raise_for_status()
    if vtn:
        stack.up("mock-vtn")


def wait_for_event(api: httpx.Client, timeout_s: float = 90.0) -> dict[str, Any]:
    """The VTN's event as the gateway stored it (registration may wait on the VEN's backoff)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        events = api.get("/v1/events").json()["events"]
        if events:
            return dict(events[0])
        time.sleep(0.5)
    raise ComposeError(f"the VTN's event did not reach the gateway within {timeout_s:g} s")


def run_compose_lab(stack: Stack, *, out: Path, console: Console, keep: bool = False) -> int:
    jobs = json.loads(SITE.read_text(encoding="utf-8"))["jobs"]
    (event_spec,) = read_scenario(SCENARIO)["events"]
    requested = -float(event_spec["intervals"][0]["value"])
    duration_s = sum(float(iv["duration_s"]) for iv in event_spec["intervals"])
    console.print(f"compose lab: building images, starting project {stack.project}")
    build_images(postgres=stack.postgres)
    try:
        start_lab(stack, jobs)
        console.print(
            f"compose lab: {len(AGENTS)} agents, {len(jobs)} jobs, gateway at {stack.url}"
            + (" on PostgreSQL" if stack.postgres else "")
            + f"; the VTN asks for {requested:.1f} kW for {duration_s:g} s"
        )
        with stack.api() as api:
            event = wait_for_event(api)
            starts_in_s = (
                datetime.fromisoformat(event["start"]) - datetime.now(UTC)
            ).total_seconds()
            trace = watch(api, duration_s, requested, console, start_after_s=max(starts_in_s, 0))
            return report([read_result(api, trace, True)], jobs, requested, out, console)
    finally:
        if not keep:
            stack.down()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flexgate.lab.compose", description=__doc__)
    parser.add_argument("--postgres", action="store_true", help="the gateway on PostgreSQL")
    parser.add_argument("--keep", action="store_true", help="leave the stack up afterwards")
    parser.add_argument("--project", default="flexgate-lab", help="docker-compose project name")
    parser.add_argument("--out", type=Path, default=Path("out"), help="where the plot goes")
    args = parser.parse_args(argv)
    console = Console()
    try:
        return run_compose_lab(
            Stack(args.project, postgres=args.postgres),
            out=args.out,
            console=console,
            keep=args.keep,
        )
    except (ComposeError, httpx.HTTPError) as exc:
        console.print(f"[red]compose lab: {exc}[/]")
        return 2


if __name__ == "__main__":
    sys.exit(main())
