"""The droop path's phase report (flexmodel.droop), against figures worked by hand:
a pure delay tau lags a mode at f Hz by 360 f tau degrees."""

import math

import pytest

from flexmodel.droop import DroopRefusedError, droop_report
from flexmodel.errors import FlexModelError


def test_a_100_ms_delay_lags_the_band_by_3_6_to_36_degrees():
    report = droop_report(0.1, stiffness_hz_per_mw=1e-4, gain_mw_per_hz=50.0)
    assert report.freqs_hz[0] == pytest.approx(0.1)
    assert report.freqs_hz[-1] == pytest.approx(1.0)
    assert report.phase_lag_deg[0] == pytest.approx(3.6)
    assert report.worst_phase_lag_deg == pytest.approx(36.0)
    assert report.damping_sign[-1] == pytest.approx(math.cos(math.radians(36.0)))
    assert report.loop_gain == pytest.approx(0.005)
    assert report.max_delay_s == pytest.approx(0.25)  # 90 degrees at 1 Hz


def test_a_delay_beyond_the_bound_is_refused_naming_the_longest_allowed():
    with pytest.raises(
        DroopRefusedError, match=r"by 108 degrees, beyond the 90 allowed: at most 0.25 s"
    ):
        droop_report(0.3, stiffness_hz_per_mw=1e-4, gain_mw_per_hz=50.0)
    report = droop_report(0.3, 1e-4, 50.0, bound_deg=120.0)
    assert report.worst_phase_lag_deg == pytest.approx(108.0)
    assert report.damping_sign[-1] < 0  # the droop takes damping away from a 1 Hz mode


@pytest.mark.parametrize(
    ("args", "kw", "words"),
    [
        ((-0.1, 1e-4, 50.0), {}, "delay_s"),
        ((0.1, math.nan, 50.0), {}, "stiffness_hz_per_mw"),
        ((0.1, 1e-4, math.inf), {}, "gain_mw_per_hz"),
        ((0.1, 1e-4, 50.0), {"band_hz": (1.0, 0.1)}, "band_hz"),
        ((0.1, 1e-4, 50.0), {"bound_deg": 0.0}, "bound_deg"),
    ],
)
def test_bad_inputs_are_refused_naming_them(args, kw, words):
    with pytest.raises(FlexModelError, match=words):
        droop_report(*args, **kw)
