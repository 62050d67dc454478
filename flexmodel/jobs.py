"""Job mixes: parsing and validation of the JSON form (CONTRACT.md), their curves and problems.

`parse_job_mix` takes the decoded JSON document and returns a `JobMix`, or raises
`InvalidJobError` with a one-line message naming the job and field at fault. Unknown fields
are refused by name. `job_curves` builds every job's curve from the best source it has.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from flexmodel.allocate import Problem, allocate, allocation_dict, build_problem
from flexmodel.curves import Array, Curves, family_curves, stack, sweep_curve
from flexmodel.errors import FlexModelError, InvalidJobError
from flexmodel.facility import gpu_reduction_kw
from flexmodel.pfi import (
    DEFAULT_PFI,
    DEFAULT_PFI_STDERR,
    check_grid,
    default_grid_w,
    grid_matrix,
    pfi_of_sweep,
    solve_insensitive_share,
)

#: H200 limits; other GPUs set `min_cap_w` and `max_cap_w` per job.
DEFAULT_MIN_CAP_W = 200.0
DEFAULT_MAX_CAP_W = 700.0
#: Waveform defaults for a job whose trace has not been measured (docs/model.md).
DEFAULT_PERIOD_S = 2.0
DEFAULT_DUTY = 0.8
DEFAULT_COMM_POWER_FRACTION = 0.5
#: Finite-difference step for the sensitivity of a job's largest cut to its PFI.
PFI_STEP = 0.05
#: How far a sweep's uncapped point may differ from the job's `power_w` and `throughput`.
SWEEP_MATCH_TOLERANCE = 0.05


@dataclass(frozen=True)
class Placement:
    node: str
    gpus: tuple[int, ...]


@dataclass(frozen=True)
class Job:
    id: str
    gpus: int
    power_w: float  #: uncapped mean power per GPU [W]
    throughput: float  #: uncapped whole-job throughput [tokens/s]
    pfi: float | None = None
    pfi_stderr: float | None = None
    pfi_grid_w: tuple[float, ...] | None = None
    sweep: tuple[tuple[float, float, float], ...] | None = None
    min_cap_w: float = DEFAULT_MIN_CAP_W
    max_cap_w: float = DEFAULT_MAX_CAP_W
    min_throughput_fraction: float = 0.0
    protected: bool = False
    weight: float = 1.0
    remaining_s: float | None = None
    period_s: float = DEFAULT_PERIOD_S
    duty: float = DEFAULT_DUTY
    comm_power_fraction: float = DEFAULT_COMM_POWER_FRACTION
    placement: tuple[Placement, ...] | None = None

    @property
    def curve_source(self) -> str:
        """Where this job's curve comes from: `sweep`, `pfi` or `default`."""
        if self.sweep is not None:
            return "sweep"
        return "pfi" if self.pfi is not None else "default"

    @property
    def grid_w(self) -> tuple[float, ...]:
        return self.pfi_grid_w or default_grid_w(self.gpus)

    @property
    def full_sweep(self) -> list[tuple[float, float, float]]:
        """The sweep with the job's own uncapped point at `max_cap_w` when it lacks one."""
        points = list(self.sweep or ())
        if not points or max(p[0] for p in points) < self.max_cap_w:
            points.append((self.max_cap_w, self.power_w, self.throughput))
        return points

    @property
    def pfi_value(self) -> float:
        """The PFI the `pfi` strategy ranks by: given, else the sweep's, else the fleet's."""
        if self.pfi is not None:
            return self.pfi
        if self.sweep is not None:
            return pfi_of_sweep(self.full_sweep, f"job '{self.id}' sweep").pfi
        return DEFAULT_PFI

    @property
    def pfi_error(self) -> float:
        """Standard error of `pfi_value`."""
        if self.pfi_stderr is not None:
            return self.pfi_stderr
        return DEFAULT_PFI_STDERR if self.curve_source == "default" else 0.0


