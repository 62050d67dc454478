"""The meter history (issue 38, item 1): the site's samples kept raw and rolled up into 1-,
5-, 15- and 30-minute intervals in the store, with gaps, estimates and meter faults marked,
pruned on time, served by `GET /v1/site/meter`, and nothing lost across a clean restart.

Times run on a `SteppedClock`; the means below are worked out by hand."""

from __future__ import annotations

import asyncio
import contextlib
from datetime import UTC, datetime, timedelta

import httpx
import pytest
from pydantic import ValidationError

from agents.service import AgentNode
from agents.simulated import SimulatedBackend
from flexgate.serve import ServerThread
from flexmodel.jobmix import parse_job_mix
from gateway.agentclient.memory import InMemoryAgentClient
from gateway.app import create_app
from gateway.clock import SteppedClock
from gateway.services.fleet import Fleet
from gateway.services.jobbook import JobBook
from gateway.services.meterhistory import MeterHistory
from gateway.services.overhead import Overhead
from gateway.services.site import SitePower, open_feed
from gateway.settings import GatewaySettings
from gateway.store import repo
from gateway.store.db import Store
from tests.conftest import wait_for
from tests.gateway.conftest import AGENT_TOKEN, API, API_TOKEN, site_jobs, start_site
from tests.gateway.test_meter import JsonServer

T0 = datetime(2026, 3, 1, tzinfo=UTC)


def settings_for(database_url: str, **changes) -> GatewaySettings:
    return GatewaySettings(
        database_url=database_url, api_token=API_TOKEN, agent_token=AGENT_TOKEN, **changes
    )


def intervals(store: Store, start: datetime, minutes: int, length_s: int) -> list:
    with store.session() as s:
        return repo.meter_intervals(
            s, start=start, end=start + timedelta(minutes=minutes), length_s=length_s
        )


def samples(store: Store, start: datetime, end: datetime) -> list:
    with store.session() as s:
        return repo.meter_samples(s, start=start, end=end)


def test_intervals_are_the_means_of_their_samples_with_gaps_and_estimates_marked(database_url):
    """A 10 s meter: six samples a minute. Minute 0 whole; minute 1 three samples, written in
    two batches; minute 2 none; minute 3 whole, one sample estimated; minute 4 five samples,
    one taken while the meter faulted."""
    clock = SteppedClock(T0)
    store = Store(database_url)
    history = MeterHistory(settings_for(database_url, meter_period_s=10), store, clock)
    script = {
        0: (100, 110, 120, 130, 140, 150),
        60: (200, 210, None, None, None, None),
        120: (None,) * 6,
        180: (300, 300, 330, 300, 300, 300),
        240: (400, 400, 400, 400, 460, None),
    }
    marks = {200: (True, False), 280: (True, True)}  # (estimated, fault)

    async def scenario():
        for minute_s, kws in script.items():
            for i, kw in enumerate(kws):
                at_s = minute_s + 10 * i
                clock.step(at_s - clock.monotonic())
                if kw is not None:
                    estimated, fault = marks.get(at_s, (False, False))
                    history.record(at=clock.now(), kw=kw, estimated=estimated, fault=fault)
                if at_s == 70:  # a write inside minute 1, before its third sample
                    clock.step(5)
                    await history.flush()
                    assert [i.samples for i in intervals(store, T0, 2, 60)] == [6, 0]
                    history.record(at=clock.now(), kw=230, estimated=False, fault=False)
        clock.step(300 - clock.monotonic())
        await history.flush()
        five_minutes = intervals(store, T0, 5, 60), intervals(store, T0, 5, 300)
        not_closed = intervals(store, T0, 15, 900)
        clock.step(1800 - clock.monotonic())
        await history.flush()
        return (
            five_minutes,
            not_closed,
            intervals(store, T0, 30, 900),
            intervals(store, T0, 30, 1800),
        )

    try:
        (minutes, five), not_closed, quarters, half = asyncio.run(scenario())
    finally:
        store.close()
    got = [
        (i.mean_kw, i.samples, i.coverage, i.gap, i.estimated_share, i.estimated, i.fault)
        for i in minutes
    ]
    assert got == [
        (125.0, 6, 1.0, False, 0.0, False, False),
        (pytest.approx(640 / 3), 3, 0.5, True, 0.0, False, False),
        (None, 0, 0.0, True, 0.0, False, False),  # no sample: a gap, nothing stored
        (305.0, 6, 1.0, False, pytest.approx(1 / 6), True, False),
        (412.0, 5, pytest.approx(5 / 6), False, 0.2, True, True),  # one of six missing: jitter
    ]
    assert [i.start for i in minutes] == [T0 + timedelta(minutes=m) for m in range(5)]
    assert minutes[0].end == T0 + timedelta(minutes=1)
    # 5 minutes: 20 samples of the 30 a 10 s meter gives, summing 750 + 640 + 1830 + 2060 kW
    (whole,) = five
    assert (whole.mean_kw, whole.samples, whole.coverage, whole.gap) == (
        264.0,
        20,
        pytest.approx(20 / 30),
        True,
    )
    assert (whole.estimated_share, whole.estimated, whole.fault) == (0.1, True, True)
    assert [(i.samples, i.mean_kw) for i in not_closed] == [(0, None)]  # ends at 00:15
    assert [(i.samples, i.mean_kw, i.coverage) for i in quarters] == [
        (20, 264.0, pytest.approx(20 / 90)),
        (0, None, 0.0),
    ]
    assert [(i.samples, i.mean_kw, i.coverage, i.fault) for i in half] == [
        (20, 264.0, pytest.approx(20 / 180), True)
    ]


