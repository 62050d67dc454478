"""The fast path's settings: armed depths, the trigger's secret, zero-notice OpenADR events and
the frequency trigger (docs/fast.md)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, SecretStr

from agents.protocol import MIN_TOKEN_CHARS, PLACEHOLDER_TOKENS
from flexmodel.droop import DEFAULT_PHASE_BOUND_DEG
from flexmodel.errors import FlexModelError
from flexmodel.frequencyrule import FrequencyRule
from gateway.meter.frequency import open_frequency
from gateway.settingsgroups.base import SettingsGroup


class FastSettings(SettingsGroup):
    #: the fast path's armed depths, percent of the site's power, comma-separated (10,20,30);
    #: empty: no plans armed, no fast trigger (docs/fast.md)
    fast_depths: str = ""
    fast_secret: SecretStr | None = None  #: signs fast triggers; the agents' FAST_SECRET
    fast_rearm_s: float = Field(default=10.0, gt=0.0, le=3600.0)  #: how often plans are checked
    #: an OpenADR event with zero notice whose reduction matches an armed depth fires the fast
    #: path (gateway/openadr/zeronotice.py); its notice at most this [s], its reduction within
    #: this many percentage points of the depth
    fast_openadr: bool = True
    fast_openadr_max_notice_s: float = Field(default=2.0, ge=0.0, le=60.0)
    fast_openadr_depth_tolerance_pct: float = Field(default=1.0, ge=0.0, le=50.0)
    #: the frequency trigger's feed (modbus://... or tcp://host:port); empty: off (docs/fast.md)
    frequency_url: str = ""
    frequency_mode: Literal["threshold", "droop"] = "threshold"
    frequency_period_s: float = Field(default=0.1, gt=0.0, le=0.1)  #: sampled at 10 Hz or faster
    frequency_timeout_s: float = Field(
        default=0.5, gt=0.0, le=10.0
    )  #: a feed silent this long: fault
    frequency_nominal_hz: float = Field(default=50.0, ge=45.0, le=65.0)
    frequency_threshold_hz: float = 49.7  #: threshold mode: fires below this
    frequency_depth_pct: float | None = None  #: threshold mode's depth; None: the deepest armed
    frequency_dead_band_hz: float = Field(default=0.015, ge=0.0)  #: droop: none this near nominal
    frequency_full_hz: float = 49.5  #: droop: the deepest armed depth at and below this
    frequency_hysteresis_hz: float = Field(default=0.05, ge=0.0)
    frequency_retrigger_s: float = Field(default=2.0, ge=0.0)  #: at most one trigger per this
    frequency_hold_s: float = Field(default=30.0, gt=0.0, le=3600.0)  #: each trigger's caps hold
    frequency_min_hz: float = 45.0  #: a reading outside min-max is a fault
    frequency_max_hz: float = 65.0
    #: the grid's frequency change per MW of the site's power [Hz/MW]; droop mode needs it
    frequency_stiffness_hz_per_mw: float | None = Field(default=None, ge=0.0)
    #: the trigger path's delay, trigger to caps enforced (bench/fast_bench.py measures it) [s]
    frequency_trigger_delay_s: float = Field(default=0.1, ge=0.0, le=10.0)
    frequency_phase_bound_deg: float = Field(default=DEFAULT_PHASE_BOUND_DEG, gt=0.0, le=180.0)

    @property
    def fast_depths_pct(self) -> tuple[float, ...]:
        """FLEXGATE_FAST_DEPTHS as numbers, ascending; ValueError naming a wrong one."""
        try:
            depths = sorted({float(d) for d in self.fast_depths.split(",") if d.strip()})
        except ValueError:
            raise ValueError(
                f"FLEXGATE_FAST_DEPTHS must be comma-separated percentages (10,20,30,40), "
                f"got {self.fast_depths!r}"
            ) from None
        if any(not 0.0 < d <= 100.0 for d in depths):
            raise ValueError(f"FLEXGATE_FAST_DEPTHS {self.fast_depths!r}: each in (0, 100]")
        return tuple(depths)

    @property
    def frequency_rule(self) -> FrequencyRule | None:
        """The frequency trigger's rule (None: FLEXGATE_FREQUENCY_URL empty); ValueError naming
        the settings that cannot work."""
        if not self.frequency_url.strip():
            return None
        depths = self.fast_depths_pct
        try:
            return FrequencyRule(
                self.frequency_mode,
                depths,
                nominal_hz=self.frequency_nominal_hz,
                threshold_hz=self.frequency_threshold_hz,
                depth_pct=self.frequency_depth_pct or max(depths, default=0.0),
                dead_band_hz=self.frequency_dead_band_hz,
                full_hz=self.frequency_full_hz,
                hysteresis_hz=self.frequency_hysteresis_hz,
                retrigger_s=self.frequency_retrigger_s,
                hold_s=self.frequency_hold_s,
                min_hz=self.frequency_min_hz,
                max_hz=self.frequency_max_hz,
            )
        except FlexModelError as exc:
            raise ValueError(
                f"the frequency trigger (FLEXGATE_FREQUENCY_*, FLEXGATE_FAST_DEPTHS): {exc}"
            ) from None

    def _check_fast(self) -> None:
        secret = self.fast_secret.get_secret_value() if self.fast_secret else None
        if secret is not None and (
            secret.lower() in PLACEHOLDER_TOKENS or len(secret) < MIN_TOKEN_CHARS
        ):
            raise ValueError(
                f"FLEXGATE_FAST_SECRET must be a secret of at least {MIN_TOKEN_CHARS} characters "
                "(placeholders are refused)"
            )
        if self.fast_depths_pct and secret is None:
            raise ValueError(
                "FLEXGATE_FAST_DEPTHS needs FLEXGATE_FAST_SECRET (the agents' "
                "FLEXGATE_AGENT_FAST_SECRET): triggers are signed"
            )

    def _check_frequency(self) -> None:
        if not self.frequency_url.strip():
            return
        if not self.fast_depths_pct:
            raise ValueError("FLEXGATE_FREQUENCY_URL needs FLEXGATE_FAST_DEPTHS: it fires them")
        open_frequency(self.frequency_url, timeout_s=self.frequency_timeout_s)
        rule = self.frequency_rule  # built: one that cannot work is refused
        if rule is not None and rule.mode == "droop" and self.frequency_stiffness_hz_per_mw is None:
            raise ValueError(
                "FLEXGATE_FREQUENCY_MODE=droop needs FLEXGATE_FREQUENCY_STIFFNESS_HZ_PER_MW (the "
                "grid's Hz per MW): the droop's phase is checked against it before it starts"
            )