@dataclass(frozen=True)
class JobMix:
    jobs: tuple[Job, ...]
    overhead_factor: float = 1.0
    overhead_factor_stderr: float = 0.0
    static_load_kw: float = 0.0

    @cached_property
    def curves(self) -> Curves:
        """Every job's curve (built once, on first use)."""
        return job_curves(self.jobs)

    @cached_property
    def problem(self) -> Problem:
        """The allocation problem of the mix (built once, with its hulls, on first use)."""
        return mix_problem(self)

    @cached_property
    def shed_per_pfi_w(self) -> Array:
        """How much each job's largest cut [W] grows per unit of PFI.

        A finite difference over `PFI_STEP`: the curves of the jobs whose PFI is uncertain,
        rebuilt at a lower PFI, once per mix. 0 for the others (sweep jobs are measured).
        """
        slope = np.zeros(len(self.jobs))
        uncertain = [
            i for i, j in enumerate(self.jobs) if j.curve_source != "sweep" and j.pfi_error
        ]
        if uncertain:
            jobs = [self.jobs[i] for i in uncertain]
            pfi = np.array([j.pfi_value for j in jobs]) - PFI_STEP
            lower = build_problem(
                job_curves(jobs, pfi=pfi),
                gpus=field_array(jobs, "gpus"),
                min_cap_w=field_array(jobs, "min_cap_w"),
                min_throughput_fraction=field_array(jobs, "min_throughput_fraction"),
                protected=[j.protected for j in jobs],
                weights=field_array(jobs, "weight"),
                pfi=pfi,
            )
            slope[uncertain] = (self.problem.max_cut_w[uncertain] - lower.max_cut_w) / PFI_STEP
        return slope

    def array(self, name: str) -> Array:
        """One numeric job field as an array over the jobs."""
        return field_array(self.jobs, name)


def field_array(jobs: tuple[Job, ...] | list[Job], name: str) -> Array:
    """One numeric job field as an array over `jobs`."""
    return np.array([float(getattr(j, name)) for j in jobs], dtype=float)


_MIX_FIELDS = {"overhead_factor", "overhead_factor_stderr", "static_load_kw", "jobs"}
_JOB_FIELDS = set(Job.__dataclass_fields__)
_REQUIRED = ("id", "gpus", "power_w", "throughput")
_POINT_FIELDS = ("cap_w", "power_w", "throughput")


def parse_job_mix(doc: Any) -> JobMix:
    """Validate a decoded job-mix document; raise `InvalidJobError` naming the first problem."""
    if not isinstance(doc, dict):
        raise InvalidJobError("job mix: expected a JSON object with a 'jobs' list")
    _refuse_unknown(doc, _MIX_FIELDS, "job mix")
    jobs_doc = doc.get("jobs")
    if not isinstance(jobs_doc, list):
        raise InvalidJobError("job mix: 'jobs' must be a list of job objects")
    jobs = tuple(parse_job(item, i) for i, item in enumerate(jobs_doc))
    seen: set[str] = set()
    for job in jobs:
        if job.id in seen:
            raise InvalidJobError(f"job mix: job id '{job.id}' appears twice")
        seen.add(job.id)
    mix = JobMix(
        jobs=jobs,
        overhead_factor=_number(doc, "overhead_factor", "job mix", 1.0, minimum=1.0),
        overhead_factor_stderr=_number(doc, "overhead_factor_stderr", "job mix", 0.0, minimum=0.0),
        static_load_kw=_number(doc, "static_load_kw", "job mix", 0.0, minimum=0.0),
    )
    mix.curves  # noqa: B018 - a PFI the family cannot represent is bad input: say so now
    return mix


