"""The gateway dies (SIGKILL) mid-event and comes back: no event lost, the agents held their
caps, the new gateway takes over the leases and restores at the end."""

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta

import httpx
import pytest
from sqlalchemy import create_engine, text

from flexgate.serve import ServerThread, free_port
from tests.conftest import ROOT
from tests.gateway.conftest import (
    AGENT_TOKEN,
    API,
    API_TOKEN,
    POSTGRES,
    Site,
    lease_ends,
    past_and_renewed,
    postgres_available,
    running_site,
    start_site,
)


@pytest.fixture(params=["sqlite"])
def database_url(request, tmp_path):
    return f"sqlite:///{tmp_path / 'gateway.db'}"


def gateway_process(port, env, log):
    with log.open("ab") as errors:
        process = subprocess.Popen(
            [sys.executable, "-m", "flexgate.cli", "gateway", "--port", str(port)],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=errors,
        )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/health", timeout=0.5).status_code == 200:
                return process, url
        except httpx.HTTPError:
            time.sleep(0.1)
    process.kill()
    process.wait()
    raise RuntimeError(f"the gateway did not start: {log.read_text()}")


def test_gateway_killed_mid_event_resumes(tmp_path, database_url, recovery):
    jobs, nodes, agents = start_site(tmp_path, database_url)
    with ServerThread(agents) as agents_url:
        env = {k: v for k, v in os.environ.items() if not k.startswith("FLEXGATE_")} | {
            "FLEXGATE_DATABASE_URL": database_url,
            "FLEXGATE_API_TOKEN": API_TOKEN,
            "FLEXGATE_AGENT_TOKEN": AGENT_TOKEN,
            "FLEXGATE_AGENTS": ",".join(f"{agents_url}/nodes/{n}" for n in nodes),
            "FLEXGATE_LEASE_S": "4",
            "FLEXGATE_RECONCILE_PERIOD_S": "0.5",
            "FLEXGATE_RECOVERY_RAMP_S": "0.2",
            "FLEXGATE_RECOVERY_STEPS": "1",
            "FLEXGATE_ALLOW_SIMULATED": "true",
            "FLEXGATE_READ_PUBLIC": "true",
        }
        port, log = free_port(), tmp_path / "gateway.log"
        gateway, url = gateway_process(port, env, log)
        stack = contextlib.ExitStack()
        try:
            api = httpx.Client(base_url=url, timeout=20)
            site = Site(api, nodes, None)
            stack.callback(api.close)
            assert api.put("/v1/jobs", json={"jobs": jobs}, headers=API).status_code == 200
            end = datetime.now(UTC) + timedelta(seconds=24)
            event = api.post(
                "/v1/events",
                headers=API,
                json={
                    "reduction_kw": 15,
                    "start": datetime.now(UTC).isoformat(),
                    "duration_s": 24,
                },
            ).json()
            plan_id = site.wait(lambda: api.get(f"/v1/events/{event['id']}").json()["plan_id"])
            site.wait(
                lambda: all(
                    c["status"] == "acked"
                    for c in api.get(f"/v1/plans/{plan_id}").json()["commands"]
                ),
                what="every node's ack",
            )
            capped = site.limits()
            os.kill(gateway.pid, signal.SIGKILL)
            gateway.wait(timeout=10)
            ends = lease_ends(nodes)  # the leases the dead gateway gave
            assert site.limits() == capped  # the agents hold their caps (lease 4 s)
            restart = time.monotonic()
            left = {name: n.controller.lease_remaining_s() or 0.0 for name, n in nodes.items()}
            gateway, url = gateway_process(port, env, log)
            recovery(
                "gateway SIGKILLed: answering again after its restart", time.monotonic() - restart
            )

            def renewed():  # more left than the old lease would have by now
                since = time.monotonic() - restart
                return all(
                    (n.controller.lease_remaining_s() or 0.0) > left[name] - since + 0.5
                    for name, n in nodes.items()
                )

            site.wait(renewed, what="the leases renewed")
            recovery(
                "gateway SIGKILLed: every lease renewed after its restart",
                time.monotonic() - restart,
            )
            assert api.get(f"/v1/events/{event['id']}").json()["status"] == "active"
            site.wait(lambda: past_and_renewed(nodes, ends), what="past the old leases, renewed")
            assert site.limits() == capped  # re-planned on the same mix: the same caps
            remaining = (end - datetime.now(UTC)).total_seconds()
            site.wait(
                lambda: api.get(f"/v1/events/{event['id']}").json()["status"] == "completed",
                seconds=remaining + 10,
                what="the end of the event",
            )
            site.wait(
                lambda: all(w == 700.0 for ws in site.limits().values() for w in ws),
                what="the restore at the end",
            )
        finally:
            stack.close()
            gateway.terminate()
            gateway.wait(timeout=10)


