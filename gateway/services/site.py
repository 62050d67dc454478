"""The site's power at the meter: what it draws now, what it would draw uncapped, the shed.

Every meter period the site is sampled: the placed jobs' GPU power from the agents, and the
facility power from the meter when one is configured (`FLEXGATE_METER_URL`), else the
estimate `static_kw + k * gpu_kw` (labelled `estimated`). A meter that stops answering or
answers nonsense is flagged, not believed (`gateway.meter`): its readings leave the history,
so the site loop holds and figures fall back to the estimate, and `/health` says why.
Baselines count the placed jobs only: a job without a placement can be neither measured nor
capped. The overhead model in force (`Overhead`) gives `k` and the static load.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from flexmodel.meterpath import MeterPath
from gateway.clock import Clock
from gateway.meter import MeterFeed, open_meter
from gateway.services.fleet import Fleet
from gateway.services.jobbook import JobBook
from gateway.services.overhead import Overhead, meter_path_doc
from gateway.settingsgroups.meter import MeterSettings

log = logging.getLogger("flexgate.gateway")
ESTIMATE = "estimate"


def open_feed(settings: MeterSettings, *, clock: Clock) -> MeterFeed | None:
    """The feed `FLEXGATE_METER_*` describe, or None without a meter URL (the site's estimate
    stands in, labelled `estimated`)."""
    meter = open_meter(
        settings.meter_url, json_key=settings.meter_json_key, timeout_s=settings.meter_timeout_s
    )
    if meter is None:
        return None
    return MeterFeed(
        meter,
        clock=clock,
        period_s=settings.meter_period_s,
        max_age_s=settings.meter_max_age_s,
        max_step_kw=settings.meter_max_step_kw,
        max_kw=settings.meter_max_kw,
    )


@dataclass(frozen=True)
class Sample:
    at_s: float  #: monotonic
    gpu_kw: float  #: the placed jobs' GPUs, measured by the agents
    facility_kw: float | None  #: at the meter (or the estimate); None while the meter faults
    #: when what it reads was measured (monotonic) [s]: the meter's reading, or on the
    #: estimate the end of the agents' samples (their telemetry round)
    reading_at_s: float
    #: every reporting GPU, placed or not (a job the scheduler has not reported yet) [kW]
    all_gpu_kw: float = 0.0


class SitePower:
    def __init__(
        self,
        settings: MeterSettings,
        clock: Clock,
        fleet: Fleet,
        book: JobBook,
        overhead: Overhead,
        feed: MeterFeed | None = None,
    ) -> None:
        self.settings, self.clock, self.fleet, self.book = settings, clock, fleet, book
        self.overhead, self.feed = overhead, feed
        self.history: deque[Sample] = deque(maxlen=4096)
        #: how long a stretch of the GPUs' power each facility reading averages before the
        #: site loop's own window [s]: the agents' samples on the estimate; at a meter, 0
        #: (the meter's own averaging is part of its path: `meter_path`)
        self.averaging_s = 0.0
        self._listeners: list[Callable[[], Awaitable[None]]] = []
        self._tasks: list[asyncio.Task[None]] = []

    @property
    def source(self) -> str:
        return self.feed.meter.source if self.feed is not None else ESTIMATE

    def subscribe(self, listener: Callable[[], Awaitable[None]]) -> None:
        """`listener()` is awaited after every sample of the site."""
        self._listeners.append(listener)

    def start(self) -> None:
        if self.feed is not None:
            self._tasks.append(asyncio.create_task(self.feed.run()))
        self._tasks.append(asyncio.create_task(self._sample_forever()))

    def stop(self) -> None:
        for task in self._tasks:
            task.cancel()

    def meter_path(self) -> MeterPath:
        """How a GPU step reaches the facility figure the loop reads: the meter's path, or
        on the estimate the agents' averaging behind their power sensors' lag (the slowest
        agent's, as each models its GPUs' sensor: `flexmodel.sensors`)."""
        if self.feed is None:
            lag_s = max(self.fleet.sensor_lags_s.values(), default=0.0)
            source = f"estimate (the agents' sensor lag {lag_s:g} s)"
            return MeterPath(lag_s, 0.0, self.averaging_s, 0.0, 0.0, source)
        return self.overhead.meter_path()

    def facility_kw(self, gpu_kw: float) -> float:
        """The facility power the overhead model puts on this GPU power [kW]."""
        return self.overhead.current().facility_kw(gpu_kw)

    def envelope(self) -> tuple[float, float]:
        """(baseline facility kW, maximum facility kW): uncapped, and every GPU at its limit."""
        mix = self.book.mix()
        return self.facility_kw(mix.baseline_gpu_kw), self.facility_kw(mix.max_gpu_kw)

    async def _sample_forever(self) -> None:
        period_s = self.settings.meter_period_s
        while True:
            started_s = self.clock.monotonic()
            try:
                await self.sample()
            except Exception:  # the next period tries again
                log.exception("sampling the site failed")
            await self.clock.sleep(period_s - (self.clock.monotonic() - started_s))

    async def sample(self) -> Sample:
        """One sample of the site; the overhead calibration and the listeners see it."""
        power = await self.fleet.power(self.book.mix())
        gpu_kw, now_s = power.gpu_kw, self.clock.monotonic()
        if self.feed is None:
            facility_kw: float | None = self.facility_kw(gpu_kw)
            self.averaging_s = power.span_s
            reading_at_s = now_s if power.at_s is None else power.at_s
        else:
            facility_kw = self.feed.believed_kw()
            self.overhead.record(gpu_kw, facility_kw, self.source)
            last = self.feed.last()
            reading_at_s = now_s if last is None else last.monotonic_s
        sample = Sample(now_s, gpu_kw, facility_kw, reading_at_s, power.all_gpu_kw)
        self.history.append(sample)
        for listener in self._listeners:
            await listener()
        return sample

    def filtered_kw(self, window_s: float) -> float | None:
        """The facility power averaged over the last `window_s` [kW]: the site loop's
        measurement; None while the meter faults or before a whole window was seen."""
        if not self.history or self.history[-1].facility_kw is None:
            return None
        window = self.window(window_s)
        if not window or any(s.facility_kw is None for s in window):
            return None  # a window shorter than a period holds no sample
        if self.history[0].at_s > self.clock.monotonic() - window_s:
            return None
        return sum(s.facility_kw for s in window if s.facility_kw is not None) / len(window)

    def window(self, window_s: float) -> list[Sample]:
        """The samples `filtered_kw` averages over the last `window_s`."""
        since_s = self.clock.monotonic() - window_s
        return [s for s in self.history if s.at_s > since_s]

    def meter_doc(self, gpu_kw: float) -> dict[str, Any]:
        """The `meter` object of `GET /v1/site`: the real meter's state, or the estimate."""
        if self.feed is not None:
            return dict(self.feed.state())
        return {
            "source": ESTIMATE,
            "facility_power_kw": self.facility_kw(gpu_kw),
            "measured_at": self.clock.now(),
            "age_s": 0.0,
            "estimated": True,
            "fault": None,
        }

    @property
    def meter_fault(self) -> str | None:
        return None if self.feed is None else self.feed.state()["fault"]

    async def doc(self) -> dict[str, Any]:
        """The site now: GPU power measured by the agents, facility power at the meter (or
        estimated when there is none or it faults), and what each figure is computed from."""
        power = await self.fleet.power(self.book.mix())
        model = self.overhead.current()
        meter = self.meter_doc(power.gpu_kw)
        metered = meter["facility_power_kw"] if meter["fault"] is None else None
        return {
            "gpu_power_kw": power.gpu_kw,
            "facility_power_kw": (
                metered if metered is not None else model.facility_kw(power.gpu_kw)
            ),
            "baseline_gpu_kw": power.baseline_gpu_kw,
            "baseline_facility_kw": model.facility_kw(power.baseline_gpu_kw),
            "shed_facility_kw": model.k * (power.baseline_gpu_kw - power.gpu_kw),
            "overhead_factor": model.k,
            "overhead_factor_stderr": model.k_stderr,
            "nodes_reporting": power.nodes_reporting,
            "meter": meter,
            "overhead": {**model.doc(), "meter_path": meter_path_doc(self.meter_path())},
            "basis": {
                "gpu_power_kw": f"measured by the {power.nodes_reporting} agent(s) reporting: "
                "the mean of each placed GPU's recent samples",
                "facility_power_kw": (
                    f"read at the meter ({meter['source']})"
                    if metered is not None
                    else f"estimated: static {model.static_kw:g} kW + k {model.k:g} x GPU power"
                ),
                "baseline_gpu_kw": "declared uncapped power of the placed jobs whose nodes "
                "all report",
                "shed_facility_kw": "k x (baseline GPU power - measured GPU power)",
            },
        }
