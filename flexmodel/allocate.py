"""Dividing a power reduction among jobs (MODEL.md section 5).

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

Bounds (`power_bounds`): the GPU's minimum cap, the QoS floor `min_throughput_fraction`, and
`protected` jobs that give nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any, Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray

from flexmodel.curves import (
    Array,
    Curves,
    cap_for_power,
    interp_rows,
    operating_point,
    power_for_throughput,
    throughput_at_power,
)
from flexmodel.errors import FlexModelError
from flexmodel.facility import gpu_reduction_kw

Strategy = Literal["equal", "pfi", "optimal", "oracle"]
Objective = Literal["throughput", "gpu_fraction"]
STRATEGIES: tuple[str, ...] = ("equal", "pfi", "optimal", "oracle")
OBJECTIVES: tuple[str, ...] = ("throughput", "gpu_fraction")
#: Relative tolerance on watts and on throughput when comparing curve values.
_TOL = 1e-9


@dataclass(frozen=True)
class Problem:
    """What every strategy needs: curves, GPU counts, weights and power bounds per job."""

    curves: Curves
    gpus: Array  #: (J,) GPUs per job
    weights: Array  #: (J,) objective weight per unit of whole-job throughput
    lo_w: Array  #: (J,) lowest allowed mean power per GPU [W]
    pfi: Array  #: (J,) PFI per job, for the `pfi` strategy

    @property
    def hi_w(self) -> Array:
        return self.curves.uncapped_power_w

    @property
    def max_cut_w(self) -> Array:
        """Largest reduction each job can give, whole job [W]."""
        return self.gpus * (self.hi_w - self.lo_w)

    @cached_property
    def cut_space(self) -> _CutSpace:
        """The curves seen from uncapped down, with their hulls (built once per problem)."""
        return _cut_space(self)

    def excluding(self, gone: ArrayLike) -> Problem:
        """The same problem with the `gone` jobs giving nothing; the hulls are reused."""
        out = replace(self, lo_w=np.where(gone, self.hi_w, self.lo_w))
        space = self.cut_space
        rows = np.asarray(gone, dtype=bool)[:, None]
        out.__dict__["cut_space"] = _CutSpace(  # what cached_property would compute, cheaper
            cut=np.where(rows, 0.0, space.cut),
            loss=np.where(rows, 0.0, space.loss),
            hull=np.where(rows, 0.0, space.hull),
        )
        return out


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


def power_bounds(
    curves: Curves,
    *,
    min_cap_w: ArrayLike,
    min_throughput_fraction: ArrayLike,
    protected: ArrayLike,
) -> Array:
    """Lowest allowed mean power per GPU [W]: minimum cap, QoS floor, protection."""
    hi = curves.uncapped_power_w
    at_min_cap = operating_point(curves, min_cap_w)[0]
    floor = np.asarray(min_throughput_fraction, dtype=float) * curves.uncapped_throughput
    at_floor = power_for_throughput(curves, floor)
    lo = np.maximum(at_min_cap, at_floor)
    return np.minimum(np.where(np.asarray(protected, dtype=bool), hi, lo), hi)


def objective_weights(objective: str, weights: ArrayLike, gpus: Array, throughput: Array) -> Array:
    """Per-job weight on whole-job throughput for an objective."""
    w = np.asarray(weights, dtype=float)
    if objective == "throughput":
        return w * np.ones_like(gpus)
    if objective == "gpu_fraction":
        return w * gpus / throughput
    raise FlexModelError(f"unknown objective '{objective}' (choose from {', '.join(OBJECTIVES)})")


def allocate(
    problem: Problem, reduction_w: float, strategy: str, objective: str = "throughput"
) -> Allocation:
    """Per-job operating points that cut `reduction_w` [W] of GPU power with `strategy`.

    For `oracle`, pass a problem built on the true curves.
    """
    if strategy not in STRATEGIES:
        raise FlexModelError(f"unknown strategy '{strategy}' (choose from {', '.join(STRATEGIES)})")
    if not np.isfinite(reduction_w) or reduction_w < 0:
        raise FlexModelError(f"reduction {reduction_w!r} W must be a finite number of at least 0")
    max_w = float(problem.max_cut_w.sum())
    feasible = reduction_w <= max_w * (1 + _TOL)
    target = min(reduction_w, max_w)
    space = problem.cut_space
    cut, hull_loss = _hull_cut(space, target)
    bound_loss = float(hull_loss.sum())
    if strategy == "equal":
        cut = _equal_cut(problem, target)
    elif strategy == "pfi":
        cut = _pfi_cut(problem, target)
    else:
        bridged = _bridged(space, cut, hull_loss)
        if bridged.size:  # the hull answer can fall short there: keep the best real candidate
            candidates = [cut, *_repairs(space, cut, int(bridged[0]))]
            candidates += [_equal_cut(problem, target), _pfi_cut(problem, target)]
            cut = min(candidates, key=lambda c: float(space.loss_at(c, hull=False).sum()))
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


@dataclass(frozen=True)
class _CutSpace:
    """Each job's curve seen as (watts cut, weighted throughput lost), from uncapped down."""

    cut: Array  #: (J, K) whole-job watts cut at each point, ascending from 0
    loss: Array  #: (J, K) weighted throughput lost at each point (the real curve)
    hull: Array  #: (J, K) the lower convex hull of `loss`, at the same points

    def loss_at(self, cut: Array, *, hull: bool) -> Array:
        return interp_rows(self.cut, self.hull if hull else self.loss, cut)


