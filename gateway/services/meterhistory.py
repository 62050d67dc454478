"""The meter history: the site's facility power kept as interval data, for settlement.

Every sample the site takes (`SitePower`, each meter period) is kept: the meter's reading, or
the site's estimate where there is no meter (`estimated`) or where the meter was faulted or
suspected (`fault`: its value is then the estimate the site's figures fell back to). A
suspicion dates from before it is raised (`MeterFeed.suspect_since_s`): the samples kept from
then on are marked too, and their intervals rolled up again.

Recording a sample only appends it to a buffer, keyed by its UTC millisecond (a sample taken
within the same millisecond as the last, as when a slow sample is followed at once by the next,
is kept a millisecond later). Every `FLEXGATE_METER_HISTORY_FLUSH_S`, at
every read, and when the gateway stops, the buffer is written in one batch in a worker thread
(never a commit per sample on the event loop), so a clean stop loses nothing the history was
given; a crash, at most one flush period. A batch the store refuses goes back to the buffer.

Each write then closes every interval whose end has passed: its 1-, 5-, 15- and 30-minute
means (`INTERVAL_LENGTHS_S`, aligned on UTC) are rolled up from the stored samples, so a
restart inside an interval loses none of it. An interval records how many samples it holds,
their `coverage` (samples over those the meter period gives it, at most 1), a `gap` when more
than one is missing (one may fall across a boundary by jitter), the share `estimated` or
faulted and whether any `fault` was inside. An interval with no sample is not stored: readers
(`repo.meter_intervals`) see it as a gap. Samples are kept `FLEXGATE_METER_HISTORY_RAW_KEEP_S`,
intervals `FLEXGATE_METER_HISTORY_KEEP_DAYS`. Times are UTC: the local clock intervals of a
utility's baseline are built from these.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import math
import threading
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlmodel import Session

from gateway.clock import Clock
from gateway.meter import MeterFeed
from gateway.services.site import SitePower
from gateway.settingsgroups.meter import MeterSettings
from gateway.store import repo
from gateway.store.db import Store
from gateway.store.models import (
    INTERVAL_LENGTHS_S,
    MeterInterval,
    MeterSample,
    epoch_ms,
    from_epoch_ms,
    iso,
)

log = logging.getLogger("flexgate.gateway")

#: (at_ms, kW, estimated, fault): one sample as buffered and rolled up.
Point = tuple[int, float, bool, bool]
#: The samples a roll-up reads at once [ms]: six hours, a multiple of every interval length.
CHUNK_MS = 6 * 3600 * 1000
#: The most samples held while the store does not answer (a day at 1 s); older ones go first.
MAX_BUFFER = 86_400


def roll_up(points: Sequence[Point], *, length_s: int, period_s: float) -> list[dict[str, Any]]:
    """The intervals of `length_s` the samples (oldest first) fall in, as `MeterIntervalRow`
    fields; `period_s` is the meter period, which says how many samples an interval should
    hold."""
    step_ms = length_s * 1000
    expected = length_s / period_s
    out = []
    for start_ms, group in itertools.groupby(points, key=lambda p: p[0] // step_ms * step_ms):
        members = list(group)
        count = len(members)
        marked = sum(1 for p in members if p[2] or p[3])
        out.append(
            {
                "length_s": length_s,
                "start_ms": start_ms,
                "mean_kw": math.fsum(p[1] for p in members) / count,
                "samples": count,
                "coverage": min(1.0, count / expected),
                "gap": count < expected - 1,
                "estimated_share": marked / count,
                "estimated": marked > 0,
                "fault": any(p[3] for p in members),
            }
        )
    return out


class MeterHistory:
    def __init__(
        self,
        settings: MeterSettings,
        store: Store,
        clock: Clock,
        site: SitePower | None = None,
    ) -> None:
        """`site`: the samples `on_sample` keeps; None where `record` is called instead."""
        self.settings, self.store, self.clock, self.site = settings, store, clock, site
        self._buffer: list[Point] = []
        #: stretches [from, to) [ms] of samples already taken that a suspicion reaches back to
        self._marks: list[tuple[int, int]] = []
        self._buffer_lock = threading.Lock()  #: the buffer: the loop appends, a writer takes
        self._write_lock = threading.Lock()  #: one writer at a time, batches in order
        self._flushing = asyncio.Lock()
        self._inflight: asyncio.Future[None] | None = None
        self._closed: dict[int, int] | None = None  #: per length, rolled up to [ms]
        self._suspect_since_s: float | None = None
        self._task: asyncio.Task[None] | None = None
        self.dropped = 0  #: samples dropped from a full buffer
        self._last_ms = 0  #: the last sample's key [UTC ms]

    def start(self) -> None:
        """Write what was recorded every flush period (`on_sample` follows the site's
        samples once subscribed to it)."""
        self._task = asyncio.create_task(self._flush_forever())

    async def stop(self) -> None:
        """Write everything given so far (after the site has stopped sampling)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        try:
            await self.flush()
        except Exception:
            log.exception("writing the meter history at shutdown failed")

    def record(self, *, at: datetime, kw: float, estimated: bool, fault: bool) -> None:
        """Keep one sample (written at the next flush)."""
        with self._buffer_lock:
            # Samples are keyed by their millisecond: two taken within one (a sample that took
            # longer than the meter period is followed at once by the next) keep both, the
            # later a millisecond on, where the store would keep only the first.
            at_ms = max(epoch_ms(at), self._last_ms + 1)
            self._last_ms = at_ms
            self._buffer.append((at_ms, kw, estimated, fault))
            if len(self._buffer) > MAX_BUFFER:
                del self._buffer[0]
                self.dropped += 1

    async def on_sample(self) -> None:
        """A `SitePower` listener (the first, so a sample is kept whatever the others do):
        keep the sample the site just took."""
        assert self.site is not None
        sample = self.site.history[-1]
        now, now_s = self.clock.now(), self.clock.monotonic()
        at = now - timedelta(seconds=now_s - sample.at_s)
        feed = self.site.feed
        if feed is not None:
            self._follow_suspicion(feed, now, now_s)
        if sample.facility_kw is not None:
            self.record(at=at, kw=sample.facility_kw, estimated=feed is None, fault=False)
        else:  # the meter faults: the estimate stands in, as in the site's figures
            kw = self.site.facility_kw(sample.gpu_kw)
            self.record(at=at, kw=kw, estimated=True, fault=True)

    def _follow_suspicion(self, feed: MeterFeed, now: datetime, now_s: float) -> None:
        since_s = feed.suspect_since_s
        if since_s is not None and since_s != self._suspect_since_s:
            now_ms = epoch_ms(now)
            with self._buffer_lock:
                self._marks.append((now_ms - round((now_s - since_s) * 1000), now_ms))
        self._suspect_since_s = since_s

    async def flush(self) -> None:
        """Write the buffer and close the intervals that have ended, in a worker thread."""
        async with self._flushing:
            if self._inflight is not None and not self._inflight.done():
                # a flush whose caller was cancelled is still writing: batches go in order
                with contextlib.suppress(Exception):
                    await asyncio.shield(self._inflight)
            with self._buffer_lock:
                batch, self._buffer = self._buffer, []
                marks, self._marks = self._marks, []
                now_ms = epoch_ms(self.clock.now())
            self._inflight = asyncio.ensure_future(
                asyncio.to_thread(self._write, batch, marks, now_ms)
            )
            await asyncio.shield(self._inflight)

    async def _flush_forever(self) -> None:
        while True:
            await self.clock.sleep(self.settings.meter_history_flush_s)
            try:
                await self.flush()
            except Exception:  # kept in the buffer for the next try
                log.exception("writing the meter history failed")

    def _write(self, batch: list[Point], marks: list[tuple[int, int]], now_ms: int) -> None:
        with self._write_lock:
            try:
                with self.store.session() as s:
                    repo.add_meter_samples(
                        s,
                        rows=[
                            {"at_ms": at_ms, "kw": kw, "estimated": est, "fault": fault}
                            for at_ms, kw, est, fault in batch
                        ],
                    )
                    for since_ms, until_ms in marks:
                        repo.mark_meter_fault(s, since_ms=since_ms, until_ms=until_ms)
                    dirty_ms = min((m[0] for m in marks), default=None)
                    closed = self._roll_up(s, now_ms, dirty_ms)
                    now = from_epoch_ms(now_ms)
                    repo.prune_meter_history(
                        s,
                        samples_before=now
                        - timedelta(seconds=self.settings.meter_history_raw_keep_s),
                        intervals_before=now
                        - timedelta(days=self.settings.meter_history_keep_days),
                    )
                    s.commit()
                self._closed = closed
            except Exception:
                with self._buffer_lock:
                    self._buffer[:0] = batch
                    self._marks[:0] = marks
                raise

    def _roll_up(self, s: Session, now_ms: int, dirty_ms: int | None) -> dict[int, int]:
        """Roll up every interval that ended by `now_ms` and is not stored yet, and those
        from `dirty_ms` on; the new ends of what is rolled up, per length."""
        closed = dict(self._closed if self._closed is not None else repo.meter_intervals_closed(s))
        first_ms = repo.first_meter_sample_ms(s)
        if first_ms is None:
            return closed
        spans: dict[int, tuple[int, int]] = {}
        for length_s in INTERVAL_LENGTHS_S:
            step_ms = length_s * 1000
            begin_ms = closed.get(length_s, 0)
            if dirty_ms is not None:
                begin_ms = min(begin_ms, dirty_ms // step_ms * step_ms)
            begin_ms = max(begin_ms, first_ms // step_ms * step_ms)
            end_ms = now_ms // step_ms * step_ms
            if end_ms > begin_ms:
                spans[length_s] = (begin_ms, end_ms)
        if not spans:
            return closed
        low_ms = min(begin for begin, _ in spans.values())
        high_ms = max(end for _, end in spans.values())
        period_s = self.settings.meter_period_s
        for chunk_ms in range(low_ms // CHUNK_MS * CHUNK_MS, high_ms, CHUNK_MS):
            points = repo.meter_sample_tuples(
                s, start_ms=max(chunk_ms, low_ms), end_ms=min(chunk_ms + CHUNK_MS, high_ms)
            )
            for length_s, (begin_ms, end_ms) in spans.items():
                lo_ms, hi_ms = max(begin_ms, chunk_ms), min(end_ms, chunk_ms + CHUNK_MS)
                if hi_ms <= lo_ms:
                    continue
                inside = [p for p in points if lo_ms <= p[0] < hi_ms]
                repo.replace_meter_intervals(
                    s,
                    length_s=length_s,
                    start_ms=lo_ms,
                    end_ms=hi_ms,
                    rows=roll_up(inside, length_s=length_s, period_s=period_s),
                )
        for length_s, (_, end_ms) in spans.items():
            closed[length_s] = end_ms
        return closed

    async def intervals(
        self, *, start: datetime, end: datetime, length_s: int
    ) -> list[MeterInterval]:
        """The closed intervals of `length_s` overlapping [start, end), gaps included
        (`repo.meter_intervals`), after writing what is buffered."""
        await self.flush()
        step = timedelta(seconds=length_s)
        now = self.clock.now()
        closed_end = now - (now - datetime.fromtimestamp(0, now.tzinfo)) % step
        end = min(end, closed_end)
        if end <= start:
            return []

        def read() -> list[MeterInterval]:
            with self.store.session() as s:
                return repo.meter_intervals(s, start=start, end=end, length_s=length_s)

        return await asyncio.to_thread(read)

    async def samples(
        self, *, start: datetime, end: datetime, limit: int | None = None
    ) -> list[MeterSample]:
        """The samples taken in [start, end), after writing what is buffered."""
        await self.flush()

        def read() -> list[MeterSample]:
            with self.store.session() as s:
                return repo.meter_samples(s, start=start, end=end, limit=limit)

        return await asyncio.to_thread(read)

    async def doc(
        self, *, start: datetime, end: datetime, length_s: int | None, limit: int
    ) -> dict[str, Any]:
        """`GET /v1/site/meter`: the intervals of `length_s` (None: the raw samples, at most
        `limit`) over [start, end)."""
        doc: dict[str, Any] = {
            "interval_s": length_s,
            "start": iso(start),
            "end": iso(end),
            "meter_period_s": self.settings.meter_period_s,
        }
        if length_s is None:
            doc["samples"] = [
                {"at": iso(p.at), "power_kw": p.kw, "estimated": p.estimated, "fault": p.fault}
                for p in await self.samples(start=start, end=end, limit=limit)
            ]
            return doc
        doc["intervals"] = [
            {
                "start": iso(i.start),
                "end": iso(i.end),
                "mean_kw": i.mean_kw,
                "samples": i.samples,
                "coverage": i.coverage,
                "gap": i.gap,
                "estimated_share": i.estimated_share,
                "estimated": i.estimated,
                "fault": i.fault,
            }
            for i in await self.intervals(start=start, end=end, length_s=length_s)
        ]
        return doc
