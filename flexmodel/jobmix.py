"""The job-mix JSON reader (docs/configuration.md, "The job mix"): the one every caller uses.

`parse_job_mix_json` takes the text of a job-mix document (a file's contents, a request body)
and `parse_job_mix` the decoded document; both return a `JobMix` or raise `InvalidJobError`
with a one-line message naming the source, job and field at fault. Unknown fields are refused
by name; so are NaN and Infinity, which Python's `json` would otherwise accept. Every physical
quantity must lie in a plausible range (the `*_RANGE` constants, docs/configuration.md), so a
value in the wrong unit is refused with the unit named instead of giving nonsense
(`flexmodel.fieldchecks`); two jobs on one GPU are refused naming both. Reading the file is the
caller's (flexmodel does no I/O).
"""

from __future__ import annotations

import json
from typing import Any

from flexmodel.errors import FlexModelError, InvalidJobError
from flexmodel.fieldchecks import (
    SHARE,
    boolean_field,
    check_number,
    number_field,
    number_list,
    optional_field,
    refuse_unknown,
)
from flexmodel.jobs import (
    DEFAULT_COMM_POWER_FRACTION,
    DEFAULT_DUTY,
    DEFAULT_MAX_CAP_W,
    DEFAULT_MIN_CAP_W,
    DEFAULT_PERIOD_S,
    SWEEP_MATCH_TOLERANCE,
    Job,
    JobMix,
    Placement,
)
from flexmodel.pfi import check_grid
from flexmodel.tiers import DEFAULT_TIERS, TierTable

# Plausible ranges, inclusive. Each is wide enough for any GPU or job we know of and narrow
# enough to catch the usual slip of unit (kW for W, ms for s, percent for a fraction).
#: Per-GPU power and limits [W]: no data-centre GPU under load draws under 50 W or over 2 kW
#: (H200 700 W, B200 1000 W), so 0.662 is kW typed as W.
GPU_POWER_RANGE_W = (50.0, 2000.0)
#: Iteration period [s]: 10 ms to an hour covers the fastest inference step and the slowest
#: checkpointing loop; beyond them the value is in ms or minutes.
PERIOD_RANGE_S = (0.01, 3600.0)
#: GPUs per job: the largest training jobs run on about 100,000.
GPUS_RANGE = (1, 100_000)
#: PFI: the study's H200 jobs lie in 1.10 - 2.67 and the fleet family reaches about 0.8 - 40
#: (docs/model.md, section 2); below 0.5 or above 10 no measured job has been seen.
PFI_RANGE = (0.5, 10.0)
#: Overhead factor k: facility kW per GPU kW; above 3 (a PUE of 3) it is a percentage.
OVERHEAD_FACTOR_RANGE = (1.0, 3.0)
#: Static load [kW]: up to a gigawatt, larger than any site; more is W typed as kW.
STATIC_LOAD_RANGE_KW = (0.0, 1_000_000.0)
#: What a sweep's curve is below its lowest cap (`flexmodel.jobs.Job.sweep_extension`).
SWEEP_EXTENSIONS = ("none", "family")
#: A job's own power-to-clock shape (`flexmodel.dvfs`): static share below the lowest cap's
#: power fraction, exponent from constant voltage to well past voltage proportional to clock.
STATIC_SHARE_RANGE = (0.0, 0.6)
EXPONENT_RANGE = (0.5, 5.0)
#: How a sweep's curve joins its points (`flexmodel.jobs.Job.sweep_interpolation`).
SWEEP_INTERPOLATIONS = ("linear", "pchip", "family")


def parse_job_mix_json(
    text: str, *, source: str = "job mix", tiers: TierTable = DEFAULT_TIERS
) -> JobMix:
    """Decode and validate a job-mix document; errors start with `source` (a file name)."""
    doc = parse_json(text, source=source)
    try:
        return parse_job_mix(doc, tiers=tiers)
    except FlexModelError as exc:
        raise type(exc)(f"{source}: {exc}") from exc


def parse_json(text: str, *, source: str) -> Any:
    """Strict JSON: a syntax error says where; NaN and Infinity are refused (JSON has neither)."""
    try:
        return json.loads(text.removeprefix("\ufeff"), parse_constant=_refuse_constant)
    except json.JSONDecodeError as exc:
        raise FlexModelError(
            f"{source}: invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}"
        ) from exc
    except _NotJsonError as exc:
        raise FlexModelError(f"{source}: {exc}") from exc


class _NotJsonError(ValueError):
    """A constant Python's `json` accepts and JSON does not."""


def _refuse_constant(name: str) -> Any:
    raise _NotJsonError(f"{name} is not a number JSON allows")


_MIX_FIELDS = {"overhead_factor", "overhead_factor_stderr", "static_load_kw", "jobs"}
_JOB_FIELDS = set(Job.__dataclass_fields__)
_REQUIRED = ("id", "gpus", "power_w", "throughput")
_POINT_FIELDS = ("cap_w", "power_w", "throughput")
_WATTS: dict[str, Any] = {"within": GPU_POWER_RANGE_W, "unit": "W"}


