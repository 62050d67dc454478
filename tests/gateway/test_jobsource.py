"""The job source: squeue's answer read into jobs, and a gateway that follows it, keeps its last
good view through bad input, and re-plans an active event when a job starts or ends.

The gateway runs the real Slurm source against an `squeue` of the test's own (tests/gateway/
jobsites.py) for what a real controller cannot be made to do on cue: answer garbage, fail,
time out. tests/gateway/test_slurm.py runs it against a real Slurm.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from sqlmodel import select

from gateway.errors import JobSourceError
from gateway.jobsource.base import TagError, changes, parse_tags
from gateway.jobsource.slurm import gpu_indices, parse_squeue
from gateway.store.db import Store
from gateway.store.models import AuditRow
from tests.conftest import wait_for
from tests.gateway.conftest import API
from tests.gateway.jobsites import ScriptedSqueue, following_site, squeue_job
from tests.promtext import samples

# --- squeue's answer ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("detail", "indices"),
    [
        ("gpu:4(IDX:0-3)", (0, 1, 2, 3)),
        ("gpu:h200:2(IDX:0,2)", (0, 2)),
        ("gpu:4(IDX:0-1,4-5)", (0, 1, 4, 5)),
        ("gpu:a100:1(IDX:3),gpu:h200:1(IDX:5)", (3, 5)),
        ("", ()),
    ],
)
def test_gpu_indices_of_a_gres_detail(detail, indices):
    assert gpu_indices(detail) == indices


@pytest.mark.parametrize(
    ("detail", "words"),
    [
        ("gpu:4(IDX:0-2)", "3 indices for 4 GPUs"),
        ("gpu:2(IDX:N/A)", "not a list of numbers"),
        ("gpu:1(IDX:0),gpu:1(IDX:0)", "names a GPU twice"),
    ],
)
def test_a_gres_detail_that_does_not_add_up_is_refused(detail, words):
    with pytest.raises(ValueError, match=words):
        gpu_indices(detail)


def test_squeue_json_becomes_the_running_gpu_jobs():
    text = ScriptedSqueue.document(
        [
            squeue_job(
                7,
                gres=("gpu:8(IDX:0-7)", "gpu:h200:4(IDX:2-5)"),
                nodes=("node-01", "node-02"),
                comment="nightly; flexgate:tier=2,pfi=1.8",
                time_limit=30,
            ),
            squeue_job(8, state="PENDING"),
            squeue_job(9, gres=()),  # a CPU job: not the gateway's
            squeue_job(10, comment="flexgate:tier=high"),
            squeue_job(11, time_limit=0xFFFFFFFF, user="", account=""),
        ]
    )
    reading = parse_squeue(text)
    job, unlimited = reading.jobs
    assert job.id == "7"
    assert job.gpus == 12
    assert [(p.node, p.gpus) for p in job.placement] == [
        ("node-01", tuple(range(8))),
        ("node-02", (2, 3, 4, 5)),
    ]
    assert (job.tier, job.pfi, job.user, job.account) == (2, 1.8, "alice", "ml")
    assert job.start is not None
    assert job.end is not None
    assert job.start.tzinfo == UTC
    assert abs((datetime.now(UTC) - job.start).total_seconds() - 5) < 60
    assert (job.end - job.start).total_seconds() == 30 * 60
    assert unlimited.end is None
    assert unlimited.user is None
    assert unlimited.account is None
    (problem,) = reading.problems
    assert problem.id == "10"
    assert "tier 'high' is not a whole number" in problem.reason


def test_the_shapes_later_slurm_versions_write_are_read_alike():
    """From 23.02 states are lists and numbers `{set, infinite, number}`; from 24.05 the nodes
    are `job_resources.nodes.allocation[].name`."""
    old = squeue_job(3, gres=("gpu:2(IDX:0-1)", "gpu:1(IDX:7)"), nodes=("a", "b"))
    new = {
        **old,
        "job_state": ["RUNNING", "POWER_UP_NODE"],
        "start_time": {"set": True, "infinite": False, "number": old["start_time"]},
        "end_time": {"set": True, "infinite": False, "number": old["end_time"]},
        "time_limit": {"set": True, "infinite": False, "number": 60},
        "job_resources": {"nodes": {"allocation": [{"name": "a"}, {"name": "b"}]}},
    }
    unlimited = {**new, "job_id": 4, "time_limit": {"set": True, "infinite": True, "number": 0}}
    pending = {**new, "job_id": 5, "job_state": ["PENDING"]}
    one, two, forever = parse_squeue(ScriptedSqueue.document([old, new, unlimited, pending])).jobs
    assert (one.placement, one.start, one.end) == (two.placement, two.start, two.end)
    assert [(p.node, p.gpus) for p in two.placement] == [("a", (0, 1)), ("b", (7,))]
    assert forever.end is None


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("squeue: error: invalid option", "not JSON"),
        ('{"jobs": 3}', "without a 'jobs' list"),
        ('{"jobs": [], "errors": [{"error": "Unable to contact slurm controller"}]}', "errors"),
    ],
)
def test_an_answer_that_is_not_squeues_is_an_error(text, words):
    with pytest.raises(JobSourceError, match=words):
        parse_squeue(text)


def test_an_entry_missing_its_fields_is_a_problem_of_that_job_only():
    broken = squeue_job(5)
    del broken["job_resources"]
    reading = parse_squeue(ScriptedSqueue.document([broken, squeue_job(6)]))
    assert [j.id for j in reading.jobs] == ["6"]
    assert reading.problems[0].id == "5"
    assert "lacks 'job_resources'" in reading.problems[0].reason


@pytest.mark.parametrize(
    ("text", "tags"),
    [
        ("flexgate:tier=2,pfi=1.8", (2, 1.8)),
        ("run 3 flexgate:pfi=1.2", (None, 1.2)),
        ("flexgate:tier=0;", (0, None)),
        ("no tag here", (None, None)),
        (None, (None, None)),
    ],
)
def test_tags(text, tags):
    assert parse_tags(text) == tags


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("flexgate:tier=-1", "not a whole number"),
        ("flexgate:pfi=fast", "not a number"),
        ("flexgate:pfi=nan", "not a finite number"),
        ("flexgate:priority=3", "expected tier=N and/or pfi=X"),
        ("flexgate:", "expected tier=N"),
    ],
)
def test_bad_tags_are_refused_naming_the_problem(text, words):
    with pytest.raises(TagError, match=words):
        parse_tags(text)


def test_changes_between_two_looks():
    first = parse_squeue(ScriptedSqueue.document([squeue_job(1), squeue_job(2)]))
    second = parse_squeue(
        ScriptedSqueue.document([squeue_job(2, comment="flexgate:tier=3"), squeue_job(3)])
    )
    found = changes({j.id: j for j in first.jobs}, {j.id: j for j in second.jobs})
    assert (found.started, found.ended, found.changed) == (("3",), ("1",), ("2",))
    assert not changes({j.id: j for j in first.jobs}, {j.id: j for j in first.jobs})


# --- a gateway that follows the source ---------------------------------------------------


@pytest.fixture
def squeue(tmp_path):
    return ScriptedSqueue(tmp_path / "slurm-bin")


def test_the_job_mix_follows_the_source_with_tiers_and_who_runs_what(tmp_path, squeue):
    squeue.answer_jobs([squeue_job(41, comment="flexgate:tier=3,pfi=1.5")])
    with following_site(tmp_path, slurm_bin_dir=str(squeue.folder)) as site:
        jobs = site.wait_jobs({"41"})
        assert jobs["41"]["tier"] == 3
        assert jobs["41"]["pfi"] == 1.5
        assert jobs["41"]["placement"] == [{"node": "node-01", "gpus": [0, 1, 2, 3]}]
        assert 59 * 60 < jobs["41"]["remaining_s"] <= 60 * 60
        doc = site.api.get("/v1/jobs").json()
        assert doc["bounds"] == [
            {"id": "41", "tier": 3, "min_throughput_fraction": 0.5, "protected": False}
        ]
        assert [t["min_throughput_fraction"] for t in doc["tiers"]] == [1.0, 0.9, 0.75, 0.5]
        assert doc["source"]["kind"] == "slurm"
        assert doc["source"]["fault"] is None
        (info,) = doc["source"]["jobs"]
        assert (info["user"], info["account"]) == ("alice", "ml")
        # A job that names no tier gets the site's default tier (1: 10 % slowdown).
        squeue.answer_jobs(
            [
                squeue_job(41, comment="flexgate:tier=3,pfi=1.5"),
                squeue_job(42, gres=("gpu:4(IDX:4-7)",)),
            ]
        )
        assert site.wait_jobs({"41", "42"})["42"]["tier"] == 1
        last = site.api.get("/v1/jobs").json()["source"]["last_changes"]
        assert (last["started"], last["ended"], last["changed"]) == (["42"], [], [])
        # The API does not edit a mix a scheduler owns; it says where to change it.
        refused = site.api.put("/v1/jobs", headers=API, json={"jobs": []})
        assert refused.status_code == 409
        assert "FLEXGATE_JOB_SOURCE=slurm" in refused.json()["detail"]
        assert site.api.delete("/v1/jobs/41", headers=API).status_code == 409
        assert set(site.jobs()) == {"41", "42"}
        assert site.api.post("/v1/jobs/refresh").status_code == 401


def test_an_event_is_replanned_when_a_job_starts_and_when_one_ends(tmp_path, squeue):
    squeue.answer_jobs([squeue_job(1, gres=("gpu:4(IDX:0-3)",), comment="flexgate:tier=3")])
    with following_site(tmp_path, slurm_bin_dir=str(squeue.folder)) as site:
        site.wait_jobs({"1"})
        event = site.start_event(reduction_kw=2.0)
        first = site.plan(event)
        assert [j["id"] for j in first["jobs"]] == ["1"]
        assert first["jobs"][0]["tier"] == 3
        assert first["jobs"][0]["min_throughput_fraction"] == 0.5
        wait_for(lambda: max(site.limits("node-01")[:4]) < 700, "job 1's GPUs capped")
        # Job 2 starts on the other four GPUs: the event is re-planned to take it in.
        squeue.answer_jobs(
            [
                squeue_job(1, gres=("gpu:4(IDX:0-3)",), comment="flexgate:tier=3"),
                squeue_job(2, gres=("gpu:4(IDX:4-7)",), comment="flexgate:tier=3"),
            ]
        )
        second = site.plan(event, other_than=first["id"])
        assert sorted(j["id"] for j in second["jobs"]) == ["1", "2"]
        caps = {c["node"]: c["caps"] for c in second["commands"]}
        assert {c["gpu"] for c in caps["node-01"]} == set(range(8))
        # Job 1 ends: re-planned without it, and its GPUs get their original limit back.
        squeue.answer_jobs([squeue_job(2, gres=("gpu:4(IDX:4-7)",), comment="flexgate:tier=3")])
        third = site.plan(event, other_than=second["id"])
        assert [j["id"] for j in third["jobs"]] == ["2"]
        assert {c["gpu"] for c in third["commands"][0]["caps"]} == {4, 5, 6, 7}
        wait_for(lambda: site.limits("node-01")[:4] == [700.0] * 4, "job 1's GPUs restored")
        assert max(site.limits("node-01")[4:]) < 700


def test_a_source_that_fails_keeps_the_last_good_mix_and_goes_stale(tmp_path, squeue):
    squeue.answer_jobs([squeue_job(1)])
    with following_site(tmp_path, slurm_bin_dir=str(squeue.folder), job_source_stale_s=1.5) as site:
        site.wait_jobs({"1"})
        for breaks, words in (
            (lambda: squeue.answer_text("<html>502 Bad Gateway</html>"), "not JSON"),
            (lambda: squeue.fail("squeue: error: Unable to contact slurm controller"), "exit 1"),
            (lambda: squeue.delay(5), "gave no answer within 2 s"),
        ):
            breaks()
            health = wait_for(
                lambda w=words: (
                    h
                    if w in ((h := site.api.get("/health").json())["job_source"]["fault"] or "")
                    else None
                ),
                f"the fault '{words}' in /health",
            )
            assert health["status"] == "degraded"
            assert any("planning on its last good view" in r for r in health["degraded"])
            assert set(site.jobs()) == {"1"}  # the last good view holds
        wait_for(lambda: site.api.get("/health").json()["job_source"]["stale"], "stale")
        health = site.api.get("/health").json()
        assert any("the job mix is stale" in r for r in health["degraded"])
        metrics = samples(site.api.get("/metrics").text)
        assert metrics["flexgate_job_source_stale"] == 1
        assert metrics["flexgate_job_source_fault"] == 1
        assert metrics["flexgate_job_source_failures_total"] >= 3
        # The controller answers again: fresh, and the mix follows it.
        squeue.answer_jobs([squeue_job(2)])
        site.wait_jobs({"2"}, seconds=20)
        health = wait_for(
            lambda: h if (h := site.api.get("/health").json())["status"] == "ok" else None,
            "health ok again",
        )
        assert health["job_source"]["stale"] is False
        assert health["job_source"]["fault"] is None


def test_bad_jobs_are_reported_and_left_out_and_a_known_one_keeps_its_last_entry(tmp_path, squeue):
    good = squeue_job(1, comment="flexgate:tier=2")
    squeue.answer_jobs([good])
    with following_site(tmp_path, slurm_bin_dir=str(squeue.folder)) as site:
        site.wait_jobs({"1"})
        squeue.answer_jobs(
            [
                squeue_job(1, comment="flexgate:tier=two"),  # was good: keeps its entry
                squeue_job(2, nodes=("node-99",), gres=("gpu:2(IDX:0-1)",)),
                squeue_job(3, gres=("gpu:4(IDX:4-7)",), comment="flexgate:tier=9"),
                squeue_job(4, gres=("gpu:2(IDX:4-5)",), comment="flexgate:pfi=1.3"),
                squeue_job(5, gres=("gpu:0(IDX:)",)),
            ]
        )
        site.wait_jobs({"1", "4"})
        assert site.jobs()["1"]["tier"] == 2
        problems = wait_for(
            lambda: (
                p if len(p := site.api.get("/v1/jobs").json()["source"]["problems"]) == 4 else None
            ),
            "four problems reported",
        )
        text = " | ".join(problems)
        assert "job '1': its comment: the tier 'two' is not a whole number" in text
        assert "job '2': placed on node(s) node-99 that no agent reports" in text
        assert "job '3': job '3': 'tier' must be a whole number from 0 to 3, got 9" in text
        assert "job '5'" in text
        health = site.api.get("/health").json()
        assert health["status"] == "degraded"
        assert any("4 job(s) left out" in r for r in health["degraded"])
        assert samples(site.api.get("/metrics").text)["flexgate_job_source_jobs_left_out"] == 4
        # Jobs that would share a GPU: the whole view is refused, the last good one kept.
        squeue.answer_jobs([squeue_job(1), squeue_job(6, gres=("gpu:1(IDX:0)",))])
        wait_for(
            lambda: (
                "both placed on node 'node-01'"
                in (site.api.get("/health").json()["job_source"]["fault"] or "")
            ),
            "the clash reported",
        )
        assert set(site.jobs()) == {"1", "4"}


def test_the_static_mix_has_no_source_to_refresh(tmp_path):
    with following_site(tmp_path, job_source="static") as site:
        answer = site.api.post("/v1/jobs/refresh", headers=API)
        assert answer.status_code == 409
        assert "static" in answer.json()["detail"]
        doc = site.api.get("/v1/jobs").json()
        assert doc["source"] is None
        assert doc["jobs"] == []
        assert site.api.get("/health").json()["job_source"] is None
        assert "flexgate_job_source" not in site.api.get("/metrics").text


def test_the_time_left_follows_an_extended_limit_without_a_replan(tmp_path, squeue):
    squeue.answer_jobs([squeue_job(1, time_limit=60)])
    with following_site(tmp_path, slurm_bin_dir=str(squeue.folder)) as site:
        assert site.wait_jobs({"1"})["1"]["remaining_s"] <= 3600
        event = site.start_event(reduction_kw=0.5)
        plan_id = site.plan(event)["id"]
        squeue.answer_jobs([squeue_job(1, time_limit=600)])  # scontrol update TimeLimit=600
        wait_for(lambda: site.jobs()["1"]["remaining_s"] > 590 * 60, "the longer time left")
        assert site.api.get(f"/v1/events/{event}").json()["plan_id"] == plan_id
        assert site.api.get("/v1/jobs").json()["source"]["last_changes"]["started"] == ["1"]


def test_a_static_mix_takes_tiers_read_as_the_site_defines_them(tmp_path):
    placed = {"node": "node-01", "gpus": [0, 1, 2, 3]}
    job = {"id": "a", "gpus": 4, "power_w": 600.0, "throughput": 4000.0, "placement": [placed]}
    with following_site(
        tmp_path, job_source="static", tiers="0,0.2", tier_slowdown_means="duration"
    ) as site:
        assert site.api.put("/v1/jobs", headers=API, json={"jobs": [{**job, "tier": 1}]}).is_success
        doc = site.api.get("/v1/jobs").json()
        (bounds,) = doc["bounds"]
        assert bounds["min_throughput_fraction"] == pytest.approx(1 / 1.2)
        assert [t["slowdown"] for t in doc["tiers"]] == [0.0, 0.2]
        refused = site.api.put("/v1/jobs", headers=API, json={"jobs": [{**job, "tier": 2}]})
        assert refused.status_code == 422
        assert "job 'a': 'tier' must be a whole number from 0 to 1, got 2" in refused.text
        assert site.jobs()["a"]["tier"] == 1  # nothing changed


def test_the_slurm_source_audits_who_started_and_ended_jobs(tmp_path, squeue):
    squeue.answer_jobs([squeue_job(1, user="bob", account="vision")])
    with following_site(tmp_path, slurm_bin_dir=str(squeue.folder)) as site:
        site.wait_jobs({"1"})
        squeue.answer_jobs([])
        site.wait_jobs(set())
    store = Store(f"sqlite:///{tmp_path / 'gateway.db'}")
    try:
        with store.session() as s:
            rows = [(r.actor, r.action, r.detail) for r in s.exec(select(AuditRow)).all()]
    finally:
        store.close()
    entry = {"id": "1", "gpus": 4, "user": "bob", "account": "vision"}
    assert ("jobsource:slurm", "jobsource.start", entry) in rows
    assert ("jobsource:slurm", "jobsource.end", entry) in rows


def test_a_restarted_gateway_keeps_the_last_good_mix_while_the_source_is_down(tmp_path, squeue):
    squeue.answer_jobs(
        [squeue_job(1, comment="flexgate:tier=3"), squeue_job(2, gres=("gpu:2(IDX:6-7)",))]
    )
    with following_site(tmp_path, slurm_bin_dir=str(squeue.folder)) as site:
        before = site.wait_jobs({"1", "2"})
    squeue.fail("squeue: error: Unable to contact slurm controller")
    with following_site(tmp_path, slurm_bin_dir=str(squeue.folder)) as site:
        wait_for(lambda: site.api.get("/health").json()["job_source"]["fault"], "the failure shown")
        assert site.jobs() == before  # from the store, as last read
        # Back, with job 1's tag now unreadable: it keeps the entry stored before the restart.
        squeue.answer_jobs(
            [squeue_job(1, comment="flexgate:tier=x"), squeue_job(3, gres=("gpu:1(IDX:5)",))]
        )
        after = site.wait_jobs({"1", "3"})
        assert after["1"] == before["1"]
