"""Each job's measured curve: the agents' points per cap level, fitted by the one sweep rule.

- **Harvest**: every `curve_harvest_s`, and at the end of each probe, the agents' points per
  cap level (`agents.protocol.CapPoint`) are merged into each job's stored points (a level
  measured over more periods replaces the one kept). Points count only once the job has been
  seen at its uncapped limit (`reference_cap_w` at `max_cap_w`): throughput is `T_ref / T`
  times the job's uncapped throughput. Events add points as probes do: the agents see every cap.
- **Fit**: `flexmodel.sweeps.fit_sweep` on the points with their stated noise: the PFI with its
  standard error on the measured grid (nothing extrapolated; PFIs compare only on one grid),
  the monotone curve, the points set aside. Each fit is stored (`JobCurveRow`) with when.
- **A probe's fit** (`record_probe`, `fit_probe_levels`): the stretches the probe recorded, in
  the order run, with the uncapped references that bracket its capped levels, read by
  `flexmodel.drift.fit_probe`: the job's drift in power and throughput across the probe is
  measured from the references, removed from every level, and its uncertainty added to the
  PFI's error (`fit["drift"]`). Its points are the levels so corrected; the harvest leaves
  such a curve alone until the next probe: points seen outside a probe have no references,
  and merging them would bring the drift's bias back.
- **In force** (`fields_in_force`): a fit whose PFI's standard error is at most
  `curve_max_pfi_stderr`, or below that of the PFI it would replace (a prediction's, the
  default's), replaces the job's curve in the job book (`JobBook.use_curves`), as a sweep in
  the job-mix form with the fitted error, so plans and quotes use it and firm kW carries its
  uncertainty. Its shape (`curve_shape`): by default the fleet family's at the fitted PFI
  on the measured grid, through the measured uncapped level (`sweep_interpolation: family`):
  the few measured levels, each off by its noise and the drift left after its removal, give
  the PFI and the uncapped level well, their shape between them badly, and a planner given a
  cubic through them allocates on its wiggles (docs/benchmarks.md, "PFI measured on site by
  probing"). With `curve_shape=points`, the points themselves: a monotone cubic between the
  levels (`curve_interpolation`) and below the lowest the fleet family at the fitted PFI
  (`curve_extend`, `flexmodel.curves.extend_below`). Either way measuring a job never makes
  it less flexible to the planner than its prediction did. A fit not good enough for that is
  weighed with the PFI it would replace, on the job's own grid (`combined`).
"""

from __future__ import annotations

import asyncio
import logging
import math
from dataclasses import replace
from typing import Any

from agents.protocol import JobTelemetry
from flexmodel.curves import EXPONENT, STATIC_SHARE, FamilyShape
from flexmodel.drift import ProbeLevel, fit_probe
from flexmodel.dvfs import ClockShape, family_shape, fit_clock_shape
from flexmodel.errors import FlexModelError
from flexmodel.jobmix import PFI_RANGE
from flexmodel.jobs import CARRY_SHAPE_REL, Job, pfi_on_own_grid
from flexmodel.pfi import combined_estimate, default_grid_w, fitted_family_pfi
from flexmodel.sweeps import MeasuredSweep, fit_sweep
from gateway.clock import Clock
from gateway.services.fleet import Fleet, job_readings
from gateway.services.jobbook import JobBook
from gateway.services.periodic import Every
from gateway.services.probecaps import CAP_RESOLUTION_W
from gateway.settings import GatewaySettings
from gateway.store import repo
from gateway.store.db import Store
from gateway.store.models import JobCurveRow, iso

log = logging.getLogger("flexgate.gateway")


def fit_points(points: list[dict[str, Any]], *, name: str) -> dict[str, Any]:
    """The one sweep rule on measured points (`cap_w`, `power_w`, `throughput` and their
    errors): the PFI with its error on the grid of the caps that bound, and the fitted curve;
    `error` says why there is none."""
    if len(points) < 2:
        return {"error": "needs a capped level besides the uncapped run", "pfi": None}
    rows = [(p["cap_w"], p["power_w"], p["throughput"]) for p in points]
    noise = max((_relative_error(p) for p in points), default=0.0)
    try:
        sweep = fit_sweep(rows, name=name, noise=min(noise, 0.5))
    except FlexModelError as exc:
        return {"error": str(exc), "pfi": None}
    uncapped = max(points, key=lambda p: p["cap_w"])
    return _fit_doc(sweep, uncapped.get("power_stderr_w"))


