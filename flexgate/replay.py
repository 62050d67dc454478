"""A lab replay of a month at a site: the meter history, its events and their settlement.

`flexgate replay` (docs/operations.md, "Settlement"): weeks of a site's load go into a gateway
store without running anything, then each event runs through the gateway's own services, and
the month is settled as `GET /v1/events/{id}/settlement` settles it.

- The site is `flexgate.lab.simsite.SimulatedSite`: simulated agents and GPUs running the lab's job
  mix, the gateway's planner, targets, closed loop (`Tracker`) and site sampling on a stepped
  clock, a simulated facility meter. Its meter also reads the load besides the cluster
  (`flexgate.lab.loadshape.LoadShape.other_at`: cooling and offices on a daily cycle).
- Quiet stretches (every day without an event, and each event day outside the hours around
  its event) are synthesised from `LoadShape` at `resolution_s` and written through the meter
  history's own write path (`MeterHistory.record`, then its flush: the stored rollups are the
  real ones). The loop does not run then.
- Around each event (from a half hour before it to a half hour after) the site runs a sample
  every meter period: the event's record is written as the events service writes a manual one
  (active with the baseline it began with, then completed), the loop pursues its reduction
  (`Tracker.pursue`, as `bench/campaign_bench.py` drives it), and the meter history keeps the
  site's samples as the gateway does (`MeterHistory.on_sample`). The events service's
  scheduling is the one part not run.

`delivered_kwh` per event is what the replay made it deliver: the site's uncapped load at each
sample (known here: the cluster's uncapped draw plus the other load) less the meter's reading.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import numpy as np

from flexgate.lab.jobs import lab_jobs
from flexgate.lab.loadshape import LoadShape
from flexgate.lab.simsite import SimulatedMeter, SimulatedSite, draw_truth
from gateway.services.meterhistory import MeterHistory
from gateway.services.settlement import Settlement
from gateway.store import repo
from gateway.store.models import EventRow, iso

METER_PERIOD_S = 5.0  #: the simulated site's meter period while the loop runs
OVERHEAD_FACTOR = 1.3  #: declared and true
STATIC_SHARE = 0.2  #: the cluster's own static load, as a share of its GPUs' facility power
OTHER_SHARE = 0.25  #: the load besides the cluster, as a share of the cluster's
NOISE_SHARE = 0.003  #: the meter's noise, one standard deviation as a share of the cluster's
DEPTH = (0.1, 0.25)  #: an event's reduction, as a share of the cluster's uncapped load
START_HOURS = (13.0, 16.0)  #: events start between these local hours, on quarter hours
DURATIONS_MIN = (60, 75, 90, 105, 120)
AROUND = timedelta(minutes=30)  #: the loop runs this long either side of an event (at least)
ALIGN_S = 1800  #: loop stretches begin and end on the history's longest interval
CONTEXT = timedelta(hours=2)  #: the history drawn around an event in the report


class ReplayError(ValueError):
    """A replay that cannot be laid out (more events than weekdays): bad input."""


@dataclass(frozen=True)
class ReplayEvent:
    id: str
    start: datetime  #: UTC
    end: datetime
    reduction_kw: float


@dataclass
class EventRun:
    """What the replay made an event deliver, at the meter."""

    event: ReplayEvent
    delivered_kwh: float = 0.0
    metered_kwh: float = 0.0
    uncapped_kwh: float = 0.0

    def doc(self) -> dict[str, Any]:
        hours = (self.event.end - self.event.start).total_seconds() / 3600
        return {
            "requested_kw": self.event.reduction_kw,
            "delivered_kwh": self.delivered_kwh,
            "mean_delivered_kw": self.delivered_kwh / hours,
            "metered_kwh": self.metered_kwh,
            "uncapped_kwh": self.uncapped_kwh,
        }


@dataclass
class ReplayResult:
    first_day: date  #: the replayed span's (its history before excluded)
    last_day: date
    history_from: date
    holiday: date
    database: Path
    settlements: list[dict[str, Any]]
    events: dict[str, dict[str, Any]]  #: as `GET /v1/events` shows them, in part
    contexts: dict[str, list[dict[str, Any]]]  #: the meter history around each event
    runs: dict[str, EventRun] = field(default_factory=dict)


def default_holiday(first_day: date, days: int) -> date:
    """The replay's holiday: the weekday on or after `min(18, days // 2)` days in."""
    day = first_day + timedelta(days=min(18, days // 2))
    while day.weekday() >= 5:
        day += timedelta(days=1)
    return day


def draw_events(
    days: list[date],
    count: int,
    *,
    shape: LoadShape,
    rng: np.random.Generator,
) -> list[ReplayEvent]:
    """`count` events on distinct weekdays of `days` (holidays not), in the afternoon."""
    weekdays = [d for d in days if not shape.off_day(d)]
    if count > len(weekdays):
        raise ReplayError(
            f"{count} events need as many weekdays; {len(days)} days hold {len(weekdays)}"
        )
    chosen = sorted(rng.choice(len(weekdays), size=count, replace=False))
    out = []
    for k, index in enumerate(chosen):
        quarters = int(rng.integers(START_HOURS[0] * 4, START_HOURS[1] * 4 + 1))
        local = datetime.combine(weekdays[index], time(0), tzinfo=shape.zone)
        start = (local + timedelta(minutes=15 * quarters)).astimezone(UTC)
        minutes = int(rng.choice(DURATIONS_MIN))
        depth = float(rng.uniform(*DEPTH))
        out.append(
            ReplayEvent(
                id=f"replay-{k + 1:02d}",
                start=start,
                end=start + timedelta(minutes=minutes),
                reduction_kw=round(depth * shape.cluster_kw, 1),
            )
        )
    return out


class ShapedMeter:
    """The facility meter: the simulated cluster's meter plus the load besides it."""

    def __init__(self, cluster: SimulatedMeter, shape: LoadShape) -> None:
        self.cluster, self.shape = cluster, shape
        self.source = cluster.source

    async def read_kw(self) -> float:
        return await self.cluster.read_kw() + self.shape.other_at(self.cluster.clock.now())

    async def aclose(self) -> None:
        return None


def _zone(name: str) -> ZoneInfo:
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise ReplayError(f"timezone: no time zone {name!r} in the IANA database") from None


def _align(at: datetime, *, up: bool) -> datetime:
    seconds = at.timestamp() / ALIGN_S
    return datetime.fromtimestamp(
        (math.ceil(seconds) if up else math.floor(seconds)) * ALIGN_S, UTC
    )


class Replay:
    """`await Replay(...).run()`: the whole replay, in `folder` (its store `gateway.db`)."""

    def __init__(
        self,
        *,
        first_day: date,
        days: int,
        events: int,
        folder: Path,
        seed: int = 1,
        history_days: int = 21,
        resolution_s: int = 60,
        nodes: int = 2,
        gpus_per_node: int = 8,
        timezone: str = "UTC",
        rules: str = "10of10,sameday-3+2",
        interval_min: int = 15,
    ) -> None:
        self.first_day, self.days, self.count = first_day, days, events
        self.history_days, self.resolution_s = history_days, resolution_s
        self.rng = np.random.default_rng(seed)
        self.holiday = default_holiday(first_day, days)
        declared = lab_jobs(nodes, gpus_per_node, seed)
        gpu_kw = sum(j["power_w"] * j["gpus"] for j in declared) / 1000.0
        static_kw = round(STATIC_SHARE * OVERHEAD_FACTOR * gpu_kw, 1)
        truth = draw_truth(
            declared, overhead_factor=OVERHEAD_FACTOR, static_kw=static_kw, rng=self.rng
        )
        self.history_from = first_day - timedelta(days=history_days)
        self.site = SimulatedSite(
            declared,
            truth,
            declared_overhead_factor=OVERHEAD_FACTOR,
            meter_period_s=METER_PERIOD_S,
            noise_kw=NOISE_SHARE * OVERHEAD_FACTOR * gpu_kw,
            gpus_per_node=gpus_per_node,
            seed=seed,
            folder=folder,
            start=datetime.combine(self.history_from, time(0), tzinfo=_zone(timezone)),
            static_load_kw=static_kw,
            site_timezone=timezone,
            settlement_rules=rules,
            settlement_interval_min=interval_min,
            settlement_holidays=self.holiday.isoformat(),
        )
        self.settings = self.site.settings
        self.quiet = self.settings.model_copy(update={"meter_period_s": float(resolution_s)})
        self.seed = seed
        self._history: MeterHistory | None = None  #: the loop stretch's, while it runs

    async def run(self) -> ReplayResult:
        site = self.site
        try:
            await site.start()
            shape = LoadShape(
                cluster_kw=site.meter.true_facility_kw(),
                other_kw=OTHER_SHARE * site.meter.true_facility_kw(),
                zone=self.settings.site_zone,
                holidays=frozenset({self.holiday}),
                noise_kw=site.meter.noise_kw,
                seed=self.seed,
            )
            site.feed.meter = ShapedMeter(site.meter, shape)
            site.power.subscribe(self._on_sample)
            days = [self.first_day + timedelta(days=n) for n in range(self.days)]
            events = draw_events(days, self.count, shape=shape, rng=self.rng)
            end = datetime.combine(days[-1] + timedelta(days=1), time(0), tzinfo=shape.zone)
            runs = {}
            for event in events:
                await self._quiet(shape, until=_align(event.start - AROUND, up=False))
                runs[event.id] = await self._event(shape, event)
            await self._quiet(shape, until=end.astimezone(UTC))
            return await self._settle(runs)
        finally:
            site.close()

    async def _on_sample(self) -> None:
        if self._history is not None:
            await self._history.on_sample()

    async def _quiet(self, shape: LoadShape, *, until: datetime) -> None:
        """Synthesise the load up to `until`, a day's samples at a time."""
        clock = self.site.clock
        history = MeterHistory(self.quiet, self.site.store, clock)
        while clock.now() < until:
            step_end = min(clock.now() + timedelta(days=1), until)
            at = clock.now()
            while at < step_end:
                kw = shape.sample(at, self.rng)
                history.record(at=at, kw=kw, estimated=False, fault=False)
                at += timedelta(seconds=self.resolution_s)
            clock.step((step_end - clock.now()).total_seconds())
            await history.flush()

    async def _event(self, shape: LoadShape, event: ReplayEvent) -> EventRun:
        """Run the site from a half hour before the event to a half hour after it."""
        site, clock = self.site, self.site.clock
        self._history = MeterHistory(self.settings, site.store, clock, site.power)
        run = EventRun(event)
        try:
            await self._tick_until(event.start)
            self._write_event(event, "active", baseline_kw=site.power.envelope()[0])
            await site.tracker.pursue(event.id, event.reduction_kw, None)
            while clock.now() < event.end:
                at = clock.now()
                reading = await site.tick()
                uncapped = shape.kw(at)
                hours = METER_PERIOD_S / 3600
                if reading is not None:
                    run.metered_kwh += reading * hours
                    run.delivered_kwh += (uncapped - reading) * hours
                run.uncapped_kwh += uncapped * hours
            site.tracker.release()
            await site.targets.hold(0.0, "idle")
            self._write_event(event, "completed")
            await self._tick_until(_align(event.end + AROUND, up=True))
            await self._history.flush()
        finally:
            self._history = None
        return run

    async def _tick_until(self, until: datetime) -> None:
        while self.site.clock.now() < until:
            await self.site.tick()

    def _write_event(
        self, event: ReplayEvent, status: str, baseline_kw: float | None = None
    ) -> None:
        """The event's record, as the events service keeps a manual one."""
        with self.site.store.session() as s:
            row = repo.get_event(s, event_id=event.id)
            if row is None:
                interval = {
                    "start": iso(event.start),
                    "end": iso(event.end),
                    "reduction_kw": event.reduction_kw,
                }
                row = EventRow(
                    id=event.id,
                    source="manual",
                    status=status,
                    start=event.start,
                    end=event.end,
                    reduction_kw=event.reduction_kw,
                    intervals=[interval],
                    baseline_kw=baseline_kw,
                    created_at=self.site.clock.now(),
                )
                repo.add_event(s, event=row)
            else:
                row.status = status
                s.add(row)
            s.commit()

    async def _settle(self, runs: dict[str, EventRun]) -> ReplayResult:
        """Each event settled as `GET /v1/events/{id}/settlement` answers, and the meter
        history around it as `GET /v1/site/meter` does."""
        site = self.site
        settlement = Settlement(self.settings, site.store, site.clock)
        history = MeterHistory(self.settings, site.store, site.clock)
        length_s = min(self.settings.settlement_interval_min, 30) * 60
        settlements, contexts, events = [], {}, {}
        with site.store.session() as s:
            rows = {e.id: e for e in repo.list_events(s) if e.id in runs}
        for event_id, run in runs.items():
            doc = await settlement.doc(event_id)
            settlements.append(doc)
            row = rows[event_id]
            events[event_id] = {
                "id": row.id,
                "source": row.source,
                "status": row.status,
                "reduction_kw": row.reduction_kw,
                "plan_id": row.plan_id,
            }
            around = await history.doc(
                start=run.event.start - CONTEXT,
                end=run.event.end + CONTEXT,
                length_s=length_s,
                limit=0,
            )
            contexts[event_id] = around["intervals"]
        return ReplayResult(
            first_day=self.first_day,
            last_day=self.first_day + timedelta(days=self.days - 1),
            history_from=self.history_from,
            holiday=self.holiday,
            database=site.folder / "gateway.db",
            settlements=settlements,
            events=events,
            contexts=contexts,
            runs=runs,
        )
