"""Probes that measure their own drift (issue 34, case 1)."""

import numpy as np
import pytest

from flexmodel.drift import ProbeLevel, fit_probe, probe_sequence
from flexmodel.errors import InvalidSweepError
from flexmodel.sweeps import fit_sweep

#: `examples/sweep.csv`'s curve on the grid 400-700 W: true PFI 2.036.
ROWS = {
    400.0: (392.0, 17300.0),
    500.0: (481.0, 19700.0),
    600.0: (571.0, 21300.0),
    700.0: (603.0, 21800.0),
}
TRUE_PFI = 2.0364035


def test_the_sequence_brackets_the_caps_with_uncapped_references():
    assert probe_sequence([700.0, 600.0, 500.0, 400.0]) == [700.0, 600.0, 500.0, 400.0, 700.0]
    assert probe_sequence([700.0, 600.0, 500.0, 400.0, 300.0], reference_every=2) == [
        700.0,
        600.0,
        500.0,
        700.0,
        400.0,
        300.0,
        700.0,
    ]


def _drifting(drift: float, seq: list[float]) -> list[ProbeLevel]:
    span = len(seq) - 1
    return [
        ProbeLevel(c, float(i), ROWS[c][0], ROWS[c][1] * (1 - drift * i / span))
        for i, c in enumerate(seq)
    ]


@pytest.mark.parametrize(("drift", "naive"), [(0.01, 1.915), (0.02, 1.810)])
def test_a_drifting_probe_is_unbiased_within_its_stated_error(drift, naive):
    """Before (no last reference), the drift read as throughput lost: 1.915 at 1% across the
    probe and 1.810 at 2% (1.878 and 1.748 when the drift spans just the four levels)."""
    seq = probe_sequence([700.0, 600.0, 500.0, 400.0])
    levels = _drifting(drift, seq)
    stepped_down = fit_sweep([(lv.cap_w, lv.power_w, lv.throughput) for lv in levels[:-1]])
    assert stepped_down.pfi == pytest.approx(naive, abs=0.001)  # without the last reference
    fit = fit_probe(levels)
    assert abs(fit.sweep.pfi - TRUE_PFI) < fit.sweep.pfi_stderr
    assert fit.throughput_drift_per_s * 4 == pytest.approx(-drift, rel=0.02)  # relative to the mean
    assert fit.pfi_drift_stderr > 0  # the drift's own uncertainty is in the error


def test_noisy_drifting_probes_are_covered_by_their_stated_errors():
    rng = np.random.default_rng(7)
    seq = probe_sequence([700.0, 600.0, 500.0, 400.0])
    z = []
    for _ in range(300):
        drift = rng.uniform(-0.02, 0.02)
        levels = [
            ProbeLevel(
                lv.cap_w,
                lv.time_s,
                lv.power_w * (1 + 0.005 * rng.standard_normal()),
                lv.throughput * (1 + 0.005 * rng.standard_normal()),
            )
            for lv in _drifting(drift, seq)
        ]
        sweep = fit_probe(levels).sweep
        if sweep.grid_w == (400.0, 500.0, 600.0, 700.0):
            z.append((sweep.pfi - TRUE_PFI) / sweep.pfi_stderr)
    z_arr = np.array(z)
    assert len(z_arr) > 250
    assert 0.90 <= np.mean(np.abs(z_arr) < 1.96) <= 0.99
    assert 0.8 <= z_arr.std() <= 1.15


def test_a_probe_needs_a_capped_and_an_uncapped_level():
    with pytest.raises(InvalidSweepError, match="needs an uncapped level and a capped one"):
        fit_probe([ProbeLevel(700.0, 0.0, 600.0, 1.0)])
