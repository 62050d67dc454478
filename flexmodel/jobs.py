"""Jobs and job mixes (docs/model.md, section 6), with what the model derives from them.

A `JobMix` holds its jobs and the site's overhead figures; on first use it builds every job's
curve from the best source the job has (`job_curves`) and its allocation problem. It also
answers the site-level figures every caller shares: the baseline and maximum GPU power of the
placed jobs, and the jobs whose power waves (the ones the sync analysis looks at).
The JSON reader is `flexmodel.jobmix`; the allocator is `flexmodel.allocate`; a PFI carried
from another grid onto a job's own, `flexmodel.pficarry`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property

import numpy as np
from numpy.typing import ArrayLike

from flexmodel.curves import (
    EXPONENT,
    STATIC_SHARE,
    Array,
    Curves,
    FamilyShape,
    extend_below,
    family_curves,
    stack,
)
from flexmodel.errors import InvalidSweepError
from flexmodel.pfi import (
    DEFAULT_PFI,
    DEFAULT_PFI_STDERR,
    default_grid_w,
    grid_matrix,
    solve_insensitive_share,
)
from flexmodel.problem import AllocationProblem, build_problem
from flexmodel.sweeps import MeasuredSweep, fit_sweep

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
    #: below the sweep's lowest cap: `none` (the job goes no lower) or `family` (the fleet
    #: family at the sweep's own PFI, joined to its lowest point: `extend_below`)
    sweep_extension: str = "none"
    #: between the sweep's points: `linear` or `pchip` (a monotone cubic: `sweep_curve`); or
    #: `family`: not the points' shape but the fleet family's at the job's PFI on its grid
    #: (`pfi` and `pfi_grid_w`, else the sweep's own), through the sweep's uncapped point,
    #: over the whole cap range (`sweep_extension` then has nothing below to add)
    sweep_interpolation: str = "linear"
    min_cap_w: float = DEFAULT_MIN_CAP_W
    max_cap_w: float = DEFAULT_MAX_CAP_W
    min_throughput_fraction: float = 0.0  #: the stricter of the job's own and its tier's
    protected: bool = False  #: the job's own, or its tier tolerates no slowdown
    tier: int | None = None  #: flexibility tier (flexmodel.tiers), when tagged
    weight: float = 1.0
    remaining_s: float | None = None
    period_s: float = DEFAULT_PERIOD_S
    duty: float = DEFAULT_DUTY
    comm_power_fraction: float = DEFAULT_COMM_POWER_FRACTION
    placement: tuple[Placement, ...] | None = None
    #: the job's kind of model (dense, moe-pretrain, moe-finetune ...): the PFI predictor's
    #: group, for its leave-one-group-out error
    model_family: str | None = None
    #: standard error of `power_w` when it was measured [W]; None: declared, and a quote gives
    #: it the site's declared-power uncertainty (flexmodel.quote)
    power_stderr_w: float | None = None
    #: the job's own power-to-clock shape, `s` and `a` of q(f) (docs/model.md, section 1), as
    #: a probe measures it from the SM clock (`flexmodel.dvfs`); None: the fleet family's
    static_share: float | None = None
    exponent: float | None = None

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
            pfi = self.measured_sweep.pfi
            if pfi is None:
                raise InvalidSweepError(
                    f"job '{self.id}' sweep: no cap slowed the job beyond the measurement "
                    "noise, so it has no PFI (Eq. 1 divides by the throughput lost)"
                )
            return pfi
        return DEFAULT_PFI

    @cached_property
    def measured_sweep(self) -> MeasuredSweep:
        """The job's sweep read by the one rule (`flexmodel.sweeps.fit_sweep`)."""
        return fit_sweep(self.full_sweep, name=f"job '{self.id}' sweep")

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
    def by_id(self) -> dict[str, Job]:
        """The jobs by id (ids are unique in a mix)."""
        return {job.id: job for job in self.jobs}

    @cached_property
    def curves(self) -> Curves:
        """Every job's curve (built once, on first use)."""
        return job_curves(self.jobs)

    @cached_property
    def problem(self) -> AllocationProblem:
        """The allocation problem of the mix (built once, with its hulls, on first use)."""
        return self.problem_for()

    def problem_for(
        self,
        objective: str = "throughput",
        *,
        curves: Curves | None = None,
        unavailable: ArrayLike | None = None,
    ) -> AllocationProblem:
        """The allocation problem of the mix for `objective`, built anew.

        `curves` replaces the mix's own (a what-if); `unavailable` jobs give nothing, like
        protected ones (a quote's jobs that end inside its window).
        """
        protected = np.array([j.protected for j in self.jobs], dtype=bool)
        if unavailable is not None:
            protected |= np.asarray(unavailable, dtype=bool)
        return build_problem(
            self.curves if curves is None else curves,
            gpus=self.array("gpus"),
            min_cap_w=self.array("min_cap_w"),
            min_throughput_fraction=self.array("min_throughput_fraction"),
            protected=protected,
            weights=self.array("weight"),
            pfi=[j.pfi_value for j in self.jobs],
            objective=objective,
        )

    @cached_property
    def shed_per_pfi_w(self) -> Array:
        """How much each job's largest cut [W] grows per unit of PFI.

        A finite difference over `PFI_STEP`: the curves of the jobs whose PFI is uncertain,
        rebuilt at a lower PFI, once per mix. A sweep fitted with a stated error
        (`pfi_stderr`, a measured curve) has its cut proportional to its PFI (Eq. 1 at the
        throughput lost at its largest cut): `cut / PFI`. 0 for the others (declared sweeps).
        """
        slope = np.zeros(len(self.jobs))
        fitted = [
            i
            for i, j in enumerate(self.jobs)
            if j.curve_source == "sweep" and j.pfi_stderr and j.pfi_value > 0
        ]
        for i in fitted:
            slope[i] = self.problem.max_cut_w[i] / self.jobs[i].pfi_value
        uncertain = [
            i for i, j in enumerate(self.jobs) if j.curve_source != "sweep" and j.pfi_error
        ]
        if uncertain:
            jobs = tuple(self.jobs[i] for i in uncertain)
            pfi = np.array([j.pfi_value for j in jobs]) - PFI_STEP
            lower = JobMix(jobs=jobs).problem_for(curves=job_curves(jobs, pfi=pfi))
            slope[uncertain] = (self.problem.max_cut_w[uncertain] - lower.max_cut_w) / PFI_STEP
        return slope

    @cached_property
    def placed(self) -> tuple[Job, ...]:
        """The jobs with a placement: the only ones the site can measure and cap."""
        return tuple(j for j in self.jobs if j.placement)

    @cached_property
    def baseline_gpu_kw(self) -> float:
        """Uncapped GPU power of the placed jobs [kW] (unplaced jobs are not the site's load)."""
        return sum(j.gpus * j.power_w for j in self.placed) / 1000.0

    @cached_property
    def max_gpu_kw(self) -> float:
        """GPU power of the placed jobs with every GPU at its limit [kW]."""
        return sum(j.gpus * j.max_cap_w for j in self.placed) / 1000.0

    @cached_property
    def waving(self) -> tuple[Job, ...]:
        """The jobs whose power swings between two levels (0 < duty < 1): the ones a control
        loop can phase-lock."""
        return tuple(j for j in self.jobs if 0.0 < j.duty < 1.0)

    def array(self, name: str) -> Array:
        """One numeric job field as an array over the jobs."""
        return field_array(self.jobs, name)


