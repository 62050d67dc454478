"""The agent's settings: environment variables prefixed `FLEXGATE_` (docs/configuration.md)."""

from __future__ import annotations

import socket
from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from agents.protocol import LAB_TOKEN, MIN_TOKEN_CHARS, PLACEHOLDER_TOKENS


class AgentSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="FLEXGATE_", extra="ignore")

    agent_token: SecretStr = Field(default=SecretStr(""), description="bearer token for changes")
    agent_node_id: str = Field(default_factory=socket.gethostname)
    agent_backend: Literal["sim", "nvml"] = "sim"
    agent_host: str = "127.0.0.1"
    agent_port: int = Field(default=9100, ge=0, le=65535)
    agent_state_dir: Path = Path(".flexgate/agent")
    agent_gpus: int = Field(default=8, ge=1, le=64)
    agent_job_mix: Path | None = None
    agent_sample_hz: float = Field(default=20.0, ge=10.0, le=1000.0)
    agent_telemetry_window_s: float = Field(default=60.0, gt=1.0)
    agent_lease_check_s: float = Field(default=0.1, gt=0.0, le=10.0)
    agent_podresources_socket: Path | None = None  #: the kubelet's; None: no Kubernetes
    lab: bool = False

    @model_validator(mode="after")
    def _refuse_placeholder_token(self) -> AgentSettings:
        token = self.agent_token.get_secret_value()
        if self.lab and not token:
            self.agent_token = SecretStr(LAB_TOKEN)
        elif not self.lab and (token.lower() in PLACEHOLDER_TOKENS or len(token) < MIN_TOKEN_CHARS):
            raise ValueError(
                "FLEXGATE_AGENT_TOKEN must be set to a secret of at least "
                f"{MIN_TOKEN_CHARS} characters (placeholders are refused outside the lab)"
            )
        return self


@lru_cache
def get_settings() -> AgentSettings:
    return AgentSettings()