def parse_job(doc: Any, index: int = 0) -> Job:
    """Validate one job object of a job mix."""
    if not isinstance(doc, dict):
        raise InvalidJobError(f"jobs[{index}]: expected a job object")
    ident = doc.get("id")
    if not isinstance(ident, str) or not ident.strip():
        raise InvalidJobError(f"jobs[{index}]: 'id' must be a non-empty string")
    where = f"job '{ident}'"
    _refuse_unknown(doc, _JOB_FIELDS, where)
    for name in _REQUIRED:
        if name not in doc:
            raise InvalidJobError(f"{where}: missing required field '{name}'")
    gpus = doc["gpus"]
    if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1:
        raise InvalidJobError(f"{where}: 'gpus' must be a whole number of at least 1, got {gpus!r}")
    min_cap = _number(doc, "min_cap_w", where, DEFAULT_MIN_CAP_W, minimum=0.0, strict=True)
    max_cap = _number(doc, "max_cap_w", where, DEFAULT_MAX_CAP_W, minimum=0.0, strict=True)
    if min_cap >= max_cap:
        raise InvalidJobError(f"{where}: min_cap_w {min_cap:g} must be below max_cap_w {max_cap:g}")
    power = _number(doc, "power_w", where, minimum=0.0, strict=True)
    if power > max_cap:
        raise InvalidJobError(
            f"{where}: power_w {power:g} is above max_cap_w {max_cap:g} (a GPU cannot draw more "
            "than its limit on average)"
        )
    pfi = _optional(doc, "pfi", where, minimum=0.0, strict=True)
    grid = doc.get("pfi_grid_w")
    if grid is not None:
        grid = tuple(_number_list(grid, f"{where}: pfi_grid_w"))
        check_grid(grid, where)
    job = Job(
        id=ident,
        gpus=gpus,
        power_w=power,
        throughput=_number(doc, "throughput", where, minimum=0.0, strict=True),
        pfi=pfi,
        pfi_stderr=_optional(doc, "pfi_stderr", where, minimum=0.0),
        pfi_grid_w=grid,
        sweep=_sweep(doc.get("sweep"), where),
        min_cap_w=min_cap,
        max_cap_w=max_cap,
        min_throughput_fraction=_number(
            doc, "min_throughput_fraction", where, 0.0, minimum=0.0, maximum=1.0
        ),
        protected=_boolean(doc, "protected", where),
        weight=_number(doc, "weight", where, 1.0, minimum=0.0),
        remaining_s=_optional(doc, "remaining_s", where, minimum=0.0, strict=True),
        period_s=_number(doc, "period_s", where, DEFAULT_PERIOD_S, minimum=0.0, strict=True),
        duty=_number(doc, "duty", where, DEFAULT_DUTY, minimum=0.0, maximum=1.0, strict=True),
        comm_power_fraction=_number(
            doc, "comm_power_fraction", where, DEFAULT_COMM_POWER_FRACTION, minimum=0.0, maximum=1.0
        ),
        placement=_placement(doc.get("placement"), where, gpus),
    )
    if job.sweep is not None:
        _check_sweep(job, where)
    return job


def job_curves(jobs: tuple[Job, ...] | list[Job], pfi: Array | None = None) -> Curves:
    """Every job's curve from its best source, in the order of `jobs`.

    Family jobs (a PFI or the fleet default) are built together, vectorised; each sweep is its
    own table. `pfi` (one value per job) replaces the family jobs' PFIs, taken as the nearest
    the family reaches (for what-if curves, such as a quote's lower PFI). An empty list gives
    an empty table.
    """
    if not jobs:
        empty = np.zeros((0, 2))
        return Curves(cap_w=empty, power_w=empty, throughput=empty, period_s=np.zeros(0))
    family = [i for i, j in enumerate(jobs) if j.sweep is None]
    sweeps = [i for i, j in enumerate(jobs) if j.sweep is not None]
    parts = []
    if family:
        chosen = None if pfi is None else np.asarray(pfi, dtype=float)[family]
        parts.append(_family_table([jobs[i] for i in family], chosen))
    parts += [
        sweep_curve(jobs[i].full_sweep, period_s=jobs[i].period_s, name=f"job '{jobs[i].id}' sweep")
        for i in sweeps
    ]
    table = stack(parts) if len(parts) > 1 else parts[0]
    return table.select(np.argsort(family + sweeps))


