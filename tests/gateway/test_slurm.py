"""The gateway follows a real Slurm (slurm-wlm 22.05, munge): jobs submitted with sbatch appear
in GET /v1/jobs with their GPUs, tier and PFI; finished and cancelled ones leave it; an event
active meanwhile is re-planned; a controller that goes away costs nothing but freshness.

The gateway polls only once an hour here: after its first look, it learns of every job from
the PrologSlurmctld and EpilogSlurmctld that call scripts/slurm/flexgate-notify, as on a site.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from tests.conftest import ROOT, wait_for
from tests.gateway.conftest import API, API_TOKEN
from tests.gateway.jobsites import following_site
from tests.gateway.slurmcluster import NODE, SlurmCluster, require_slurm

NOTIFY = ROOT / "scripts" / "slurm" / "flexgate-notify"


@pytest.fixture(scope="module")
def cluster():
    require_slurm()
    # Not under pytest's temporary folder: munged wants every folder above its socket
    # searchable by all, and pytest's is private.
    root = Path(tempfile.mkdtemp(prefix="flexgate-slurm-"))
    hook = root / "flexgate-hook"  # as a site installs it: the script and its settings file
    hook.write_text(f"#!/bin/sh\nFLEXGATE_NOTIFY_CONF={root}/notify.conf exec {NOTIFY}\n")
    hook.chmod(0o755)
    cluster = SlurmCluster(root, prolog=hook)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)


def tell_hooks(cluster: SlurmCluster, gateway_url: str) -> None:
    """The prolog/epilog settings file, pointing at the gateway (absent: they do nothing)."""
    token = cluster.root / "api-token"
    token.write_text(API_TOKEN)
    token.chmod(0o600)
    (cluster.root / "notify.conf").write_text(
        f"FLEXGATE_URL={gateway_url}\nFLEXGATE_TOKEN_FILE={token}\n"
    )


@pytest.fixture
def site(cluster, tmp_path, monkeypatch):
    monkeypatch.setenv("SLURM_CONF", str(cluster.conf))  # what the gateway's squeue reads
    (cluster.root / "notify.conf").unlink(missing_ok=True)
    with following_site(
        tmp_path,
        nodes=(NODE,),
        job_source_poll_s=3600.0,
        job_source_timeout_s=3.0,
        job_source_stale_s=600.0,
    ) as site:
        tell_hooks(cluster, str(site.api.base_url).rstrip("/"))
        yield site
    cluster.cancel_all()


def test_sbatched_jobs_appear_finished_and_cancelled_ones_leave_and_the_event_follows(
    cluster, site
):
    # Every job is announced by the prolog and epilog: the poll is an hour away.
    first = cluster.sbatch("--gres=gpu:4", "--comment=flexgate:tier=2,pfi=1.8", "--time=30")
    jobs = site.wait_jobs({first})
    assert jobs[first]["placement"] == [{"node": NODE, "gpus": [0, 1, 2, 3]}]
    assert (jobs[first]["tier"], jobs[first]["pfi"]) == (2, 1.8)
    assert 29 * 60 < jobs[first]["remaining_s"] <= 30 * 60
    (info,) = site.api.get("/v1/jobs").json()["source"]["jobs"]
    assert info["user"] == "root"

    event = site.start_event(reduction_kw=0.5)
    one = site.plan(event)
    assert [(j["id"], j["tier"]) for j in one["jobs"]] == [(first, 2)]
    wait_for(lambda: max(site.limits(NODE)[:4]) < 700, f"job {first}'s GPUs capped")

    second = cluster.sbatch("--gres=gpu:4", "--time=10")
    jobs = site.wait_jobs({first, second})  # told by the prolog
    assert jobs[second]["placement"] == [{"node": NODE, "gpus": [4, 5, 6, 7]}]
    assert jobs[second]["tier"] == 1  # no tag: the site's default tier
    two = site.plan(event, other_than=one["id"])
    assert sorted(j["id"] for j in two["jobs"]) == sorted([first, second])

    cluster.command("scancel", first)
    site.wait_jobs({second})  # told by the epilog
    three = site.plan(event, other_than=two["id"])
    assert [j["id"] for j in three["jobs"]] == [second]
    assert {c["gpu"] for c in three["commands"][0]["caps"]} <= {4, 5, 6, 7}
    wait_for(lambda: site.limits(NODE)[:4] == [700.0] * 4, f"job {first}'s GPUs restored")

    short = cluster.sbatch("--gres=gpu:2", "--time=5", seconds=4)
    site.wait_jobs({second, short})
    site.wait_jobs({second}, seconds=30)  # it finished on its own


def test_a_controller_that_goes_away_leaves_the_last_good_view(cluster, site):
    job = cluster.sbatch("--gres=gpu:2", "--time=20")
    site.wait_jobs({job})
    cluster.stop_controller()
    try:
        assert site.api.post("/v1/jobs/refresh", headers=API).status_code == 202
        health = wait_for(
            lambda: h if (h := site.api.get("/health").json())["job_source"]["fault"] else None,
            "the controller's absence in /health",
        )
        assert health["status"] == "degraded"
        assert "squeue" in health["job_source"]["fault"]
        assert set(site.jobs()) == {job}
    finally:
        cluster.start_controller()
    assert site.api.post("/v1/jobs/refresh", headers=API).status_code == 202
    wait_for(
        lambda: site.api.get("/health").json()["job_source"]["fault"] is None,
        "the controller back",
    )
    assert set(site.jobs()) == {job}


def test_the_notify_script_never_fails_a_job(tmp_path):
    """A prolog that fails would requeue the job: with no gateway, no settings, or a wrong
    token, the script still exits 0."""
    conf = tmp_path / "notify.conf"
    unreachable = "FLEXGATE_URL=http://127.0.0.1:9\n"
    missing_token = f"{unreachable}FLEXGATE_TOKEN_FILE={tmp_path / 'missing'}\n"
    for text in ("", unreachable, missing_token):
        conf.write_text(text)
        done = subprocess.run(
            [str(NOTIFY)],
            env={"FLEXGATE_NOTIFY_CONF": str(conf), "PATH": "/usr/bin:/bin", "SLURM_JOB_ID": "1"},
            capture_output=True,
            timeout=10,
        )
        assert done.returncode == 0
        assert done.stdout == b""
    assert Path(NOTIFY).stat().st_mode & 0o111


def test_a_job_running_before_the_gateway_starts_is_found_at_its_first_look(
    cluster, tmp_path, monkeypatch
):
    monkeypatch.setenv("SLURM_CONF", str(cluster.conf))
    (cluster.root / "notify.conf").unlink(missing_ok=True)  # no gateway to tell yet
    try:
        job = cluster.sbatch("--gres=gpu:3", "--comment=flexgate:tier=0", "--time=15")
        wait_for(lambda: cluster.state(job) == "RUNNING", f"job {job} running")
        with following_site(tmp_path, nodes=(NODE,), job_source_poll_s=3600.0) as site:
            jobs = site.wait_jobs({job})
            assert jobs[job]["placement"] == [{"node": NODE, "gpus": [0, 1, 2]}]
            (bounds,) = site.api.get("/v1/jobs").json()["bounds"]
            assert (bounds["tier"], bounds["protected"]) == (0, True)  # tier 0: never capped
    finally:
        cluster.cancel_all()
