"""Sending each node its desired state, concurrently (aiohttp, keep-alive connections).

A command is retried on timeouts, connection errors and 5xx answers, with exponential backoff;
a 4xx answer (a refused token, a stale generation) is final. Every attempt's outcome is
returned with its timings for the store.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import aiohttp

from agents.protocol import CapCommand
from gateway.store.models import utcnow

BACKOFF_S = 0.1


@dataclass
class Ack:
    node: str
    status: str  #: acked or failed
    attempts: int
    sent_at: datetime
    acked_at: datetime | None
    delay_s: float | None
    answer: dict[str, Any] | None
    error: str | None


async def send(
    session: aiohttp.ClientSession,
    node: str,
    url: str,
    token: str,
    command: CapCommand,
    *,
    timeout_s: float,
    retries: int,
) -> Ack:
    sent_at, start = utcnow(), time.perf_counter()
    error = "not sent"
    for attempt in range(1, retries + 2):
        try:
            async with session.put(
                f"{url}/v1/caps",
                json=command.model_dump(),
                headers={"Authorization": f"Bearer {token}"},
                timeout=aiohttp.ClientTimeout(total=timeout_s),
            ) as response:
                body = await response.json(content_type=None)
                if response.status == 200:
                    return Ack(
                        node,
                        "acked",
                        attempt,
                        sent_at,
                        utcnow(),
                        time.perf_counter() - start,
                        body,
                        _gpu_errors(body),
                    )
                detail = body.get("detail", body) if isinstance(body, dict) else body
                error = f"HTTP {response.status}: {detail}"
                if response.status < 500:
                    break
        except (TimeoutError, aiohttp.ClientError, ValueError) as exc:
            error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        if attempt <= retries:
            await asyncio.sleep(BACKOFF_S * 2 ** (attempt - 1))
    return Ack(node, "failed", attempt, sent_at, None, None, None, error)


def _gpu_errors(body: dict[str, Any]) -> str | None:
    errors = [f"GPU {r['gpu']}: {r['error']}" for r in body.get("results", []) if r.get("error")]
    return "; ".join(errors) or None


async def fan_out(
    session: aiohttp.ClientSession,
    targets: list[tuple[str, str, CapCommand]],
    token: str,
    *,
    timeout_s: float,
    retries: int,
) -> list[Ack]:
    """Send every (node, url, command) at once; the answers come back in the same order."""
    return list(
        await asyncio.gather(
            *(
                send(session, node, url, token, command, timeout_s=timeout_s, retries=retries)
                for node, url, command in targets
            )
        )
    )
