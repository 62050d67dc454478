"""Whether a job's measured fit is in force, and what it sets (`gateway.services.curves`
lays it over the job book).

A fit whose PFI's standard error is at most `curve_max_pfi_stderr`, or below that of the PFI
it would replace (a prediction's, the default's), replaces the job's curve in the job book
(`JobBook.use_curves`), as a sweep in the job-mix form with the fitted error, so plans and
quotes use it and firm kW carries its uncertainty. Its shape (`curve_shape`): by default the
fleet family's at the fitted PFI on the measured grid, through the measured uncapped level
(`sweep_interpolation: family`): the few measured levels, each off by its noise and the drift
left after its removal, give the PFI and the uncapped level well, their shape between them
badly, and a planner given a cubic through them allocates on its wiggles (docs/benchmarks.md,
"PFI measured on site by probing"). With `curve_shape=points`, the points themselves: a
monotone cubic between the levels (`curve_interpolation`) and below the lowest the fleet
family at the fitted PFI (`curve_extend`, `flexmodel.curves.extend_below`). Either way
measuring a job never makes it less flexible to the planner than its prediction did. A fit
not good enough for that is weighed with the PFI it would replace, on the job's own grid
(`combined`).
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from flexmodel.curves import EXPONENT, STATIC_SHARE, FamilyShape
from flexmodel.jobmix import PFI_RANGE
from flexmodel.jobs import Job
from flexmodel.pfi import combined_estimate, fitted_family_pfi
from flexmodel.pficarry import CARRY_SHAPE_REL, pfi_on_own_grid
from gateway.services.probecaps import CAP_RESOLUTION_W


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
    own grid through the fleet family (`flexmodel.pficarry.pfi_on_own_grid`), is weighed with the
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