def _cut_space(problem: Problem) -> _CutSpace:
    curves = problem.curves
    lo = problem.lo_w[:, None]
    power, thr = curves.power_w, curves.throughput
    if np.any(power < lo):  # points below a job's bound collapse onto the bound
        x_lo = throughput_at_power(curves, problem.lo_w)[:, None]
        power, thr = np.maximum(power, lo), np.where(power < lo, x_lo, thr)
    n, w = problem.gpus[:, None], problem.weights[:, None]
    cut = n * (curves.uncapped_power_w[:, None] - power[:, ::-1])
    loss = w * (curves.uncapped_throughput[:, None] - thr[:, ::-1])
    cut = np.maximum.accumulate(np.maximum(cut, 0.0), axis=1)
    return _CutSpace(cut=cut, loss=loss, hull=_lower_hull(cut, loss))


def _lower_hull(cut: Array, loss: Array) -> Array:
    """The lower convex hull of each row's points, evaluated at the same points.

    Rows that are already convex are returned as they are. On the others, every point above the
    chord of its neighbouring vertices is dropped, round after round, until none is (a point
    above a chord of two real points is never on the hull, so dropping them together is safe).
    """
    d_cut, d_loss = np.diff(cut, axis=1), np.diff(loss, axis=1)
    flat = d_cut <= _TOL * np.maximum(cut[:, -1:], 1.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        slope = d_loss / d_cut
    # A flat segment is neutral unless the loss jumps there; a slope below an earlier one bends.
    slope[flat] = np.where(d_loss[flat] > _TOL * (1.0 + np.abs(loss[:, 1:][flat])), np.inf, -np.inf)
    highest = np.maximum.accumulate(slope, axis=1)
    later = slope[:, 1:]
    bent = ~flat[:, 1:] & (later < highest[:, :-1] - _TOL * (1.0 + np.abs(later)))
    rows = np.flatnonzero(bent.any(axis=1) | np.isposinf(slope).any(axis=1))
    hull = loss.copy()
    if rows.size == 0:
        return hull
    c, l_ = cut[rows], loss[rows]
    k = c.shape[1]
    idx = np.arange(k)
    rr = np.arange(len(rows))[:, None]
    # Losses never fall along a row, so a point at the cut of the one before it is not below it.
    vertex = np.concatenate(
        [np.ones((len(rows), 1), bool), np.diff(c, axis=1) > _TOL * np.maximum(c[:, -1:], 1.0)],
        axis=1,
    )
    live = np.arange(len(rows))  # rows that dropped a vertex in the last round
    while live.size:  # drop every vertex above the chord of its neighbours, round after round
        v, cl, ll = vertex[live], c[live], l_[live]
        at = np.arange(live.size)[:, None]
        before = np.maximum.accumulate(np.where(v, idx, -1), axis=1)
        after = np.minimum.accumulate(np.where(v, idx, k)[:, ::-1], axis=1)[:, ::-1]
        p = np.concatenate([np.full((live.size, 1), -1), before[:, :-1]], axis=1)
        n = np.concatenate([after[:, 1:], np.full((live.size, 1), k)], axis=1)
        inner = v & (p >= 0) & (n < k)
        p, n = np.where(inner, p, 0), np.where(inner, n, k - 1)
        with np.errstate(divide="ignore", invalid="ignore"):
            slope_in = (ll - ll[at, p]) / (cl - cl[at, p])
            slope_out = (ll[at, n] - ll) / (cl[at, n] - cl)
        above = inner & (slope_in > slope_out + _TOL * (1.0 + np.abs(slope_out)))
        vertex[live] = v & ~above
        live = live[above.any(axis=1)]
    # Interpolate the hull between consecutive vertices at every point.
    prev_v = np.maximum.accumulate(np.where(vertex, idx, 0), axis=1)
    next_v = np.minimum.accumulate(np.where(vertex, idx, k - 1)[:, ::-1], axis=1)[:, ::-1]
    c0, c1 = c[rr, prev_v], c[rr, next_v]
    l0, l1 = l_[rr, prev_v], l_[rr, next_v]
    with np.errstate(divide="ignore", invalid="ignore"):
        t = np.where(c1 > c0, (c - c0) / (c1 - c0), 0.0)
    # Points past the last vertex (flat tail) take the last vertex's loss.
    hull[rows] = np.minimum(l0 + np.clip(t, 0.0, 1.0) * (l1 - l0), l_)
    return hull


def _equal_cut(problem: Problem, target: float) -> Array:
    return _proportional_fill(problem.gpus * problem.hi_w, problem.max_cut_w, target)


def _pfi_cut(problem: Problem, target: float) -> Array:
    share = problem.gpus * problem.hi_w * problem.pfi / problem.curves.uncapped_throughput
    return _proportional_fill(share, problem.max_cut_w, target)


def _segments(space: _CutSpace) -> tuple[Array, Array]:
    """Every hull segment's width [W] and cost (weighted throughput lost per W)."""
    width = np.diff(space.cut, axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        cost = np.where(width > 0, np.diff(space.hull, axis=1) / width, np.inf)
    return width, cost


def _hull_cut(space: _CutSpace, target: float) -> tuple[Array, Array]:
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


def hull_cuts(problem: Problem, reductions_w: ArrayLike) -> Array:
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


def _bridged(space: _CutSpace, cut: Array, hull: Array) -> NDArray[np.intp]:
    """Jobs whose cut ends where the hull loss `hull` lies below the real curve's."""
    return np.flatnonzero(space.loss_at(cut, hull=False) > hull + _TOL * (1.0 + np.abs(hull)))


def _take(order: NDArray[np.intp], width: Array, amount: float) -> Array:
    """Per-job watts when `amount` is taken from segments `width` (J, S) in flat `order`."""
    w = width.ravel()[order]
    taken = np.minimum(np.maximum(amount - (np.cumsum(w) - w), 0.0), w)
    per_job = np.bincount(order // width.shape[1], weights=taken, minlength=width.shape[0])
    return np.asarray(per_job, dtype=float)


def _repairs(space: _CutSpace, cut: Array, job: int) -> list[Array]:
    """Allocations that move `job` to either end of its bridged hull stretch.

    The difference is given back by (or taken from) the other jobs' most (least) expensive
    segments, which keeps every other job on its own cheapest-first prefix.
    """
    width, cost = _segments(space)
    order = np.argsort(cost, axis=None)
    row = space.cut[job]
    vertex = np.isclose(space.hull[job], space.loss[job], rtol=_TOL, atol=0.0)
    deeper = row[vertex & (row >= cut[job])]
    shallower = row[vertex & (row <= cut[job])]
    held = np.clip(cut[:, None] - space.cut[:, :-1], 0.0, width)
    others = order[order // width.shape[1] != job]
    out = []
    if deeper.size:
        extra = float(deeper.min() - cut[job])
        back = _take(others[::-1], held, extra)
        if back.sum() >= extra * (1 - _TOL):
            out.append(np.where(np.arange(len(cut)) == job, deeper.min(), cut - back))
    if shallower.size:
        short = float(cut[job] - shallower.max())
        more = _take(others, width - held, short)
        if more.sum() >= short * (1 - _TOL):
            out.append(np.where(np.arange(len(cut)) == job, shallower.max(), cut + more))
    return out


def build_problem(
    jobs_curves: Curves,
    *,
    gpus: ArrayLike,
    min_cap_w: ArrayLike,
    min_throughput_fraction: ArrayLike,
    protected: ArrayLike,
    weights: ArrayLike,
    pfi: ArrayLike,
    objective: str = "throughput",
) -> Problem:
    """Assemble a `Problem` from per-job arrays."""
    n = np.asarray(gpus, dtype=float)
    return Problem(
        curves=jobs_curves,
        gpus=n,
        weights=objective_weights(objective, weights, n, jobs_curves.uncapped_throughput),
        lo_w=power_bounds(
            jobs_curves,
            min_cap_w=min_cap_w,
            min_throughput_fraction=min_throughput_fraction,
            protected=protected,
        ),
        pfi=np.asarray(pfi, dtype=float),
    )


def allocation_dict(
    allocation: Allocation,
    *,
    job_ids: list[str],
    overhead_factor: float,
    requested_facility_kw: float,
) -> dict[str, Any]:
    """The allocation in the JSON shape of CONTRACT.md (facility figures from `k`)."""
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
