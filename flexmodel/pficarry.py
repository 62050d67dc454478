"""A PFI carried between grids (docs/model.md, section 2): PFIs compare only on one grid, so one
measured on a probe's few caps is set beside a prediction or a declaration on the study's grid
through the fleet family of the job's shape, with the family shape's own error
(`CARRY_SHAPE_REL`, refitted from measured jobs by `fit_carry_shape_rel`).
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

from flexmodel.jobs import Job, job_family_shape
from flexmodel.pfi import family_pfi, grid_matrix, solve_insensitive_share

#: The fleet family's own shape error when a PFI is carried between grids, relative (one
#: standard deviation): the study's real jobs moved a median 10.7% between its two grids where
#: the family moves 0-4%, so about 7% is the jobs' own shape; `examples/sweep.csv`'s curve
#: carried from 400-700 W to 200-700 W by the family is 4.2% off. Refitted from measured jobs
#: by `fit_carry_shape_rel`.
CARRY_SHAPE_REL = 0.06


def pfi_on_own_grid(
    job: Job,
    pfi: float,
    stderr: float,
    grid_w: tuple[float, ...],
    *,
    shape_rel: float = CARRY_SHAPE_REL,
) -> tuple[float, float]:
    """A PFI measured on `grid_w` (with its standard error) as the PFI on the job's own grid
    (`job.grid_w`): the fleet family of the job's shape that gives `pfi` on `grid_w`, read on
    the job's grid. Its error: half the spread of `pfi -+ stderr` carried the same way, and the
    family shape's own error (`shape_rel` of the carried value) in quadrature; never, relative
    to the value, below the source's: a carried PFI is never more certain than its source.

    PFIs compare only on one grid (docs/model.md, section 2); this is how one measured on a probe's
    few caps is set beside a prediction or a declaration on the study's grid. A value the
    family cannot reach on `grid_w` is taken as the nearest it reaches. On the job's own grid
    the PFI and its error are as given.
    """
    if tuple(float(c) for c in grid_w) == tuple(float(c) for c in job.grid_w):
        return pfi, stderr
    shape = job_family_shape([job])
    values = np.array([pfi, pfi - stderr, pfi + stderr])
    m = solve_insensitive_share(
        values, grid_matrix([grid_w] * 3), shape, names=[job.id] * 3, clip=True
    )
    own = family_pfi(grid_matrix([job.grid_w] * 3), shape.select(np.zeros(3, np.intp)), m)
    carried = float(own[0])
    propagated = float(own[2] - own[1]) / 2.0
    total = float(np.hypot(propagated, shape_rel * carried))
    at_least = stderr * carried / pfi if pfi > 0 else stderr
    return carried, max(total, at_least)


def fit_carry_shape_rel(
    carried: ArrayLike,
    carried_stderr: ArrayLike,
    measured: ArrayLike,
    measured_stderr: ArrayLike,
    *,
    leave_out: int | None = None,
) -> float:
    """The family shape's relative error fitted from jobs measured on both grids: PFIs
    `carried` from one grid (their errors without the shape's) against the PFIs `measured` on
    the target grid; the mean squared relative difference beyond what the two errors explain
    (never below 0). `leave_out`: the job whose own measurement stays out of the fit it is
    judged against."""
    c, sc = np.asarray(carried, float), np.asarray(carried_stderr, float)
    v, sv = np.asarray(measured, float), np.asarray(measured_stderr, float)
    keep = np.ones(c.size, bool)
    if leave_out is not None:
        keep[leave_out] = False
    rel = (c[keep] - v[keep]) / v[keep]
    explained = (sc[keep] ** 2 + sv[keep] ** 2) / v[keep] ** 2
    return float(np.sqrt(max(float(np.mean(rel**2 - explained)), 0.0))) if keep.any() else 0.0
