"""From GPU power to the facility meter (docs/model.md, section 3).

    facility_kw = static_load_kw + k * gpu_kw        reduction at the meter = k * GPU reduction

`k >= 1` (the overhead factor) covers what scales with GPU heat: conversion losses and cooling.
Static non-GPU load does not shrink with caps and is not in `k`.
"""

from __future__ import annotations

from flexmodel.errors import FlexModelError


def check_overhead_factor(k: float) -> None:
    if not k >= 1.0:
        raise FlexModelError(
            f"overhead factor {k:g} must be at least 1 (GPU power is part of the site's)"
        )


def facility_reduction_kw(gpu_reduction_kw: float, overhead_factor: float) -> float:
    """Reduction at the facility meter [kW] for a GPU power reduction [kW]."""
    check_overhead_factor(overhead_factor)
    return overhead_factor * gpu_reduction_kw


def gpu_reduction_kw(facility_reduction_kw: float, overhead_factor: float) -> float:
    """GPU power reduction [kW] that sheds `facility_reduction_kw` at the meter."""
    check_overhead_factor(overhead_factor)
    return facility_reduction_kw / overhead_factor


def facility_power_kw(gpu_kw: float, overhead_factor: float, static_load_kw: float) -> float:
    """Facility power [kW] estimated from GPU power [kW]."""
    check_overhead_factor(overhead_factor)
    return static_load_kw + overhead_factor * gpu_kw