def fit_probe_levels(
    levels: list[dict[str, Any]], throughput: float, *, name: str, at: str, probe_id: str
) -> tuple[list[dict[str, Any]], dict[str, Any]] | None:
    """A probe's stretches (`Probe.measured`: the order run, each with its cap, times, power
    and period) read with their drift (`flexmodel.drift.fit_probe`): (the points, each level
    corrected for the drift, in the job's units; the fit, with `drift`). None when there is
    no uncapped reference and capped level, each with a period, to read. `throughput`: the
    job's uncapped throughput, what the references' mean period stands for."""
    timed = [lv for lv in levels if lv.get("period_s") and lv.get("start_s") is not None]
    if not timed:
        return None
    uncapped = max(lv["cap_w"] for lv in timed)
    refs = [lv for lv in timed if lv["cap_w"] == uncapped]
    if len(refs) == len(timed):
        return None
    ref_period = sum(lv["period_s"] for lv in refs) / len(refs)
    probe = [
        ProbeLevel(
            cap_w=lv["cap_w"],
            time_s=0.5 * (lv["start_s"] + lv["end_s"]),
            power_w=lv["power_w"],
            throughput=throughput * ref_period / lv["period_s"],
        )
        for lv in timed
    ]
    noise_t = max((lv["period_stderr_s"] or 0.0) / lv["period_s"] for lv in timed)
    noise_p = max((lv["power_stderr_w"] or 0.0) / lv["power_w"] for lv in timed)
    try:
        drift = fit_probe(probe, name=name, noise=min(noise_t, 0.5), power_noise=min(noise_p, 0.5))
    except FlexModelError as exc:
        return [], {"error": str(exc), "pfi": None}
    sweep = drift.sweep
    shape = clock_shape_of(timed, uncapped, drift.power_drift_per_s)
    ref_power_se = [lv["power_stderr_w"] for lv in refs if lv["power_stderr_w"]]
    power_se = None if not ref_power_se else max(ref_power_se) / len(refs) ** 0.5
    fit = _fit_doc(sweep, power_se) | {
        "drift": {
            "power_per_s": drift.power_drift_per_s,
            "power_stderr_per_s": drift.power_drift_stderr_per_s,
            "throughput_per_s": drift.throughput_drift_per_s,
            "throughput_stderr_per_s": drift.throughput_drift_stderr_per_s,
            "pfi_stderr": drift.pfi_drift_stderr,
            "references": drift.references,
        },
        "shape": shape.as_doc(),
        "levels": levels,
    }
    by_cap: dict[float, list[dict[str, Any]]] = {}
    for lv in timed:
        by_cap.setdefault(lv["cap_w"], []).append(lv)
    points = [
        {
            "cap_w": float(c),
            "power_w": float(p),
            "power_stderr_w": power_se if c == uncapped else by_cap[c][-1]["power_stderr_w"],
            "throughput_fraction": float(t) / throughput,
            "throughput": float(t),
            "throughput_stderr": float(t) * sweep.throughput_noise_fraction,
            "period_s": ref_period * throughput / float(t),
            "periods": sum(lv["periods"] for lv in by_cap[c]),
            "origin": "probe",
            "probe_id": probe_id,
            "drift_corrected": True,
            "at": at,
        }
        for c, p, t in zip(sweep.cap_w, sweep.power_w, sweep.throughput, strict=True)
    ]
    return points, fit


