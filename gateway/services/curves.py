"""Each job's measured curve: the agents' points per cap level, fitted by the one sweep rule.

- **Harvest**: every `curve_harvest_s`, and at the end of each probe, the agents' points per
  cap level (`agents.protocol.CapPoint`) are merged into each job's stored points (a level
  measured over more periods replaces the one kept). Points count only once the job has been
  seen at its uncapped limit (`reference_cap_w` at `max_cap_w`): throughput is `T_ref / T`
  times the job's uncapped throughput. Events add points as probes do: the agents see every cap.
- **Fit**: `fit_points` (`gateway.services.curvefit`) on the points with their stated noise.
  Each fit is stored (`JobCurveRow`) with when.
- **A probe's fit** (`record_probe`): the stretches the probe recorded, read with the job's
  drift across the probe (`fit_probe_levels`); the harvest leaves such a curve alone until
  the next probe: points seen outside a probe have no references, and merging them would
  bring the drift's bias back.
- **In force** (`fields_in_force`, `gateway.services.curveinforce`): a fit good enough
  replaces the job's curve in the job book (`JobBook.use_curves`); one not good enough is
  weighed with the PFI it would replace.
"""

from __future__ import annotations

import asyncio
import math
from typing import Any

from agents.protocol import JobTelemetry
from flexmodel.jobs import Job
from flexmodel.pfi import default_grid_w
from gateway.clock import Clock
from gateway.services.curvefit import fit_points, fit_probe_levels
from gateway.services.curveinforce import fields_in_force
from gateway.services.fleet import Fleet, job_readings
from gateway.services.jobbook import JobBook
from gateway.services.periodic import Every
from gateway.services.probecaps import CAP_RESOLUTION_W
from gateway.settings import GatewaySettings
from gateway.store import repo
from gateway.store.db import Store
from gateway.store.models import JobCurveRow, iso


def points_of(reading: JobTelemetry, job: Job, origin: str, at: str) -> list[dict[str, Any]]:
    """An agent's points for `job` in the job's units; none before it was seen uncapped."""
    reference = reading.reference_cap_w
    if reference is None or reference < job.max_cap_w - CAP_RESOLUTION_W:
        return []
    out = []
    for p in reading.points:
        if p.relative_throughput is None:
            continue
        out.append(
            {
                "cap_w": p.cap_w,
                "power_w": p.power_w,
                "power_stderr_w": p.power_stderr_w,
                "throughput_fraction": p.relative_throughput,
                "throughput": p.relative_throughput * job.throughput,
                "throughput_stderr": (p.relative_throughput_stderr or 0.0) * job.throughput,
                "period_s": p.period_s,
                "periods": p.periods,
                "origin": origin,
                "at": at,
            }
        )
    return out


