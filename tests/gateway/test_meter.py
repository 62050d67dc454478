"""The facility meter: each source against a real server on loopback, and the feed that
believes only plausible readings (on a stepped clock)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
from typing import Any

import pytest
from aiohttp import web
from pymodbus.constants import ExcCodes
from pymodbus.server import ModbusTcpServer
from pymodbus.simulator import DataType, SimData, SimDevice

from flexgate.serve import free_port
from gateway.clock import SteppedClock
from gateway.errors import MeterError
from gateway.meter import MeterFeed, open_meter
from gateway.services.site import open_feed
from gateway.settings import GatewaySettings

WAIT_S = 10.0  # the longest any wait below may take before the test fails


class JsonServer:
    """A real aiohttp server on loopback: every GET answers `body` (JSON unless a str) with
    `status`, or hangs while `hang` is set, until `release` is set."""

    def __init__(self, body: Any) -> None:
        self.body, self.status, self.hang = body, 200, False
        self.release = asyncio.Event()
        self.queries: list[dict[str, str]] = []

    async def answer(self, request: web.Request) -> web.Response:
        self.queries.append(dict(request.query))
        if self.hang:
            await self.release.wait()
        text = self.body if isinstance(self.body, str) else json.dumps(self.body)
        return web.Response(text=text, status=self.status, content_type="application/json")

    @contextlib.asynccontextmanager
    async def running(self):
        app = web.Application()
        app.router.add_get("/{tail:.*}", self.answer)
        runner = web.AppRunner(app, shutdown_timeout=1.0)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        try:
            yield f"127.0.0.1:{runner.addresses[0][1]}"
        finally:
            self.release.set()
            await runner.cleanup()


async def read_once(url: str, **options: Any) -> float:
    meter = open_meter(url, **options)
    assert meter is not None
    try:
        return await meter.read_kw()
    finally:
        await meter.aclose()


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, WAIT_S * 3))


# -- HTTP JSON -------------------------------------------------------------------------------


def test_http_json_reads_the_power_at_a_dotted_path():
    async def check():
        server = JsonServer({"site": {"power": {"kw": 812.5}}, "other": 1})
        async with server.running() as where:
            return await read_once(f"http://{where}/meter", json_key="site.power.kw")

    assert run(check()) == 812.5


@pytest.mark.parametrize(
    ("body", "status", "expected"),
    [
        ({"site": {"kw": 1.0}}, 200, "no 'power' in site"),
        ({"facility": 3}, 200, "no 'site' in the document"),
        ({"site": {"power": {"kw": "lots"}}}, 200, "'lots', not a number"),
        ({"site": {"power": {"kw": True}}}, 200, "True, not a number"),
        ({"site": {"power": {"kw": 5}}}, 503, "answered HTTP 503"),
        ("<html>down</html>", 200, "HTTP 200 with no JSON"),
    ],
)
def test_http_json_answers_of_the_wrong_shape_are_errors_that_say_so(body, status, expected):
    async def check():
        server = JsonServer(body)
        server.status = status
        async with server.running() as where:
            with pytest.raises(MeterError, match=expected):
                await read_once(f"http://{where}/meter", json_key="site.power.kw")

    run(check())


def test_http_json_that_stops_answering_times_out_with_an_error():
    async def check():
        server = JsonServer({"facility_power_kw": 1.0})
        server.hang = True
        async with server.running() as where:
            with pytest.raises(MeterError, match=r"did not answer within 0\.2 s"):
                await read_once(f"http://{where}/meter", timeout_s=0.2)
        with pytest.raises(MeterError, match="could not be read"):  # the server is gone
            await read_once(f"http://{where}/meter", timeout_s=0.2)

    run(check())


# -- Prometheus ------------------------------------------------------------------------------


def vector(*values: str) -> dict:
    result = [
        {"metric": {"instance": f"pdu-{i}"}, "value": [1.7e9, v]} for i, v in enumerate(values)
    ]
    return {"status": "success", "data": {"resultType": "vector", "result": result}}


def test_a_prometheus_url_names_the_api_it_queries():
    plain = open_meter("prometheus://127.0.0.1:9090?query=sum(facility_kw)")
    tls = open_meter("prometheus+https://prom.example:443/prefix/?query=up")
    assert (plain.url, plain.query) == ("http://127.0.0.1:9090/api/v1/query", "sum(facility_kw)")
    assert tls.url == "https://prom.example:443/prefix/api/v1/query"
    assert tls.source == "prometheus+https://prom.example:443/prefix/?query=up"


def test_a_password_in_a_meter_url_is_never_shown():
    meter = open_meter("https://ops:s3cret@meter.example/site?x=1")
    assert meter.source == "https://ops:***@meter.example/site?x=1"
    assert meter.url == "https://ops:s3cret@meter.example/site?x=1"  # still used to read
    with pytest.raises(ValueError, match="scheme must be") as refused:
        open_meter("ftp://u:pw@meter.example/x")
    assert "'ftp://u:***@meter.example/x'" in str(refused.value)
    assert "pw" not in str(refused.value)


def test_prometheus_instant_query_reads_one_series():
    async def check():
        server = JsonServer(vector("640.25"))
        async with server.running() as where:
            kw = await read_once(f"prometheus://{where}?query=sum(facility_kw)")
            server.body = {
                "status": "success",
                "data": {"resultType": "scalar", "result": [1, "7"]},
            }
            scalar = await read_once(f"prometheus://{where}?query=scalar(x)")
        return kw, scalar, server.queries

    kw, scalar, queries = run(check())
    assert (kw, scalar) == (640.25, 7.0)
    assert queries[0] == {"query": "sum(facility_kw)"}


@pytest.mark.parametrize(
    ("body", "status", "expected"),
    [
        (vector(), 200, "matched no series"),
        (vector("1", "2"), 200, "matched 2 series; it must select one"),
        (
            {"status": "error", "errorType": "bad_data", "error": "parse error at char 4"},
            400,
            r"failed \(bad_data\): parse error at char 4",
        ),
        ({"status": "success", "data": {"resultType": "matrix", "result": []}}, 200, "a matrix"),
        (vector("NaNish"), 200, "'NaNish', not a number"),
    ],
)
def test_prometheus_error_shapes_are_errors_that_say_so(body, status, expected):
    async def check():
        server = JsonServer(body)
        server.status = status
        async with server.running() as where:
            with pytest.raises(MeterError, match=expected):
                await read_once(f"prometheus://{where}?query=facility_kw")

    run(check())


# -- Modbus TCP ------------------------------------------------------------------------------

#: 812.5 as float32 is 0x444B2000; -5 as int32 is 0xFFFFFFFB
HOLDING = [0x444B, 0x2000, 0xFFFF, 0xFFFB, 0x2000, 0x444B, 1234, 0xFFFE]
INPUT = [0x0001, 0x86A0]  # uint32 100000


@contextlib.asynccontextmanager
async def modbus_server(holding: list[int], failing: list[ExcCodes] | None = None):
    """pymodbus's own TCP server (device 1) on a free loopback port; `holding` is read live,
    and while `failing` holds a code, every request is answered with that exception."""

    async def live(function_code, start, address, count, current, set_values):
        if failing:
            return failing[0]
        block = holding if function_code == 3 else INPUT
        current[: len(block)] = block[: len(current)]
        return None

    blocks = (
        [SimData(0, values=False, datatype=DataType.BITS)],
        [SimData(0, values=False, datatype=DataType.BITS)],
        [SimData(0, values=list(holding), datatype=DataType.REGISTERS)],
        [SimData(0, values=INPUT, datatype=DataType.REGISTERS)],
    )
    port = free_port()
    server = ModbusTcpServer(
        SimDevice(id=1, simdata=blocks, action=live), address=("127.0.0.1", port)
    )
    task = asyncio.create_task(server.serve_forever())
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await server.shutdown()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def read_modbus(where: str, query: str) -> float:
    for _ in range(int(WAIT_S / 0.05)):  # the server listens a moment after it is started
        try:
            return await read_once(f"modbus://{where}?{query}", timeout_s=1.0)
        except MeterError as exc:
            if "no connection" not in str(exc):
                raise
            await asyncio.sleep(0.05)
    raise AssertionError("the modbus server never listened")


@pytest.mark.parametrize(
    ("query", "expected_kw"),
    [
        ("register=0&type=float32", 812.5),
        ("register=4&type=float32&word_order=little", 812.5),
        ("register=2&type=int32&scale=10", -50.0),
        ("register=6&type=uint16&scale=0.1", 123.4),
        ("register=7&type=int16", -2.0),
        ("register=6&type=uint32&unit=1", (1234 << 16 | 0xFFFE)),
        ("register=0&type=uint32&table=input&scale=0.001", 100.0),
    ],
)
def test_modbus_registers_of_each_type_and_table(query, expected_kw):
    async def check():
        async with modbus_server(HOLDING) as where:
            return await read_modbus(where, query)

    assert run(check()) == pytest.approx(expected_kw)


def test_modbus_exceptions_are_errors_that_say_so_and_readings_resume_after():
    async def check():
        failing: list[ExcCodes] = []
        async with modbus_server(HOLDING, failing) as where:
            with pytest.raises(MeterError, match=r"exception code 2 \(illegal data address\)"):
                await read_modbus(where, "register=40&type=uint16")  # past the registers
            failing.append(ExcCodes.DEVICE_BUSY)
            with pytest.raises(MeterError, match=r"exception code 6 \(device busy\)"):
                await read_modbus(where, "register=0&type=float32")
            failing.clear()
            return await read_modbus(where, "register=0&type=float32")

    assert run(check()) == 812.5


def test_a_modbus_meter_nobody_listens_on_is_an_error():
    async def check():
        with pytest.raises(MeterError, match="no connection"):
            await read_once(f"modbus://127.0.0.1:{free_port()}?register=0", timeout_s=0.5)

    run(check())


# -- URLs and settings -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("ftp://meter/x", r"scheme must be http, https, prometheus, prometheus\+https or modbus"),
        ("prometheus://127.0.0.1:9090", "needs one query="),
        ("prometheus://127.0.0.1?query=x", "needs host:port"),
        ("modbus://127.0.0.1:502?type=int16", "needs host"),
        ("modbus://127.0.0.1:502?register=1&type=int64", "'int64' is not one of"),
        ("modbus://127.0.0.1:502?register=1&table=coils", "table='coils': holding or input"),
        ("modbus://127.0.0.1:502?register=1&word_order=middle", "big or little"),
        ("modbus://127.0.0.1:502?register=1&scale=0", "scale 0.0 must be"),
        ("modbus://127.0.0.1:502?register=99999", "out of range"),
        ("modbus://127.0.0.1:502?register=1&slave=2", "unknown parameter"),
    ],
)
def test_a_meter_url_it_cannot_use_is_refused_at_settings_load(url, expected):
    with pytest.raises(ValueError, match=expected) as refused:
        GatewaySettings(lab=True, meter_url=url)
    assert "FLEXGATE_METER_URL" in str(refused.value)


def test_settings_refuse_an_empty_json_key_and_a_max_age_within_one_period():
    with pytest.raises(ValueError, match="must be a dotted path"):
        GatewaySettings(lab=True, meter_url="http://127.0.0.1:1/m", meter_json_key="a..b")
    with pytest.raises(ValueError, match=r"MAX_AGE_S .* must be longer than"):
        GatewaySettings(lab=True, meter_period_s=5, meter_max_age_s=5)


def test_no_meter_url_means_no_feed_and_a_url_makes_one_from_the_settings():
    clock = SteppedClock()
    assert open_feed(GatewaySettings(lab=True), clock=clock) is None
    settings = GatewaySettings(
        lab=True,
        meter_url="modbus://127.0.0.1:5020?register=3&type=int32&table=input",
        meter_period_s=2,
        meter_max_step_kw=40,
        meter_max_kw=900,
    )
    feed = open_feed(settings, clock=clock)
    assert feed is not None
    assert (feed.period_s, feed.max_age_s, feed.max_step_kw, feed.max_kw) == (2, 6, 40, 900)
    assert feed.state()["source"].startswith("modbus://127.0.0.1:5020?unit=1&register=3&type=int32")
    assert feed.state()["fault"] == "no reading yet"


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ({"period_s": 0}, "period_s must be positive"),
        ({"period_s": 1, "max_step_kw": -1}, "max_step_kw must be positive"),
        ({"period_s": 1, "max_kw": 0}, "max_kw must be positive"),
        ({"period_s": 10, "history_s": 5}, "shorter than one period"),
    ],
)
def test_a_feed_with_impossible_bounds_is_refused(options, expected):
    meter = open_meter("http://127.0.0.1:1/m")
    with pytest.raises(ValueError, match=expected):
        MeterFeed(meter, clock=SteppedClock(), **options)


# -- The feed --------------------------------------------------------------------------------


async def until(check, what: str) -> None:
    for _ in range(int(WAIT_S / 0.01)):
        if check():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


def samples(feed: MeterFeed) -> int:
    return feed.readings + sum(feed.rejected.values())


async def next_sample(feed: MeterFeed, clock: SteppedClock) -> dict:
    """Step one period once the feed sleeps, and wait for its next sample."""
    await until(lambda: clock.sleepers == 1, "the feed to sleep")
    before = samples(feed)
    clock.step(feed.period_s)
    await until(lambda: samples(feed) > before, "the next sample")
    return dict(feed.state())


def test_the_feed_flags_nonsense_holds_the_last_good_reading_and_recovers():
    async def scenario():
        clock = SteppedClock()
        server = JsonServer({"facility_power_kw": 500.0})
        async with server.running() as where:
            meter = open_meter(f"http://{where}/m", timeout_s=0.2)
            feed = MeterFeed(meter, clock=clock, period_s=5, max_step_kw=100, max_kw=1000)
            task = asyncio.create_task(feed.run())
            await until(lambda: feed.readings == 1, "the first reading")
            seen = {"first": dict(feed.state())}

            async def answer(kw):
                server.body = {"facility_power_kw": kw}
                return await next_sample(feed, clock)

            seen["nan"] = await answer(math.nan)
            seen["good"] = await answer(520.0)
            seen["negative"] = await answer(-3.0)
            seen["good2"] = await answer(530.0)
            seen["spike"] = await answer(900.0)
            seen["back"] = await answer(540.0)
            seen["step"] = await answer(900.0)
            seen["confirmed"] = await answer(910.0)
            seen["filtered"] = feed.filtered_kw(window_s=12)
            seen["above"] = await answer(1500.0)
            server.hang = True
            seen["hung"] = await answer(910.0)
            seen["while_faulted"] = (feed.believed_kw(), feed.filtered_kw(window_s=60))
            server.hang = False
            seen["recovered"] = await answer(905.0)
            seen["believed"] = feed.believed_kw()
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            return seen, feed

    seen, feed = run(scenario())
    shown = {
        step: (state["facility_power_kw"], state["fault"])
        for step, state in seen.items()
        if isinstance(state, dict)
    }
    assert shown["first"] == (500.0, None)
    assert (seen["first"]["estimated"], seen["first"]["age_s"]) == (False, 0.0)
    assert shown["nan"] == (500.0, "not_finite: the meter read nan kW")
    assert seen["nan"]["age_s"] == 5.0
    assert shown["good"] == (520.0, None)
    assert shown["negative"] == (520.0, "negative: the meter read -3 kW, below zero")
    assert shown["spike"][0] == 530.0
    assert shown["spike"][1].startswith("jump: the meter jumped from 530 to 900 kW")
    assert shown["back"] == (540.0, None)  # a spike is dropped
    assert shown["step"][1].startswith("jump: the meter jumped from 540 to 900 kW")
    assert shown["confirmed"] == (910.0, None)  # a step the next reading confirms is believed
    assert seen["filtered"] == pytest.approx((540.0 + 910.0) / 2)  # the good readings of 12 s
    assert shown["above"] == (
        910.0,
        "above_max: the meter read 1500 kW, above the site's maximum 1000 kW",
    )
    assert shown["hung"][0] == 910.0
    assert shown["hung"][1].startswith("error: ")
    assert "did not answer within 0.2 s" in shown["hung"][1]
    assert seen["while_faulted"] == (None, None)
    assert shown["recovered"] == (905.0, None)
    assert seen["believed"] == 905.0
    assert feed.readings == 6
    assert feed.rejected == {"error": 1, "not_finite": 1, "negative": 1, "above_max": 1, "jump": 2}


def test_a_feed_with_no_good_reading_for_longer_than_its_max_age_is_stale():
    async def scenario():
        clock = SteppedClock()
        server = JsonServer({"facility_power_kw": 300.0})
        async with server.running() as where:
            feed = MeterFeed(open_meter(f"http://{where}/m"), clock=clock, period_s=5, max_age_s=12)
            await feed.sample()
            await feed.meter.aclose()
        clock.step(12)
        fresh = (dict(feed.state()), feed.believed_kw())
        clock.step(0.5)
        return fresh, dict(feed.state()), feed.believed_kw(), feed.filtered_kw(window_s=60)

    fresh, stale, believed, filtered = run(scenario())
    assert (fresh[0]["fault"], fresh[1]) == (None, 300.0)
    assert stale["fault"] == "stale: no good reading for 12.5 s (max age 12 s)"
    assert (stale["facility_power_kw"], stale["age_s"]) == (300.0, 12.5)
    assert (believed, filtered) == (None, None)


class Readings:
    """A meter that answers the given readings, one a call."""

    source = "test://readings"

    def __init__(self, values: list[float]) -> None:
        self.values = iter(values)

    async def read_kw(self) -> float:
        return next(self.values)

    async def aclose(self) -> None:
        return None


@pytest.mark.parametrize(
    ("values", "step_kw"),
    [
        ([40.0, 40.5, 40.5, 41.0, 40.0, 40.5, 41.5], 0.5),  # a register in 0.5 kW
        ([40.0, 40.013, 40.27, 39.9, 40.11, 40.2], 0.0),  # no whole number of the least
        ([40.0, 40.0 + 1e-14, 40.0, 40.0 + 2e-14, 40.0], 0.0),  # a float's last bits
        ([40.0, 40.5, 41.0], 0.0),  # too few changes to tell
    ],
)
def test_the_feed_finds_the_step_its_meter_reads_in(values, step_kw):
    feed = MeterFeed(
        Readings(values), clock=SteppedClock(), period_s=5, max_step_kw=100, max_kw=1000
    )

    async def read_all() -> None:
        for _ in values:
            await feed.sample()

    asyncio.run(read_all())
    assert feed.step_kw == pytest.approx(step_kw)
