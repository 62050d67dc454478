"""Measured points fitted (`gateway.services.curves` stores the fits).

- **Fit** (`fit_points`): `flexmodel.sweeps.fit_sweep` on the points with their stated noise:
  the PFI with its standard error on the measured grid (nothing extrapolated; PFIs compare
  only on one grid), the monotone curve, the points set aside.
- **A probe's fit** (`fit_probe_levels`): the stretches the probe recorded, in the order run,
  with the uncapped references that bracket its capped levels, read by
  `flexmodel.drift.fit_probe`: the job's drift in power and throughput across the probe is
  measured from the references, removed from every level, and its uncertainty added to the
  PFI's error (`fit["drift"]`). Its points are the levels so corrected. The job's own
  power-to-clock shape is read from the same stretches where the agents report the SM clock
  (`clock_shape_of`, `fit["shape"]`).
"""

from __future__ import annotations

import math
from typing import Any

from flexmodel.drift import DriftFit, ProbeLevel, fit_probe
from flexmodel.dvfs import ClockShape, family_shape, fit_clock_shape
from flexmodel.errors import FlexModelError
from flexmodel.sweeps import MeasuredSweep, fit_sweep


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
    ref_power_se = [lv["power_stderr_w"] for lv in refs if lv["power_stderr_w"]]
    power_se = None if not ref_power_se else max(ref_power_se) / len(refs) ** 0.5
    fit = _fit_doc(drift.sweep, power_se) | {
        "drift": _drift_doc(drift),
        "shape": clock_shape_of(timed, uncapped, drift.power_drift_per_s).as_doc(),
        "levels": levels,
    }
    points = _corrected_points(
        timed, drift.sweep, uncapped, power_se, ref_period, throughput, probe_id=probe_id, at=at
    )
    return points, fit


def _drift_doc(drift: DriftFit) -> dict[str, Any]:
    return {
        "power_per_s": drift.power_drift_per_s,
        "power_stderr_per_s": drift.power_drift_stderr_per_s,
        "throughput_per_s": drift.throughput_drift_per_s,
        "throughput_stderr_per_s": drift.throughput_drift_stderr_per_s,
        "pfi_stderr": drift.pfi_drift_stderr,
        "references": drift.references,
    }


def _corrected_points(
    timed: list[dict[str, Any]],
    sweep: MeasuredSweep,
    uncapped: float,
    power_se: float | None,
    ref_period: float,
    throughput: float,
    *,
    probe_id: str,
    at: str,
) -> list[dict[str, Any]]:
    """A probe's levels (`timed`) as the drift-corrected `sweep` gives them, points in the job's
    units: the uncapped one with its references' error of the mean `power_se`, the period of
    each from the references' mean `ref_period`."""
    by_cap: dict[float, list[dict[str, Any]]] = {}
    for lv in timed:
        by_cap.setdefault(lv["cap_w"], []).append(lv)
    return [
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
