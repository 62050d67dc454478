"""The planner's settings: the site model, the predictor, the flexibility tiers, quotes and
opt-in (gateway.services.planning, gateway.services.quotes)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from flexmodel.errors import InvalidJobError
from flexmodel.quote import DEFAULT_POWER_UNCERTAINTY
from flexmodel.tiers import TierTable
from gateway.settingsgroups.base import SettingsGroup


class PlanningSettings(SettingsGroup):
    overhead_factor: float = Field(default=1.3, ge=1.0)
    overhead_factor_stderr: float = Field(default=0.05, ge=0.0)
    static_load_kw: float = Field(default=0.0, ge=0.0)
    #: how often jobs' PFIs are predicted from their telemetry [s]
    predictor_period_s: float = Field(default=30.0, gt=0.0, le=86400.0)
    #: the site's measured jobs the predictor needs before it is refitted on them alone
    predictor_min_jobs: int = Field(default=8, ge=3, le=100_000)
    opt_policy: Literal["feasible", "always", "never"] = "feasible"
    opt_confidence: float = Field(default=0.9, gt=0.0, lt=1.0)
    #: relative standard error of a declared job power, carried into firm kW (docs/model.md)
    declared_power_uncertainty: float = Field(default=DEFAULT_POWER_UNCERTAINTY, ge=0.0, lt=1.0)
    #: the last events whose delivery at the meter scales firm kW; 0: the model alone
    quote_history_events: int = Field(default=10, ge=0)
    #: a manual event asking more than this many times the kW the site can shed now is refused
    #: (422) unless forced: watts typed as kW would drive every job to its floor
    event_max_overreach: float = Field(default=3.0, ge=1.0, le=1000.0)
    #: what a GPU no job uses draws [W]: a job that ends mid-event frees its GPUs to this
    gpu_idle_w: float = Field(default=80.0, ge=0.0, le=500.0)
    tiers: str = Field(default="0,0.10,0.25,0.50", description="tolerated slowdown per tier")
    tier_slowdown_means: Literal["throughput", "duration"] = "throughput"

    @property
    def tier_table(self) -> TierTable:
        """The flexibility tiers (FLEXGATE_TIERS read as FLEXGATE_TIER_SLOWDOWN_MEANS says)."""
        try:
            slowdowns = tuple(float(s) for s in self.tiers.split(","))
        except ValueError:
            raise ValueError(
                f"FLEXGATE_TIERS must be comma-separated fractions (0,0.10,0.25,0.50), "
                f"got {self.tiers!r}"
            ) from None
        try:
            return TierTable(slowdowns, self.tier_slowdown_means)
        except InvalidJobError as exc:
            raise ValueError(f"FLEXGATE_TIERS: {exc}") from None
