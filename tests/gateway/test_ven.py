"""The VEN against openleadr's own VTN on loopback: an event becomes caps, a cancellation
restores, a signal flexgate does not follow is an opt-out with its reason; the usage report,
and the settlement report under the program's baseline rule."""

import asyncio
import threading
import time
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from openleadr import OpenADRServer, hooks

from flexgate.serve import free_port
from gateway.store import repo
from gateway.store.db import Store
from gateway.store.models import epoch_ms
from tests.gateway.conftest import API, Outbound, running_site

VEN_ID = "ven-flexgate"


class Vtn:
    """openleadr's VTN in a thread of its own, asking VENs to poll every second. It asks a VEN
    it does not know to re-register (`ven_lookup`), as a VTN that lost its state would."""

    def __init__(self, port: int | None = None) -> None:
        self.port = port or free_port()
        self.loop = asyncio.new_event_loop()
        self.answers: dict[str, str] = {}
        self.reports: dict[str, list[float]] = {}  #: TELEMETRY_USAGE values by resource
        self.readings: dict[str, list[tuple[datetime, float]]] = {}  #: the same, timed
        self.server = OpenADRServer(
            vtn_id="TEST_VTN",
            http_host="127.0.0.1",
            http_port=self.port,
            requested_poll_freq=timedelta(seconds=1),
            show_fingerprint=False,
            ven_lookup=self.lookup,
        )
        self.registrations = 0
        self.server.add_handler("on_create_party_registration", self.register)
        self.server.add_handler("on_register_report", self.register_report)
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.url = f"http://127.0.0.1:{self.port}/OpenADR2/Simple/2.0b"

    async def register(self, registration_info):
        self.registrations += 1
        return VEN_ID, f"reg-{self.registrations}"

    def lookup(self, ven_id):
        known = ven_id == VEN_ID and self.registrations > 0
        return {"ven_id": ven_id, "registration_id": f"reg-{self.registrations}"} if known else {}

    async def register_report(
        self,
        ven_id,
        resource_id,
        measurement,
        unit,
        scale,
        min_sampling_interval,
        max_sampling_interval,
    ):
        """Ask for every usage value at a 1 s granularity (openleadr's compact handler)."""
        self.reports[resource_id] = []

        def received(values):
            self.reports[resource_id] += [value for _, value in values]
            self.readings.setdefault(resource_id, []).extend(values)

        self.units = (unit, scale)
        return received, max(min_sampling_interval, timedelta(seconds=1))

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_until_complete(self.server.run())
        self.loop.run_forever()

    def add_event(self, signal_name, signal_type, value, start, seconds):
        done = threading.Event()
        box = {}

        def add():
            box["id"] = self.server.add_event(
                ven_id=VEN_ID,
                signal_name=signal_name,
                signal_type=signal_type,
                intervals=[
                    {
                        "dtstart": start,
                        "duration": timedelta(seconds=seconds),
                        "signal_payload": value,
                    }
                ],
                callback=lambda ven_id, event_id, opt_type: self.answers.__setitem__(
                    event_id, opt_type
                ),
            )
            done.set()

        self.loop.call_soon_threadsafe(add)
        done.wait(5)
        return box["id"]

    def forget(self, event_id):
        """Drop the event from what the VTN distributes, without cancelling it (implied)."""

        def drop():
            events = self.server.events[VEN_ID]
            events[:] = [e for e in events if e.event_descriptor.event_id != event_id]
            self.server.events_updated[VEN_ID] = True

        self.loop.call_soon_threadsafe(drop)

    def cancel(self, event_id):
        self.loop.call_soon_threadsafe(self.server.cancel_event, VEN_ID, event_id)

    def __enter__(self) -> "Vtn":
        self.thread.start()
        return self

    def __exit__(self, *_exc) -> None:
        self.stop()

    def stop(self) -> None:
        if self.loop.is_closed():
            return
        future = asyncio.run_coroutine_threadsafe(self.server.stop(), self.loop)
        future.result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


@pytest.fixture
def database_url(tmp_path):
    return f"sqlite:///{tmp_path / 'gateway.db'}"


