"""The site's power at the meter: what it draws now, what it would draw uncapped, the shed.

Facility power is modelled from the agents' GPU power: `static_load_kw + k * gpu_kw`, with
`k` the overhead factor (MODEL.md section 4). Baselines count the placed jobs only: a job
without a placement can be neither measured nor capped.
"""

from __future__ import annotations

from typing import Any

from gateway.clock import Clock
from gateway.meter import MeterFeed, open_meter
from gateway.services.fleet import Fleet, placed_gpu_kw
from gateway.services.jobbook import JobBook
from gateway.settings import GatewaySettings


def open_feed(
    settings: GatewaySettings, *, clock: Clock, max_kw: float | None = None
) -> MeterFeed | None:
    """The feed `FLEXGATE_METER_*` describe, or None without a meter URL (the site's estimate
    stands in, labelled `estimated`). `max_kw` is the site's physical maximum, if known."""
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
        max_kw=max_kw,
    )


class SitePower:
    def __init__(self, settings: GatewaySettings, fleet: Fleet, book: JobBook) -> None:
        self.settings, self.fleet, self.book = settings, fleet, book

    def facility_kw(self, gpu_kw: float) -> float:
        """The facility power the overhead model puts on this GPU power [kW]."""
        return self.settings.static_load_kw + self.settings.overhead_factor * gpu_kw

    def envelope(self) -> tuple[float, float]:
        """(baseline facility kW, maximum facility kW): uncapped, and every GPU at its limit."""
        baseline_kw, max_kw = placed_gpu_kw(self.book.mix())
        return self.facility_kw(baseline_kw), self.facility_kw(max_kw)

    async def doc(self) -> dict[str, Any]:
        """The site now: GPU power measured by the agents, at the meter by the model."""
        power = await self.fleet.power(self.book.mix())
        k = self.settings.overhead_factor
        return {
            "gpu_power_kw": power.gpu_kw,
            "facility_power_kw": self.facility_kw(power.gpu_kw),
            "baseline_gpu_kw": power.baseline_gpu_kw,
            "baseline_facility_kw": self.facility_kw(power.baseline_gpu_kw),
            "shed_facility_kw": k * (power.baseline_gpu_kw - power.gpu_kw),
            "overhead_factor": k,
            "overhead_factor_stderr": self.settings.overhead_factor_stderr,
            "nodes_reporting": power.nodes_reporting,
        }
