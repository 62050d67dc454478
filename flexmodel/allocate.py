"""Dividing a power reduction among jobs (docs/model.md, section 5).

Given a GPU-level reduction `R` [W], choose each job's mean power per GPU `p_j` in
`[lo_j, P_j]` to

    maximise   sum_j w_j * x_j(p_j)     subject to   sum_j n_j * (P_j - p_j) = R

Strategies share the bounds and deliver the target exactly when it is feasible, and the
maximum (with `feasible = False`) when it is not:

- `equal`: the same fraction of uncapped power from every flexible job;
- `pfi`: the study's heuristic, cut shares proportional to `n_j * P_j * PFI_j / X_j`;
- `optimal`: the optimum on each job's curve. Curves are piecewise linear, so on concave curves
  this is the exact LP optimum: a fractional knapsack over curve segments taken cheapest
  (least weighted throughput lost per watt) first. A non-concave curve is replaced by its
  concave hull; the one job that can end inside a bridged stretch is repaired (kept, moved to
  either end of the stretch with the difference taken from or given to the others, whichever
  is best on the real curves, the `equal` and `pfi` answers included);
- `oracle`: `optimal` on true curves (simulation only).

Every answer reports `optimality_gap_bound`: the optimum on the hulls (an upper bound on the true
optimum) minus the answer's objective. It is 0 for `optimal` on concave curves and measures what
`equal` and `pfi` leave on the table.

The problem and its bounds are in `flexmodel.problem`; `allocate_mix` is the entry point for a
job mix (the command line and the gateway's planner).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from flexmodel.curves import Array, cap_for_power, throughput_at_power
from flexmodel.errors import FlexModelError
from flexmodel.facility import gpu_reduction_kw
from flexmodel.jobs import JobMix
from flexmodel.problem import TOLERANCE, AllocationProblem, CutSpace

STRATEGIES: tuple[str, ...] = ("equal", "pfi", "optimal", "oracle")


@dataclass(frozen=True)
class Allocation:
    """Per-job operating points for a GPU-level reduction."""

    strategy: str
    objective: str
    feasible: bool
    target_w: float  #: requested GPU reduction [W]
    achieved_w: float  #: delivered GPU reduction [W]
    max_w: float  #: largest feasible GPU reduction [W]
    cap_w: Array  #: (J,) per-GPU cap [W]
    power_w: Array  #: (J,) mean power per GPU under the cap [W]
    throughput: Array  #: (J,) whole-job throughput [tokens/s]
    throughput_before: Array  #: (J,) uncapped throughput [tokens/s]
    value: float  #: the objective after the cut
    value_before: float  #: the objective uncapped
    optimality_gap_bound: float  #: how far `value` can be below the optimum (objective units)


def allocate(
    problem: AllocationProblem, reduction_w: float, strategy: str, objective: str = "throughput"
) -> Allocation:
    """Per-job operating points that cut `reduction_w` [W] of GPU power with `strategy`.

    For `oracle`, pass a problem built on the true curves.
    """
    if strategy not in STRATEGIES:
        raise FlexModelError(f"unknown strategy '{strategy}' (choose from {', '.join(STRATEGIES)})")
    if not np.isfinite(reduction_w) or reduction_w < 0:
        raise FlexModelError(f"reduction {reduction_w!r} W must be a finite number of at least 0")
    max_w = float(problem.max_cut_w.sum())
    feasible = reduction_w <= max_w * (1 + TOLERANCE)
    target = min(reduction_w, max_w)
    space = problem.cut_space
    cut, hull_loss = _hull_cut(space, target)
    bound_loss = float(hull_loss.sum())
    if strategy == "equal":
        cut = _equal_cut(problem, target)
    elif strategy == "pfi":
        cut = _pfi_cut(problem, target)
    else:
        cut = _repaired(problem, cut, hull_loss, target)
    power = np.clip(problem.hi_w - cut / problem.gpus, problem.lo_w, problem.hi_w)
    throughput = throughput_at_power(problem.curves, power)
    before = problem.curves.uncapped_throughput
    value = float(problem.weights @ throughput)
    value_before = float(problem.weights @ before)
    return Allocation(
        strategy=strategy,
        objective=objective,
        feasible=bool(feasible),
        target_w=float(reduction_w),
        achieved_w=float(cut.sum()),
        max_w=max_w,
        cap_w=cap_for_power(problem.curves, power),
        power_w=power,
        throughput=throughput,
        throughput_before=before,
        value=value,
        value_before=value_before,
        optimality_gap_bound=max(value_before - bound_loss - value, 0.0),
    )


def _proportional_fill(share: Array, max_cut: Array, target: float) -> Array:
    """Cuts `min(beta * share_j, max_cut_j)` with `beta` chosen so they sum to `target` exactly.

    What a job's bound blocks is redistributed to the others in proportion to their shares.
    """
    cut = np.zeros_like(max_cut)
    flexible = (max_cut > 0) & (share > 0)
    if target <= 0 or not flexible.any():
        return cut
    share_f, max_f = share[flexible], max_cut[flexible]
    stop = max_f / share_f  # beta at which each job reaches its bound
    order = np.argsort(stop, kind="stable")
    stop_s, share_s, max_s = stop[order], share_f[order], max_f[order]
    # Total cut at beta = stop_s[i]: jobs before i are at their bound, the rest proportional.
    done = np.concatenate([[0.0], np.cumsum(max_s)[:-1]])
    open_share = np.cumsum(share_s[::-1])[::-1]
    total_at_stop = done + stop_s * open_share
    i = int(np.searchsorted(total_at_stop, target))
    if i >= len(order):
        out = max_f
    else:
        beta = (target - done[i]) / open_share[i]
        out = np.minimum(beta * share_f, max_f)
        out[order[:i]] = max_s[:i]
    cut[flexible] = out
    # Absorb rounding so the cuts sum to the target to the last bit a float allows.
    cut[np.argmax(max_cut - cut)] += target - cut.sum()
    return np.minimum(cut, max_cut)


def _equal_cut(problem: AllocationProblem, target: float) -> Array:
    return _proportional_fill(problem.gpus * problem.hi_w, problem.max_cut_w, target)


def _pfi_cut(problem: AllocationProblem, target: float) -> Array:
    share = problem.gpus * problem.hi_w * problem.pfi / problem.curves.uncapped_throughput
    return _proportional_fill(share, problem.max_cut_w, target)


def _segments(space: CutSpace) -> tuple[Array, Array]:
    """Every hull segment's width [W] and cost (weighted throughput lost per W)."""
    width = np.diff(space.cut, axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        cost = np.where(width > 0, np.diff(space.hull, axis=1) / width, np.inf)
    return width, cost


def _hull_cut(space: CutSpace, target: float) -> tuple[Array, Array]:
    """Cuts [W] optimal on the hulls, and each job's hull loss (in sum, a bound on any answer)."""
    width, cost = _segments(space)
    cut = _take_cheapest(cost, width, target)
    return cut, space.loss_at(cut, hull=True)


def _take_cheapest(cost: Array, width: Array, amount: float) -> Array:
    """Per-job watts when `amount` is taken from the cheapest segments first.

    Each row's costs rise along the row (hulls are convex), so any order that sorts by cost
    fills every job from the top; ties, within a row or across rows, cost the same either way.
    """
    return _take(np.argsort(cost, axis=None), width, amount)


def hull_cuts(problem: AllocationProblem, reductions_w: ArrayLike) -> Array:
    """Per-job whole-job cuts [W] (P, J) optimal on the hulls, at each of P reductions.

    One sort serves every point: a segment taken whole at one reduction is taken at every
    larger one, so each segment is added once, at the first point that takes it whole, and a
    running sum over the points does the rest. Reductions are clipped to what can be shed.
    """
    width, cost = _segments(problem.cut_space)
    order = np.argsort(cost, axis=None)
    w = width.ravel()[order]
    end = np.cumsum(w)
    rows = order // width.shape[1]
    jobs = width.shape[0]
    amounts = np.minimum(np.asarray(reductions_w, dtype=float), float(end[-1]) if end.size else 0.0)
    # Segments up to `full[p]` (exclusive) are taken whole at point p; segment `full[p]` in part.
    full = np.searchsorted(end, amounts * (1 + 1e-12) - 1e-9, side="right")
    first = np.searchsorted(full, np.arange(w.size), side="right")  # first point taking it whole
    whole = np.zeros((len(amounts) + 1, jobs))
    np.add.at(whole, (first, rows), w)
    cuts = np.cumsum(whole, axis=0)[:-1]
    partial = full < w.size
    at = full[partial]
    cuts[np.flatnonzero(partial), rows[at]] += amounts[partial] - (end[at] - w[at])
    return cuts


def optimal_cuts(problem: AllocationProblem, reductions_w: ArrayLike) -> Array:
    """Per-job whole-job cuts [W] (P, J) that `optimal` makes at each of P reductions: the
    hull cuts of one sort (`hull_cuts`), repaired where a job's cut ends on a bridged stretch
    of a non-concave curve, exactly as `allocate` repairs them."""
    cuts = hull_cuts(problem, reductions_w)
    space = problem.cut_space
    for p, cut in enumerate(cuts):
        cuts[p] = _repaired(problem, cut, space.loss_at(cut, hull=True), float(cut.sum()))
    return cuts


def _repaired(problem: AllocationProblem, cut: Array, hull_loss: Array, target: float) -> Array:
    """The hull answer can fall short where a job's cut bridges a non-concave stretch: there,
    the best real candidate (the repairs, `equal`, `pfi`); elsewhere the hull cut itself."""
    space = problem.cut_space
    bridged = _bridged(space, cut, hull_loss)
    if not bridged.size:
        return cut
    candidates = [cut, *_repairs(space, cut, int(bridged[0]))]
    candidates += [_equal_cut(problem, target), _pfi_cut(problem, target)]
    return min(candidates, key=lambda c: float(space.loss_at(c, hull=False).sum()))


def _bridged(space: CutSpace, cut: Array, hull: Array) -> NDArray[np.intp]:
    """Jobs whose cut ends where the hull loss `hull` lies below the real curve's."""
    return np.flatnonzero(space.loss_at(cut, hull=False) > hull + TOLERANCE * (1.0 + np.abs(hull)))


def _take(order: NDArray[np.intp], width: Array, amount: float) -> Array:
    """Per-job watts when `amount` is taken from segments `width` (J, S) in flat `order`."""
    w = width.ravel()[order]
    taken = np.minimum(np.maximum(amount - (np.cumsum(w) - w), 0.0), w)
    per_job = np.bincount(order // width.shape[1], weights=taken, minlength=width.shape[0])
    return np.asarray(per_job, dtype=float)


def _repairs(space: CutSpace, cut: Array, job: int) -> list[Array]:
    """Allocations that move `job` to either end of its bridged hull stretch.

    The difference is given back by (or taken from) the other jobs' most (least) expensive
    segments, which keeps every other job on its own cheapest-first prefix.
    """
    width, cost = _segments(space)
    order = np.argsort(cost, axis=None)
    row = space.cut[job]
    vertex = np.isclose(space.hull[job], space.loss[job], rtol=TOLERANCE, atol=0.0)
    deeper = row[vertex & (row >= cut[job])]
    shallower = row[vertex & (row <= cut[job])]
    held = np.clip(cut[:, None] - space.cut[:, :-1], 0.0, width)
    others = order[order // width.shape[1] != job]
    out = []
    if deeper.size:
        extra = float(deeper.min() - cut[job])
        back = _take(others[::-1], held, extra)
        if back.sum() >= extra * (1 - TOLERANCE):
            out.append(np.where(np.arange(len(cut)) == job, deeper.min(), cut - back))
    if shallower.size:
        short = float(cut[job] - shallower.max())
        more = _take(others, width - held, short)
        if more.sum() >= short * (1 - TOLERANCE):
            out.append(np.where(np.arange(len(cut)) == job, shallower.max(), cut + more))
    return out


def allocation_dict(
    allocation: Allocation,
    *,
    job_ids: list[str],
    overhead_factor: float,
    requested_facility_kw: float,
) -> dict[str, Any]:
    """The allocation in the JSON shape docs/cli.md shows (facility figures from `k`)."""
    k = overhead_factor
    before = allocation.throughput_before
    return {
        "strategy": allocation.strategy,
        "objective": allocation.objective,
        "feasible": allocation.feasible,
        "requested_facility_kw": requested_facility_kw,
        "target_gpu_kw": gpu_reduction_kw(requested_facility_kw, k),
        "achieved_gpu_kw": allocation.achieved_w / 1000.0,
        "achieved_facility_kw": k * allocation.achieved_w / 1000.0,
        "max_facility_kw": k * allocation.max_w / 1000.0,
        "throughput_before": float(before.sum()),
        "throughput_after": float(allocation.throughput.sum()),
        "optimality_gap_bound": allocation.optimality_gap_bound,
        "jobs": [
            {
                "id": job_id,
                "cap_w": float(cap),
                "power_w": float(power),
                "throughput": float(thr),
                "throughput_fraction": float(thr / x0),
            }
            for job_id, cap, power, thr, x0 in zip(
                job_ids,
                allocation.cap_w,
                allocation.power_w,
                allocation.throughput,
                before,
                strict=True,
            )
        ],
    }


def allocate_mix(
    mix: JobMix,
    facility_kw: float,
    *,
    strategy: str = "optimal",
    objective: str = "throughput",
    excluded: ArrayLike | None = None,
) -> dict[str, Any]:
    """Per-job caps that shed `facility_kw` at the meter, as the JSON docs/cli.md shows.

    `excluded` jobs (one flag per job) give nothing, as the jobs a site cannot reach now; the
    mix's hulls are reused for them.
    """
    if not np.isfinite(facility_kw) or facility_kw < 0:
        raise FlexModelError(f"reduction {facility_kw!r} kW must be a finite number of at least 0")
    problem = mix.problem if objective == "throughput" else mix.problem_for(objective)
    if excluded is not None:
        problem = problem.excluding(excluded)
    # Beyond twice what can be cut, a target is as infeasible (and stays finite: 1e308 kW
    # overflows in watts).
    limit_w = 2.0 * float(problem.max_cut_w.sum()) + 1.0
    gpu_w = min(gpu_reduction_kw(facility_kw, mix.overhead_factor) * 1000.0, limit_w)
    result = allocate(problem, gpu_w, strategy, objective)
    return allocation_dict(
        result,
        job_ids=[j.id for j in mix.jobs],
        overhead_factor=mix.overhead_factor,
        requested_facility_kw=facility_kw,
    )
