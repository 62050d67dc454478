"""Characterisation's settings: probes and measured curves (gateway.services.characterise)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from gateway.settingsgroups.base import SettingsGroup


class CharacteriseSettings(SettingsGroup):
    #: characterisation (gateway.services.characterise): the share of the site's throughput
    #: (tokens/s of the jobs probed, over the mix's) that may be under probe at once
    probe_budget: float = Field(default=0.25, gt=0.0, le=1.0)
    probe_levels: int = Field(default=3, ge=1, le=10)  #: capped levels per probe
    #: capped levels between the uncapped references that measure a probe's drift (the
    #: references run before the first capped level and after the last anyway); 0: no more
    probe_reference_every: int = Field(default=2, ge=0, le=10)
    probe_periods: float = Field(default=20.0, ge=3.0, le=1000.0)  #: iterations per level
    probe_settle_s: float = Field(default=2.0, ge=0.0)  #: added to each level's hold
    #: no level below this throughput fraction (nor below the job's own floor)
    probe_min_throughput_fraction: float = Field(default=0.65, gt=0.0, lt=1.0)
    probe_every_s: float = Field(default=0.0, ge=0.0)  #: probe unmeasured jobs; 0: never
    curve_harvest_s: float = Field(default=60.0, gt=0.0)  #: agents' points read this often
    #: a measured curve replaces the declared one once its PFI's standard error is this small
    curve_max_pfi_stderr: float = Field(default=0.15, gt=0.0)
    #: below a measured curve's lowest level: the fleet family at its PFI, or nothing
    curve_extend: Literal["family", "none"] = "family"
    #: between a measured curve's levels: a monotone cubic, or straight lines
    curve_interpolation: Literal["pchip", "linear"] = "pchip"
    #: what a measured curve is planned on: the fleet family's shape at the measured PFI and
    #: uncapped level, or the measured points themselves (as interpolated and extended above)
    curve_shape: Literal["family", "points"] = "family"