def _family_table(jobs: list[Job], pfi: Array | None = None) -> Curves:
    stated = pfi is None
    if pfi is None:
        pfi = np.array([j.pfi if j.pfi is not None else DEFAULT_PFI for j in jobs])
    m = solve_insensitive_share(
        pfi,
        grid_matrix([j.grid_w for j in jobs]),
        power_w=field_array(jobs, "power_w"),
        max_cap_w=field_array(jobs, "max_cap_w"),
        duty=field_array(jobs, "duty"),
        comm_power_fraction=field_array(jobs, "comm_power_fraction"),
        names=[j.id for j in jobs],
        clip=not stated,
    )
    return family_curves(
        power_w=field_array(jobs, "power_w"),
        throughput=field_array(jobs, "throughput"),
        min_cap_w=field_array(jobs, "min_cap_w"),
        max_cap_w=field_array(jobs, "max_cap_w"),
        duty=field_array(jobs, "duty"),
        comm_power_fraction=field_array(jobs, "comm_power_fraction"),
        insensitive_share=m,
        period_s=field_array(jobs, "period_s"),
    )


def _check_sweep(job: Job, where: str) -> None:
    assert job.sweep is not None
    top = max(job.sweep)
    if top[0] > job.max_cap_w:
        raise InvalidJobError(
            f"{where}: sweep cap {top[0]:g} W is above max_cap_w {job.max_cap_w:g}"
        )
    if top[0] == job.max_cap_w:
        for label, measured, stated in (
            ("power_w", top[1], job.power_w),
            ("throughput", top[2], job.throughput),
        ):
            if abs(measured - stated) > SWEEP_MATCH_TOLERANCE * stated:
                raise InvalidJobError(
                    f"{where}: the sweep's uncapped point has {label} {measured:g}, but the job "
                    f"states {stated:g}"
                )
    try:
        sweep_curve(job.full_sweep, period_s=job.period_s, name=f"{where} sweep")
    except FlexModelError as exc:
        raise InvalidJobError(str(exc)) from exc


def _refuse_unknown(doc: dict[str, Any], allowed: set[str], where: str) -> None:
    unknown = sorted(set(doc) - allowed)
    if unknown:
        raise InvalidJobError(f"{where}: unknown field(s) {', '.join(map(repr, unknown))}")


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_number(
    value: Any, label: str, *, minimum: float | None, maximum: float | None, strict: bool
) -> float:
    if not _is_number(value) or not math.isfinite(value):
        raise InvalidJobError(f"{label} must be a finite number, got {value!r}")
    out = float(value)
    if minimum is not None and (out <= minimum if strict else out < minimum):
        word = "above" if strict else "at least"
        raise InvalidJobError(f"{label} must be {word} {minimum:g}, got {out:g}")
    if maximum is not None and out > maximum:
        raise InvalidJobError(f"{label} must be at most {maximum:g}, got {out:g}")
    return out


def _number(
    doc: dict[str, Any],
    name: str,
    where: str,
    default: float | None = None,
    *,
    minimum: float | None = None,
    maximum: float | None = None,
    strict: bool = False,
) -> float:
    if doc.get(name) is None:
        if default is None:
            raise InvalidJobError(f"{where}: missing required field '{name}'")
        return default
    return _check_number(
        doc[name], f"{where}: '{name}'", minimum=minimum, maximum=maximum, strict=strict
    )


def _optional(
    doc: dict[str, Any], name: str, where: str, *, minimum: float, strict: bool = False
) -> float | None:
    if doc.get(name) is None:
        return None
    return _number(doc, name, where, minimum=minimum, strict=strict)


def _boolean(doc: dict[str, Any], name: str, where: str) -> bool:
    value = doc.get(name, False)
    if not isinstance(value, bool):
        raise InvalidJobError(f"{where}: '{name}' must be true or false, got {value!r}")
    return value


def _number_list(value: Any, label: str) -> list[float]:
    if not isinstance(value, list):
        raise InvalidJobError(f"{label} must be a list of numbers")
    return [_check_number(v, label, minimum=0.0, maximum=None, strict=True) for v in value]


