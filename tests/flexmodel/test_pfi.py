import csv

import numpy as np
import pytest

from flexmodel.curves import FamilyShape, family_point
from flexmodel.errors import InvalidJobError, InvalidSweepError
from flexmodel.pfi import (
    COARSE_GRID_W,
    FINE_GRID_W,
    default_grid_w,
    family_pfi,
    fitted_family_pfi,
    grid_matrix,
    pfi_of_sweep,
    solve_insensitive_share,
)


def test_pfi_of_a_small_sweep_by_hand():
    # (1 - 300/600)/(1 - 600/1000) = 0.5/0.4 = 1.25 ; (1 - 450/600)/(1 - 900/1000) = 0.25/0.1 = 2.5
    points = [(700, 600.0, 1000.0), (300, 300.0, 600.0), (500, 450.0, 900.0)]
    result = pfi_of_sweep(points)
    assert result.pfi == pytest.approx((1.25 + 2.5) / 2)
    assert result.grid_w == (300, 500, 700)
    assert result.points == 3


def test_pfi_uses_measured_power_not_the_cap():
    # Same caps, different measured power: the PFI must change.
    a = pfi_of_sweep([(700, 600.0, 1000.0), (400, 400.0, 700.0)]).pfi
    b = pfi_of_sweep([(700, 600.0, 1000.0), (400, 380.0, 700.0)]).pfi
    assert a == pytest.approx((1 - 400 / 600) / 0.3)
    assert b == pytest.approx((1 - 380 / 600) / 0.3)


@pytest.mark.parametrize(
    ("points", "message"),
    [
        ([(700, 600.0, 1000.0)], "at least two points"),
        ([(700, 600.0, 1000.0), (700, 500.0, 900.0)], "share a cap"),
        ([(700, 600.0, 1000.0), (600, 590.0, 1000.0)], "not below the uncapped"),
        ([(700, 0.0, 1000.0), (600, 0.0, 900.0)], "positive power"),
    ],
)
def test_pfi_refuses_sweeps_it_cannot_define(points, message):
    with pytest.raises(InvalidSweepError, match=message):
        pfi_of_sweep(points)


def test_default_grids_follow_the_study():
    assert default_grid_w(8) == FINE_GRID_W
    assert default_grid_w(4) == FINE_GRID_W
    assert default_grid_w(16) == COARSE_GRID_W


def _shape(power_w=650.0, duty=0.8, rho=0.5):
    return FamilyShape.of(
        power_w=power_w, duty=duty, comm_power_fraction=rho, min_cap_w=200.0, max_cap_w=700.0
    )


@pytest.mark.parametrize("target", [1.10, 1.27, 1.43, 2.10, 2.67])
@pytest.mark.parametrize("grid", [FINE_GRID_W, COARSE_GRID_W])
def test_solved_share_reproduces_the_pfi(target, grid):
    g = grid_matrix([grid])
    m = solve_insensitive_share([target], g, _shape())
    got = family_pfi(g, _shape(), m)
    assert got[0] == pytest.approx(target, rel=1e-9)


def test_family_pfi_rises_with_the_insensitive_share():
    m = np.linspace(-1.0, 0.9, 40)
    g = grid_matrix([FINE_GRID_W] * len(m))
    pfi = family_pfi(g, _shape(), m)
    assert np.all(np.diff(pfi) > 0)


@pytest.mark.parametrize("target", [1.15, 1.9, 2.6])
@pytest.mark.parametrize(("static_share", "exponent"), [(0.15, 1.6), (0.08, 2.0), (0.22, 1.3)])
def test_the_family_fitted_through_exact_levels_has_their_pfi(target, static_share, exponent):
    """Levels read off a family curve (of any static share and exponent) give back that
    curve's PFI on their grid."""
    shape = FamilyShape.of(
        power_w=610.0,
        duty=0.7,
        comm_power_fraction=0.4,
        min_cap_w=200.0,
        max_cap_w=700.0,
        static_share=static_share,
        exponent=exponent,
    )
    grid = grid_matrix([(430.0, 520.0, 610.0, 700.0)])
    m = solve_insensitive_share([target], grid, shape)
    _, frac = family_point(grid, shape, m)
    got = fitted_family_pfi(shape, grid[0, :-1], frac[0, :-1], grid[0])
    assert got == pytest.approx(target, rel=1e-6)


def test_noise_at_the_shallow_level_moves_the_fitted_family_less_than_eq_1():
    """Eq. 1 divides the shallowest level's power saved by its small throughput loss: 0.3%
    of throughput there moves it by 0.04 (a family job of PFI 1.9 on 460/580/700 W, losing
    7.3% of its throughput at 580 W); least squares on the throughputs moves it by 0.015."""
    shape = _shape(power_w=640.0)
    grid = grid_matrix([(460.0, 580.0, 700.0)])
    m = solve_insensitive_share([1.9], grid, shape)
    power, frac = family_point(grid, shape, m)
    assert frac[0, 1] == pytest.approx(0.9272, abs=1e-4)
    for shift in (0.003, -0.003):
        off = frac[0] + np.array([0.0, shift, 0.0])
        eq_1 = pfi_of_sweep(list(zip(grid[0], power[0], off, strict=True))).pfi
        fitted = fitted_family_pfi(shape, grid[0, :-1], off[:-1], grid[0])
        assert abs(eq_1 - 1.9) == pytest.approx(0.041, abs=0.003)
        assert abs(fitted - 1.9) == pytest.approx(0.015, abs=0.002)


def test_a_pfi_the_family_cannot_reach_names_the_job():
    with pytest.raises(InvalidJobError, match=r"job 'x'.*outside what the fleet family"):
        solve_insensitive_share([0.2], grid_matrix([FINE_GRID_W]), _shape(), names=["x"])


def test_table_pfis_map_to_the_documented_shares(shared):
    """Calibration (docs/model.md): the fleet shape fits the study's table and group medians."""
    with (shared / "data" / "h200_pfi_table.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    grids = [FINE_GRID_W if r["caps_in_grid"] == "6" else COARSE_GRID_W for r in rows]
    m = solve_insensitive_share(
        [float(r["pfi"]) for r in rows],
        grid_matrix(grids),
        _shape(),
        names=[r["job"] for r in rows],
    )
    group = {r["job"]: (r["architecture"], r["task"]) for r in rows}
    by = {
        key: np.median([mi for r, mi in zip(rows, m, strict=True) if group[r["job"]] == key])
        for key in set(group.values())
    }
    dense = np.median([mi for r, mi in zip(rows, m, strict=True) if r["architecture"] == "dense"])
    assert abs(dense) < 0.1  # dense jobs near m ~ 0
    assert by[("moe", "finetune")] == pytest.approx(0.5, abs=0.08)  # MoE fine-tuning near 0.5
    assert 0.1 < by[("moe", "pretrain")] < 0.3
    assert m.min() > -0.3
    assert m.max() < 0.7