def clock_shape_of(
    levels: list[dict[str, Any]], uncapped_w: float, power_drift_per_s: float
) -> ClockShape:
    """The job's power-to-clock shape from a probe's stretches (`flexmodel.dvfs`): at each
    capped level the compute phase's power and SM clock relative to the uncapped references'
    means (their compute level corrected for the drift they measured, as the PFI's points
    are). A capped level's compute power is its cap: the firmware holds the compute phase at
    the cap and lowers the clock until it does, so a reading below the cap is the job's own
    drift or the sensor's noise, not the clock's doing. Errors: the clock's from its stated
    error, the power's from the references' scatter (at least `flexmodel.dvfs.NOISE_FLOOR`).
    The family's shape, and why, where the clock or the levels are missing."""
    read = [
        lv
        for lv in levels
        if lv.get("compute_w") and lv.get("compute_sm_clock_mhz") and lv.get("start_s") is not None
    ]
    refs = [lv for lv in read if lv["cap_w"] == uncapped_w]
    capped = [lv for lv in read if lv["cap_w"] < uncapped_w]
    if not refs or not capped:
        return family_shape("no SM clock was read at the uncapped and a capped level")
    mid = sum(_middle(lv) for lv in refs) / len(refs)

    def compute_w(lv: dict[str, Any]) -> float:
        return float(lv["compute_w"]) / (1.0 + power_drift_per_s * (_middle(lv) - mid))

    ref_w = [compute_w(lv) for lv in refs]
    ref_power = sum(ref_w) / len(ref_w)
    ref_clock = sum(lv["compute_sm_clock_mhz"] for lv in refs) / len(refs)
    scatter = 0.0
    if len(ref_w) >= 2:
        scatter = (sum((w - ref_power) ** 2 for w in ref_w) / (len(ref_w) - 1)) ** 0.5 / ref_power
    ref_clock_se = math.hypot(*(lv.get("compute_sm_clock_stderr_mhz") or 0.0 for lv in refs))
    ref_clock_rel = ref_clock_se / len(refs) / ref_clock
    return fit_clock_shape(
        [min(lv["cap_w"], ref_power) / ref_power for lv in capped],
        [lv["compute_sm_clock_mhz"] / ref_clock for lv in capped],
        power_noise=scatter,
        clock_noise=[
            math.hypot((lv.get("compute_sm_clock_stderr_mhz") or 0.0) / ref_clock, ref_clock_rel)
            for lv in capped
        ],
    )


def _middle(level: dict[str, Any]) -> float:
    return 0.5 * (float(level["start_s"]) + float(level["end_s"]))


def _fit_doc(sweep: MeasuredSweep, power_stderr_w: float | None) -> dict[str, Any]:
    return {
        "pfi": sweep.pfi,
        "pfi_stderr": sweep.pfi_stderr,
        # The uncapped power's own error: what firm kW carries for the job once the curve
        # is in force, in place of the declared power's (flexmodel.quote).
        "power_stderr_w": power_stderr_w,
        "pfi_measured": sweep.pfi_measured,
        "grid_w": list(sweep.grid_w),
        "noise_fraction": sweep.noise_fraction,
        "set_aside": [
            {"cap_w": a.cap_w, "power_w": a.power_w, "throughput": a.throughput, "reason": a.reason}
            for a in sweep.set_aside
        ],
        "sweep": [
            {"cap_w": float(c), "power_w": float(p), "throughput": float(t)}
            for c, p, t in zip(sweep.cap_w, sweep.fit_power_w, sweep.fit_throughput, strict=True)
        ],
    }


def _relative_error(point: dict[str, Any]) -> float:
    parts = [
        (point.get("power_stderr_w"), point["power_w"]),
        (point.get("throughput_stderr"), point["throughput"]),
    ]
    return max((se / value for se, value in parts if se and value > 0), default=0.0)


def verdict(
    fit: dict[str, Any] | None, max_stderr: float, replaced_stderr: float = 0.0
) -> str | None:
    """Why this fit may not replace the job's curve, or None when it may: its PFI's standard
    error must be at most `max_stderr`, or below `replaced_stderr`, the error of the PFI it
    would replace (a measurement better known than the prediction it replaces is used)."""
    if fit is None or fit.get("pfi") is None:
        return (fit or {}).get("error") or "no capped level slowed the job beyond the noise"
    if fit["pfi_stderr"] > max_stderr and fit["pfi_stderr"] >= replaced_stderr:
        return (
            f"the PFI's standard error {fit['pfi_stderr']:.3g} is above "
            f"FLEXGATE_CURVE_MAX_PFI_STDERR={max_stderr:g} and not below the "
            f"{replaced_stderr:.3g} of the PFI it would replace"
        )
    if not PFI_RANGE[0] <= fit["pfi"] <= PFI_RANGE[1]:
        return f"the PFI {fit['pfi']:.3g} lies outside the plausible {PFI_RANGE}"
    return None