def ven_site(tmp_path, database_url, vtn_url: str, http_trace=(), **changes):
    """A site whose VEN talks to `vtn_url` (openleadr's test VTN has no certificate)."""
    return running_site(
        tmp_path,
        database_url,
        http_trace,
        vtn_url=vtn_url,
        vtn_allow_unsigned=True,
        recovery_ramp_s=0.2,
        recovery_steps=1,
        ven_name="flexgate-test",
        **changes,
    )


@pytest.fixture
def vtn_site(tmp_path, database_url):
    with Vtn() as vtn, ven_site(tmp_path, database_url, vtn.url) as site:
        site.wait(
            lambda: site.api.get("/health").json()["ven"] == "registered",
            what="the VEN's registration",
        )
        yield site, vtn


def test_an_openadr_event_becomes_caps_and_a_cancellation_restores(vtn_site):
    site, vtn = vtn_site
    start = datetime.now(UTC) + timedelta(seconds=2)
    event_id = vtn.add_event("simple", "level", 2.0, start, 60)
    stored = site.wait(
        lambda: (r := site.api.get(f"/v1/events/oadr-{event_id}")).status_code == 200 and r.json(),
        what="the event reaching the gateway",
    )
    assert stored["source"] == "openadr"
    assert stored["opt"] == "in"
    baseline = site.api.get("/v1/site").json()["baseline_facility_kw"]
    # SIMPLE level 2: 25%; /v1/site shows kW to 1 W
    assert stored["reduction_kw"] == pytest.approx(0.25 * baseline, abs=1e-3)
    site.wait(lambda: vtn.answers.get(event_id) == "optIn", what="the VTN hearing optIn")
    site.wait(lambda: any(w < 700 for ws in site.limits().values() for w in ws), what="caps")
    assert site.api.get(f"/v1/events/oadr-{event_id}").json()["status"] == "active"
    vtn.cancel(event_id)
    site.wait(
        lambda: site.api.get(f"/v1/events/oadr-{event_id}").json()["status"] == "cancelled",
        what="the cancellation",
    )
    site.wait(
        lambda: all(w == 700.0 for ws in site.limits().values() for w in ws), what="the restore"
    )


def test_a_signal_flexgate_does_not_follow_is_an_opt_out_with_its_reason(vtn_site):
    site, vtn = vtn_site
    event_id = vtn.add_event(
        "ELECTRICITY_PRICE", "price", 0.3, datetime.now(UTC) + timedelta(seconds=2), 60
    )
    site.wait(lambda: vtn.answers.get(event_id) == "optOut", what="the VTN hearing optOut")
    stored = site.api.get(f"/v1/events/oadr-{event_id}").json()
    assert stored["status"] == "opted_out"
    assert "not a signal flexgate acts on" in stored["reason"]
    assert all(w == 700.0 for ws in site.limits().values() for w in ws)


def test_an_event_the_vtn_stops_listing_is_cancelled_and_restored(vtn_site):
    site, vtn = vtn_site
    kept = vtn.add_event("simple", "level", 1.0, datetime.now(UTC) + timedelta(seconds=600), 60)
    event_id = vtn.add_event("simple", "level", 2.0, datetime.now(UTC) + timedelta(seconds=2), 60)
    site.wait(lambda: vtn.answers.get(event_id) == "optIn", what="the VTN hearing optIn")
    site.wait(lambda: any(w < 700 for ws in site.limits().values() for w in ws), what="caps")
    vtn.forget(event_id)
    site.wait(
        lambda: site.api.get(f"/v1/events/oadr-{event_id}").json()["status"] == "cancelled",
        what="the implied cancellation",
    )
    site.wait(
        lambda: all(w == 700.0 for ws in site.limits().values() for w in ws), what="the restore"
    )
    assert site.api.get(f"/v1/events/oadr-{kept}").json()["status"] == "pending"