def test_only_the_documented_interval_lengths_are_read():
    with pytest.raises(ValueError, match="120 s is not one of"):
        repo.meter_intervals(None, start=T0, end=T0 + timedelta(hours=1), length_s=120)


class MeteredSite:
    """A site sampled by hand: agents in memory, a real HTTP meter, a stepped clock."""

    def __init__(self, tmp_path, meter_url: str) -> None:
        mix = parse_job_mix({"jobs": site_jobs()})
        names = sorted({p.node for j in mix.jobs for p in j.placement})
        nodes = {
            f"mem://{n}": AgentNode(
                n, SimulatedBackend(8, mix=mix, node_id=n), tmp_path / n, sample_hz=0
            )
            for n in names
        }
        self.clock = SteppedClock(T0)
        self.settings = settings_for(
            f"sqlite:///{tmp_path / 'gateway.db'}",
            agents=",".join(nodes),
            allow_simulated=True,
            meter_url=meter_url,
            meter_period_s=5,
        )
        self.store = Store(self.settings.database_url)
        fleet = Fleet(self.settings, self.store, self.clock, InMemoryAgentClient(nodes, self.clock))
        overhead = Overhead(self.settings, self.store, self.clock)
        self.book = JobBook(self.store, self.clock, overhead)
        self.feed = open_feed(self.settings, clock=self.clock)
        self.site = SitePower(self.settings, self.clock, fleet, self.book, overhead, self.feed)
        self.history = MeterHistory(self.settings, self.store, self.clock, self.site)
        self.site.subscribe(self.history.on_sample)


