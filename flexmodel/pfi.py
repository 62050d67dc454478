"""The Power Flexibility Index (docs/model.md, section 2).

    PFI = mean over capped points i of (1 - P_i / P_max) / (1 - T_i / T_max)

with `P_i` measured mean GPU power (not the cap), `T_i` throughput and the uncapped run
(highest cap) as reference. A PFI depends on its cap grid, so the grid travels with it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy.optimize import minimize_scalar

from flexmodel.curves import INSENSITIVE_SHARE_RANGE, Array, FamilyShape, family_point
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


def pfi_rows(grid_w: Array, power_w: Array, throughput: Array) -> Array:
    """Eq. 1 per row, from power [W] and throughput sampled at each row's grid caps (J, G).

    Grids are NaN-padded; a row's highest cap is its uncapped reference. Caps that did not
    lower throughput are left out, as a sweep would leave out a cap that did not bind; a row no
    cap binds gets NaN.
    """
    grid = np.asarray(grid_w, dtype=float)
    top = np.nanargmax(grid, axis=1)
    rows = np.arange(grid.shape[0])
    p_max, t_max = power_w[rows, top][:, None], throughput[rows, top][:, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        loss = 1.0 - throughput / t_max
        binding = ~np.isnan(grid) & (grid < grid[rows, top][:, None]) & (loss > _BINDING)
        ratio = np.where(binding, (1.0 - power_w / p_max) / loss, 0.0)
        count = binding.sum(axis=1)
        return np.where(count > 0, ratio.sum(axis=1) / count, np.nan)


def family_pfi(grid_w: Array, shape: FamilyShape, insensitive_share: ArrayLike) -> Array:
    """Eq. 1 for family jobs on their grids (J, G), NaN-padded (see `pfi_rows`)."""
    grid = np.asarray(grid_w, dtype=float)
    power, frac = family_point(np.nan_to_num(grid, nan=0.0), shape, insensitive_share)
    return pfi_rows(grid, power, frac)


def solve_insensitive_share(
    pfi: ArrayLike,
    grid_w: Array,
    shape: FamilyShape,
    *,
    names: list[str] | None = None,
    clip: bool = False,
) -> Array:
    """The clock-insensitive share `m` per job so that the family's PFI on `grid_w` equals `pfi`.

    The family's PFI rises with `m`, so a vectorised bracketing solver finds it. A PFI outside
    what the family can represent on that grid raises `InvalidJobError` naming the job. Jobs
    that no grid cap binds (uncapped power below every capped grid point) keep `m = 0`: any cap
    leaves them untouched. With `clip`, a PFI out of reach is taken as the nearest one the
    family reaches (for noisy estimates, such as predicted PFIs).
    """
    target = np.atleast_1d(np.asarray(pfi, dtype=float))
    if len(shape) == 1:  # one shape for every job
        shape = shape.select(np.zeros(target.size, dtype=np.intp))

    def pfi_at(m: Array, rows: slice | NDArray[np.intp] = slice(None)) -> Array:
        return family_pfi(grid_w[rows], shape.select(rows), m)

    lo = np.full(target.shape, INSENSITIVE_SHARE_RANGE[0])
    hi = np.full(target.shape, INSENSITIVE_SHARE_RANGE[1])
    pfi_lo, pfi_hi = pfi_at(lo), pfi_at(hi)
    unbound = np.isnan(pfi_lo)
    if clip:
        target = np.where(unbound, target, np.clip(target, pfi_lo, pfi_hi))
    bad = ~unbound & ((target < pfi_lo) | (target > pfi_hi))
    if np.any(bad):
        j = int(np.flatnonzero(bad)[0])
        who = f"job '{names[j]}'" if names else f"job {j}"
        raise InvalidJobError(
            f"{who}: pfi {target[j]:g} is outside what the fleet family can represent on grid "
            f"{_grid_text(grid_w[j])} for this job ({pfi_lo[j]:.3f} to {pfi_hi[j]:.3f})"
        )
    return _illinois(pfi_at, target, (lo, hi), (pfi_lo - target, pfi_hi - target), ~unbound)


def _illinois(
    pfi_at: Callable[[Array, NDArray[np.intp]], Array],
    target: Array,
    bracket: tuple[Array, Array],
    misses: tuple[Array, Array],
    solve: NDArray[np.bool_],
) -> Array:
    """The `m` in each job's `bracket` at which `pfi_at` meets `target`, for the jobs to
    `solve` (0 for the others), by Illinois (regula falsi that halves a stale end) on the jobs
    not yet converged; `misses` are `pfi_at - target` at the bracket's ends."""
    lo, hi = bracket
    f_lo, f_hi = misses
    m = np.zeros(target.shape)
    last = np.zeros(target.shape)
    active = np.flatnonzero(solve)
    for _ in range(_MAX_ITERATIONS):
        if active.size == 0:
            break
        lo_a, hi_a, fl, fh = lo[active], hi[active], f_lo[active], f_hi[active]
        with np.errstate(divide="ignore", invalid="ignore"):
            mid = (lo_a * fh - hi_a * fl) / (fh - fl)
        mid = np.clip(np.where(np.isfinite(mid), mid, 0.5 * (lo_a + hi_a)), lo_a, hi_a)
        f = pfi_at(mid, active) - target[active]
        m[active] = mid
        done = (np.abs(f) <= _PFI_TOLERANCE * target[active]) | (hi_a - lo_a <= 1e-13)
        left = f < 0
        lo[active], f_lo[active] = np.where(left, mid, lo_a), np.where(left, f, fl)
        hi[active], f_hi[active] = np.where(left, hi_a, mid), np.where(left, fh, f)
        stale_hi, stale_lo = left & (last[active] < 0), ~left & (last[active] > 0)
        f_hi[active] = np.where(stale_hi, f_hi[active] / 2, f_hi[active])
        f_lo[active] = np.where(stale_lo, f_lo[active] / 2, f_lo[active])
        last[active] = np.where(left, -1.0, 1.0)
        active = active[~done]
    return m


