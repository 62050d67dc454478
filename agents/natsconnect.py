"""How an agent connects to NATS: its options (from settings) and the connection itself."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nats
from nats.aio.client import Client
from nats.errors import Error as NatsError

CONNECT_TIMEOUT_S = 5.0


class NatsConnectError(Exception):
    """The NATS server refused the connection (wrong credentials) or did not answer."""


@dataclass(frozen=True)
class NatsOptions:
    url: str
    token: str | None = None
    user: str | None = None
    password: str | None = None
    tls_ca: Path | None = None  #: trust this CA; TLS is on with it or with a tls:// URL


def _client_options(options: NatsOptions, name: str) -> dict[str, Any]:
    tls = None
    if options.tls_ca is not None or options.url.startswith("tls://"):
        tls = ssl.create_default_context(cafile=str(options.tls_ca) if options.tls_ca else None)
    return {
        "name": name,
        "token": options.token or None,
        "user": options.user or None,
        "password": options.password or None,
        "tls": tls,
        "connect_timeout": CONNECT_TIMEOUT_S,
    }


async def check(options: NatsOptions) -> None:
    """Fail now, with the server's reason, if these options cannot connect (before serving)."""
    try:
        await probe(options.url, _client_options(options, "flexgate-agent check"))
    except (NatsError, OSError, TimeoutError) as exc:
        raise NatsConnectError(f"cannot connect to NATS at {options.url}: {exc}") from exc


async def connect(options: NatsOptions, name: str, **callbacks: Any) -> Client:
    """A connection that reconnects for ever once made; the first connect fails with
    NatsConnectError naming the reason (wrong credentials, no server)."""
    common = _client_options(options, name)
    try:
        # A connection that reconnects for ever also retries its first connect for ever, even
        # with wrong credentials: one attempt first, which fails at once with the reason.
        await probe(options.url, common)
        return await nats.connect(
            options.url,
            allow_reconnect=True,
            max_reconnect_attempts=-1,
            reconnect_time_wait=0.5,
            **common,
            **callbacks,
        )
    except (NatsError, OSError, TimeoutError) as exc:
        raise NatsConnectError(f"cannot connect to NATS at {options.url}: {exc}") from exc


async def probe(url: str, options: dict[str, Any]) -> None:
    """One connection attempt, closed again: it raises the server's reason for refusing."""
    attempt = Client()
    try:
        # nats-py waits for ever on a TLS handshake the client refused: bounded here.
        await asyncio.wait_for(
            attempt.connect(url, allow_reconnect=False, error_cb=_raised_anyway, **options),
            2 * CONNECT_TIMEOUT_S,
        )
    finally:
        with contextlib.suppress(NatsError, OSError, TimeoutError):
            await asyncio.wait_for(attempt.close(), CONNECT_TIMEOUT_S)


async def _raised_anyway(exc: Exception) -> None:
    """The probe's errors are raised to its caller: nats-py need not log them too."""
