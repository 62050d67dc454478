"""Settlement's settings: baseline rules, the site's time zone and intervals, holidays
(gateway.services.settlement)."""

from __future__ import annotations

from datetime import date
from zoneinfo import ZoneInfo

from pydantic import Field

from flexmodel.baselines import RULE_NAMES, is_preset
from gateway.settingsgroups.base import SettingsGroup
from gateway.settingsgroups.checks import interval_problem, parse_dates, zone_problem


class SettlementSettings(SettingsGroup):
    #: settlement (gateway.services.settlement): the program's baseline rules (presets of
    #: flexmodel.baselines), the site's time zone (IANA) its clock intervals are in, their
    #: length [min], and the program's holidays (ISO dates)
    settlement_rules: str = Field(default="10of10,sameday-3+2", description="preset names")
    site_timezone: str = "UTC"
    settlement_interval_min: int = 15
    #: a fast event's (source `fast`) rules and interval length [min]: the level just before
    #: the trigger, in minutes, as fast services settle (docs/fast.md)
    fast_settlement_rules: str = Field(default="meterbefore-30s", description="preset names")
    fast_settlement_interval_min: int = 1
    settlement_holidays: str = Field(default="", description="comma-separated ISO dates")
    #: a preset the opt-in decision also counts an event under (gateway.services.counted):
    #: opted out when the firm kW the utility would count falls short; None: not counted
    opt_in_baseline: str | None = Field(default=None, description="a preset name")
    #: the preset the VENs' BASELINE and DELTA_USAGE reports (3.1) and settlement report (2.0b)
    #: follow (gateway.openadr.programbaseline); None: the uncapped power, as before
    report_baseline: str | None = Field(default=None, description="a preset name")

    @property
    def settlement_rule_names(self) -> tuple[str, ...]:
        """FLEXGATE_SETTLEMENT_RULES as a list of preset names (checked at load)."""
        return tuple(n.strip() for n in self.settlement_rules.split(",") if n.strip())

    @property
    def fast_settlement_rule_names(self) -> tuple[str, ...]:
        """FLEXGATE_FAST_SETTLEMENT_RULES as a list of preset names (checked at load)."""
        return tuple(n.strip() for n in self.fast_settlement_rules.split(",") if n.strip())

    def settles_with(self, source: str) -> tuple[tuple[str, ...], int]:
        """The rules and interval length [min] an event from `source` is settled under."""
        if source == "fast":
            return self.fast_settlement_rule_names, self.fast_settlement_interval_min
        return self.settlement_rule_names, self.settlement_interval_min

    @property
    def site_zone(self) -> ZoneInfo:
        return ZoneInfo(self.site_timezone)

    @property
    def holiday_dates(self) -> frozenset[date]:
        return parse_dates(self.settlement_holidays)

    def _check_settlement(self) -> None:
        for key, names in (
            ("SETTLEMENT_RULES", self.settlement_rule_names),
            ("FAST_SETTLEMENT_RULES", self.fast_settlement_rule_names),
        ):
            for name in names:
                if not is_preset(name):
                    raise ValueError(
                        f"FLEXGATE_{key}: {name!r} is not a baseline preset (one of {RULE_NAMES})"
                    )
        for key, chosen in (
            ("OPT_IN_BASELINE", self.opt_in_baseline),
            ("REPORT_BASELINE", self.report_baseline),
        ):
            if chosen is not None and not is_preset(chosen):
                raise ValueError(
                    f"FLEXGATE_{key}: {chosen!r} is not a baseline preset (one of {RULE_NAMES})"
                )
        for key, minutes in (
            ("SETTLEMENT_INTERVAL_MIN", self.settlement_interval_min),
            ("FAST_SETTLEMENT_INTERVAL_MIN", self.fast_settlement_interval_min),
        ):
            problem = interval_problem(minutes)
            if problem:
                raise ValueError(f"FLEXGATE_{key}: {problem}")
            problem = zone_problem(self.site_timezone, minutes)
            if problem:
                raise ValueError(f"FLEXGATE_SITE_TIMEZONE: {problem}")
        try:
            parse_dates(self.settlement_holidays)
        except ValueError as exc:
            raise ValueError(f"FLEXGATE_SETTLEMENT_HOLIDAYS: {exc}") from None