def test_the_ven_reports_site_usage_at_the_vtns_granularity(vtn_site):
    site, vtn = vtn_site
    site.wait(
        lambda: all(len(vtn.reports.get(r, [])) >= 3 for r in ("facility_kw", "gpu_kw", "shed_kw")),
        what="three TELEMETRY_USAGE reports of each value",
    )
    assert vtn.units == ("W", "k")
    now = site.api.get("/v1/site").json()
    facility, gpu = vtn.reports["facility_kw"][-1], vtn.reports["gpu_kw"][-1]
    # Two instants of a site whose multi-node jobs swing together (one job, one phase): the
    # same power to within those swings.
    assert facility == pytest.approx(now["facility_power_kw"], rel=0.1)
    assert facility == pytest.approx(now["overhead_factor"] * gpu, rel=1e-3)
    # No event: what is shed is the swing's own, the uncapped baseline less the same report's
    # facility power.
    shed = vtn.reports["shed_kw"][-1]
    assert shed == pytest.approx(now["baseline_facility_kw"] - facility, abs=0.02 * facility)


def test_cancelling_an_openadr_event_on_the_site_restores_and_tells_the_vtn(vtn_site):
    site, vtn = vtn_site
    event_id = vtn.add_event("simple", "level", 2.0, datetime.now(UTC) + timedelta(seconds=1), 60)
    site.wait(lambda: vtn.answers.get(event_id) == "optIn", what="the VTN hearing optIn")
    site.wait(lambda: any(w < 700 for ws in site.limits().values() for w in ws), what="caps")
    heard: list[str] = []

    async def created(message_type, payload):  # openleadr hands the first answer only
        if message_type == "oadrCreatedEvent":
            heard.extend(r["opt_type"] for r in payload["event_responses"])

    hooks.register("before_handle", created)
    try:
        answer = site.api.delete(f"/v1/events/oadr-{event_id}", headers=API)
        assert answer.status_code == 200, answer.text
        assert answer.json()["status"] == "cancelled"
        assert answer.json()["opt"] == "out"
        site.wait(lambda: "optOut" in heard, what="the VTN hearing optOut")
    finally:
        hooks.HOOKS["before_handle"].remove(created)
    site.wait(
        lambda: all(w == 700.0 for ws in site.limits().values() for w in ws), what="the restore"
    )


def test_a_vtn_that_is_down_is_retried_and_stored_events_run_without_it(
    tmp_path, database_url, recovery
):
    """The VTN is unreachable when the gateway starts; the VEN keeps trying and registers when
    it comes up. Once an event is stored, the VTN going away again changes nothing: the event
    starts, caps are set, and it ends and restores on time."""
    port = free_port()
    url = f"http://127.0.0.1:{port}/OpenADR2/Simple/2.0b"
    with ven_site(tmp_path, database_url, url) as site:
        api = site.api
        time.sleep(2.0)  # a few failed attempts
        assert api.get("/health").json()["ven"] == "registering"
        with Vtn(port) as vtn:  # the VTN goes away with the event stored
            up = time.monotonic()
            site.wait(
                lambda: api.get("/health").json()["ven"] == "registered",
                seconds=30,
                what="registration once the VTN is up",
            )
            recovery("VTN down at start: VEN registered after it came up", time.monotonic() - up)
            event_id = vtn.add_event(
                "simple", "level", 2.0, datetime.now(UTC) + timedelta(seconds=3), 4
            )
            site.wait(lambda: vtn.answers.get(event_id) == "optIn", what="optIn")
        site.wait(lambda: any(w < 700 for ws in site.limits().values() for w in ws), what="caps")
        site.wait(
            lambda: api.get(f"/v1/events/oadr-{event_id}").json()["status"] == "completed",
            what="the event's end",
        )
        site.wait(
            lambda: all(w == 700.0 for ws in site.limits().values() for w in ws),
            what="the restore",
        )


def test_a_restarted_vtn_asks_for_reregistration_and_gets_it(tmp_path, database_url, recovery):
    """The VTN goes away and comes back without its state: at the first poll it answers
    oadrRequestReregistration, the VEN registers again, and the next event is acted on."""
    with Vtn() as first, ven_site(tmp_path, database_url, first.url) as site:
        site.wait(lambda: first.registrations == 1, what="the first registration")
        first.stop()
        time.sleep(2.0)  # polls fail meanwhile
        with Vtn(first.port) as vtn:  # knows no VEN
            back = time.monotonic()
            site.wait(lambda: vtn.registrations == 1, what="the re-registration")
            recovery("VTN restarted without state: VEN registered again", time.monotonic() - back)
            event_id = vtn.add_event("simple", "level", 2.0, datetime.now(UTC), 30)
            site.wait(lambda: vtn.answers.get(event_id) == "optIn", what="optIn")
            site.wait(
                lambda: any(w < 700 for ws in site.limits().values() for w in ws), what="caps"
            )


