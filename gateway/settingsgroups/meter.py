"""The facility meter's settings: the feed, its checks, the meter history and the overhead
calibration (gateway.meter, gateway.services.sitepower, gateway.services.meterhistory)."""

from __future__ import annotations

from pydantic import Field

from gateway.meter.sources import DEFAULT_JSON_KEY, open_meter
from gateway.settingsgroups.base import SettingsGroup


class MeterSettings(SettingsGroup):
    meter_url: str = Field(default="", description="the facility meter; empty: the estimate")
    meter_json_key: str = DEFAULT_JSON_KEY
    meter_period_s: float = Field(default=5.0, gt=0.0)
    meter_timeout_s: float = Field(default=2.0, gt=0.0)
    meter_max_age_s: float | None = Field(default=None, gt=0.0)  #: None: three periods
    meter_max_step_kw: float | None = Field(default=None, gt=0.0)  #: None: no jump check
    #: the meter path until a calibration identifies it (flexmodel.meterpath): the meter's own
    #: transport delay, the first-order time constant after it, each reading's averaging [s]
    meter_dead_s: float = Field(default=0.0, ge=0.0)
    meter_lag_s: float = Field(default=0.0, ge=0.0)
    meter_averaging_s: float = Field(default=0.0, ge=0.0)
    #: silent faults (gateway.meter.watch): the meter's noise, one standard deviation [kW], and
    #: the smallest predicted move it must answer (None: 2% of the site or six noise deviations)
    meter_noise_kw: float = Field(default=0.0, ge=0.0)
    meter_check_kw: float | None = Field(default=None, gt=0.0)
    meter_max_kw: float | None = Field(default=None, gt=0.0)  #: the site's physical maximum
    #: the meter history (gateway.services.meterhistory): every site sample stored, written in
    #: batches every FLUSH_S, kept RAW_KEEP_S (at least an hour: the 30-minute intervals are
    #: rolled up from them), and its 1/5/15/30-minute intervals kept KEEP_DAYS
    meter_history: bool = True
    meter_history_flush_s: float = Field(default=10.0, gt=0.0, le=3600.0)
    meter_history_raw_keep_s: float = Field(default=7 * 86400.0, ge=3600.0)
    meter_history_keep_days: float = Field(default=400.0, ge=90.0)
    calibrate: bool = True  #: fit the overhead factor on the meter (a real meter only)
    calibration_window_s: float = Field(default=60.0, gt=0.0)
    calibration_settle_s: float = Field(default=60.0, ge=0.0)
    calibration_history_s: float = Field(default=3600.0, gt=0.0)
    calibration_every_s: float = Field(default=300.0, gt=0.0)

    def _check_meter(self) -> None:
        try:
            open_meter(self.meter_url, json_key=self.meter_json_key, timeout_s=self.meter_timeout_s)
        except ValueError as exc:
            raise ValueError(f"FLEXGATE_METER_URL / FLEXGATE_METER_JSON_KEY: {exc}") from exc
        if self.calibration_window_s < 2 * self.meter_period_s:
            raise ValueError(
                f"FLEXGATE_CALIBRATION_WINDOW_S ({self.calibration_window_s:g} s) must cover at "
                f"least two meter periods (FLEXGATE_METER_PERIOD_S {self.meter_period_s:g} s)"
            )
        if self.meter_max_age_s is not None and self.meter_max_age_s <= self.meter_period_s:
            raise ValueError(
                f"FLEXGATE_METER_MAX_AGE_S ({self.meter_max_age_s:g} s) must be longer than "
                f"FLEXGATE_METER_PERIOD_S ({self.meter_period_s:g} s), or every reading is stale"
            )