def merged(old: list[dict[str, Any]], new: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The points by level: a level measured over at least as many periods replaces the one
    kept."""
    by_cap = {round(p["cap_w"] / CAP_RESOLUTION_W): p for p in old}
    for point in new:
        key = round(point["cap_w"] / CAP_RESOLUTION_W)
        kept = by_cap.get(key)
        if kept is None or (point["periods"] >= kept["periods"] and _differs(point, kept)):
            by_cap[key] = point
    return [by_cap[k] for k in sorted(by_cap)]


def _differs(a: dict[str, Any], b: dict[str, Any]) -> bool:
    keys = ("power_w", "throughput", "periods")
    return any(not math.isclose(a[k], b[k], rel_tol=1e-9) for k in keys)


class JobCurves:
    def __init__(
        self,
        settings: GatewaySettings,
        store: Store,
        clock: Clock,
        book: JobBook,
        fleet: Fleet,
    ) -> None:
        self.settings, self.store, self.clock, self.book, self.fleet = (
            settings,
            store,
            clock,
            book,
            fleet,
        )
        self._lock = asyncio.Lock()
        # A round that fails reads again the next; the agents keep their points meanwhile.
        self._every = Every(
            clock,
            settings.curve_harvest_s,
            self.harvest,
            "reading the jobs' measured points failed",
        )

    def start(self) -> None:
        self.book.use_curves(self.in_force())
        self._every.start()

    def stop(self) -> None:
        self._every.stop()

    def latest(self) -> dict[str, JobCurveRow]:
        with self.store.session() as s:
            return repo.latest_job_curves(s)

    def in_force(self) -> dict[str, dict[str, Any]]:
        """The job-mix fields each fit sets over the job's declared ones (`fields_in_force`)."""
        rows = self.latest()
        if not rows:
            return {}
        jobs = {j.id: j for j in self.book.validate(self.book.docs()).jobs}
        out = {}
        for job_id, row in rows.items():
            job = jobs.get(job_id)
            if job is not None and row.fit is not None:
                fields, _ = self._fields(job, row.fit)
                if fields is not None:
                    out[job_id] = fields
        return out

    def _fields(
        self, job: Job, fit: dict[str, Any] | None
    ) -> tuple[dict[str, Any] | None, str | None]:
        return fields_in_force(
            job,
            fit,
            max_stderr=self.settings.curve_max_pfi_stderr,
            extension=self.settings.curve_extend,
            interpolation=self.settings.curve_interpolation,
            shape=self.settings.curve_shape,
        )

    async def harvest(
        self, job_ids: set[str] | None = None, origin: str = "telemetry"
    ) -> list[str]:
        """Merge the agents' points into the stored curves and fit those that changed; the
        ids of the jobs whose curve changed."""
        async with self._lock:
            readings = {r.job_id: r for r in job_readings(await self.fleet.telemetry())}
            jobs = {j.id: j for j in self.book.mix().jobs}
            stored = self.latest()
            at = self.clock.now()
            changed = []
            for job_id, reading in readings.items():
                job = jobs.get(job_id)
                if job is None or (job_ids is not None and job_id not in job_ids):
                    continue
                if job_id in stored and _from_probe(stored[job_id]):
                    continue  # a probe's drift-corrected curve stands until the next probe
                old = stored[job_id].points if job_id in stored else []
                points = merged(old, points_of(reading, job, origin, at.isoformat()))
                if points == old or not points:
                    continue
                fit = fit_points(points, name=f"job '{job_id}' measured curve")
                with self.store.session() as s:
                    repo.add_job_curve(
                        s,
                        curve=JobCurveRow(
                            job_id=job_id, at=at, source="measured", points=points, fit=fit
                        ),
                    )
                    s.commit()
                changed.append(job_id)
            # Every round: what a fit must beat moves too (a job's prediction is refitted).
            self.book.use_curves(self.in_force())
            return changed

    async def record_probe(
        self, probe_id: str, measured: dict[str, list[dict[str, Any]]]
    ) -> tuple[set[str], list[str]]:
        """Fit and store each job's probe with its drift (`fit_probe_levels`): (the jobs it
        could read, those whose curve changed)."""
        async with self._lock:
            jobs = {j.id: j for j in self.book.mix().jobs}
            at = self.clock.now()
            fitted: set[str] = set()
            for job_id, levels in measured.items():
                job = jobs.get(job_id)
                found = None
                if job is not None:
                    found = fit_probe_levels(
                        levels,
                        job.throughput,
                        name=f"job '{job_id}' probe {probe_id}",
                        at=at.isoformat(),
                        probe_id=probe_id,
                    )
                if found is None:
                    continue
                points, fit = found
                with self.store.session() as s:
                    row = JobCurveRow(
                        job_id=job_id, at=at, source="measured", points=points, fit=fit
                    )
                    repo.add_job_curve(s, curve=row)
                    s.commit()
                fitted.add(job_id)
            self.book.use_curves(self.in_force())
            return fitted, sorted(fitted)

    def describe(
        self, doc: dict[str, Any], row: JobCurveRow | None, *, points: bool
    ) -> dict[str, Any]:
        """A job's curve as the API shows it (`doc`: the job as declared): where it comes from,
        the PFI with its error and grid, and (with `points`) the measured points and the fit."""
        fields, why_not = None, None
        if row is not None:
            fields, why_not = self._fields(self.book.validate([doc]).jobs[0], row.fit)
        combined = fields if why_not is not None else None
        return curve_doc(
            doc, row, why_not, combined, extension=self.settings.curve_extend, points=points
        )


def _from_probe(row: JobCurveRow) -> bool:
    """Whether the curve is a probe's fit with its drift measured."""
    return row.fit is not None and row.fit.get("drift") is not None


def curve_doc(
    doc: dict[str, Any],
    row: JobCurveRow | None,
    why_not: str | None,
    combined: dict[str, Any] | None,
    *,
    extension: str,
    points: bool,
) -> dict[str, Any]:
    """A job's curve as the API shows it (`doc`: the job as declared, `why_not` the reason
    its fit is not in force, `combined` the PFI in force weighed from it and the one it
    would replace)."""
    fit = row.fit if row is not None else None
    used = row is not None and why_not is None
    kind = "sweep" if doc.get("sweep") else ("pfi" if doc.get("pfi") is not None else None)
    source = "declared" if kind else "default"
    out: dict[str, Any] = {
        "source": "measured" if used else ("combined" if combined else source),
        "declared": None
        if kind is None
        else {
            "kind": kind,
            "pfi": doc.get("pfi"),
            "pfi_stderr": doc.get("pfi_stderr"),
            "grid_w": list(doc.get("pfi_grid_w") or default_grid_w(int(doc["gpus"]))),
        },
        "measured": None,
        # the fit's PFI on the job's own grid weighed with the one it would replace
        "combined": None
        if combined is None
        else {
            "pfi": combined["pfi"],
            "pfi_stderr": combined["pfi_stderr"],
            "grid_w": list(doc.get("pfi_grid_w") or default_grid_w(int(doc["gpus"]))),
        },
    }
    if row is not None and fit is not None:
        out["measured"] = {
            "at": iso(row.at),
            "in_force": used,
            "why_not": why_not,
            "pfi": fit.get("pfi"),
            "pfi_stderr": fit.get("pfi_stderr"),
            "pfi_measured": fit.get("pfi_measured"),
            "grid_w": fit.get("grid_w"),
            "levels": len(row.points),
            # below its lowest level the curve in force is the fleet family at this PFI
            "extension": extension,
            # PFIs compare only on one grid: a probe within the floor reaches fewer caps
            "same_grid_as_declared": out["declared"] is not None
            and fit.get("grid_w") == out["declared"]["grid_w"],
            # a probe's drift across it, measured from its uncapped references and removed
            # (its uncertainty is in pfi_stderr); null for points seen without references
            "drift": fit.get("drift"),
        }
    if points:
        out["points"] = row.points if row is not None else []
        out["fit"] = fit
    return out
