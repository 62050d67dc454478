"""The job book: the site's job mix as stored, validated whole before anything is kept.

It holds the parsed mix and the quotes made on it until the mix changes (a quote depends on
nothing else), and tells its listeners (the events, which re-plan) after every change.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from flexmodel.errors import FlexModelError
from flexmodel.jobmix import parse_job_mix
from flexmodel.jobs import JobMix
from flexmodel.quote import quote
from gateway.clock import Clock
from gateway.errors import InvalidRequestError, NotFoundError
from gateway.services.overhead import Overhead, OverheadModel
from gateway.store import repo
from gateway.store.db import Store

#: Quotes kept at most (by parameters and by raw request body) before the cache starts over.
QUOTE_CACHE = 256


def site_mix(jobs: list[dict[str, Any]], overhead: OverheadModel) -> JobMix:
    """These jobs with the site's overhead in force, validated by flexmodel."""
    try:
        return parse_job_mix(
            {
                "overhead_factor": overhead.k,
                "overhead_factor_stderr": overhead.k_stderr,
                "static_load_kw": overhead.static_kw,
                "jobs": jobs,
            }
        )
    except FlexModelError as exc:
        raise InvalidRequestError(str(exc)) from exc


class JobBook:
    def __init__(self, store: Store, clock: Clock, overhead: Overhead) -> None:
        self.store, self.clock, self.overhead = store, clock, overhead
        overhead.subscribe(self._forget)
        self._mix: JobMix | None = None
        self._quotes: dict[tuple[float | None, float, float] | bytes, bytes] = {}
        self._listeners: list[Callable[[], Awaitable[None]]] = []

    def subscribe(self, listener: Callable[[], Awaitable[None]]) -> None:
        """`listener()` is awaited after every change of the mix."""
        self._listeners.append(listener)

    def docs(self) -> list[dict[str, Any]]:
        with self.store.session() as s:
            return repo.load_jobs(s)

    def mix(self) -> JobMix:
        if self._mix is None:
            self._mix = site_mix(self.docs(), self.overhead.current())
            self._quotes.clear()
        return self._mix

    async def replace(self, docs: list[dict[str, Any]], actor: str) -> JobMix:
        mix = site_mix(docs, self.overhead.current())  # refused whole, before anything is stored
        with self.store.session() as s:
            repo.replace_jobs(s, docs=docs)
            self._audit(s, actor, "jobs.replace", {"jobs": len(docs)})
            s.commit()
        await self._changed(mix)
        return mix

    async def put(self, doc: dict[str, Any], actor: str) -> bool:
        """Add or replace one job; True when it is new."""
        docs = self.docs()
        new = doc["id"] not in {d.get("id") for d in docs}
        merged = [*docs, doc] if new else [doc if d.get("id") == doc["id"] else d for d in docs]
        mix = site_mix(merged, self.overhead.current())  # refused whole, before anything is stored
        with self.store.session() as s:
            repo.put_job(s, doc=doc)
            self._audit(s, actor, "jobs.put", {"id": doc["id"]})
            s.commit()
        await self._changed(mix)
        return new

    async def delete(self, job_id: str, actor: str) -> None:
        with self.store.session() as s:
            if not repo.delete_job(s, job_id=job_id):
                raise NotFoundError(f"no job '{job_id}'")
            self._audit(s, actor, "jobs.delete", {"id": job_id})
            s.commit()
        await self._changed(None)

    def _forget(self) -> None:
        """The overhead in force changed: the mix is rebuilt with it when next asked for."""
        self._mix, self._quotes = None, {}

    def _audit(self, session: Any, actor: str, action: str, detail: dict[str, Any]) -> None:
        repo.audit(session, actor=actor, action=action, detail=detail, at=self.clock.now())

    async def _changed(self, mix: JobMix | None) -> None:
        self._mix, self._quotes = mix, {}
        for listener in self._listeners:
            await listener()

    def quote(
        self,
        reduction_kw: float | None,
        window_s: float,
        confidence: float,
        raw: bytes | None = None,
    ) -> bytes:
        """A quote as JSON; kept until the job mix changes, by its parameters and by the
        request's raw body, so a repeated request skips parsing too."""
        key = (reduction_kw, window_s, confidence)
        mix = self.mix()
        if key not in self._quotes:
            if len(self._quotes) >= QUOTE_CACHE:
                self._quotes.clear()
            doc = quote(mix, window_s=window_s, confidence=confidence, reduction_kw=reduction_kw)
            self._quotes[key] = json.dumps(doc, allow_nan=False).encode()
        if raw is not None:
            self._quotes[raw] = self._quotes[key]
        return self._quotes[key]

    def cached_quote(self, raw: bytes) -> bytes | None:
        """The answer to exactly this request body, if the mix has not changed since."""
        self.mix()  # a changed mix clears the cache
        return self._quotes.get(raw)
