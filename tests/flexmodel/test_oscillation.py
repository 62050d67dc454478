"""The site's oscillation in the grid's band (issue 35, item 4: the function only)."""

from __future__ import annotations

import numpy as np
import pytest

from flexmodel.oscillation import site_oscillation


def test_the_swing_and_the_band_energy_where_the_source_sees_them():
    """The agents' 10 Hz aggregate: a 3 kW swing at 2 s and a slow 0.5 kW one at 30 s (below
    the 0.1 Hz band). The band is cut to 0.1-5 Hz; its rms is the 2 s swing's alone."""
    t = np.arange(0.0, 120.0, 0.1)
    power = 100 + 3 * np.sin(2 * np.pi * t / 2.0) + 0.5 * np.sin(2 * np.pi * t / 30.0)
    out = site_oscillation(power, 0.1, periods_s=[2.0, 0.15])
    assert out["band_observed_hz"] == [0.1, 5.0]
    assert out["rms_kw"] == pytest.approx(3 / np.sqrt(2), rel=0.01)
    assert out["swings"][0]["swing_kw"] == pytest.approx(3.0, rel=0.01)
    assert out["swings"][1]["swing_kw"] is None  # 6.7 Hz: beyond a 10 Hz source


def test_a_meter_read_every_5_s_sees_nothing_of_the_band_and_says_so():
    t = np.arange(0.0, 600.0, 5.0)
    out = site_oscillation(100 + np.sin(t), 5.0, periods_s=[2.0])
    assert out["rms_kw"] is None
    assert out["band_observed_hz"] is None
    assert "nothing of 0.1-20 Hz" in out["reason"]
    assert out["swings"] == [{"period_s": 2.0, "swing_kw": None}]