def parse_job_mix(doc: Any, *, tiers: TierTable = DEFAULT_TIERS) -> JobMix:
    """Validate a decoded job-mix document; raise `InvalidJobError` naming the first problem.
    A job's `tier` is read in `tiers`."""
    if not isinstance(doc, dict):
        raise InvalidJobError("job mix: expected a JSON object with a 'jobs' list")
    refuse_unknown(doc, _MIX_FIELDS, "job mix")
    jobs_doc = doc.get("jobs")
    if not isinstance(jobs_doc, list):
        raise InvalidJobError("job mix: 'jobs' must be a list of job objects")
    jobs = tuple(parse_job(item, i, tiers) for i, item in enumerate(jobs_doc))
    seen: set[str] = set()
    for job in jobs:
        if job.id in seen:
            raise InvalidJobError(f"job mix: job id '{job.id}' appears twice")
        seen.add(job.id)
    _refuse_shared_gpus(jobs)
    mix = JobMix(
        jobs=jobs,
        overhead_factor=number_field(
            doc, "overhead_factor", "job mix", 1.0, within=OVERHEAD_FACTOR_RANGE
        ),
        overhead_factor_stderr=number_field(
            doc, "overhead_factor_stderr", "job mix", 0.0, within=(0.0, 1.0)
        ),
        static_load_kw=number_field(
            doc, "static_load_kw", "job mix", 0.0, within=STATIC_LOAD_RANGE_KW, unit="kW"
        ),
    )
    mix.curves  # noqa: B018 - a PFI the family cannot represent is bad input: say so now
    return mix


def parse_job(doc: Any, index: int = 0, tiers: TierTable = DEFAULT_TIERS) -> Job:
    """Validate one job object of a job mix; its `tier` is read in `tiers`."""
    ident, where = _job_where(doc, index)
    gpus = _gpus(doc, where)
    min_cap, max_cap, power = _power_w(doc, where)
    pfi = optional_field(doc, "pfi", where, within=PFI_RANGE)
    grid = _grid_w(doc.get("pfi_grid_w"), where)
    tier, floor, protected = _tier_bounds(doc, where, tiers)
    job = Job(
        id=ident,
        gpus=gpus,
        power_w=power,
        power_stderr_w=optional_field(doc, "power_stderr_w", where, minimum=0.0, unit="W"),
        throughput=number_field(
            doc, "throughput", where, minimum=0.0, strict=True, unit="tokens/s"
        ),
        pfi=pfi,
        pfi_stderr=optional_field(doc, "pfi_stderr", where, within=(0.0, PFI_RANGE[1])),
        pfi_grid_w=grid,
        sweep=_sweep(doc.get("sweep"), where),
        sweep_extension=_sweep_option(doc, "sweep_extension", SWEEP_EXTENSIONS, where),
        sweep_interpolation=_sweep_option(doc, "sweep_interpolation", SWEEP_INTERPOLATIONS, where),
        min_cap_w=min_cap,
        max_cap_w=max_cap,
        min_throughput_fraction=floor,
        protected=protected,
        tier=tier,
        weight=number_field(doc, "weight", where, 1.0, minimum=0.0),
        remaining_s=optional_field(doc, "remaining_s", where, minimum=0.0, unit="s"),
        period_s=number_field(
            doc, "period_s", where, DEFAULT_PERIOD_S, within=PERIOD_RANGE_S, unit="s"
        ),
        duty=number_field(doc, "duty", where, DEFAULT_DUTY, within=SHARE, strict=True),
        comm_power_fraction=number_field(
            doc, "comm_power_fraction", where, DEFAULT_COMM_POWER_FRACTION, within=SHARE
        ),
        placement=_placement(doc.get("placement"), where, gpus),
        model_family=_model_family(doc.get("model_family"), where),
        static_share=optional_field(doc, "static_share", where, within=STATIC_SHARE_RANGE),
        exponent=optional_field(doc, "exponent", where, within=EXPONENT_RANGE),
    )
    if job.sweep is not None:
        _check_sweep(job, where)
    return job


def _job_where(doc: Any, index: int) -> tuple[str, str]:
    """A job object's id and how messages name it, once its fields are known and present."""
    if not isinstance(doc, dict):
        raise InvalidJobError(f"jobs[{index}]: expected a job object")
    ident = doc.get("id")
    if not isinstance(ident, str) or not ident.strip():
        raise InvalidJobError(f"jobs[{index}]: 'id' must be a non-empty string")
    where = f"job '{ident}'"
    refuse_unknown(doc, _JOB_FIELDS, where)
    for name in _REQUIRED:
        if name not in doc:
            raise InvalidJobError(f"{where}: missing required field '{name}'")
    return ident, where


