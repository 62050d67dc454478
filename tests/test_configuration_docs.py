"""docs/configuration.md lists every setting of both programs, by its environment name."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic_settings import BaseSettings

from agents.settings import AgentSettings
from gateway.settings import GatewaySettings

DOCUMENTED = (Path(__file__).resolve().parent.parent / "docs" / "configuration.md").read_text(
    encoding="utf-8"
)


@pytest.mark.parametrize(
    ("settings", "one_of_them"),
    [(GatewaySettings, "meter_url"), (AgentSettings, "agent_node_id")],
)
def test_every_setting_is_documented(settings: type[BaseSettings], one_of_them: str):
    prefix = settings.model_config.get("env_prefix", "")
    names = list(settings.model_fields)
    assert one_of_them in names
    assert [n for n in names if f"`{prefix}{n.upper()}`" not in DOCUMENTED] == []
