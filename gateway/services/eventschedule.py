"""When each event's moments come: APScheduler (3.x, on the wall clock, as events are) jobs
for its start, its end and each change of its target, named by the event so that a re-armed
event replaces its jobs and a cancelled one drops them. What happens then:
`gateway.services.events`."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import UTC, datetime

from apscheduler.schedulers.asyncio import AsyncIOScheduler

from gateway.clock import Clock
from gateway.store.models import EventRow, as_utc

Moment = Callable[[str], Awaitable[None]]  #: what runs at an event's start or end, by its id


class EventSchedule:
    def __init__(
        self, clock: Clock, begin: Moment, finish: Moment, step: Callable[[], Awaitable[None]]
    ) -> None:
        self.clock, self.begin, self.finish, self.step = clock, begin, finish, step
        self._scheduler = AsyncIOScheduler(timezone=UTC)

    @property
    def running(self) -> bool:
        return bool(self._scheduler.running)

    def start(self) -> None:
        self._scheduler.start()

    def stop(self) -> None:
        self._scheduler.shutdown(wait=False)

    def arm(self, event: EventRow) -> None:
        """Jobs for the event's start, end and each change of its target; a moment already
        past runs at once."""
        now = self.clock.now()
        for action, when in (("start", event.start), ("end", event.end)):
            self._scheduler.add_job(
                self.begin if action == "start" else self.finish,
                "date",
                run_date=max(as_utc(when), now),
                args=[event.id],
                id=f"{action}-{event.id}",
                replace_existing=True,
            )
        for k, interval in enumerate(event.intervals[1:], start=1):
            when = datetime.fromisoformat(interval["start"])
            if when > now:
                self._scheduler.add_job(
                    self.step,
                    "date",
                    run_date=when,
                    id=f"step-{event.id}-{k}",
                    replace_existing=True,
                )

    def disarm(self, event_id: str) -> None:
        """No start or end any more for the event (its steps only re-plan what is active)."""
        for job in (f"start-{event_id}", f"end-{event_id}"):
            if self._scheduler.get_job(job):
                self._scheduler.remove_job(job)
