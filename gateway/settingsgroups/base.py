"""The base of the settings groups: the `FLEXGATE_` prefix and the lab switch they all read."""

from __future__ import annotations

from pydantic import SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from agents.protocol import MIN_TOKEN_CHARS, PLACEHOLDER_TOKENS


class SettingsGroup(BaseSettings):
    """One topic's settings; `gateway.settings.GatewaySettings` inherits every group."""

    model_config = SettingsConfigDict(
        env_prefix="FLEXGATE_", extra="ignore", hide_input_in_errors=True
    )

    lab: bool = False

    def _lab_or_secret(self, name: str, lab_value: str) -> None:
        """The token `name`: the lab's when unset in the lab, else a real secret."""
        token = getattr(self, name).get_secret_value()
        if self.lab and not token:
            setattr(self, name, SecretStr(lab_value))
        elif not self.lab and (token.lower() in PLACEHOLDER_TOKENS or len(token) < MIN_TOKEN_CHARS):
            raise ValueError(
                f"FLEXGATE_{name.upper()} must be set to a secret of at least "
                f"{MIN_TOKEN_CHARS} characters (placeholders are refused outside the lab)"
            )
