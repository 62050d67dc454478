"""The gateway's settings in groups by topic, one mixin class each; `gateway.settings`'s
`GatewaySettings` inherits them all (docs/configuration.md)."""

from gateway.settingsgroups.api import ApiSettings
from gateway.settingsgroups.base import SettingsGroup
from gateway.settingsgroups.characterise import CharacteriseSettings
from gateway.settingsgroups.fast import FastSettings
from gateway.settingsgroups.fleet import FleetSettings
from gateway.settingsgroups.jobsource import JobSourceSettings
from gateway.settingsgroups.loop import LoopSettings, SyncSettings
from gateway.settingsgroups.meter import MeterSettings
from gateway.settingsgroups.openadr import OpenAdrSettings
from gateway.settingsgroups.planning import PlanningSettings
from gateway.settingsgroups.settlement import SettlementSettings
from gateway.settingsgroups.store import StoreSettings

__all__ = [
    "ApiSettings",
    "CharacteriseSettings",
    "FastSettings",
    "FleetSettings",
    "JobSourceSettings",
    "LoopSettings",
    "MeterSettings",
    "OpenAdrSettings",
    "PlanningSettings",
    "SettingsGroup",
    "SettlementSettings",
    "StoreSettings",
    "SyncSettings",
]