def _sweep(value: Any, where: str) -> tuple[tuple[float, float, float], ...] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not value:
        raise InvalidJobError(f"{where}: 'sweep' must be a non-empty list of points")
    points = []
    for i, point in enumerate(value):
        label = f"{where}: sweep[{i}]"
        if not isinstance(point, dict):
            raise InvalidJobError(f"{label} must be an object with {', '.join(_POINT_FIELDS)}")
        _refuse_unknown(point, set(_POINT_FIELDS), label)
        cap, power, thr = (
            _number(point, name, label, minimum=0.0, strict=name != "throughput")
            for name in _POINT_FIELDS
        )
        points.append((cap, power, thr))
    return tuple(points)


def _placement(value: Any, where: str, gpus: int) -> tuple[Placement, ...] | None:
    if value is None:
        return None
    if not isinstance(value, list):
        raise InvalidJobError(f"{where}: 'placement' must be a list of {{node, gpus}} objects")
    out = []
    for i, item in enumerate(value):
        label = f"{where}: placement[{i}]"
        if not isinstance(item, dict):
            raise InvalidJobError(f"{label} must be an object with 'node' and 'gpus'")
        _refuse_unknown(item, {"node", "gpus"}, label)
        node, indices = item.get("node"), item.get("gpus")
        if not isinstance(node, str) or not node:
            raise InvalidJobError(f"{label}: 'node' must be a non-empty string")
        if not isinstance(indices, list) or not all(
            isinstance(g, int) and not isinstance(g, bool) and g >= 0 for g in indices
        ):
            raise InvalidJobError(f"{label}: 'gpus' must be a list of GPU indices (0 or more)")
        if len(set(indices)) != len(indices):
            raise InvalidJobError(f"{label}: a GPU index appears twice")
        out.append(Placement(node=node, gpus=tuple(indices)))
    nodes = [p.node for p in out]
    if len(set(nodes)) != len(nodes):
        raise InvalidJobError(f"{where}: placement names a node twice")
    placed = sum(len(p.gpus) for p in out)
    if placed != gpus:
        raise InvalidJobError(f"{where}: placement covers {placed} GPUs but the job has {gpus}")
    return tuple(out)


def mix_problem(
    mix: JobMix,
    objective: str = "throughput",
    *,
    curves: Curves | None = None,
    unavailable: ArrayLike | None = None,
) -> Problem:
    """The allocation problem of a job mix, on the curves built from what is known of each job.

    `curves` replaces the mix's own (a what-if); `unavailable` jobs give nothing, like
    protected ones (a quote's jobs that end inside its window).
    """
    protected = np.array([j.protected for j in mix.jobs], dtype=bool)
    if unavailable is not None:
        protected |= np.asarray(unavailable, dtype=bool)
    return build_problem(
        mix.curves if curves is None else curves,
        gpus=mix.array("gpus"),
        min_cap_w=mix.array("min_cap_w"),
        min_throughput_fraction=mix.array("min_throughput_fraction"),
        protected=protected,
        weights=mix.array("weight"),
        pfi=[j.pfi_value for j in mix.jobs],
        objective=objective,
    )


def allocate_mix(
    mix: JobMix, facility_kw: float, *, strategy: str = "optimal", objective: str = "throughput"
) -> dict[str, Any]:
    """Per-job caps that shed `facility_kw` at the meter, as the JSON of CONTRACT.md."""
    if not np.isfinite(facility_kw) or facility_kw < 0:
        raise FlexModelError(f"reduction {facility_kw!r} kW must be a finite number of at least 0")
    gpu_w = gpu_reduction_kw(facility_kw, mix.overhead_factor) * 1000.0
    problem = mix.problem if objective == "throughput" else mix_problem(mix, objective)
    result = allocate(problem, gpu_w, strategy, objective)
    return allocation_dict(
        result,
        job_ids=[j.id for j in mix.jobs],
        overhead_factor=mix.overhead_factor,
        requested_facility_kw=facility_kw,
    )