def fitted_family_pfi(
    shape: FamilyShape, cap_w: ArrayLike, throughput_fraction: ArrayLike, grid_w: ArrayLike
) -> float:
    """The PFI on `grid_w` of one job's family curve (`shape`, one job) nearest its measured
    levels: the clock-insensitive share whose throughput fractions at the capped levels
    `cap_w` [W] are nearest the measured ones in least squares.

    Eq. 1 on a few measured levels weighs each ratio alike, and the shallowest level's
    ratio divides by the smallest loss: its noise moves the PFI most. Least squares on the
    throughputs weighs each level by what it says, so the deep levels set the curve
    (docs/model.md, section 1). NaN where no cap of the grid binds the family.
    """
    caps = np.atleast_2d(np.asarray(cap_w, dtype=float))
    measured = np.asarray(throughput_fraction, dtype=float)

    def cost(m: float) -> float:
        _, frac = family_point(caps, shape, np.array([m]))
        return float(np.sum((frac[0] - measured) ** 2))

    m = minimize_scalar(
        cost, bounds=INSENSITIVE_SHARE_RANGE, method="bounded", options={"xatol": 1e-9}
    )
    grid = np.atleast_2d(np.asarray(grid_w, dtype=float))
    return float(family_pfi(grid, shape, np.array([m.x]))[0])


def combined_estimate(*estimates: tuple[float, float]) -> tuple[float, float]:
    """Independent estimates `(value, standard error)` of one PFI on one grid, weighted by
    their precision (inverse variance): the combined value and its standard error. Every
    error must be positive."""
    if not estimates or any(not se > 0 for _, se in estimates):
        raise ValueError(f"estimates need positive standard errors, got {estimates}")
    weights = [1.0 / se**2 for _, se in estimates]
    total = sum(weights)
    value = sum(w * v for w, (v, _) in zip(weights, estimates, strict=True)) / total
    return value, total**-0.5


def grid_matrix(grids: list[tuple[float, ...]]) -> Array:
    """Grids of different lengths as one NaN-padded (J, G) array."""
    width = max(len(g) for g in grids)
    out = np.full((len(grids), width), np.nan)
    for j, g in enumerate(grids):
        out[j, : len(g)] = sorted(g)
    return out


def _grid_text(row: Array) -> str:
    return "{" + ",".join(f"{v:g}" for v in row[~np.isnan(row)]) + "} W"


def check_grid(grid: tuple[float, ...], name: str) -> None:
    if len(grid) < 2 or len(set(grid)) != len(grid) or min(grid) <= 0:
        raise InvalidJobError(f"{name}: pfi_grid_w needs two or more distinct positive caps")
