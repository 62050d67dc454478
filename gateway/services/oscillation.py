"""The site's oscillation, watched (docs/sync.md, "The site's oscillation").

Grid rules for large loads bound the oscillation a load injects in a band (by default
0.1-20 Hz, `FLEXGATE_OSCILLATION_BAND_*_HZ`). Each check reads the site's power from the two
sources the gateway has and gives, per source, the swing at the fleet's dominant periods and
the RMS within the band (`flexmodel.oscillation.site_oscillation`), each clamped to what the
source can see:

- `meter`: the facility meter's readings (every `FLEXGATE_METER_PERIOD_S`: a meter read every
  5 s sees nothing above 0.1 Hz, so the default band is out of its reach: null, and why);
- `agents`: the GPUs' power, the sum of every agent's recent samples (their sample interval,
  0.1 s in the simulated backend: up to 5 Hz). Over NATS an agent publishes one mean a period,
  which is no trace: null, and why.

With `FLEXGATE_OSCILLATION_LIMIT_KW` set, an in-band RMS above it at either source is the
alarm: scattering starts on it (`gateway.services.scattering`) and `/metrics` shows it.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np

from flexmodel.oscillation import site_oscillation
from gateway.services.fleet import Fleet, Telemetry, job_readings
from gateway.services.jobbook import JobBook
from gateway.services.site import SitePower
from gateway.settings import GatewaySettings

#: The meter readings a check reads (the newest), and the fleet's periods it reports.
METER_SAMPLES = 256
DOMINANT_PERIODS = 3
#: The fewest samples a source needs to give a spectrum.
MIN_SAMPLES = 8


class OscillationWatch:
    def __init__(
        self, settings: GatewaySettings, site: SitePower, fleet: Fleet, book: JobBook
    ) -> None:
        self.settings, self.site, self.fleet, self.book = settings, site, fleet, book
        self.band_hz = (settings.oscillation_band_low_hz, settings.oscillation_band_high_hz)
        self.last: dict[str, Any] | None = None  #: the last check's document

    async def check(self) -> dict[str, Any]:
        """Both sources now, and the alarm: `GET /v1/sync`'s `oscillation`."""
        telemetry = await self.fleet.telemetry()
        periods = self._dominant_periods(telemetry)
        sources = {
            "meter": self._source(*self._meter_trace(), periods),
            "agents": self._source(*_agents_trace(telemetry), periods),
        }
        limit = self.settings.oscillation_limit_kw
        over = [
            name
            for name, doc in sources.items()
            if limit is not None and doc["rms_kw"] is not None and doc["rms_kw"] > limit
        ]
        self.last = {
            "band_hz": list(self.band_hz),
            "limit_kw": limit,
            "alarm": bool(over),
            "alarm_sources": over,
            "periods_s": periods,
            **sources,
        }
        return self.last

    def alarm_reason(self) -> str | None:
        """Why the last check raised the alarm; None where it did not."""
        last = self.last
        if last is None or not last["alarm"]:
            return None
        found = ", ".join(f"{name} {last[name]['rms_kw']:.3g} kW" for name in last["alarm_sources"])
        low, high = last["band_hz"]
        return f"oscillation in {low:g}-{high:g} Hz above {last['limit_kw']:g} kW RMS: {found}"

    def _source(
        self, power_kw: list[float], sample_s: float, why: str | None, periods: list[float]
    ) -> dict[str, Any]:
        """One source's figures, or null figures with the reason it has none."""
        empty = {"sample_period_s": sample_s or None, "samples": len(power_kw)}
        if why is None and len(power_kw) < MIN_SAMPLES:
            why = f"{len(power_kw)} samples: at least {MIN_SAMPLES} are needed"
        if why is not None:
            return empty | {"band_observed_hz": None, "rms_kw": None, "swings": [], "reason": why}
        doc = site_oscillation(power_kw, sample_s, periods_s=periods, band_hz=self.band_hz)
        return empty | {key: doc[key] for key in ("band_observed_hz", "rms_kw", "swings", "reason")}

    def _meter_trace(self) -> tuple[list[float], float, str | None]:
        """The meter's newest readings, evenly spaced by its period; the reason where none."""
        if self.site.feed is None:
            return [], 0.0, "no meter: the site's power is the agents' estimate"
        readings = list(self.site.history)[-METER_SAMPLES:]
        kept: list[float] = []
        for sample in reversed(readings):  # the newest stretch without a fault
            if sample.facility_kw is None:
                break
            kept.append(sample.facility_kw)
        return kept[::-1], self.settings.meter_period_s, None

    def _dominant_periods(self, telemetry: Telemetry) -> list[float]:
        """The periods of the jobs that swing the site most (their GPUs' power), as the agents
        measure them where they do."""
        measured = {j.job_id: j.period_s for j in job_readings(telemetry) if j.period_s}
        swings = sorted(
            (
                (job.gpus * job.power_w, measured.get(job.id) or job.period_s)
                for job in self.book.mix().waving
            ),
            reverse=True,
        )
        periods: list[float] = []
        for _, period in swings:
            if all(abs(period - p) > 0.01 * p for p in periods):
                periods.append(float(period))
            if len(periods) == DOMINANT_PERIODS:
                break
        return periods


def _agents_trace(telemetry: Telemetry) -> tuple[list[float], float, str | None]:
    """The GPUs' power summed over every agent's recent samples [kW], on the sample interval
    most of them use (the newest samples aligned: each agent's trace ends at its answer)."""
    traces = [(g.sample_interval_s, g.power_w) for t in telemetry.values() for g in t.gpus]
    if not traces:
        return [], 0.0, "no agent reports"
    interval = Counter(round(s, 6) for s, _ in traces).most_common(1)[0][0]
    same = [np.asarray(p, dtype=float) for s, p in traces if round(s, 6) == interval and p]
    length = min((len(p) for p in same), default=0)
    if length < MIN_SAMPLES:
        return (
            [],
            interval,
            (
                "the agents send no sample traces (over NATS, one mean a telemetry period)"
                if length <= 1
                else f"the agents' traces hold {length} samples: at least {MIN_SAMPLES} are needed"
            ),
        )
    total_w = np.sum([p[-length:] for p in same], axis=0)
    return [float(v) / 1000.0 for v in total_w], interval, None