def test_the_ven_calls_only_the_vtn(tmp_path, database_url):
    """Every outbound request of a whole OpenADR session (registration, polls, the event's
    answer, reports) goes to the VTN, or to a configured agent, and nowhere else."""
    outbound = Outbound()
    outbound_urls = outbound.urls
    with Vtn() as vtn, ven_site(tmp_path, database_url, vtn.url, [outbound.trace]) as site:
        event_id = vtn.add_event("simple", "level", 2.0, datetime.now(UTC), 2)
        site.wait(lambda: vtn.answers.get(event_id) == "optIn", what="optIn")
        site.wait(lambda: any(vtn.reports.values()), what="a report")
        site.wait(
            lambda: site.api.get(f"/v1/events/oadr-{event_id}").json()["status"] == "completed",
            what="the event's end",
        )
        allowed = [vtn.url, *site.settings.agent_urls]
    to_vtn = [url for url in outbound_urls if url.startswith(f"{vtn.url}/")]
    assert to_vtn, "no request to the VTN was seen: the check would prove nothing"
    assert all(any(url.startswith(f"{a}/") for a in allowed) for url in outbound_urls), (
        outbound_urls
    )


def test_a_setpoint_is_a_level_held_as_the_job_mix_changes(vtn_site):
    """A LOAD_DISPATCH setpoint that arrives before the jobs are declared still sheds once
    they are: the target is the facility level, re-evaluated when the mix changes."""
    site, vtn = vtn_site
    jobs = site.api.get("/v1/jobs").json()["jobs"]
    baseline = site.api.get("/v1/site").json()["baseline_facility_kw"]
    assert site.api.put("/v1/jobs", json={"jobs": []}, headers=API).status_code == 200
    level_kw = baseline - 5.0
    event_id = vtn.add_event(
        "LOAD_DISPATCH", "setpoint", level_kw, datetime.now(UTC) + timedelta(seconds=1), 60
    )
    site.wait(lambda: vtn.answers.get(event_id) == "optIn", what="the VTN hearing optIn")
    site.wait(
        lambda: site.api.get(f"/v1/events/oadr-{event_id}").json()["status"] == "active",
        what="the event's start",
    )
    assert all(w == 700.0 for ws in site.limits().values() for w in ws)  # nothing to cap yet
    assert site.api.put("/v1/jobs", json={"jobs": jobs}, headers=API).status_code == 200
    event = site.api.get(f"/v1/events/oadr-{event_id}").json()
    assert event["reduction_kw"] == pytest.approx(5.0, abs=1e-3)  # /v1/site is to 1 W
    plan = site.acked_plan(event["plan_id"])
    assert plan["requested_facility_kw"] == pytest.approx(5.0, abs=1e-3)
    assert any(w < 700 for ws in site.limits().values() for w in ws)


def test_the_site_opts_out_when_the_firm_kw_of_jobs_it_can_cap_falls_short(vtn_site):
    """Most of the site's power on a node that does not answer: the baseline counts it, but
    the site cannot cap it, so an event at 40% of the baseline is beyond its firm kW."""
    site, vtn = vtn_site
    jobs = site.api.get("/v1/jobs").json()["jobs"]
    for job in jobs[1:]:
        for where in job["placement"]:
            where["node"] = where["node"].replace("node-0", "silent-")
    assert site.api.put("/v1/jobs", json={"jobs": jobs}, headers=API).status_code == 200
    event_id = vtn.add_event("simple", "level", 3.0, datetime.now(UTC) + timedelta(seconds=5), 60)
    site.wait(lambda: vtn.answers.get(event_id) == "optOut", what="the VTN hearing optOut")
    stored = site.api.get(f"/v1/events/oadr-{event_id}").json()
    assert stored["status"] == "opted_out"
    assert "the site can promise" in stored["reason"]
    assert "which does not answer" in stored["reason"]


