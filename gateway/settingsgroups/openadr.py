"""The VEN's settings: OpenADR 2.0b and 3.1, the VTN, the VEN's identity (gateway.openadr)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr

from agents.protocol import PLACEHOLDER_TOKENS
from gateway.settingsgroups.base import SettingsGroup
from gateway.settingsgroups.checks import insecure_url, parse_fallback_limits

#: The OpenADR 3.1 mock VTN's lab client (`flexgate mock-vtn --openadr 3.1`), used with
#: `--lab` when no client is configured.
LAB_VTN_CLIENT_ID = "flexgate-lab-ven"
LAB_VTN_CLIENT_SECRET = "flexgate-lab-ven-secret"


class OpenAdrSettings(SettingsGroup):
    vtn_url: str = Field(default="", description="the VTN's endpoint; empty: no VEN")
    openadr: Literal["2.0b", "3.1"] = "2.0b"  #: the OpenADR version the VEN speaks
    vtn_client_id: str = ""  #: OpenADR 3.1: the OAuth2 client the VTN's operator issued
    vtn_client_secret: SecretStr = SecretStr("")  #: OpenADR 3.1: its secret
    vtn_token_url: str = ""  #: OpenADR 3.1: the token service; empty: `GET /auth/server`
    #: OpenADR 3.1: how the client credentials reach the token service: in the form body (the
    #: 3.1.0 schema's clientCredentialRequest) or as HTTP Basic (RFC 6749 2.3.1)
    vtn_client_auth: Literal["body", "basic"] = "body"
    vtn_allow_http: bool = False  #: OpenADR 3.1: plain HTTP to a VTN on loopback
    vtn_poll_s: float = Field(default=10.0, gt=0.0)  #: OpenADR 3.1: events are read this often
    #: OpenADR 3.1 safe mode: `programName=kW,...`, each program's import limit held while the
    #: VTN is unreachable; FALLBACK_EVENT names events that set it; FALLBACK_AFTER_S the wait
    vtn_fallback_limits: str = ""
    vtn_fallback_event: str = ""
    vtn_fallback_after_s: float = Field(default=300.0, gt=0.0)
    ven_callback_url: str = ""  #: OpenADR 3.1: where the VTN posts notifications; empty: poll
    vtn_mqtt: bool = True  #: OpenADR 3.1: use the VTN's MQTT notifier when it offers one
    vtn_mqtt_username: str = ""  #: OpenADR 3.1: the broker's username; empty: as the VTN says
    vtn_mqtt_password: SecretStr = SecretStr("")  #: OpenADR 3.1: with vtn_mqtt_username
    ven_name: str = "flexgate"
    ven_groups: str = Field(default="", description="comma-separated groupIDs this VEN answers")
    ven_resources: str = Field(default="", description="comma-separated resourceIDs it controls")
    vtn_fingerprint: str | None = None
    vtn_allow_unsigned: bool = False
    ven_cert: Path | None = None
    ven_key: Path | None = None

    def _check_vtn(self) -> None:
        if self.vtn_url and self.openadr == "3.1":
            self._check_openadr31()
        elif self.vtn_url and not (self.lab or self.vtn_fingerprint or self.vtn_allow_unsigned):
            raise ValueError(
                "FLEXGATE_VTN_FINGERPRINT must be set with FLEXGATE_VTN_URL: without it openleadr "
                "checks no signature and a forged event would cap real GPUs (set "
                "FLEXGATE_VTN_ALLOW_UNSIGNED=true only for a VTN that signs nothing, on a trusted "
                "network)"
            )
        if (self.ven_cert is None) != (self.ven_key is None):
            raise ValueError("FLEXGATE_VEN_CERT and FLEXGATE_VEN_KEY go together")

    def _check_openadr31(self) -> None:
        if self.lab and not self.vtn_client_id:
            self.vtn_client_id, self.vtn_client_secret = (
                LAB_VTN_CLIENT_ID,
                SecretStr(LAB_VTN_CLIENT_SECRET),
            )
        # The callback carries the subscription's bearer token: the same rule as the VTN.
        for name in ("vtn_url", "vtn_token_url", "ven_callback_url"):
            problem = insecure_url(getattr(self, name), allow_http=self.lab or self.vtn_allow_http)
            if problem:
                raise ValueError(f"FLEXGATE_{name.upper()}: {problem}")
        if self.vtn_mqtt_password.get_secret_value() and not self.vtn_mqtt_username:
            raise ValueError(
                "FLEXGATE_VTN_MQTT_PASSWORD is set without FLEXGATE_VTN_MQTT_USERNAME: set both, "
                "or neither to use the credentials the VTN's MQTT notifier names"
            )
        try:
            parse_fallback_limits(self.vtn_fallback_limits)
        except ValueError as exc:
            raise ValueError(f"FLEXGATE_VTN_FALLBACK_LIMITS: {exc}") from None
        secret = self.vtn_client_secret.get_secret_value()
        if not self.vtn_client_id or not secret:
            raise ValueError(
                "FLEXGATE_VTN_CLIENT_ID and FLEXGATE_VTN_CLIENT_SECRET must be set with "
                "FLEXGATE_OPENADR=3.1: the VTN answers only OAuth2 clients it issued"
            )
        if not self.lab and (
            secret.lower() in PLACEHOLDER_TOKENS or secret == LAB_VTN_CLIENT_SECRET
        ):
            raise ValueError(
                "FLEXGATE_VTN_CLIENT_SECRET is a placeholder or the lab's secret: set the one "
                "the VTN's operator issued (placeholders are refused outside the lab)"
            )
