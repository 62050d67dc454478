"""The fast path's events (docs/fast.md): the one a trigger records, renewed by the triggers
while it lasts, completed at its end, and released along the ramp-up limit.

- **One event, renewed.** A trigger records a fast event (source `fast`, status `triggered`);
  a trigger while it lasts renews it (`_renew`): no new event. Its status is no live status:
  the event scheduler never plans it; the agents hold its caps for its duration by their
  lease, whatever happens to the gateway.
- **Completed.** At its end (`completed`); a restarted gateway completes the ones over and
  holds the others (`resume`).
- **Held.** While one lasts (`holding`) the site loop holds its correction.
- **Released.** With FLEXGATE_RAMP_UP_KW_PER_MIN set its shed is taken over by the ordinary
  path before its end and stepped back at the limit (`_ramped_release`).
"""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime, timedelta
from typing import Any

from gateway.clock import Clock
from gateway.services.targets import Targets
from gateway.store import repo
from gateway.store.db import Store
from gateway.store.models import EventRow, as_utc

log = logging.getLogger("flexgate.gateway")
#: With a ramp-up limit, the ordinary path takes a fast event's shed over this long before
#: its end (half the event's length if shorter): time to plan and send it to every node [s].
RELEASE_LEAD_S = 5.0


class FastEvents:
    def __init__(self, store: Store, clock: Clock, release: Targets | None) -> None:
        """`release`: the ordinary path that steps a fast event's end back along the ramp-up
        limit (none: the caps end at once)."""
        self.store, self.clock, self.release = store, clock, release
        self.depth_pct: float | None = None  #: the depth of the last trigger
        self.duration_s = 0.0  #: the last trigger's length [s]
        self.depth_kw = 0.0  #: the last trigger's planned reduction at the meter [kW]
        self.until_s: float | None = None  #: the fast event in force ends (monotonic) [s]
        self.current: str | None = None  #: the fast event in force (or last), its id
        self._tasks: list[asyncio.Task[None]] = []

    @property
    def holding(self) -> bool:
        """Whether a fast event lasts now (the site loop holds its correction)."""
        return self.until_s is not None and self.clock.monotonic() < self.until_s

    def stop(self) -> None:
        for task in self._tasks:
            task.cancel()

    def fire(
        self,
        seq: int,
        depth_pct: float,
        duration_s: float,
        reduction_kw: float,
        cause: str | None,
        external_id: str | None,
    ) -> tuple[EventRow, bool]:
        """Trigger `seq`, sent: the fast event in force renewed, or a new one recorded (with
        `cause` in its reason, `external_id` on its record); (the event, whether renewed).
        `reduction_kw`: its depth's planned reduction at the meter [kW]."""
        running = self.current if self.holding else None
        self.until_s = self.clock.monotonic() + duration_s  # the agents hold the last trigger's
        self.depth_pct, self.duration_s = depth_pct, duration_s
        self.depth_kw = reduction_kw
        if running is not None:
            return self._renew(running, seq, depth_pct, duration_s), True
        reason = f"fast trigger at {depth_pct:g}% of the site" + (f": {cause}" if cause else "")
        event = self._record(seq, depth_pct, duration_s, reason, external_id)
        self.current = event.id
        self._tasks.append(asyncio.create_task(self._complete(event.id)))
        if self.release is not None:
            self._tasks.append(asyncio.create_task(self._ramped_release(event.id)))
        return event, False

    def _interval(self, seq: int, depth_pct: float, duration_s: float) -> dict[str, Any]:
        """A stretch of a fast event at one depth, as its record keeps it: the triggers that
        started and renewed it."""
        now = self.clock.now()
        return {
            "start": now.isoformat(),
            "end": (now + timedelta(seconds=duration_s)).isoformat(),
            "reduction_kw": round(self.depth_kw, 3),
            "depth_pct": depth_pct,
            "triggers": [{"seq": seq, "at": now.isoformat()}],
        }

    def _record(
        self,
        seq: int,
        depth_pct: float,
        duration_s: float,
        reason: str,
        external_id: str | None,
    ) -> EventRow:
        now = self.clock.now()
        interval = self._interval(seq, depth_pct, duration_s)
        event = EventRow(
            id=f"fast-{seq}",
            source="fast",
            status="triggered",
            start=now,
            end=datetime.fromisoformat(interval["end"]),
            reduction_kw=interval["reduction_kw"],
            intervals=[interval],
            reason=reason,
            external_id=external_id,
            created_at=now,
        )
        with self.store.session() as s:
            repo.add_event(s, event=event)
            s.commit()
        return event

    def _renew(self, event_id: str, seq: int, depth_pct: float, duration_s: float) -> EventRow:
        """A trigger while fast event `event_id` lasts: the event now ends with this trigger
        (the agents hold its lease). At the depth in force its stretch is renewed (the
        trigger added to it); at another depth (deeper, or shallower as a droop's frequency
        recovers) a new stretch starts now; the event's `reduction_kw` is its deepest."""
        interval = self._interval(seq, depth_pct, duration_s)
        with self.store.session() as s:
            event = repo.get_event(s, event_id=event_id)
            assert event is not None, f"the fast event {event_id} in force is not stored"
            stretches = [dict(i) for i in event.intervals]
            last = stretches[-1]
            if last.get("depth_pct") == depth_pct:
                last["end"] = interval["end"]
                last["triggers"] = [*last.get("triggers", []), *interval["triggers"]]
            else:
                last["end"] = interval["start"]
                stretches.append(interval)
            event.intervals = stretches  # a new list: the JSON column is written again
            event.end = datetime.fromisoformat(interval["end"])
            event.reduction_kw = max(float(i["reduction_kw"]) for i in stretches)
            s.add(event)
            s.commit()
            s.refresh(event)
        return event

    def resume(self) -> None:
        """Fast events a previous run recorded: completed when over, else held (the site loop
        too) and completed at their end. The agents held their caps by their lease meanwhile."""
        now = self.clock.now()
        with self.store.session() as s:
            fast = [e for e in repo.list_events(s, statuses=("triggered",)) if e.source == "fast"]
        for event in fast:
            left_s = (as_utc(event.end) - now).total_seconds()
            if left_s > 0.0 and left_s > (self.until_s or 0.0) - self.clock.monotonic():
                self.until_s = self.clock.monotonic() + left_s
                self.current = event.id
                last = event.intervals[-1]
                self.depth_pct, self.duration_s = last.get("depth_pct"), left_s
                self.depth_kw = float(last["reduction_kw"])
            self._tasks.append(asyncio.create_task(self._complete(event.id)))
        if self.current is not None and self.release is not None:
            self._tasks.append(asyncio.create_task(self._ramped_release(self.current)))

    async def _complete(self, event_id: str) -> None:
        """Completed at its end; renewals move the end on, so it is read again on waking."""
        while True:
            with self.store.session() as s:
                event = repo.get_event(s, event_id=event_id)
                if event is None:
                    return
                left_s = (as_utc(event.end) - self.clock.now()).total_seconds()
                if left_s <= 0.0:
                    event.status = "completed"
                    s.add(event)
                    s.commit()
                    break
            await self.clock.sleep(left_s)
        if self.current == event_id:
            self.current = None

    async def _ramped_release(self, event_id: str) -> None:
        """The end of fast event `event_id` along the ramp-up limit: RELEASE_LEAD_S before
        its caps' lease ends (half its length, if shorter) the ordinary path takes over its
        shed (`Targets.take_over`: the same reduction, planned and sent as an ordinary plan
        each agent holds under the fast caps), then at the end steps it back at the limit
        (`Targets.release`). A renewal moves both on; a deeper one is taken over again."""
        assert self.release is not None
        taken_kw: float | None = None
        try:
            while self.until_s is not None and self.current == event_id:
                left_s = self.until_s - self.clock.monotonic()
                lead_s = min(RELEASE_LEAD_S, self.duration_s / 2.0)
                if left_s <= 0.0:
                    break
                kw = self.depth_kw
                if taken_kw is None or kw > taken_kw:
                    if left_s > lead_s + 1e-6:  # (not woken again by a rounding's worth)
                        await self.clock.sleep(left_s - lead_s)
                        continue  # read again: a renewal may have moved the end
                    taken = await self.release.take_over(kw, event_id)
                    if taken is None:
                        log.info("fast event %s ends into the event in force", event_id)
                        return
                    if taken != event_id:
                        log.info("fast event %s ends into event %s along the ramp", event_id, taken)
                        return
                    taken_kw = kw
                await self.clock.sleep(left_s)
            if taken_kw is not None:
                self.release.release()
        except Exception:  # the agents' leases end the caps regardless
            log.exception("fast event %s: its ramped release failed", event_id)