def field_array(jobs: tuple[Job, ...] | list[Job], name: str) -> Array:
    """One numeric job field as an array over `jobs`."""
    return np.array([float(getattr(j, name)) for j in jobs], dtype=float)


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
    parts += [_sweep_table(jobs[i]) for i in sweeps]
    table = stack(parts) if len(parts) > 1 else parts[0]
    return table.select(np.argsort(family + sweeps))


def _sweep_table(job: Job) -> Curves:
    """A sweep job's curve: its measured points, and below them the fleet family at the
    sweep's own PFI on its own grid when the job asks for it (`sweep_extension: family`); or,
    with `sweep_interpolation: family`, the fleet family alone (`_sweep_family_table`)."""
    sweep = job.measured_sweep
    if job.sweep_interpolation == "family":
        return _sweep_family_table(job, sweep)
    measured = sweep.curve(
        job.period_s, name=f"job '{job.id}' sweep", interpolation=job.sweep_interpolation
    )
    if job.sweep_extension != "family" or sweep.pfi is None:
        return measured
    stand_in = replace(job, sweep=None, pfi=sweep.pfi, pfi_grid_w=sweep.grid_w)
    return extend_below(measured, _family_table([stand_in], np.array([sweep.pfi])))


def _sweep_family_table(job: Job, sweep: MeasuredSweep) -> Curves:
    """A sweep job planned on the fleet family's shape: the family at the job's PFI on its
    grid (`pfi` and `pfi_grid_w` when given, as a measured curve in force sets them, else the
    sweep's own PFI on its kept caps), through the sweep's uncapped point. A few noisy
    levels joined by a cubic wiggle, and a planner allocates on the wiggles; the points still
    give the PFI and the uncapped level (docs/model.md, section 1)."""
    pfi, grid = job.pfi, job.pfi_grid_w
    if pfi is None or grid is None:
        if sweep.pfi is None:
            raise InvalidSweepError(
                f"job '{job.id}' sweep: no cap slowed the job beyond the measurement noise, "
                "so it has no PFI for the fleet family's shape (sweep_interpolation: family)"
            )
        pfi, grid = sweep.pfi, sweep.grid_w
    _, power_w, throughput = max(job.full_sweep)
    stand_in = replace(
        job, sweep=None, pfi=pfi, pfi_grid_w=grid, power_w=power_w, throughput=throughput
    )
    return _family_table([stand_in], np.array([pfi]))


def job_family_shape(jobs: list[Job]) -> FamilyShape:
    """The jobs' family shape: each job's own static share and exponent where it has them."""
    return FamilyShape.of(
        power_w=field_array(jobs, "power_w"),
        duty=field_array(jobs, "duty"),
        comm_power_fraction=field_array(jobs, "comm_power_fraction"),
        min_cap_w=field_array(jobs, "min_cap_w"),
        max_cap_w=field_array(jobs, "max_cap_w"),
        static_share=[STATIC_SHARE if j.static_share is None else j.static_share for j in jobs],
        exponent=[EXPONENT if j.exponent is None else j.exponent for j in jobs],
    )


def _family_table(jobs: list[Job], pfi: Array | None = None) -> Curves:
    stated = pfi is None
    if pfi is None:
        pfi = np.array([j.pfi if j.pfi is not None else DEFAULT_PFI for j in jobs])
    shape = job_family_shape(jobs)
    m = solve_insensitive_share(
        pfi,
        grid_matrix([j.grid_w for j in jobs]),
        shape,
        names=[j.id for j in jobs],
        clip=not stated,
    )
    return family_curves(
        shape, m, throughput=field_array(jobs, "throughput"), period_s=field_array(jobs, "period_s")
    )
