"""The agent's settings: environment variables prefixed `FLEXGATE_` (docs/configuration.md)."""

from __future__ import annotations

import os
import re
import socket
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from agents.fasttrigger import TriggerGuard
from agents.natsconnect import NatsOptions
from agents.protocol import NATS_NODE_ID
from agents.protocol_settings import (
    AGENT_NAMESPACE,
    LAB_TOKEN,
    MIN_TOKEN_CHARS,
    PLACEHOLDER_TOKENS,
    unknown_variables,
)


class AgentSettings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="FLEXGATE_", extra="ignore", hide_input_in_errors=True
    )

    agent_token: SecretStr = Field(default=SecretStr(""), description="bearer token for changes")
    agent_node_id: str = Field(default_factory=socket.gethostname)
    #: None: stated nowhere, which only the lab allows (there it means sim): an agent on a GPU
    #: node left on simulated GPUs would cap GPUs that do not exist while the real ones run
    agent_backend: Literal["sim", "nvml"] | None = None
    agent_host: str = "127.0.0.1"
    agent_port: int = Field(default=9100, ge=0, le=65535)
    #: serve HTTPS with this certificate and key (both or neither); the gateway verifies it
    #: against FLEXGATE_AGENTS_CA
    agent_tls_cert: Path | None = None
    agent_tls_key: Path | None = None
    agent_state_dir: Path = Path(".flexgate/agent")
    agent_gpus: int = Field(default=8, ge=1, le=64)
    agent_job_mix: Path | None = None
    agent_sample_hz: float = Field(default=20.0, ge=10.0, le=1000.0)
    agent_telemetry_window_s: float = Field(default=60.0, gt=1.0)
    agent_lease_check_s: float = Field(default=0.1, gt=0.0, le=10.0)
    agent_podresources_socket: Path | None = None  #: the kubelet's; None: no Kubernetes
    agent_transport: Literal["http", "nats"] = "http"  #: nats: commands over NATS too
    agent_nats_url: str = "nats://127.0.0.1:4222"
    agent_nats_token: SecretStr | None = None
    agent_nats_user: str | None = None
    agent_nats_password: SecretStr | None = None
    agent_nats_tls_ca: Path | None = None
    agent_telemetry_period_s: float = Field(default=1.0, gt=0.0, le=3600.0)
    #: DCGM-exporter's metrics URL (DRAM activity for the PFI predictor); None: not read
    agent_dcgm_url: str | None = None
    agent_dcgm_timeout_s: float = Field(default=2.0, gt=0.0, le=60.0)
    agent_feature_period_s: float = Field(default=5.0, gt=0.0, le=3600.0)
    agent_feature_samples: int = Field(default=120, ge=1, le=100_000)
    #: The power sensor's effective lag [s] (`flexmodel.sensors`); None: from the GPU model
    agent_sensor_lag_s: float | None = Field(default=None, ge=0.0, le=10.0)
    #: the site's shared secret that signs fast triggers (docs/fast.md); None: refused
    agent_fast_secret: SecretStr | None = None
    agent_fast_max_age_s: float = Field(default=2.0, gt=0.0, le=60.0)
    lab: bool = False

    @model_validator(mode="before")
    @classmethod
    def _refuse_unknown_variables(cls, data: Any) -> Any:
        """Every `FLEXGATE_AGENT_*` name must be one of the agent's settings; the other names
        are the gateway's, which checks them (`flexgate agent` checks both first)."""
        problem = unknown_variables(
            os.environ, cls.model_fields, foreign=lambda name: not name.startswith(AGENT_NAMESPACE)
        )
        if problem:
            raise ValueError(problem)
        return data

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
        if self.agent_backend is None:
            if not self.lab:
                raise ValueError(
                    "FLEXGATE_AGENT_BACKEND (--backend) must be stated outside the lab: nvml on a "
                    "GPU node, sim for simulated GPUs"
                )
            self.agent_backend = "sim"
        if (self.agent_tls_cert is None) != (self.agent_tls_key is None):
            raise ValueError("FLEXGATE_AGENT_TLS_CERT and FLEXGATE_AGENT_TLS_KEY go together")
        for path in (self.agent_tls_cert, self.agent_tls_key):
            if path is not None and not path.is_file():
                raise ValueError(f"FLEXGATE_AGENT_TLS_CERT / _KEY: {path}: no such file")
        self._check_nats()
        fast = self.agent_fast_secret.get_secret_value() if self.agent_fast_secret else None
        if fast is not None and (fast.lower() in PLACEHOLDER_TOKENS or len(fast) < MIN_TOKEN_CHARS):
            raise ValueError(
                f"FLEXGATE_AGENT_FAST_SECRET must be a secret of at least {MIN_TOKEN_CHARS} "
                "characters (placeholders are refused)"
            )
        if self.agent_dcgm_url is not None and not self.agent_dcgm_url.startswith(
            ("http://", "https://")
        ):
            raise ValueError(
                f"FLEXGATE_AGENT_DCGM_URL {self.agent_dcgm_url!r} is not an http(s) URL "
                "(dcgm-exporter serves http://HOST:9400/metrics)"
            )
        return self

    def _check_nats(self) -> None:
        if (self.agent_nats_user is None) != (self.agent_nats_password is None):
            raise ValueError(
                "FLEXGATE_AGENT_NATS_USER and FLEXGATE_AGENT_NATS_PASSWORD go together"
            )
        if self.agent_nats_token is not None and self.agent_nats_user is not None:
            raise ValueError(
                "set FLEXGATE_AGENT_NATS_TOKEN or FLEXGATE_AGENT_NATS_USER/_PASSWORD, not both"
            )
        anonymous = self.agent_nats_token is None and self.agent_nats_user is None
        if self.agent_transport == "nats" and anonymous and not self.lab:
            raise ValueError(
                "FLEXGATE_AGENT_TRANSPORT=nats needs FLEXGATE_AGENT_NATS_TOKEN or "
                "FLEXGATE_AGENT_NATS_USER and FLEXGATE_AGENT_NATS_PASSWORD (anonymous NATS is "
                "for the lab only)"
            )
        if not re.match(NATS_NODE_ID, self.agent_node_id) and self.agent_transport == "nats":
            raise ValueError(
                f"FLEXGATE_AGENT_NODE_ID {self.agent_node_id!r}: over NATS a node id is letters, "
                "digits, '-' and '_' only (it is a subject token)"
            )

    def fast_guard(self) -> TriggerGuard:
        """What checks this agent's fast triggers (`agents.fasttrigger`)."""
        secret = self.agent_fast_secret.get_secret_value() if self.agent_fast_secret else None
        return TriggerGuard(secret, self.agent_fast_max_age_s)

    def nats_options(self) -> NatsOptions:
        return NatsOptions(
            url=self.agent_nats_url,
            token=self.agent_nats_token.get_secret_value() if self.agent_nats_token else None,
            user=self.agent_nats_user,
            password=(
                self.agent_nats_password.get_secret_value() if self.agent_nats_password else None
            ),
            tls_ca=self.agent_nats_tls_ca,
        )


@lru_cache
def get_settings() -> AgentSettings:
    return AgentSettings()
