"""The lab's facility meter: what a real meter would read off the simulated site.

    facility_kw = static_kw + overhead_factor * (first-order lag of the GPUs' power) + noise

The GPUs' power is the truth the simulated agents draw (the mean of each GPU's last
`integration_s` of samples from every agent's `GET /v1/telemetry`), not what the gateway
believes from the declared job mix; the lag stands for cooling that answers a GPU step over
`time_constant_s`, after the meter's own transport delay `dead_s`. `create_app` serves
`{"facility_power_kw": ...}` over HTTP (point FLEXGATE_METER_URL at it); `LabMeter.poll` can
also be stepped by a lab on its own clock.

Faults (`LabMeter.fault_after`, `flexgate lab --fault`): `meter-freeze` holds the reading it had
(a stuck register: the answers stay fresh; `meter-freeze:KW`, KW off it), `meter-dropout`
answers 503, `meter-offset:KW` reads KW off the truth.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import numpy as np
from fastapi import FastAPI
from fastapi.responses import JSONResponse

from agents.protocol import TelemetryResponse
from gateway.clock import Clock, SystemClock

FAULTS = ("meter-freeze", "meter-dropout", "meter-offset")


@dataclass(frozen=True)
class MeterFault:
    """A fault the lab meter starts `after_s` into the event: `kind` one of FAULTS."""

    kind: str
    after_s: float
    offset_kw: float = 0.0  #: for meter-offset and meter-freeze [kW]


def parse_fault(text: str) -> MeterFault:
    """`KIND@SECONDS`, or `meter-offset:KW@SECONDS` (and `meter-freeze:KW@SECONDS`);
    ValueError naming the problem."""
    kind, at, after = text.partition("@")
    name, _, value = kind.partition(":")
    if not at or name not in FAULTS or (value and name == "meter-dropout"):
        raise ValueError(
            f"--fault {text!r}: expected one of meter-freeze[:KW]@S, meter-dropout@S or "
            "meter-offset:KW@S (S seconds after the event starts)"
        )
    try:
        after_s, offset_kw = float(after), float(value or 0.0)
    except ValueError:
        raise ValueError(f"--fault {text!r}: the seconds and kW must be numbers") from None
    if not (math.isfinite(after_s) and after_s >= 0 and math.isfinite(offset_kw)):
        raise ValueError(f"--fault {text!r}: the seconds must be finite and not negative")
    return MeterFault(name, after_s, offset_kw)


class LabMeter:
    def __init__(
        self,
        agent_urls: list[str],
        *,
        static_kw: float,
        overhead_factor: float,
        noise_kw: float = 0.0,
        time_constant_s: float = 0.0,
        integration_s: float = 1.0,
        period_s: float = 0.5,
        seed: int = 0,
        clock: Clock | None = None,
        timeout_s: float = 2.0,
        dead_s: float = 0.0,
    ) -> None:
        """agent_urls: each node's base URL (as in FLEXGATE_AGENTS); static_kw [kW] and
        overhead_factor: the site's truth; noise_kw: the meter's noise (one standard
        deviation) [kW]; time_constant_s: the cooling's first-order lag [s] (0: none);
        integration_s: the meter's averaging of GPU power [s]; period_s: how often the agents
        are read [s]; dead_s: the meter's own transport delay before any of it shows [s]."""
        if not agent_urls:
            raise ValueError("the lab meter needs at least one agent URL")
        for name, value in (("static_kw", static_kw), ("noise_kw", noise_kw)):
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"the lab meter's {name} must be finite and not negative")
        if not overhead_factor >= 1.0 or not math.isfinite(overhead_factor):
            raise ValueError(f"the lab meter's overhead factor {overhead_factor} must be >= 1")
        if time_constant_s < 0 or not integration_s > 0 or not period_s > 0 or not dead_s >= 0:
            raise ValueError(
                "time_constant_s >= 0, integration_s > 0, period_s > 0 and dead_s >= 0"
            )
        self.dead_s = dead_s
        self._delayed: deque[tuple[float, float]] = deque()  #: (monotonic, lagged GPU kW)
        self._fault: MeterFault | None = None
        self._fault_at_s = math.inf
        self._frozen_kw: float | None = None
        self.agent_urls = [u.rstrip("/") for u in agent_urls]
        self.static_kw, self.overhead_factor = static_kw, overhead_factor
        self.noise_kw, self.time_constant_s = noise_kw, time_constant_s
        self.integration_s, self.period_s, self.timeout_s = integration_s, period_s, timeout_s
        self.clock = clock or SystemClock()
        self._rng = np.random.default_rng(seed)
        self._node_kw: dict[str, float] = {}  #: each node's GPU power at its last answer
        self._lagged_gpu_kw: float | None = None  #: what the facility's load follows
        self._polled_s: float | None = None
        self.errors = 0  #: agent reads that failed (the node's last power stands)

    @property
    def gpu_power_kw(self) -> float | None:
        """The GPUs' true power at the last poll [kW], once every agent has answered."""
        if len(self._node_kw) < len(self.agent_urls):
            return None
        return sum(self._node_kw.values())

    def true_facility_kw(self) -> float | None:
        """The facility's load without the meter's noise [kW]."""
        if self._lagged_gpu_kw is None:
            return None
        return self.static_kw + self.overhead_factor * self._lagged_gpu_kw

    def fault_after(self, fault: MeterFault) -> None:
        """Start `fault` `fault.after_s` from now (the lab calls it when the event starts)."""
        self._fault, self._fault_at_s = fault, self.clock.monotonic() + fault.after_s

    @property
    def faulted(self) -> str | None:
        """The fault in force, if one has started."""
        if self._fault is None or self.clock.monotonic() < self._fault_at_s:
            return None
        return self._fault.kind

    def reading_kw(self) -> float | None:
        """One meter reading [kW]: the load `dead_s` ago plus fresh noise, never below zero;
        None while there is none (or the meter drops out)."""
        if self._delayed and self._lagged_gpu_kw is not None:
            while (
                len(self._delayed) > 1
                and self._delayed[1][0] <= self.clock.monotonic() - self.dead_s
            ):
                self._delayed.popleft()
        if not self._delayed:
            return None
        true_kw = self.static_kw + self.overhead_factor * self._delayed[0][1]
        reading = max(true_kw + float(self._rng.normal(0.0, self.noise_kw)), 0.0)
        fault = self.faulted
        if fault == "meter-dropout":
            return None
        if fault == "meter-freeze":
            if self._frozen_kw is None and self._fault is not None:
                self._frozen_kw = max(reading + self._fault.offset_kw, 0.0)
            return self._frozen_kw
        if fault == "meter-offset" and self._fault is not None:
            return max(reading + self._fault.offset_kw, 0.0)
        return reading

    async def poll(self, session: aiohttp.ClientSession) -> None:
        """Read every agent once and move the lagged load towards the GPUs' power."""
        answers = await asyncio.gather(
            *(self._node_power_kw(session, url) for url in self.agent_urls)
        )
        for url, power_kw in zip(self.agent_urls, answers, strict=True):
            if power_kw is None:
                self.errors += 1
            else:
                self._node_kw[url] = power_kw
        now_s, gpu_kw = self.clock.monotonic(), self.gpu_power_kw
        if gpu_kw is None:
            return
        if self._lagged_gpu_kw is None or self._polled_s is None or self.time_constant_s == 0:
            self._lagged_gpu_kw = gpu_kw  # a site already in steady state when first seen
        else:
            moved = 1.0 - math.exp(-(now_s - self._polled_s) / self.time_constant_s)
            self._lagged_gpu_kw += moved * (gpu_kw - self._lagged_gpu_kw)
        self._polled_s = now_s
        self._delayed.append((now_s, self._lagged_gpu_kw))

    async def _node_power_kw(self, session: aiohttp.ClientSession, url: str) -> float | None:
        try:
            async with session.get(f"{url}/v1/telemetry") as answer:
                answer.raise_for_status()
                telemetry = TelemetryResponse.model_validate(await answer.json())
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return None
        watts = 0.0
        for gpu in telemetry.gpus:
            recent = max(round(self.integration_s / gpu.sample_interval_s), 1)
            if gpu.power_w:
                watts += float(np.mean(gpu.power_w[-recent:]))
        return watts / 1000.0

    async def run(self) -> None:
        """Poll every period until cancelled."""
        timeout = aiohttp.ClientTimeout(total=self.timeout_s)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            while True:
                await self.poll(session)
                await self.clock.sleep(self.period_s)


def create_app(meter: LabMeter) -> FastAPI:
    """`GET /meter`: `{"facility_power_kw", "gpu_power_kw"}` (the second is the lab's truth,
    for its report; a real meter has no such field); 503 until every agent has answered."""

    @contextlib.asynccontextmanager
    async def polling(_: FastAPI) -> AsyncIterator[None]:
        task = asyncio.create_task(meter.run())
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    app = FastAPI(title="flexgate lab meter", lifespan=polling)

    @app.get("/meter", response_model=None)
    async def read() -> dict[str, Any] | JSONResponse:
        reading_kw = meter.reading_kw()
        if reading_kw is None:
            why = "dropped out (lab fault)" if meter.faulted else "not every agent has answered yet"
            return JSONResponse({"detail": why}, status_code=503)
        return {"facility_power_kw": reading_kw, "gpu_power_kw": meter.gpu_power_kw}

    return app
