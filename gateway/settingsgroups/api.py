"""The HTTP API's settings: where it listens, its TLS, its tokens (gateway.api)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, SecretStr

from agents.protocol import MIN_TOKEN_CHARS, PLACEHOLDER_TOKENS
from gateway.settingsgroups.base import SettingsGroup

LAB_API_TOKEN = "lab-api-token"


class ApiSettings(SettingsGroup):
    api_token: SecretStr = SecretStr("")
    read_token: SecretStr | None = None
    #: without a read token, reads (the dashboard, the API's GETs, quotes) are open to anyone
    #: who reaches the port: outside the lab only when this says so
    read_public: bool = False
    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)
    tls_cert: Path | None = None
    tls_key: Path | None = None
    log_level: str = "info"

    def _check_api_token(self) -> None:
        self._lab_or_secret("api_token", LAB_API_TOKEN)

    def _check_tls(self) -> None:
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("FLEXGATE_TLS_CERT and FLEXGATE_TLS_KEY go together")

    def _check_reads(self) -> None:
        read = self.read_token.get_secret_value() if self.read_token is not None else ""
        if self.lab:
            return
        if not read and not self.read_public:
            raise ValueError(
                "FLEXGATE_READ_TOKEN must be set outside the lab: without it anyone who reaches "
                "the port reads the dashboard, the jobs and the events (set "
                "FLEXGATE_READ_PUBLIC=true to make reads public on purpose)"
            )
        if read and (read.lower() in PLACEHOLDER_TOKENS or len(read) < MIN_TOKEN_CHARS):
            raise ValueError(
                f"FLEXGATE_READ_TOKEN must be a secret of at least {MIN_TOKEN_CHARS} characters "
                "(placeholders are refused outside the lab)"
            )