def fields_in_force(
    job: Job,
    fit: dict[str, Any] | None,
    *,
    max_stderr: float,
    extension: str,
    interpolation: str,
    combine: bool = True,
    carry_shape_rel: float = CARRY_SHAPE_REL,
    shape: str = "family",
    own_shape: bool = True,
) -> tuple[dict[str, Any] | None, str | None]:
    """The job-mix fields a fit sets over the job `job` (as declared, with its prediction),
    and why the measured curve itself is not in force (None when it is).

    A good enough fit (`verdict`) sets its curve: with `shape="points"` the measured points
    joined by `interpolation`, the fleet family at its PFI below them (`extension`); with
    `shape="family"` the fleet family's shape at its PFI on its grid through its uncapped
    point (`sweep_interpolation: family`, the points kept for what they say). A fit not good
    enough on its own still says something: with `combine`, its PFI, carried to the job's
    own grid through the fleet family (`flexmodel.jobs.pfi_on_own_grid`), is weighed with the
    PFI it would replace (a prediction, a declaration with its error, the default) by their
    precisions. A declared sweep, or a PFI declared without an error, is kept as it is.
    `carry_shape_rel`: the family shape's own relative error in that carrying (0 where the
    family is known to be the job's shape, as in tests of family jobs). `own_shape`: with
    `shape="family"`, the job's own static share and exponent where the probe's SM clock
    identified them (`fit["shape"]`, `flexmodel.dvfs`), else (and with False) the fleet's.
    """
    replaced = 0.0 if job.sweep is not None else job.pfi_error
    why = verdict(fit, max_stderr, replaced)
    if why is None and fit is not None:
        sweep = fit["sweep"]
        fields = {
            "power_w": sweep[-1]["power_w"],
            "power_stderr_w": fit.get("power_stderr_w"),  # None in fits stored before it
            "pfi": fit["pfi"],
            "pfi_stderr": fit["pfi_stderr"],
            "sweep": sweep,
            "sweep_extension": extension,
            "sweep_interpolation": interpolation,
        }
        if shape == "family":  # the PFI is on the measured grid: the family is read there
            own = measured_shape(fit) if own_shape else {}
            fields |= own | {
                "pfi": family_through_levels(_shaped(job, own), fit),
                "sweep_interpolation": "family",
                "pfi_grid_w": list(fit["grid_w"]),
            }
        return fields, None
    plausible = fit is not None and PFI_RANGE[0] <= (fit.get("pfi") or 0.0) <= PFI_RANGE[1]
    if not (combine and plausible and replaced > 0 and fit and fit["pfi_stderr"] > 0):
        return None, why
    measured = pfi_on_own_grid(
        job, fit["pfi"], fit["pfi_stderr"], tuple(fit["grid_w"]), shape_rel=carry_shape_rel
    )
    if not measured[1] > 0:
        return None, why
    pfi, stderr = combined_estimate((job.pfi_value, replaced), measured)
    return {"pfi": min(max(pfi, PFI_RANGE[0]), PFI_RANGE[1]), "pfi_stderr": stderr}, why


def measured_shape(fit: dict[str, Any]) -> dict[str, float]:
    """The job-mix fields of the job's own static share and exponent where the fit's SM clock
    identified them (`fit["shape"]`), else none (the fleet family's)."""
    found = fit.get("shape") or {}
    if found.get("source") != "sm_clock":
        return {}
    return {"static_share": found["static_share"], "exponent": found["exponent"]}


def _shaped(job: Job, shape: dict[str, float]) -> Job:
    """`job` with the static share and exponent of `measured_shape`'s fields (none: as is)."""
    if not shape:
        return job
    return replace(job, static_share=shape["static_share"], exponent=shape["exponent"])


def family_through_levels(job: Job, fit: dict[str, Any]) -> float:
    """The PFI on a fit's grid of the fleet family through its uncapped point nearest its
    levels on that grid in least squares (`flexmodel.pfi.fitted_family_pfi`): the PFI the
    job's curve in force is planned at with `curve_shape=family`. The fit's own (Eq. 1's)
    where no cap of the grid binds the family (the job's stated waveform puts its compute
    level below them): the family then has no PFI there to fit."""
    grid_w, sweep = fit["grid_w"], fit["sweep"]
    on_grid = [p for p in sweep if min(abs(p["cap_w"] - c) for c in grid_w) < CAP_RESOLUTION_W]
    top = max(sweep, key=lambda p: p["cap_w"])
    capped = [p for p in on_grid if p is not top]
    shape = FamilyShape.of(
        power_w=top["power_w"],
        duty=job.duty,
        comm_power_fraction=job.comm_power_fraction,
        min_cap_w=job.min_cap_w,
        max_cap_w=job.max_cap_w,
        static_share=STATIC_SHARE if job.static_share is None else job.static_share,
        exponent=EXPONENT if job.exponent is None else job.exponent,
    )
    nearest = fitted_family_pfi(
        shape,
        [p["cap_w"] for p in capped],
        [p["throughput"] / top["throughput"] for p in capped],
        grid_w,
    )
    return nearest if math.isfinite(nearest) else float(fit["pfi"])


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
