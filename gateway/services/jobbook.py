"""The job book: the site's job mix as stored, validated whole before anything is kept.

It holds the parsed mix until it changes (`version` counts the changes), and tells its
listeners (the events, which re-plan) after every change. A job's `tier` is read in the site's
tier table. Measured curves good enough to use (`use_curves`, from `gateway.services.curves`)
are laid over the jobs as stored when the mix is built; the stored jobs stay as declared. When
a scheduler is the source of the jobs (`managed_by`), the API's changes are
refused and the source's view comes in through `follow`, each job started or ended audited
with its user and account. PFIs predicted for the jobs that declare none
(`gateway.services.predictions`) are laid over the stored jobs in the mix it gives
(`predict_with`); what is stored and shown as the job stays what was given.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from sqlmodel import Session

from flexmodel.errors import FlexModelError
from flexmodel.jobmix import parse_job_mix
from flexmodel.jobs import JobMix
from flexmodel.tiers import DEFAULT_TIERS, TierTable
from gateway.clock import Clock
from gateway.errors import ConflictError, InvalidRequestError, NotFoundError
from gateway.services.overhead import Overhead, OverheadModel
from gateway.store import repo
from gateway.store.db import Store

log = logging.getLogger("flexgate.gateway")


def site_mix(
    jobs: list[dict[str, Any]], overhead: OverheadModel, tiers: TierTable = DEFAULT_TIERS
) -> JobMix:
    """These jobs with the site's overhead in force, validated by flexmodel."""
    try:
        return parse_job_mix(
            {
                "overhead_factor": overhead.k,
                "overhead_factor_stderr": overhead.k_stderr,
                "static_load_kw": overhead.static_kw,
                "jobs": jobs,
            },
            tiers=tiers,
        )
    except FlexModelError as exc:
        raise InvalidRequestError(str(exc)) from exc


def with_predictions(
    docs: list[dict[str, Any]], predicted: dict[str, tuple[float, float]]
) -> list[dict[str, Any]]:
    """The jobs with a predicted PFI where they declare neither a PFI nor a sweep."""
    out = []
    for doc in docs:
        found = predicted.get(doc.get("id", ""))
        if found is None or "pfi" in doc or "sweep" in doc:
            out.append(doc)
        else:
            out.append({**doc, "pfi": found[0], "pfi_stderr": found[1]})
    return out


