"""The Power Flexibility Index (MODEL.md section 3).

    PFI = mean over capped points i of (1 - P_i / P_max) / (1 - T_i / T_max)

with `P_i` measured mean GPU power (not the cap), `T_i` throughput and the uncapped run
(highest cap) as reference. A PFI depends on its cap grid, so the grid travels with it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

from flexmodel.curves import (
    EXPONENT,
    INSENSITIVE_SHARE_RANGE,
    STATIC_SHARE,
    Array,
    family_point,
    waveform_levels,
)
from flexmodel.errors import InvalidJobError, InvalidSweepError

#: The study's grids: 8-GPU jobs were swept on six caps, larger jobs on four.
FINE_GRID_W = (200.0, 300.0, 400.0, 500.0, 600.0, 700.0)
COARSE_GRID_W = (200.0, 500.0, 600.0, 700.0)
#: Fleet default when a job has neither a PFI nor a sweep (mean and standard error).
DEFAULT_PFI = 1.35
DEFAULT_PFI_STDERR = 0.30
#: A capped point counts only where the cap lowered throughput by more than this fraction.
_BINDING = 1e-9
#: A solved curve's PFI matches its target to this relative error.
_PFI_TOLERANCE = 1e-12
_MAX_ITERATIONS = 100


@dataclass(frozen=True)
class PfiResult:
    pfi: float
    grid_w: tuple[float, ...]  #: every cap of the sweep, the uncapped one included [W]
    points: int


def default_grid_w(gpus: int) -> tuple[float, ...]:
    """The study's cap grid for a job of `gpus` GPUs."""
    return FINE_GRID_W if gpus <= 8 else COARSE_GRID_W


def pfi_of_sweep(points: list[tuple[float, float, float]], name: str = "sweep") -> PfiResult:
    """Eq. 1 over a measured sweep of `(cap_w, power_w, throughput)` points."""
    if len(points) < 2:
        raise InvalidSweepError(
            f"{name}: needs at least two points (a capped and the uncapped run)"
        )
    ordered = sorted(points)
    caps = [p[0] for p in ordered]
    if len(set(caps)) != len(caps):
        raise InvalidSweepError(f"{name}: two points share a cap")
    _, p_max, t_max = ordered[-1]
    if p_max <= 0 or t_max <= 0:
        raise InvalidSweepError(f"{name}: the uncapped point needs positive power and throughput")
    ratios = []
    for cap, power, thr in ordered[:-1]:
        loss = 1.0 - thr / t_max
        if loss <= _BINDING:
            raise InvalidSweepError(
                f"{name}: at cap {cap:g} W throughput {thr:g} is not below the uncapped {t_max:g}; "
                "Eq. 1 is undefined there (drop points where the cap did not bind)"
            )
        ratios.append((1.0 - power / p_max) / loss)
    return PfiResult(pfi=float(np.mean(ratios)), grid_w=tuple(caps), points=len(ordered))


def family_pfi(
    grid_w: Array,
    *,
    compute_w: ArrayLike,
    comm_w: ArrayLike,
    duty: ArrayLike,
    insensitive_share: ArrayLike,
    static_share: ArrayLike = STATIC_SHARE,
    exponent: ArrayLike = EXPONENT,
) -> Array:
    """Eq. 1 for family jobs on their grids (J, G), NaN-padded; the last valid cap is uncapped.

    Caps at or above a job's compute level do not bind and are left out, as a sweep would
    leave out a cap that did not lower throughput. A job no grid cap binds gets NaN.
    """
    grid = np.asarray(grid_w, dtype=float)
    top = np.nanmax(grid, axis=1, keepdims=True)
    power, frac = family_point(
        np.nan_to_num(grid, nan=0.0),
        compute_w=_column(compute_w),
        comm_w=_column(comm_w),
        duty=_column(duty),
        insensitive_share=_column(insensitive_share),
        static_share=_column(static_share),
        exponent=_column(exponent),
    )
    p_max, t_max = family_point(
        top,
        compute_w=_column(compute_w),
        comm_w=_column(comm_w),
        duty=_column(duty),
        insensitive_share=_column(insensitive_share),
        static_share=_column(static_share),
        exponent=_column(exponent),
    )
    loss = 1.0 - frac / t_max
    binding = ~np.isnan(grid) & (grid < top) & (loss > _BINDING)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(binding, (1.0 - power / p_max) / loss, 0.0)
        count = binding.sum(axis=1)
        return np.where(count > 0, ratio.sum(axis=1) / count, np.nan)


