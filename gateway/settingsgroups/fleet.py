"""The agents' settings: which, over what transport (HTTP or NATS), their tokens, and the
dispatch and lease timing (gateway.agentclient, gateway.services.fleet)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr

from agents.protocol import LAB_TOKEN, NATS_NODE_ID, PLACEHOLDER_TOKENS, node_token
from gateway.settingsfiles import read_agents_file
from gateway.settingsgroups.base import SettingsGroup


class FleetSettings(SettingsGroup):
    agent_token: SecretStr = SecretStr("")
    #: each agent's token derived from this and its node id (`node_token`), instead of the one
    #: FLEXGATE_AGENT_TOKEN every agent shares
    node_token_secret: SecretStr | None = None
    #: the CA the agents' certificates are verified against (https:// agent URLs); None: the
    #: system's CAs
    agents_ca: Path | None = None
    agents: str = Field(
        default="", description="comma-separated agent base URLs (node ids over NATS)"
    )
    #: the agents one a line (URLs, or node ids over NATS; `#` comments), instead of
    #: FLEXGATE_AGENTS
    agents_file: Path | None = None
    transport: Literal["http", "nats"] = "http"
    nats_url: str = "nats://127.0.0.1:4222"
    nats_token: SecretStr | None = None
    nats_user: str | None = None
    nats_password: SecretStr | None = None
    nats_tls_ca: Path | None = None
    lease_s: float = Field(default=120.0, gt=0.0, le=86400.0)
    reconcile_period_s: float = Field(default=15.0, gt=0.0)
    recovery_ramp_s: float = Field(default=60.0, ge=0.0)
    recovery_steps: int = Field(default=4, ge=1, le=100)
    dispatch_timeout_s: float = Field(default=5.0, gt=0.0)
    dispatch_retries: int = Field(default=3, ge=0, le=10)
    telemetry_max_age_s: float = Field(default=1.0, ge=0.0)
    #: plans may rest on agents with simulated GPUs outside the lab (a demo or staging site);
    #: otherwise an event is refused while any known agent runs the sim backend
    allow_simulated: bool = False

    @property
    def agent_urls(self) -> list[str]:
        return [u.strip().rstrip("/") for u in self.agents.split(",") if u.strip()]

    def token_for(self, node_id: str) -> str:
        """The bearer token the agent of `node_id` expects."""
        if self.node_token_secret is not None:
            return node_token(self.node_token_secret.get_secret_value(), node_id)
        return self.agent_token.get_secret_value()

    def _read_agents_file(self) -> None:
        """FLEXGATE_AGENTS_FILE into `agents`."""
        if self.agents_file is not None:
            if self.agents.strip():
                raise ValueError("set FLEXGATE_AGENTS or FLEXGATE_AGENTS_FILE, not both")
            self.agents = ",".join(read_agents_file(self.agents_file))

    def _check_agent_token(self) -> None:
        if self.node_token_secret is not None:
            self._check_node_token_secret()
            return
        self._lab_or_secret("agent_token", LAB_TOKEN)

    def _check_node_token_secret(self) -> None:
        assert self.node_token_secret is not None
        secret = self.node_token_secret.get_secret_value()
        if self.agent_token.get_secret_value():
            raise ValueError(
                "set FLEXGATE_NODE_TOKEN_SECRET (a token per node) or FLEXGATE_AGENT_TOKEN (one "
                "shared token), not both"
            )
        if not self.lab and (secret.lower() in PLACEHOLDER_TOKENS or len(secret) < 32):
            raise ValueError(
                "FLEXGATE_NODE_TOKEN_SECRET must be a secret of at least 32 characters "
                "(placeholders are refused outside the lab)"
            )

    def _check_agents_ca(self) -> None:
        if self.agents_ca is not None and not self.agents_ca.is_file():
            raise ValueError(f"FLEXGATE_AGENTS_CA {self.agents_ca}: no such file")

    def _check_nats(self) -> None:
        if (self.nats_user is None) != (self.nats_password is None):
            raise ValueError("FLEXGATE_NATS_USER and FLEXGATE_NATS_PASSWORD go together")
        if self.nats_token is not None and self.nats_user is not None:
            raise ValueError("set FLEXGATE_NATS_TOKEN or FLEXGATE_NATS_USER/_PASSWORD, not both")
        if self.transport != "nats":
            return
        if self.nats_token is None and self.nats_user is None and not self.lab:
            raise ValueError(
                "FLEXGATE_TRANSPORT=nats needs FLEXGATE_NATS_TOKEN or FLEXGATE_NATS_USER and "
                "FLEXGATE_NATS_PASSWORD (anonymous NATS is for the lab only)"
            )
        bad = [a for a in self.agent_urls if not re.match(NATS_NODE_ID, a)]
        if bad:
            raise ValueError(
                f"FLEXGATE_AGENTS over NATS lists node ids (letters, digits, '-', '_'), not "
                f"{', '.join(bad[:3])}"
            )
