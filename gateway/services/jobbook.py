"""The job book: the site's job mix as stored, validated whole before anything is kept.

It holds the parsed mix until it changes (`version` counts the changes), and tells its
listeners (the events, which re-plan) after every change.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from flexmodel.errors import FlexModelError
from flexmodel.jobmix import parse_job_mix
from flexmodel.jobs import JobMix
from gateway.clock import Clock
from gateway.errors import InvalidRequestError, NotFoundError
from gateway.services.overhead import Overhead, OverheadModel
from gateway.store import repo
from gateway.store.db import Store


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
        self.version = 0  #: rises with every change of the mix in force
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
            self.version += 1
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
        self._mix = None

    def _audit(self, session: Any, actor: str, action: str, detail: dict[str, Any]) -> None:
        repo.audit(session, actor=actor, action=action, detail=detail, at=self.clock.now())

    async def _changed(self, mix: JobMix | None) -> None:
        self._mix = mix
        self.version += 1
        for listener in self._listeners:
            await listener()