def _gpus(doc: dict[str, Any], where: str) -> int:
    gpus = doc["gpus"]
    low, high = GPUS_RANGE
    if isinstance(gpus, bool) or not isinstance(gpus, int) or not low <= gpus <= high:
        raise InvalidJobError(
            f"{where}: 'gpus' must be a whole number from {low} to {high:,}, got {gpus!r}"
        )
    return gpus


def _power_w(doc: dict[str, Any], where: str) -> tuple[float, float, float]:
    """A job's per-GPU cap limits and uncapped power [W]: (min_cap_w, max_cap_w, power_w)."""
    min_cap = number_field(doc, "min_cap_w", where, DEFAULT_MIN_CAP_W, **_WATTS)
    max_cap = number_field(doc, "max_cap_w", where, DEFAULT_MAX_CAP_W, **_WATTS)
    if min_cap >= max_cap:
        raise InvalidJobError(f"{where}: min_cap_w {min_cap:g} must be below max_cap_w {max_cap:g}")
    power = number_field(doc, "power_w", where, **_WATTS)
    if power > max_cap:
        raise InvalidJobError(
            f"{where}: power_w {power:g} is above max_cap_w {max_cap:g} (a GPU cannot draw more "
            "than its limit on average)"
        )
    return min_cap, max_cap, power


def _grid_w(value: Any, where: str) -> tuple[float, ...] | None:
    """The caps a job's PFI is on [W] (None: its default grid)."""
    if value is None:
        return None
    grid = tuple(number_list(value, f"{where}: 'pfi_grid_w'", **_WATTS))
    check_grid(grid, where)
    return grid


def _tier_bounds(
    doc: dict[str, Any], where: str, tiers: TierTable
) -> tuple[int | None, float, bool]:
    """A job's tier, throughput floor and protection: the stricter of its own and its tier's."""
    tier = _tier(doc.get("tier"), where, tiers)
    floor = number_field(doc, "min_throughput_fraction", where, 0.0, within=SHARE)
    protected = boolean_field(doc, "protected", where)
    if tier is not None:
        floor = max(floor, tiers.floor(tier))
        protected = protected or tiers.protected(tier)
    return tier, floor, protected


def _sweep_option(doc: dict[str, Any], key: str, choices: tuple[str, ...], where: str) -> str:
    """One of a sweep's options (the first choice when absent)."""
    value = doc.get(key)
    if value is None:
        return choices[0]
    if value not in choices:
        raise InvalidJobError(
            f"{where}: '{key}' must be one of {', '.join(choices)}, got {value!r}"
        )
    if doc.get("sweep") is None:
        raise InvalidJobError(f"{where}: '{key}' needs a 'sweep'")
    return str(value)


def _model_family(value: Any, where: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not 0 < len(value.strip()) <= 64:
        raise InvalidJobError(
            f"{where}: 'model_family' must be a name of 1 to 64 characters "
            "(e.g. dense, moe-finetune)"
        )
    return value.strip()


def _refuse_shared_gpus(jobs: tuple[Job, ...]) -> None:
    """Two jobs on one GPU: the agent would cap the GPU for one of them and lose the other."""
    holder: dict[tuple[str, int], str] = {}
    for job in jobs:
        for place in job.placement or ():
            clashes: dict[str, list[int]] = {}
            for gpu in place.gpus:
                other = holder.setdefault((place.node, gpu), job.id)
                if other != job.id:
                    clashes.setdefault(other, []).append(gpu)
            for other, gpus in clashes.items():
                raise InvalidJobError(
                    f"job mix: jobs '{other}' and '{job.id}' are both placed on node "
                    f"'{place.node}' GPU(s) {', '.join(map(str, gpus))} (a GPU runs one job)"
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
        job.measured_sweep  # noqa: B018 - the one rule for sweeps (flexmodel.sweeps)
    except FlexModelError as exc:
        raise InvalidJobError(str(exc)) from exc


def check_gpu_power_w(value: float, label: str) -> float:
    """A per-GPU power [W] refused (`InvalidJobError`) outside `GPU_POWER_RANGE_W`, naming the
    likely slip (kW typed as W): the job mix's own check, for sweeps and traces."""
    return check_number(value, label, within=GPU_POWER_RANGE_W, unit="W")


def _tier(value: Any, where: str, tiers: TierTable) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < tiers.count:
        raise InvalidJobError(
            f"{where}: 'tier' must be a whole number from 0 to {tiers.count - 1}, got {value!r}"
        )
    return value


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
        refuse_unknown(point, set(_POINT_FIELDS), label)
        cap = number_field(point, "cap_w", label, within=GPU_POWER_RANGE_W, unit="W")
        power = number_field(point, "power_w", label, within=GPU_POWER_RANGE_W, unit="W")
        thr = number_field(point, "throughput", label, minimum=0.0, unit="tokens/s")
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
        refuse_unknown(item, {"node", "gpus"}, label)
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