def pg_ctl(action: str) -> None:
    version = sorted(os.listdir("/etc/postgresql"))[-1]
    subprocess.run(
        ["pg_ctlcluster", "--skip-systemctl-redirect", version, "main", action, "-m", "fast"]
        if action == "stop"
        else ["pg_ctlcluster", "--skip-systemctl-redirect", version, "main", action],
        check=True,
        capture_output=True,
        timeout=60,
    )
    if action == "start":
        deadline = time.monotonic() + 30
        while subprocess.run(["pg_isready", "-h", "127.0.0.1", "-q"], check=False).returncode:
            assert time.monotonic() < deadline, "PostgreSQL did not come back"
            time.sleep(0.2)


NEEDS_LOCAL_POSTGRES = pytest.mark.skipif(
    shutil.which("pg_ctlcluster") is None or os.geteuid() != 0 or "127.0.0.1" not in POSTGRES,
    reason="restarting PostgreSQL needs pg_ctlcluster, root and a local server (CI has them)",
)


@contextlib.contextmanager
def postgres_site(tmp_path):
    """A gateway on a clean PostgreSQL database, its agents, and the job mix put."""
    if not postgres_available():
        pytest.fail(f"no PostgreSQL at {POSTGRES}")
    engine = create_engine(POSTGRES)
    with engine.begin() as connection:
        connection.execute(text("drop schema public cascade; create schema public"))
    engine.dispose()
    with running_site(
        tmp_path, POSTGRES, lease_s=4.0, recovery_ramp_s=0.2, recovery_steps=1
    ) as site:
        yield site


def capped(site):
    return any(w < 700 for ws in site.limits().values() for w in ws)


def restored(site):
    return all(w == 700.0 for ws in site.limits().values() for w in ws)


@NEEDS_LOCAL_POSTGRES
def test_postgresql_restarted_mid_event(tmp_path, recovery):
    """The store goes away mid-event: /health says unhealthy (503), writes are refused with
    503 and change nothing, the caps stay (leases renewed from memory). When it is back the
    gateway answers again, the event is still active, and cancelling it restores."""
    with postgres_site(tmp_path) as site:
        api = site.api
        body = {"reduction_kw": 15, "start": datetime.now(UTC).isoformat(), "duration_s": 120}
        event = api.post("/v1/events", headers=API, json=body).json()
        caps = site.event_caps(event["id"])
        assert capped(site)
        pg_ctl("stop")
        ends = lease_ends(site.nodes)  # any renewal after this is from memory
        try:
            health = api.get("/health")
            assert health.status_code == 503
            assert health.json()["status"] == "unhealthy"
            refused = api.post("/v1/events", headers=API, json=body)
            assert refused.status_code == 503
            assert "store is unreachable" in refused.json()["detail"]
            site.wait(lambda: past_and_renewed(site.nodes, ends), what="leases renewed from memory")
            assert site.limits() == caps
        finally:
            back = time.monotonic()
            pg_ctl("start")
        site.wait(lambda: api.get("/health").status_code == 200, what="the store back")
        recovery("PostgreSQL restarted: gateway healthy after the start", time.monotonic() - back)
        assert api.get(f"/v1/events/{event['id']}").json()["status"] == "active"
        assert len(api.get("/v1/events").json()["events"]) == 1  # the refused one is not there
        assert api.delete(f"/v1/events/{event['id']}", headers=API).status_code == 200
        site.wait(lambda: restored(site), what="the restore")


@NEEDS_LOCAL_POSTGRES
def test_an_event_that_ends_while_postgresql_is_down_ends_when_it_returns(tmp_path, recovery):
    """The end falls in the outage: the scheduled end cannot be stored, so the caps hold until
    the store is back, and the next reconciliation ends the event and restores."""
    with postgres_site(tmp_path) as site:
        api = site.api
        start = datetime.now(UTC)
        body = {"reduction_kw": 15, "start": start.isoformat(), "duration_s": 4}
        event = api.post("/v1/events", headers=API, json=body).json()
        site.wait(lambda: capped(site), what="caps")
        pg_ctl("stop")
        try:
            # The end passes while the store is down, and reconciliations (every 0.5 s) after
            # it find the store gone.
            tried = start + timedelta(seconds=4 + 2 * site.settings.reconcile_period_s)
            site.wait(lambda: datetime.now(UTC) > tried, what="the end passed in the outage")
        finally:
            back = time.monotonic()
            pg_ctl("start")
        site.wait(
            lambda: api.get(f"/v1/events/{event['id']}").json()["status"] == "completed",
            what="the event ended once the store answers",
        )
        site.wait(lambda: restored(site), what="the restore")
        recovery("PostgreSQL started after an event's end: GPUs restored", time.monotonic() - back)
