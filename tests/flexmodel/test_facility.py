import pytest

from flexmodel.errors import FlexModelError
from flexmodel.facility import facility_power_kw, facility_reduction_kw, gpu_reduction_kw


def test_facility_conversions_by_hand():
    assert facility_reduction_kw(100.0, 1.3) == pytest.approx(130.0)
    assert gpu_reduction_kw(130.0, 1.3) == pytest.approx(100.0)
    assert facility_power_kw(500.0, 1.2, 80.0) == pytest.approx(680.0)


def test_overhead_factor_below_one_is_refused():
    with pytest.raises(FlexModelError, match="at least 1"):
        gpu_reduction_kw(10.0, 0.9)