def test_samples_taken_while_the_meter_faulted_or_was_suspected_are_marked(tmp_path):
    """5 s meter. Minute 0: twelve good readings 500..511 kW, written. Then a negative reading
    (rejected: the estimate stands in), a good one, and a suspicion raised at 70 s that dates
    from 40 s: the samples from 40 s are marked, minute 0 is rolled up again."""
    server = JsonServer({"facility_power_kw": 500.0})

    async def scenario():
        async with server.running() as where:
            metered = MeteredSite(tmp_path, f"http://{where}/m")
            await metered.book.replace(site_jobs(), "test")
            clock, feed, site = metered.clock, metered.feed, metered.site
            estimates = {}

            async def tick(kw: float) -> None:
                server.body = {"facility_power_kw": kw}
                await feed.sample()
                sample = await site.sample()
                if sample.facility_kw is None:
                    estimates[clock.monotonic()] = site.facility_kw(sample.gpu_kw)
                clock.step(5)

            for i in range(12):
                await tick(500.0 + i)
            await metered.history.flush()
            before = intervals(metered.store, T0, 1, 60)
            await tick(-3.0)  # 60 s
            await tick(520.0)  # 65 s
            feed.suspect("stuck", "for the test", since_s=40.0)
            await tick(525.0)  # 70 s: suspected, not believed
            feed.clear_suspicion()
            await tick(530.0)  # 75 s
            clock.step(120 - clock.monotonic())
            await metered.history.flush()
            raw = samples(metered.store, T0, T0 + timedelta(minutes=2))
            after = intervals(metered.store, T0, 2, 60)
            await feed.meter.aclose()
            metered.store.close()
            return before, raw, after, estimates

    before, raw, after, estimates = asyncio.run(scenario())
    assert [(i.mean_kw, i.fault, i.estimated) for i in before] == [(505.5, False, False)]
    seconds = [round((p.at - T0).total_seconds()) for p in raw]
    assert seconds == list(range(0, 80, 5))
    flags = {s: (p.estimated, p.fault) for s, p in zip(seconds, raw, strict=True)}
    assert all(flags[s] == (False, False) for s in range(0, 40, 5))
    assert all(flags[s] == (False, True) for s in (40, 45, 50, 55, 65))  # the meter's values
    assert flags[60] == flags[70] == (True, True)  # the estimate stood in
    assert flags[75] == (False, False)
    assert [p.kw for p in raw][:12] == [500.0 + i for i in range(12)]
    assert (raw[12].kw, raw[14].kw) == (estimates[60.0], estimates[70.0])
    minute0, minute1 = after
    assert (minute0.mean_kw, minute0.fault, minute0.estimated) == (505.5, True, True)
    assert minute0.estimated_share == pytest.approx(4 / 12)
    assert minute1.mean_kw == pytest.approx((estimates[60.0] + 520 + estimates[70.0] + 530) / 4)
    assert (minute1.samples, minute1.coverage, minute1.gap) == (4, pytest.approx(4 / 12), True)
    assert (minute1.estimated_share, minute1.fault) == (0.75, True)


def test_two_samples_taken_within_one_millisecond_are_both_kept(database_url):
    """A sample that took longer than the meter period is followed at once by the next: on a
    loaded machine the two fell in one millisecond, the samples' key, and the store kept only
    the first (`test_a_clean_stop_writes_every_sample_taken_...` failed in CI so)."""
    clock = SteppedClock(T0)
    store = Store(database_url)
    history = MeterHistory(settings_for(database_url, meter_period_s=0.05), store, clock)

    async def scenario():
        for kw in (10.0, 11.0, 12.0):
            history.record(at=clock.now(), kw=kw, estimated=False, fault=False)
        clock.step(0.05)
        history.record(at=clock.now(), kw=13.0, estimated=False, fault=False)
        await history.flush()
        return samples(store, T0, T0 + timedelta(seconds=1))

    try:
        kept = asyncio.run(scenario())
    finally:
        store.close()
    assert [p.kw for p in kept] == [10.0, 11.0, 12.0, 13.0]
    assert [p.at - T0 for p in kept][:3] == [timedelta(milliseconds=ms) for ms in (0, 1, 2)]
    assert kept[3].at - T0 == timedelta(milliseconds=50)


