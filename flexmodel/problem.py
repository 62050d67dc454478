"""The allocation problem (docs/model.md, section 5): what every strategy of `allocate` solves.

Each job's curve, GPU count, objective weight and power bounds (`power_bounds`: the GPU's
minimum cap, the QoS floor `min_throughput_fraction`, and `protected` jobs that give nothing),
and the curves seen from uncapped down as (watts cut, throughput lost) with their lower convex
hulls (`CutSpace`), built once per problem.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property

import numpy as np
from numpy.typing import ArrayLike

from flexmodel.curves import (
    Array,
    Curves,
    interp_rows,
    operating_point,
    power_for_throughput,
    throughput_at_power,
)
from flexmodel.errors import FlexModelError

OBJECTIVES: tuple[str, ...] = ("throughput", "gpu_fraction")
#: Relative tolerance on watts and on throughput when comparing curve values.
TOLERANCE = 1e-9


@dataclass(frozen=True)
class AllocationProblem:
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
    def cut_space(self) -> CutSpace:
        """The curves seen from uncapped down, with their hulls (built once per problem)."""
        return _cut_space(self)

    def excluding(self, gone: ArrayLike) -> AllocationProblem:
        """The same problem with the `gone` jobs giving nothing; the hulls are reused."""
        if not np.any(gone):
            return self
        out = replace(self, lo_w=np.where(gone, self.hi_w, self.lo_w))
        space = self.cut_space
        rows = np.asarray(gone, dtype=bool)[:, None]
        out.__dict__["cut_space"] = CutSpace(  # what cached_property would compute, cheaper
            cut=np.where(rows, 0.0, space.cut),
            loss=np.where(rows, 0.0, space.loss),
            hull=np.where(rows, 0.0, space.hull),
        )
        return out


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


@dataclass(frozen=True)
class CutSpace:
    """Each job's curve seen as (watts cut, weighted throughput lost), from uncapped down."""

    cut: Array  #: (J, K) whole-job watts cut at each point, ascending from 0
    loss: Array  #: (J, K) weighted throughput lost at each point (the real curve)
    hull: Array  #: (J, K) the lower convex hull of `loss`, at the same points

    def loss_at(self, cut: Array, *, hull: bool) -> Array:
        return interp_rows(self.cut, self.hull if hull else self.loss, cut)


def _cut_space(problem: AllocationProblem) -> CutSpace:
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
    return CutSpace(cut=cut, loss=loss, hull=_lower_hull(cut, loss))


def _lower_hull(cut: Array, loss: Array) -> Array:
    """The lower convex hull of each row's points, evaluated at the same points.

    Rows that are already convex are returned as they are. On the others, every point above the
    chord of its neighbouring vertices is dropped, round after round, until none is (a point
    above a chord of two real points is never on the hull, so dropping them together is safe).
    """
    d_cut, d_loss = np.diff(cut, axis=1), np.diff(loss, axis=1)
    flat = d_cut <= TOLERANCE * np.maximum(cut[:, -1:], 1.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        slope = d_loss / d_cut
    # A flat segment is neutral unless the loss jumps there; a slope below an earlier one bends.
    slope[flat] = np.where(
        d_loss[flat] > TOLERANCE * (1.0 + np.abs(loss[:, 1:][flat])), np.inf, -np.inf
    )
    highest = np.maximum.accumulate(slope, axis=1)
    later = slope[:, 1:]
    bent = ~flat[:, 1:] & (later < highest[:, :-1] - TOLERANCE * (1.0 + np.abs(later)))
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
        [
            np.ones((len(rows), 1), bool),
            np.diff(c, axis=1) > TOLERANCE * np.maximum(c[:, -1:], 1.0),
        ],
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
        above = inner & (slope_in > slope_out + TOLERANCE * (1.0 + np.abs(slope_out)))
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
) -> AllocationProblem:
    """Assemble a `AllocationProblem` from per-job arrays."""
    n = np.asarray(gpus, dtype=float)
    return AllocationProblem(
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
