"""The frequency trigger end to end: pymodbus's own TCP server on loopback is the grid's
frequency; a dip below the threshold puts every node at its armed caps (in-memory agents) and
the fast event says the feed fired it; a feed that fails or reads nonsense never fires; a
droop whose delay lags the inter-area modes beyond the bound does not start."""

from __future__ import annotations

import asyncio
import contextlib
import re
import struct
import threading

import pytest

from gateway.agentclient.memory import InMemoryAgentClient
from gateway.app import create_app
from gateway.clock import SteppedClock
from gateway.errors import MeterError
from gateway.meter.frequency import open_frequency
from gateway.services.fast import FastPath
from gateway.services.frequency import FrequencyRefusedError, FrequencyTrigger
from gateway.settings import GatewaySettings
from tests.gateway.conftest import AGENT_TOKEN, API_TOKEN
from tests.gateway.slurmcluster import free_port
from tests.gateway.test_fast import SECRET, BrokerDown, armed_caps, fast_site
from tests.gateway.test_meter import modbus_server
from tests.promtext import samples


def registers(hz: float) -> list[int]:
    """A float32 reading as two big-endian registers, as a meter sends it."""
    high, low = struct.unpack(">HH", struct.pack(">f", hz))
    return [high, low]


@contextlib.contextmanager
def grid(hz: float):
    """A Modbus TCP server (its own thread and loop) whose holding registers 0-1 read `hz`;
    set `.holding[:] = registers(...)` to move the frequency."""
    holding = registers(hz)
    where: list[str] = []
    stop = threading.Event()

    async def serve() -> None:
        async with modbus_server(holding) as address:
            where.append(address)
            while not stop.is_set():
                await asyncio.sleep(0.02)

    thread = threading.Thread(target=asyncio.run, args=(serve(),), daemon=True)
    thread.start()
    while not where:
        threading.Event().wait(0.01)
    try:
        yield where[0], holding
    finally:
        stop.set()
        thread.join(5.0)


FEED = {
    "frequency_mode": "threshold",
    "frequency_threshold_hz": 49.7,
    "frequency_depth_pct": 30.0,
    "frequency_retrigger_s": 1.0,
    "frequency_hold_s": 60.0,  # no renewal within a test
}


def test_a_dip_on_a_modbus_feed_puts_every_node_at_its_armed_caps(tmp_path):
    with grid(50.0) as (where, holding):
        url = f"modbus://{where}?register=0&type=float32"
        with fast_site(tmp_path, memory=True, frequency_url=url, **FEED) as site:
            doc = lambda: site.api.get("/v1/fast/frequency").json()  # noqa: E731
            site.wait(lambda: doc()["hz"] == 50.0, what="the feed read")
            assert doc()["fault"] is None
            assert doc()["triggers"] == 0
            assert doc()["measured_trigger_delay_s"] is None
            before, caps = site.limits(), armed_caps(site, 30.0)
            expected = {n: [caps[n].get(g, before[n][g]) for g in range(8)] for n in before}
            assert expected != before
            holding[:] = registers(49.62)
            site.wait(lambda: site.limits() == expected, what="every node at its armed caps")
            fast = [e for e in site.api.get("/v1/events").json()["events"] if e["source"] == "fast"]
            assert len(fast) == 1
            assert "the frequency feed read 49.620 Hz; it crossed at 20" in fast[0]["reason"]
            assert doc()["last_event_id"] == fast[0]["id"]
            assert doc()["depth_pct"] == 30.0
            site.wait(lambda: doc()["measured_trigger_delay_s"] is not None, what="fired reports")
            assert doc()["measured_trigger_delay_s"] >= 0.0
            metrics = samples(site.api.get("/metrics").text)
            assert metrics["flexgate_frequency_hz"] == pytest.approx(49.62, abs=1e-4)
            assert metrics["flexgate_frequency_fault"] == 0
            assert metrics["flexgate_frequency_triggers_total"] == 1


def test_a_feed_reading_nonsense_is_a_fault_shown_and_never_fires(tmp_path):
    with grid(20.0) as (where, _):  # 20 Hz: below the threshold, and implausible
        url = f"modbus://{where}?register=0&type=float32"
        with fast_site(tmp_path, memory=True, frequency_url=url, **FEED) as site:
            before = site.limits()
            site.wait(
                lambda: (
                    "20 Hz is implausible"
                    in (site.api.get("/v1/fast/frequency").json()["fault"] or "")
                ),
                what="the fault shown",
            )
            threading.Event().wait(0.5)  # five readings more
            doc = site.api.get("/v1/fast/frequency").json()
            assert (doc["triggers"], doc["hz"], doc["depth_pct"]) == (0, None, 0.0)
            assert site.limits() == before
            assert all(e["source"] != "fast" for e in site.api.get("/v1/events").json()["events"])
            assert samples(site.api.get("/metrics").text)["flexgate_frequency_fault"] == 1