def test_samples_and_intervals_are_pruned_when_their_time_is_up(database_url):
    clock = SteppedClock(T0)
    store = Store(database_url)
    settings = settings_for(
        database_url, meter_period_s=10, meter_history_raw_keep_s=3600, meter_history_keep_days=90
    )
    history = MeterHistory(settings, store, clock)

    async def scenario():
        for i in range(6):
            history.record(at=clock.now(), kw=100.0 + i, estimated=False, fault=False)
            clock.step(10)
        clock.step(60)
        await history.flush()
        fresh = len(samples(store, T0, T0 + timedelta(hours=1)))
        clock.step(3600)  # 01:02: the samples are older than an hour, the intervals are not
        await history.flush()
        kept = (
            len(samples(store, T0, T0 + timedelta(hours=1))),
            [i.samples for i in intervals(store, T0, 1, 60)],
            [i.samples for i in intervals(store, T0, 30, 1800)],
        )
        clock.step(90 * 86400)
        history.record(at=clock.now(), kw=7.0, estimated=False, fault=False)
        await history.flush()
        recent = samples(store, clock.now() - timedelta(minutes=1), clock.now() + timedelta(1))
        old = [i.samples for i in intervals(store, T0, 30, 60)]
        return fresh, kept, recent, old, [i.samples for i in intervals(store, T0, 30, 1800)]

    try:
        fresh, kept, recent, old, half = asyncio.run(scenario())
    finally:
        store.close()
    assert fresh == 6
    # the 30-minute interval was rolled up from the samples before they went
    assert kept == (0, [6], [6])
    assert [p.kw for p in recent] == [7.0]
    assert set(old) == {0}
    assert half == [0]


def test_raw_samples_must_outlive_the_longest_interval():
    with pytest.raises(ValidationError, match="meter_history_raw_keep_s"):
        settings_for("sqlite:///x.db", meter_history_raw_keep_s=600)
    with pytest.raises(ValidationError, match="meter_history_keep_days"):
        settings_for("sqlite:///x.db", meter_history_keep_days=30)


def test_the_history_is_served_and_bad_parameters_are_refused_by_name(tmp_path, database_url):
    """Intervals a gateway wrote earlier (two days ago, a 10 s meter), read back over HTTP by
    a gateway started on the same store: the 5-minute interval it had not closed is rolled up
    from the stored samples when the new one first writes."""
    start = datetime.now(UTC).replace(minute=0, second=0, microsecond=0) - timedelta(days=2)
    clock = SteppedClock(start)
    store = Store(database_url)
    history = MeterHistory(settings_for(database_url, meter_period_s=10), store, clock)

    async def earlier():
        for minute, (kw, estimated) in ((0, (None, False)), (2, (200.0, True))):
            clock.step(60 * minute - clock.monotonic())
            for i in range(6):
                value = 100.0 + 10 * i if kw is None else kw
                history.record(at=clock.now(), kw=value, estimated=estimated, fault=False)
                clock.step(10)
        await history.flush()

    asyncio.run(earlier())
    store.close()
    span = {"start": start.isoformat(), "end": (start + timedelta(minutes=3)).isoformat()}
    with running_gateway(tmp_path, database_url, meter_period_s=10) as (api, _):
        minutes = api.get("/v1/site/meter", params={**span, "interval": "1m"})
        assert minutes.status_code == 200, minutes.text
        doc = minutes.json()
        assert (doc["interval"], doc["interval_s"], doc["source"]) == ("1m", 60, "estimate")
        got = [(i["mean_kw"], i["samples"], i["gap"], i["estimated"]) for i in doc["intervals"]]
        assert got == [(125.0, 6, False, False), (None, 0, True, False), (200.0, 6, False, True)]
        assert doc["intervals"][1]["start"] == (start + timedelta(minutes=1)).isoformat()
        five = api.get("/v1/site/meter", params={**span, "interval": "5m"}).json()["intervals"]
        assert [(i["mean_kw"], i["samples"], i["estimated_share"]) for i in five] == [
            (162.5, 12, 0.5)
        ]
        assert five[0]["coverage"] == pytest.approx(0.4)
        raw = api.get("/v1/site/meter", params={**span, "interval": "raw"}).json()["samples"]
        assert [p["power_kw"] for p in raw] == [100, 110, 120, 130, 140, 150] + [200] * 6
        assert raw[6] == {
            "at": (start + timedelta(minutes=2)).isoformat(),
            "power_kw": 200.0,
            "estimated": True,
            "fault": False,
        }
        bad = [
            ("interval", {**span, "interval": "2m"}),
            ("start", {**span, "start": "yesterday"}),
            ("start", {**span, "start": "0001-01-01T00:00:00Z"}),  # before any history
            ("end", {**span, "end": start.replace(tzinfo=None).isoformat()}),  # no UTC offset
        ]
        for name, params in bad:
            answer = api.get("/v1/site/meter", params=params)
            assert answer.status_code == 422, answer.text
            assert names(answer.json()["detail"]) == name, answer.text
        for params in (
            {"start": span["end"], "end": span["start"]},  # the wrong way round
            {"start": (start - timedelta(days=30)).isoformat(), "end": span["end"]},  # too long
        ):
            answer = api.get("/v1/site/meter", params=params)
            assert answer.status_code == 422, answer.text
            assert names(answer.json()["detail"]) == "end", answer.text
        again = api.get("/v1/site/meter", params={**span, "interval": "1m"}).json()
        assert again["intervals"] == doc["intervals"]


