"""Predicted PFIs for the jobs that declare none (docs/model.md, section 10).

A job with neither `pfi` nor `sweep` in the job mix has the fleet default (1.35 +- 0.30)
until its agents have read its features over its uncapped run (`agents.features`); then it
gets a `predicted` PFI with its standard error, from its DRAM copy product through the
predictor (`flexmodel.predictor`). The error is the within-family one where the job's
`model_family` is one the predictor was fitted on, else at least the group-out error: a job
of a family the fit has not seen is predicted as badly as the study's fit predicts a family
it left out. The job book takes them into the mix it gives plans and
quotes (`JobBook.predict_with`), so the error is carried into firm kW as the default's is.
A declared PFI or a sweep always stays above a prediction.

The predictor is the study's fit until the site has `predictor_min_jobs` measured jobs of its
own (the store's `pfi_records`), then the refit on those: the job mix's sweeps and the curves
measured on site (`gateway.services.curves`) in force, each with the job's features, and
whatever `record` is given. A predictor that does
no better out of sample than the default's error (leave-one-out RMSE at or above 0.30)
predicts nothing: the default is then the better guess.

Every `predictor_period_s` the service reads the fleet's telemetry and updates both; a new
prediction is in force from the next plan or quote on (it re-plans nothing by itself).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from flexmodel.errors import FlexModelError
from flexmodel.jobs import Job
from flexmodel.pfi import DEFAULT_PFI, DEFAULT_PFI_STDERR
from flexmodel.predictor import PfiPredictor, PfiRecord, check_record, choose_predictor
from flexmodel.workload import study_predictor
from gateway.clock import Clock
from gateway.errors import InvalidRequestError
from gateway.services.fleet import Fleet, Telemetry
from gateway.services.jobbook import JobBook
from gateway.services.periodic import Every
from gateway.settings import GatewaySettings
from gateway.store import repo
from gateway.store.db import Store
from gateway.store.models import PfiRecordRow, iso

#: A job's features count once its agents have this many readings behind them.
MIN_FEATURE_SAMPLES = 3
#: Predictions are rounded to this, so the mix changes when a prediction does, not with
#: every reading.
PFI_STEP = 0.01
#: A sweep job's record is rewritten when its feature moves by more than this.
FEATURE_STEP = 0.005
UNKNOWN_FAMILY = "unknown"


@dataclass(frozen=True)
class JobFeature:
    dram_copy_product: float  #: over the job's uncapped run, all its nodes
    samples: int


def job_features(telemetry: Telemetry) -> dict[str, JobFeature]:
    """Each job's DRAM copy product: its nodes' readings, weighted by how many each has."""
    sums: dict[str, list[float]] = {}
    for report in telemetry.values():
        for job in report.jobs:
            if job.dram_copy_product is None or job.feature_samples <= 0:
                continue
            acc = sums.setdefault(job.job_id, [0.0, 0.0])
            acc[0] += job.dram_copy_product * job.feature_samples
            acc[1] += job.feature_samples
    return {j: JobFeature(total / n, int(n)) for j, (total, n) in sums.items()}


class Predictions:
    def __init__(
        self, settings: GatewaySettings, store: Store, clock: Clock, fleet: Fleet, book: JobBook
    ) -> None:
        self.settings, self.store, self.clock, self.fleet, self.book = (
            settings,
            store,
            clock,
            fleet,
            book,
        )
        self.study = study_predictor()
        self.predictor = self.study
        self.features: dict[str, JobFeature] = {}
        self.predicted: dict[str, tuple[float, float]] = {}  #: job id -> (PFI, stderr)
        #: (what they rest on, every job's `job_pfi`): see `job_pfis`
        self._pfis: tuple[tuple[object, ...], list[dict[str, Any]]] | None = None
        # A round that fails is tried again the next period; the predictions stand meanwhile.
        self._every = Every(
            clock, settings.predictor_period_s, self.refresh, "PFI prediction failed"
        )
        self._refit()

    # --- the predictor ----------------------------------------------------------------------

    def records(self) -> list[PfiRecordRow]:
        with self.store.session() as s:
            return repo.load_pfi_records(s)

    def _refit(self) -> None:
        records = [_as_record(r) for r in self.records()]
        self.predictor = choose_predictor(
            records, self.study, min_samples=self.settings.predictor_min_jobs
        )

    @property
    def in_use(self) -> bool:
        return self.predictor.loo_rmse < DEFAULT_PFI_STDERR

    def record(
        self, records: list[PfiRecord], *, source: str, grid_w: list[float] | None = None
    ) -> None:
        """Measured jobs for the site's refit: (feature, measured PFI, model family) each.
        Every record is checked before any is kept (`InvalidRequestError` naming the first
        bad one); a job recorded again replaces its record."""
        for r in records:
            try:
                check_record(r)
            except FlexModelError as exc:
                raise InvalidRequestError(str(exc)) from exc
            if not r.job_id:
                raise InvalidRequestError("a PFI record needs the id of the job it measured")
        now = self.clock.now()
        with self.store.session() as s:
            repo.put_pfi_records(
                s,
                rows=[
                    PfiRecordRow(
                        job_id=r.job_id,
                        feature=r.feature,
                        pfi=r.pfi,
                        model_family=r.group,
                        source=source,
                        grid_w=grid_w,
                        at=now,
                    )
                    for r in records
                ],
            )
            s.commit()
        self._refit()

    # --- the jobs ---------------------------------------------------------------------------

    def start(self) -> None:
        self._every.start()

    def stop(self) -> None:
        self._every.stop()

    async def refresh(self) -> None:
        """Read the fleet's telemetry and update the records and predictions from it."""
        self.update(await self.fleet.telemetry())

    def update(self, telemetry: Telemetry) -> None:
        """The jobs' features from this telemetry: the sweep jobs' records, then every
        undeclared job's prediction, put in force in the job book."""
        self.features = {
            j: f for j, f in job_features(telemetry).items() if f.samples >= MIN_FEATURE_SAMPLES
        }
        self._record_sweeps(self.book.mix().jobs)
        predicted: dict[str, tuple[float, float]] = {}
        if self.in_use:
            for doc in self.book.docs():
                found = self.features.get(doc["id"])
                if found is None or "pfi" in doc or "sweep" in doc:
                    continue
                x = found.dram_copy_product
                value = float(self.predictor.predict(x))
                new = self._new_group(doc)
                error = float(self.predictor.prediction_stderr(x, new_group=new))
                predicted[doc["id"]] = (_step(value), _step(error, up=True))
        self.predicted = predicted
        self.book.predict_with(predicted)

    def _new_group(self, doc: dict[str, Any]) -> bool:
        """Whether the job's model family is one the predictor was not fitted on (a job
        without one counts as new: its error is the group-out one)."""
        return doc.get("model_family") not in self.predictor.group_names

    def _record_sweeps(self, jobs: tuple[Job, ...]) -> None:
        """Record every job whose curve in force is a sweep: declared in the job mix (source
        `sweep`) or measured on site (`measured`, `gateway.services.curves`), again when its
        feature or its PFI moved."""
        known = {r.job_id: r for r in self.records()}
        fresh: dict[str, list[PfiRecord]] = {"sweep": [], "measured": []}
        for job in jobs:
            found = self.features.get(job.id)
            if job.sweep is None or found is None:
                continue
            try:
                pfi = job.pfi_value
            except FlexModelError:  # a sweep no cap slowed has no PFI to learn from
                continue
            old = known.get(job.id)
            if (
                old
                and abs(old.feature - found.dram_copy_product) <= FEATURE_STEP
                and abs(old.pfi - pfi) <= PFI_STEP
            ):
                continue
            source = "measured" if job.id in self.book.measured_in_force else "sweep"
            fresh[source].append(
                PfiRecord(
                    feature=found.dram_copy_product,
                    pfi=pfi,
                    group=job.model_family or UNKNOWN_FAMILY,
                    job_id=job.id,
                )
            )
        for source, records in fresh.items():
            if records:
                self.record(records, source=source)

    # --- what the API shows -----------------------------------------------------------------

    def job_pfis(self) -> list[dict[str, Any]]:
        """`job_pfi` of every job in the book (`GET /v1/jobs`), worked out again only when
        what they rest on was replaced: the jobs, the mix, the features, the predictions or
        the predictor (each is replaced, never changed in place)."""
        docs = self.book.docs()
        key = (docs, self.book.mix(), self.features, self.predicted, self.predictor)
        if self._pfis is None or any(a is not b for a, b in zip(self._pfis[0], key, strict=True)):
            self._pfis = (key, [self.job_pfi(doc) for doc in docs])
        return self._pfis[1]

    def job_pfi(self, doc: dict[str, Any]) -> dict[str, Any]:
        """A job's PFI in force, its standard error and where it comes from: `measured` (a
        fitted curve in force, `gateway.services.curves`), `declared`, `sweep`, `predicted`
        (with the feature it rests on) or `default`."""
        found = self.features.get(doc["id"])
        out: dict[str, Any] = {
            "id": doc["id"],
            "dram_copy_product": None if found is None else found.dram_copy_product,
            "feature_samples": 0 if found is None else found.samples,
        }
        self.book.mix()  # built, so `measured_in_force` is current
        if doc["id"] in self.book.measured_in_force:
            job = self.book.mix().by_id[doc["id"]]
            source = "measured" if job.sweep is not None else "combined"
            return out | {"source": source, "pfi": job.pfi_value, "pfi_stderr": job.pfi_error}
        if "pfi" in doc:
            return out | {
                "source": "declared",
                "pfi": doc["pfi"],
                "pfi_stderr": doc.get("pfi_stderr", 0.0),
            }
        if "sweep" in doc:
            swept = self.book.mix().by_id.get(doc["id"])
            try:
                value = None if swept is None else swept.pfi_value
            except FlexModelError:  # no cap slowed it beyond the noise: no PFI to show
                value = None
            return out | {
                "source": "sweep",
                "pfi": value,
                "pfi_stderr": None if value is None or swept is None else swept.pfi_error,
            }
        if doc["id"] in self.predicted:
            value, error = self.predicted[doc["id"]]
            basis = "leave-one-group-out" if self._new_group(doc) else "leave-one-out"
            return out | {
                "source": "predicted",
                "pfi": value,
                "pfi_stderr": error,
                "error_basis": basis,
            }
        return out | {"source": "default", "pfi": DEFAULT_PFI, "pfi_stderr": DEFAULT_PFI_STDERR}

    def doc(self) -> dict[str, Any]:
        """The predictor in force, the study's fit it started from, the site's records."""
        rows = self.records()
        return {
            "feature": "dram_copy_product",
            "in_use": self.in_use,
            "reason": None
            if self.in_use
            else (
                f"its leave-one-out RMSE {self.predictor.loo_rmse:.3f} is not below the "
                f"default's error {DEFAULT_PFI_STDERR}: jobs keep the default"
            ),
            "fit": _fit_doc(self.predictor),
            "study": _fit_doc(self.study),
            "site_records": len(rows),
            "site_records_needed": self.settings.predictor_min_jobs,
            "records": [_record_doc(r) for r in rows],
            "predicted_jobs": sorted(self.predicted),
        }


def _fit_doc(fit: PfiPredictor) -> dict[str, Any]:
    doc: dict[str, Any] = fit.as_dict()
    doc["pfi_range"] = [doc.pop("pfi_min"), doc.pop("pfi_max")]
    return doc


def _step(value: float, up: bool = False) -> float:
    """Rounded to `PFI_STEP` (an error upwards, never understated)."""
    steps = value / PFI_STEP
    whole = math.ceil(steps - 1e-9) if up else round(steps)
    return round(whole * PFI_STEP, 6)


def _as_record(row: PfiRecordRow) -> PfiRecord:
    return PfiRecord(feature=row.feature, pfi=row.pfi, group=row.model_family, job_id=row.job_id)


def _record_doc(row: PfiRecordRow) -> dict[str, Any]:
    return {
        "job_id": row.job_id,
        "feature": row.feature,
        "pfi": row.pfi,
        "model_family": row.model_family,
        "source": row.source,
        "grid_w": row.grid_w,
        "at": iso(row.at),
    }