def test_a_feed_that_does_not_answer_is_a_fault_that_says_so(tmp_path):
    url = f"modbus://127.0.0.1:{free_port()}?register=0&type=float32"
    with fast_site(tmp_path, memory=True, frequency_url=url, **FEED) as site:
        site.wait(
            lambda: "no connection" in (site.api.get("/v1/fast/frequency").json()["fault"] or ""),
            what="the fault shown",
        )
        assert site.api.get("/v1/fast/frequency").json()["triggers"] == 0


def test_a_line_stream_feed_gives_its_newest_reading_and_a_silent_one_is_a_fault():
    async def check() -> tuple[float, str]:
        lines: asyncio.Queue[bytes] = asyncio.Queue()

        async def serve(reader, writer):
            while (line := await lines.get()) != b"":
                writer.write(line)
                await writer.drain()
            writer.close()

        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        feed = open_frequency(f"tcp://127.0.0.1:{port}", timeout_s=0.3)
        assert feed is not None
        for line in (b"50.01\n", b"49.93\n"):
            lines.put_nowait(line)
        with contextlib.suppress(MeterError):
            await feed.read_hz()  # connects
        await asyncio.sleep(0.1)
        newest = await feed.read_hz()
        await asyncio.sleep(0.4)  # nothing more arrives
        try:
            await feed.read_hz()
            silent = "no error"
        except MeterError as exc:
            silent = str(exc)
        lines.put_nowait(b"")
        await feed.aclose()
        server.close()
        return newest, silent

    newest, silent = asyncio.run(check())
    assert newest == 49.93
    assert "no reading within 0.3 s" in silent


def droop_settings(delay_s: float) -> GatewaySettings:
    return GatewaySettings(
        api_token=API_TOKEN,
        agent_token=AGENT_TOKEN,
        fast_depths="10,20,30,40",
        fast_secret=SECRET,
        frequency_url="modbus://127.0.0.1:1502?register=0",
        frequency_mode="droop",
        frequency_stiffness_hz_per_mw=0.0001,
        frequency_trigger_delay_s=delay_s,
    )


def test_a_droop_delayed_beyond_the_phase_bound_does_not_start_naming_the_settings():
    settings = droop_settings(0.2)  # 0.1 s period + 0.2 s: a 1 Hz mode lags 108 degrees
    fast = FastPath(settings, None, SteppedClock(), None, None, BrokerDown())
    feed = open_frequency(settings.frequency_url, timeout_s=0.5)
    trigger = FrequencyTrigger(settings, SteppedClock(), fast, feed)
    with pytest.raises(FrequencyRefusedError, match="108 degrees") as refused:
        trigger.start()
    for name in ("PERIOD_S", "TRIGGER_DELAY_S", "PHASE_BOUND_DEG"):
        assert f"FLEXGATE_FREQUENCY_{name}" in str(refused.value)
    assert trigger.doc()["droop_refused"] is not None


def test_a_droop_within_the_bound_reports_its_phase_and_gain():
    settings = droop_settings(0.1)  # 0.2 s in all: 72 degrees at 1 Hz, 7.2 at 0.1 Hz
    fast = FastPath(settings, None, SteppedClock(), None, None, BrokerDown())
    fast.expected_kw = {40.0: 970.0}  # 0.97 MW over 49.985-49.5 Hz: 2 MW/Hz
    trigger = FrequencyTrigger(settings, SteppedClock(), fast, None)
    report = trigger.doc()["droop"]
    assert report["worst_phase_lag_deg"] == pytest.approx(72.0)
    assert report["phase_lag_deg"][0] == pytest.approx(7.2)
    assert report["loop_gain"] == pytest.approx(2.0 * 0.0001)


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        (
            {"frequency_url": "modbus://h:1?register=0"},
            "FLEXGATE_FREQUENCY_URL needs FLEXGATE_FAST_DEPTHS",
        ),
        ({"frequency_url": "udp://h:1", "fast_depths": "10"}, "modbus://host:port?register="),
        (
            {"frequency_url": "tcp://h:1", "fast_depths": "10", "frequency_mode": "droop"},
            "needs FLEXGATE_FREQUENCY_STIFFNESS_HZ_PER_MW",
        ),
        (
            {"frequency_url": "tcp://h:1", "fast_depths": "10", "frequency_depth_pct": 25.0},
            "FLEXGATE_FREQUENCY_*",
        ),
    ],
)
def test_frequency_settings_that_cannot_work_are_refused_naming_them(changes, words):
    with pytest.raises(ValueError, match=re.escape(words)):
        GatewaySettings(api_token=API_TOKEN, agent_token=AGENT_TOKEN, fast_secret=SECRET, **changes)


def test_the_gateway_does_not_start_a_droop_beyond_the_bound(tmp_path):
    settings = droop_settings(0.2).model_copy(
        update={"database_url": f"sqlite:///{tmp_path / 'gateway.db'}"}
    )
    app = create_app(settings, agents=InMemoryAgentClient({}))

    async def start() -> None:
        async with app.router.lifespan_context(app):
            raise AssertionError("the gateway started")

    with pytest.raises(FrequencyRefusedError, match=r"FLEXGATE_FREQUENCY_TRIGGER_DELAY_S 0\.2 s"):
        asyncio.run(start())
