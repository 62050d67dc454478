"""Deliveries: what each event shed at the meter, kept with the event.

After every sample of the site, while the site loop pursues an event, the sample's facility
power is compared with the loop's reference, what the site would draw without the event (the
meter before it, moved by the model as the jobs changed). The difference, and the reduction
asked for (the reference less the loop's target), are added to the event's record in the store,
each weighted by the time since the previous sample. A gap longer than `MAX_GAP_PERIODS` meter
periods (a fault, a restart) counts as `MAX_GAP_PERIODS` periods, so the averages are over the
time the meter was read. Nothing is recorded while the meter faults or the loop is off.

A ceiling (an import capacity limit) is judged as a utility judges it: the metered power's mean
over each averaging interval (`FLEXGATE_LIMIT_INTERVAL_S`, from `FLEXGATE_LIMIT_RAMP_S` after
the limit began) against the limit; the record counts the intervals judged, those above, and
the highest mean. A limit is met when none was above.

The record feeds back into what the site promises: `recent` reads the last completed events'
deliveries for the quotes (`flexmodel.quote.history_factor`), so a site that delivered less
than planned quotes less. Only completed events the plan judged feasible: a cancelled one was
stopped partway, an active one is still ramping, and one asked beyond what the model said
the site could shed measures the request, not the model.
"""

from __future__ import annotations

from typing import Any

from sqlmodel import Session

from flexmodel.quote import Delivered
from gateway.clock import Clock
from gateway.services.pursuit import Pursuit
from gateway.services.site import Sample, SitePower
from gateway.services.tracking import Tracker
from gateway.store import repo
from gateway.store.db import Store
from gateway.store.models import DeliveryRow, iso

MAX_GAP_PERIODS = 3.0
#: An event asked for less than this on average [kW] says nothing of the site's delivery.
MIN_REQUESTED_KW = 0.1


class Deliveries:
    def __init__(self, store: Store, clock: Clock, site: SitePower, tracker: Tracker) -> None:
        self.store, self.clock, self.site, self.tracker = store, clock, site, tracker
        self._last: tuple[str, float] | None = None  #: (event id, monotonic) of the last sample
        #: the ceiling's averaging interval in progress: (event id, index, kW s, s)
        self._interval: tuple[str, int, float, float] | None = None

    async def sample(self) -> None:
        """Add the site's latest sample to the pursued event's delivery (a `SitePower`
        listener, after the site loop's step)."""
        pursuit, history = self.tracker.pursuit, self.site.history
        if not self.tracker.settings.tracking or pursuit is None or not history:
            self._last = None
            return
        latest = history[-1]
        reference, target = pursuit.reference_kw, pursuit.target_kw
        if latest.facility_kw is None or reference is None or target is None:
            return  # a faulted meter: the time until it answers again is not counted
        period_s = self.tracker.config.period_s
        seconds = period_s
        if self._last is not None and self._last[0] == pursuit.event_id:
            seconds = min(latest.at_s - self._last[1], MAX_GAP_PERIODS * period_s)
        self._last = (pursuit.event_id, latest.at_s)
        with self.store.session() as s:
            repo.add_delivery_sample(
                s,
                event_id=pursuit.event_id,
                meter_source=self.site.source,
                at=self.clock.now(),
                seconds=seconds,
                requested_kw=reference
                - (
                    pursuit.level_kw if pursuit.ceiling and pursuit.level_kw is not None else target
                ),
                delivered_kw=reference - latest.facility_kw,
            )
            if pursuit.ceiling and pursuit.level_kw is not None:
                self._judge_limit(s, pursuit, pursuit.level_kw, latest, seconds)
            s.commit()

    def _judge_limit(
        self, session: Session, pursuit: Pursuit, limit_kw: float, latest: Sample, seconds: float
    ) -> None:
        """Add the sample to its averaging interval; count an interval once it is whole."""
        assert latest.facility_kw is not None
        settings = self.tracker.settings
        since_s = latest.at_s - pursuit.target_since_s - settings.limit_ramp_s
        if since_s < 0:
            return
        index = int(since_s // settings.limit_interval_s)
        known = self._interval
        if known is not None and (known[0], known[1]) != (pursuit.event_id, index):
            event_id, _, kws, measured_s = known
            if event_id == pursuit.event_id and measured_s >= settings.limit_interval_s / 2:
                repo.add_limit_interval(
                    session, event_id=event_id, limit_kw=limit_kw, mean_kw=kws / measured_s
                )
            known = None
        if known is None:
            known = (pursuit.event_id, index, 0.0, 0.0)
        kws = known[2] + latest.facility_kw * seconds
        self._interval = (known[0], index, kws, known[3] + seconds)


def delivery_doc(row: DeliveryRow) -> dict[str, Any]:
    """An event's `delivery` object in the API: its averages over the time the meter was read."""
    seconds = max(row.seconds, 1e-9)
    return {
        "meter_source": row.meter_source,
        "requested_kw": row.requested_kws / seconds,
        "delivered_kw": row.delivered_kws / seconds,
        "delivered_kwh": row.delivered_kws / 3600.0,
        "measured_s": row.seconds,
        "samples": row.samples,
        "first_at": iso(row.first_at),
        "last_at": iso(row.last_at),
        "limit": None
        if row.limit_kw is None
        else {
            "limit_kw": row.limit_kw,
            "intervals": row.limit_intervals,
            "above": row.limit_intervals_above,
            "worst_kw": row.limit_worst_kw,
            "met": not row.limit_intervals_above,
        },
    }


def recent(store: Store, last: int) -> list[Delivered]:
    """What the last `last` completed events asked for and delivered at the meter, newest
    first (their time averages, `delivery_doc`)."""
    if last <= 0:
        return []
    with store.session() as s:
        rows = repo.latest_deliveries(s, statuses=("completed",), limit=last)
    out = []
    for row in rows:
        doc = delivery_doc(row)
        if row.seconds > 0 and doc["requested_kw"] >= MIN_REQUESTED_KW:
            out.append(Delivered(row.event_id, doc["requested_kw"], doc["delivered_kw"]))
    return out