def solve_insensitive_share(
    pfi: ArrayLike,
    grid_w: Array,
    *,
    power_w: ArrayLike,
    max_cap_w: ArrayLike,
    duty: ArrayLike,
    comm_power_fraction: ArrayLike,
    static_share: ArrayLike = STATIC_SHARE,
    exponent: ArrayLike = EXPONENT,
    names: list[str] | None = None,
) -> Array:
    """The clock-insensitive share `m` per job so that the family's PFI on `grid_w` equals `pfi`.

    The family's PFI rises with `m`, so a vectorised bracketing solver finds it. A PFI outside what the
    family can represent on that grid raises `InvalidJobError` naming the job. Jobs that no grid
    cap binds (uncapped power below every capped grid point) keep `m = 0`: any cap leaves them
    untouched.
    """
    target = np.atleast_1d(np.asarray(pfi, dtype=float))
    compute, comm = waveform_levels(power_w, duty, comm_power_fraction, max_cap_w)
    compute, comm, d = (np.broadcast_to(v, target.shape) for v in (compute, comm, duty))
    shape = {"static_share": static_share, "exponent": exponent}
    s, a = (np.broadcast_to(np.asarray(v, dtype=float), target.shape) for v in shape.values())

    def pfi_at(m: Array) -> Array:
        return family_pfi(
            grid_w,
            compute_w=compute,
            comm_w=comm,
            duty=d,
            insensitive_share=m,
            static_share=s,
            exponent=a,
        )

    lo = np.full(target.shape, INSENSITIVE_SHARE_RANGE[0])
    hi = np.full(target.shape, INSENSITIVE_SHARE_RANGE[1])
    pfi_lo, pfi_hi = pfi_at(lo), pfi_at(hi)
    unbound = np.isnan(pfi_lo)
    bad = ~unbound & ((target < pfi_lo) | (target > pfi_hi))
    if np.any(bad):
        j = int(np.flatnonzero(bad)[0])
        who = f"job '{names[j]}'" if names else f"job {j}"
        raise InvalidJobError(
            f"{who}: pfi {target[j]:g} is outside what the fleet family can represent on grid "
            f"{_grid_text(grid_w[j])} for this job ({pfi_lo[j]:.3f} to {pfi_hi[j]:.3f})"
        )
    # Illinois (regula falsi that halves a stale end): about ten evaluations instead of 48.
    f_lo, f_hi = np.where(unbound, -1.0, pfi_lo - target), np.where(unbound, 1.0, pfi_hi - target)
    m = lo.copy()
    last = np.zeros(target.shape)
    for _ in range(_MAX_ITERATIONS):
        m = np.clip((lo * f_hi - hi * f_lo) / (f_hi - f_lo), lo, hi)
        f = np.where(unbound, 0.0, pfi_at(m) - target)
        if np.all(np.abs(f) <= _PFI_TOLERANCE * target):
            break
        left = f < 0
        lo, f_lo = np.where(left, m, lo), np.where(left, f, f_lo)
        hi, f_hi = np.where(left, hi, m), np.where(left, f_hi, f)
        f_hi = np.where(left & (last < 0), f_hi / 2, f_hi)
        f_lo = np.where(~left & (last > 0), f_lo / 2, f_lo)
        last = np.where(left, -1.0, 1.0)
    return np.where(unbound, 0.0, m)


def grid_matrix(grids: list[tuple[float, ...]]) -> Array:
    """Grids of different lengths as one NaN-padded (J, G) array."""
    width = max(len(g) for g in grids)
    out = np.full((len(grids), width), np.nan)
    for j, g in enumerate(grids):
        out[j, : len(g)] = sorted(g)
    return out


def _column(values: ArrayLike) -> Array:
    return np.asarray(values, dtype=float).reshape(-1, 1)


def _grid_text(row: Array) -> str:
    return "{" + ",".join(f"{v:g}" for v in row[~np.isnan(row)]) + "} W"


def check_grid(grid: tuple[float, ...], name: str) -> None:
    if len(grid) < 2 or len(set(grid)) != len(grid) or min(grid) <= 0:
        raise InvalidJobError(f"{name}: pfi_grid_w needs two or more distinct positive caps")
