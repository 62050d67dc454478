"""The job-mix JSON reader (CONTRACT.md): the one every caller uses.

`parse_job_mix_json` takes the text of a job-mix document (a file's contents, a request body)
and `parse_job_mix` the decoded document; both return a `JobMix` or raise `InvalidJobError`
with a one-line message naming the source, job and field at fault. Unknown fields are refused
by name; so are NaN and Infinity, which Python's `json` would otherwise accept. Reading the
file is the caller's (flexmodel does no I/O).
"""

from __future__ import annotations

import json
import math
from typing import Any

from flexmodel.curves import sweep_curve
from flexmodel.errors import FlexModelError, InvalidJobError
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


def parse_job_mix_json(text: str, *, source: str = "job mix") -> JobMix:
    """Decode and validate a job-mix document; errors start with `source` (a file name)."""
    doc = parse_json(text, source=source)
    try:
        return parse_job_mix(doc)
    except FlexModelError as exc:
        raise type(exc)(f"{source}: {exc}") from exc


def parse_json(text: str, *, source: str) -> Any:
    """Strict JSON: a syntax error says where; NaN and Infinity are refused (JSON has neither)."""
    try:
        return json.loads(text, parse_constant=_refuse_constant)
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