class JobBook:
    def __init__(
        self,
        store: Store,
        clock: Clock,
        overhead: Overhead,
        tiers: TierTable = DEFAULT_TIERS,
        managed_by: str | None = None,
    ) -> None:
        self.store, self.clock, self.overhead, self.tiers = store, clock, overhead, tiers
        self.managed_by = managed_by  #: the scheduler the jobs come from; None: the API
        overhead.subscribe(self._forget)
        self._mix: JobMix | None = None
        self._docs: list[dict[str, Any]] | None = None  #: the jobs as stored, once read
        self.version = 0  #: rises with every change of the mix in force
        self._listeners: list[Callable[[], Awaitable[None]]] = []
        self._curves: dict[str, dict[str, Any]] = {}  #: job id -> measured fields in force
        self.measured_in_force: set[str] = set()  #: the jobs the mix holds measured curves for
        self._predicted: dict[str, tuple[float, float]] = {}  #: job id -> (PFI, stderr)

    def subscribe(self, listener: Callable[[], Awaitable[None]]) -> None:
        """`listener()` is awaited after every change of the mix."""
        self._listeners.append(listener)

    def docs(self) -> list[dict[str, Any]]:
        """The jobs as stored (read once per change: every write goes through the book;
        callers do not change them)."""
        if self._docs is None:
            with self.store.session() as s:
                self._docs = repo.load_jobs(s)
        return self._docs

    def mix(self) -> JobMix:
        if self._mix is None:
            self._mix = self._with_measured_curves(self.docs())
            self.version += 1
        return self._mix

    def use_curves(self, curves: dict[str, dict[str, Any]]) -> None:
        """Measured curves in force from now on (job id -> the job-mix fields they set)."""
        if curves == self._curves:
            return
        self._curves = curves
        self._mix = None

    def _with_measured_curves(self, docs: list[dict[str, Any]]) -> JobMix:
        """The mix with the measured curves laid over the declared jobs; as declared when the
        overlay does not validate (a job's bounds changed since), with a warning."""
        laid = [d | self._curves[d["id"]] if d.get("id") in self._curves else d for d in docs]
        self.measured_in_force = set()
        if laid == docs:
            return self.validate(docs)
        try:
            mix = self.validate(laid)
        except InvalidRequestError as exc:
            log.warning("measured curves not used: %s", exc)
            return self.validate(docs)
        self.measured_in_force = {d["id"] for d in docs if d.get("id") in self._curves}
        return mix

    def validate(self, docs: list[dict[str, Any]]) -> JobMix:
        """These jobs as the site's mix, with the predicted PFIs of those that declare none;
        `InvalidRequestError` naming the first problem."""
        return site_mix(
            with_predictions(docs, self._predicted), self.overhead.current(), self.tiers
        )

    def predict_with(self, predicted: dict[str, tuple[float, float]]) -> None:
        """These predicted PFIs (job id -> (PFI, standard error)) in the mix from now on, for
        jobs with neither `pfi` nor `sweep`; no re-plan (the next plan or quote uses them)."""
        if predicted != self._predicted:
            self._predicted = dict(predicted)
            self._mix = None

    async def replace(self, docs: list[dict[str, Any]], actor: str) -> JobMix:
        self._refuse_when_managed()
        mix = self.validate(docs)  # refused whole, before anything is stored
        with self._writing() as s:
            repo.replace_jobs(s, docs=docs)
            self._audit(s, actor, "jobs.replace", {"jobs": len(docs)})
        await self._changed(mix)
        return mix

    async def put(self, doc: dict[str, Any], actor: str) -> bool:
        """Add or replace one job; True when it is new."""
        self._refuse_when_managed()
        docs = self.docs()
        new = doc["id"] not in {d.get("id") for d in docs}
        merged = [*docs, doc] if new else [doc if d.get("id") == doc["id"] else d for d in docs]
        mix = self.validate(merged)  # refused whole, before anything is stored
        with self._writing() as s:
            repo.put_job(s, doc=doc)
            self._audit(s, actor, "jobs.put", {"id": doc["id"]})
        await self._changed(mix)
        return new

    async def delete(self, job_id: str, actor: str) -> None:
        self._refuse_when_managed()
        with self._writing() as s:
            if not repo.delete_job(s, job_id=job_id):
                raise NotFoundError(f"no job '{job_id}'")
            self._audit(s, actor, "jobs.delete", {"id": job_id})
        await self._changed(None)

    async def follow(
        self, docs: list[dict[str, Any]], actor: str, entries: list[tuple[str, dict[str, Any]]]
    ) -> JobMix:
        """The source's whole view, with an audit entry (action, detail) for each change."""
        mix = self.validate(docs)  # refused whole, before anything is stored
        with self._writing() as s:
            repo.replace_jobs(s, docs=docs)
            for action, detail in entries:
                self._audit(s, actor, action, detail)
        await self._changed(mix)
        return mix

    def retime(self, docs: list[dict[str, Any]]) -> None:
        """The source's view with only the jobs' time left moved on: stored and in force for
        quotes, with no audit entry and no re-plan (caps do not depend on it)."""
        mix = self.validate(docs)
        with self._writing() as s:
            repo.replace_jobs(s, docs=docs)
        self._mix = None if self._curves else mix
        self.version += 1

    @contextlib.contextmanager
    def _writing(self) -> Iterator[Session]:
        """A session that changes the stored jobs: committed at the end of the block, and the
        jobs kept from the store read again after it (every write to them comes through here)."""
        with self.store.session() as s:
            yield s
            s.commit()
        self._docs = None

    def _refuse_when_managed(self) -> None:
        if self.managed_by is not None:
            raise ConflictError(
                f"the job mix follows {self.managed_by} (FLEXGATE_JOB_SOURCE={self.managed_by}): "
                "change the jobs there; POST /v1/jobs/refresh reads it now"
            )

    def _forget(self) -> None:
        """The overhead in force changed: the mix is rebuilt with it when next asked for."""
        self._mix = None

    def _audit(self, session: Any, actor: str, action: str, detail: dict[str, Any]) -> None:
        repo.audit(session, actor=actor, action=action, detail=detail, at=self.clock.now())

    async def _changed(self, mix: JobMix | None) -> None:
        self._mix = None if self._curves else mix
        self.version += 1
        for listener in self._listeners:
            await listener()
