"""The site loop's settings: tracking at the meter, limits and ramps (gateway.services.siteloop),
and the sync guard's: scatter and the oscillation watch."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from gateway.settingsgroups.base import SettingsGroup


class LoopSettings(SettingsGroup):
    tracking: bool = True  #: close the site loop at the meter during events
    loop_window_s: float | None = Field(default=None, gt=0.0)  #: None: from the jobs' periods
    loop_gain: float = Field(default=0.5, gt=0.0, le=1.5)  #: share of the error taken per sample
    loop_max_correction: float = Field(default=1.0, gt=0.0, le=2.0)
    #: how a delta (a reduction from what the site would draw) is held where there is a meter:
    #: "gain", the model's plan at the site's measured gain (the meter's answer to the
    #: events' opening steps: a cooling step or a meter offset is not the event's); "meter",
    #: the meter's reading at the meter before the event less the reduction (what a
    #: meter-before settlement counts)
    loop_delta_basis: Literal["gain", "meter"] = "gain"
    #: a ceiling (an import capacity limit) is judged on means over this interval, from this
    #: long after it began (the ramp allowance) [s]
    limit_interval_s: float = Field(default=60.0, gt=0.0)
    limit_ramp_s: float = Field(default=60.0, ge=0.0)
    #: the model's gain error the loop's gain must be robust to (flexmodel.looprobust)
    loop_gain_error: float = Field(default=0.3, ge=0.0, lt=1.0)
    #: lab only: the site loop keeps a configuration the sync analysis rejects (the lock lab)
    loop_unsafe: bool = False
    #: the most the site's power may fall (down) or rise (up) per minute by the gateway's
    #: plans, at the meter [kW/min]; None: no bound
    ramp_down_kw_per_min: float | None = Field(default=None, gt=0.0)
    ramp_up_kw_per_min: float | None = Field(default=None, gt=0.0)

    def _check_loop(self) -> None:
        if self.loop_unsafe and not self.lab:
            raise ValueError(
                "FLEXGATE_LOOP_UNSAFE keeps a site loop the sync analysis rejects, which makes "
                "jobs phase-lock: it is for the lab's lock scenario only (FLEXGATE_LAB=true)"
            )


class SyncSettings(SettingsGroup):
    scatter: Literal["auto", "off"] = "auto"  #: spread the jobs' rates when they lock
    scatter_spread: float = Field(default=0.01, gt=0.0, le=0.5)  #: first half-width of rates
    scatter_max_spread: float = Field(default=0.08, gt=0.0, le=0.5)  #: widened up to this
    #: the site power's oscillation band watched [Hz], and the in-band swing (RMS) that raises
    #: the alarm and starts scattering [kW]; None: watched, no alarm
    oscillation_band_low_hz: float = Field(default=0.1, ge=0.0)
    oscillation_band_high_hz: float = Field(default=20.0, gt=0.0)
    oscillation_limit_kw: float | None = Field(default=None, gt=0.0)

    def _check_sync(self) -> None:
        if self.oscillation_band_high_hz <= self.oscillation_band_low_hz:
            raise ValueError(
                f"FLEXGATE_OSCILLATION_BAND_HIGH_HZ ({self.oscillation_band_high_hz:g}) must be "
                f"above FLEXGATE_OSCILLATION_BAND_LOW_HZ ({self.oscillation_band_low_hz:g})"
            )
        if self.scatter_max_spread < self.scatter_spread:
            raise ValueError(
                f"FLEXGATE_SCATTER_MAX_SPREAD ({self.scatter_max_spread:g}) must be at least "
                f"FLEXGATE_SCATTER_SPREAD ({self.scatter_spread:g}): the spread only widens"
            )
