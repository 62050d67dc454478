"""The gateway's settings: environment variables prefixed `FLEXGATE_` (docs/configuration.md).

Read through `get_settings()` (cached), never at import; `create_app(settings)` takes them as
an argument so tests pass their own. The fields, their properties and their checks live in
groups by topic (gateway.settingsgroups); `GatewaySettings` inherits them all and runs the
checks that span groups.
"""

from __future__ import annotations

import os
from functools import lru_cache
from typing import Any

from pydantic import model_validator
from pydantic_settings import SettingsConfigDict

from agents.protocol import AGENT_NAMESPACE, unknown_variables
from gateway.settingsgroups import (
    ApiSettings,
    CharacteriseSettings,
    FastSettings,
    FleetSettings,
    JobSourceSettings,
    LoopSettings,
    MeterSettings,
    OpenAdrSettings,
    PlanningSettings,
    SettlementSettings,
    StoreSettings,
    SyncSettings,
)
from gateway.settingsgroups.api import LAB_API_TOKEN
from gateway.settingsgroups.checks import (
    insecure_url,
    interval_problem,
    is_loopback,
    parse_dates,
    parse_fallback_limits,
    zone_problem,
)
from gateway.settingsgroups.openadr import LAB_VTN_CLIENT_ID, LAB_VTN_CLIENT_SECRET

__all__ = [
    "LAB_API_TOKEN",
    "LAB_VTN_CLIENT_ID",
    "LAB_VTN_CLIENT_SECRET",
    "GatewaySettings",
    "get_settings",
    "insecure_url",
    "interval_problem",
    "is_loopback",
    "parse_dates",
    "parse_fallback_limits",
    "zone_problem",
]


class GatewaySettings(
    FastSettings,
    CharacteriseSettings,
    JobSourceSettings,
    SyncSettings,
    LoopSettings,
    SettlementSettings,
    MeterSettings,
    PlanningSettings,
    OpenAdrSettings,
    FleetSettings,
    ApiSettings,
    StoreSettings,
):
    # Every setting: the groups' fields (the last group's first), checked together.
    model_config = SettingsConfigDict(
        env_prefix="FLEXGATE_", extra="ignore", hide_input_in_errors=True
    )

    @model_validator(mode="before")
    @classmethod
    def _refuse_unknown_variables(cls, data: Any) -> Any:
        """Before the fields: a misspelt name explains a missing setting better than the
        missing setting's own error does. `FLEXGATE_AGENT_*` is the agents' (they check it)."""
        problem = unknown_variables(
            os.environ, cls.model_fields, foreign=lambda name: name.startswith(AGENT_NAMESPACE)
        )
        if problem:
            raise ValueError(problem)
        return data

    @model_validator(mode="after")
    def _refuse_placeholders(self) -> GatewaySettings:
        self._read_agents_file()
        self._read_password_file()
        self._check_api_token()
        self._check_agent_token()
        self._check_vtn()
        self._check_tls()
        self._check_agents_ca()
        self._check_meter()
        self._check_settlement()
        if self.job_source_default_tier >= self.tier_table.count:
            raise ValueError(
                f"FLEXGATE_JOB_SOURCE_DEFAULT_TIER ({self.job_source_default_tier}) names no tier "
                f"of FLEXGATE_TIERS ({self.tier_table.count} tiers, 0 to "
                f"{self.tier_table.count - 1})"
            )
        self._check_nats()
        self._check_fast()
        self._check_frequency()
        self._check_loop()
        self._check_reads()
        self._check_sync()
        return self


@lru_cache
def get_settings() -> GatewaySettings:
    return GatewaySettings()