def names(detail) -> str:
    """The parameter a 422 names: the one field of a malformed request, or the word its
    sentence starts with."""
    if isinstance(detail, str):
        return detail.split(":")[0]
    (only,) = detail
    assert only["loc"][0] == "query"
    return only["loc"][1]


@contextlib.contextmanager
def running_gateway(tmp_path, database_url, **changes):
    """Agents and a gateway on real uvicorn servers; yields the API client and the app."""
    _, nodes, agents = start_site(tmp_path, database_url)
    with ServerThread(agents) as agents_url:
        settings = settings_for(
            database_url,
            agents=",".join(f"{agents_url}/nodes/{n}" for n in nodes),
            allow_simulated=True,
            **changes,
        )
        app = create_app(settings)
        with ServerThread(app) as url, httpx.Client(base_url=url, timeout=20) as api:
            answer = api.put("/v1/jobs", json={"jobs": site_jobs()}, headers=API)
            assert answer.status_code == 200, answer.text
            yield api, app


def test_a_clean_stop_writes_every_sample_taken_and_a_restart_serves_them(tmp_path):
    """Samples every 50 ms, never written while it runs (a flush period of an hour): the stop
    writes them all, estimated (no meter), and the next gateway on the store serves them."""
    database_url = f"sqlite:///{tmp_path / 'gateway.db'}"
    options = {"meter_period_s": 0.05, "meter_history_flush_s": 3600}
    with running_gateway(tmp_path, database_url, **options) as (_, app):
        power = app.state.services.power
        wait_for(lambda: len(power.history) >= 20, "twenty samples of the site")
        first = datetime.now(UTC) - timedelta(minutes=1)
    taken = [s.facility_kw for s in power.history]
    store = Store(database_url)
    try:
        kept = samples(store, first, datetime.now(UTC))
    finally:
        store.close()
    assert len(taken) < power.history.maxlen
    assert [p.kw for p in kept] == taken
    assert {(p.estimated, p.fault) for p in kept} == {(True, False)}
    with running_gateway(tmp_path, database_url, **options) as (api, _):
        params = {"start": first.isoformat(), "interval": "raw"}
        served = api.get("/v1/site/meter", params=params).json()["samples"]
    assert [p["at"] for p in served[: len(kept)]] == [p.at.isoformat() for p in kept]


def test_an_hour_of_1_s_samples_stays_within_the_documented_bytes_per_day(tmp_path):
    """bench/meter_history_bench.py measures a day (docs/operations.md, "Meter history"); an
    hour here keeps the figure honest: samples at about 23 bytes each, intervals included."""
    from bench.meter_history_bench import measure

    result = measure(tmp_path, hours=1.0)
    assert (result["samples"], result["intervals"]) == (3600, 60 + 12 + 4 + 2)
    assert result["bytes_per_sample"] < 30