def on_the_minute(now: datetime) -> datetime:
    """The start of a one-minute event on the minute with at least 15 s of it to come: this
    minute (acted on late), else the next."""
    this = now.replace(second=0, microsecond=0)
    left_s = (this + timedelta(minutes=1) - now).total_seconds()
    return this if left_s >= 15 else this + timedelta(minutes=1)


def midday_zone(now: datetime) -> str:
    """A fixed-offset zone whose clock reads about noon now: the rule's hours before the
    event fall on the same local day whenever the test runs."""
    hours = 12 - now.hour
    return "Etc/GMT" if hours == 0 else f"Etc/GMT{'-' if hours > 0 else '+'}{abs(hours)}"


def write_flat_history(database_url: str, since: datetime, until: datetime, kw: float) -> None:
    """One-minute intervals of `kw` over [since, until), metered, as the history rolls them up."""
    store = Store(database_url)
    begins, ends = epoch_ms(since), epoch_ms(until)
    rows = [
        {
            "length_s": 60,
            "start_ms": at_ms,
            "mean_kw": kw,
            "samples": 12,
            "coverage": 1.0,
            "gap": False,
            "estimated_share": 0.0,
            "estimated": False,
            "fault": False,
        }
        for at_ms in range(begins, ends, 60_000)
    ]
    try:
        with store.session() as s:
            repo.replace_meter_intervals(s, length_s=60, start_ms=begins, end_ms=ends, rows=rows)
            s.commit()
    finally:
        store.close()


def test_the_ven_reports_an_events_baseline_and_metered_usage_under_the_programs_rule(
    tmp_path, database_url
):
    """FLEXGATE_REPORT_BASELINE matchday-3, one-minute settlement intervals: fifteen days of
    100 kW before the gateway starts, so the three days matched average 100 kW. An event of
    one minute on the minute: its interval's baseline (100 kW), metered load and delta reach
    the VTN once each, at the interval's start, as `GET .../settlement` serves them. The test
    waits for the minute to close."""
    now = datetime.now(UTC)
    zone = midday_zone(now)
    first_day = now.astimezone(ZoneInfo(zone)).date() - timedelta(days=15)
    since = datetime.combine(first_day, datetime.min.time(), tzinfo=ZoneInfo(zone))
    write_flat_history(database_url, since, now.replace(second=0, microsecond=0), 100.0)
    options = {
        "report_baseline": "matchday-3",
        "settlement_interval_min": 1,
        "site_timezone": zone,
    }
    with Vtn() as vtn, ven_site(tmp_path, database_url, vtn.url, **options) as site:
        site.wait(
            lambda: site.api.get("/health").json()["ven"] == "registered",
            what="the VEN's registration",
        )
        start = on_the_minute(datetime.now(UTC))
        event_id = vtn.add_event("simple", "level", 1.0, start, 60)
        site.wait(lambda: vtn.answers.get(event_id) == "optIn", what="the VTN hearing optIn")
        settled = ("baseline_kw", "usage_kw", "delta_kw")
        site.wait(
            lambda: all(vtn.readings.get(r) for r in settled),
            seconds=150,
            what="the settlement report",
        )
        served = site.api.get(
            f"/v1/events/oadr-{event_id}/settlement", params={"rules": "matchday-3"}
        ).json()
        # Reports go on every second: the interval is not sent again.
        site.wait(lambda: len(vtn.reports["facility_kw"]) > 3, what="three more usage reports")
    [row] = served["rules"][0]["intervals"]
    assert datetime.fromisoformat(row["start"]) == start
    assert row["baseline_kw"] == 100.0
    assert vtn.readings["baseline_kw"] == [(start, 100.0)]
    assert vtn.readings["usage_kw"] == [(start, pytest.approx(row["metered_kw"], abs=1e-3))]
    assert vtn.readings["delta_kw"] == [(start, pytest.approx(-row["delivered_kw"], abs=1e-3))]
