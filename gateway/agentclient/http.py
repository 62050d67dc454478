"""The agents over HTTP/1.1 (aiohttp): keep-alive connections, concurrent requests.

A command is retried on timeouts, connection errors and 5xx answers, with exponential backoff;
a 4xx answer (a refused token, a stale generation) is final.
"""

from __future__ import annotations

import ssl
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
from pydantic import BaseModel, ValidationError

from agents.protocol import CapCommand, CapResponse, Health, TelemetryResponse
from gateway.agentclient import Ack, AgentUnreachableError, gpu_errors
from gateway.clock import Clock, SystemClock
from gateway.retries import command_backoff

HEALTH_TIMEOUT_S = 2.0
TELEMETRY_TIMEOUT_S = 3.0
Model = TypeVar("Model", bound=BaseModel)
#: Hooks that see every request of the gateway's HTTP clients (aiohttp's tracing).
HttpTrace = Sequence[aiohttp.TraceConfig]


class HttpAgentClient:
    """`token`: the one every agent expects, or a node id's own (`token(node)`); `ca_file`: the
    CA that agents' certificates (https:// URLs) must chain to, else the system's."""

    def __init__(
        self,
        token: str | Callable[[str], str],
        *,
        timeout_s: float,
        retries: int,
        clock: Clock | None = None,
        trace_configs: HttpTrace = (),
        ca_file: Path | None = None,
    ) -> None:
        self._token = token
        self._timeout_s, self._retries = timeout_s, retries
        self._clock = clock or SystemClock()
        self._trace_configs = list(trace_configs)
        self._ssl = ssl.create_default_context(cafile=str(ca_file)) if ca_file else True
        self._session: aiohttp.ClientSession | None = None

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None:  # made inside the running loop that will use it
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=2000, keepalive_timeout=75, ssl=self._ssl),
                trace_configs=self._trace_configs or None,
            )
        return self._session

    def _token_for(self, node: str) -> str:
        return self._token if isinstance(self._token, str) else self._token(node)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def _get(self, url: str, model: type[Model], timeout_s: float) -> Model:
        try:
            async with self._http().get(
                url, timeout=aiohttp.ClientTimeout(total=timeout_s)
            ) as answer:
                if answer.status != 200:
                    raise AgentUnreachableError(f"HTTP {answer.status} from {url}")
                return model.model_validate(await answer.json(content_type=None))
        except (TimeoutError, aiohttp.ClientError, ValueError, ValidationError) as exc:
            raise AgentUnreachableError(_describe(exc)) from exc

    async def health(self, address: str) -> Health:
        return await self._get(f"{address}/health", Health, HEALTH_TIMEOUT_S)

    async def telemetry(self, address: str) -> TelemetryResponse | None:
        try:
            return await self._get(
                f"{address}/v1/telemetry", TelemetryResponse, TELEMETRY_TIMEOUT_S
            )
        except AgentUnreachableError:
            return None

    async def put_caps(self, node: str, address: str, command: CapCommand) -> Ack:
        sent_at, start = self._clock.now(), self._clock.monotonic()
        attempts = 0

        async def put() -> Ack:
            nonlocal attempts
            attempts += 1
            try:
                async with self._http().put(
                    f"{address}/v1/caps",
                    json=command.model_dump(),
                    headers={"Authorization": f"Bearer {self._token_for(node)}"},
                    timeout=aiohttp.ClientTimeout(total=self._timeout_s),
                ) as response:
                    body = await response.json(content_type=None)
                    if response.status != 200:
                        error = f"HTTP {response.status}: {_detail(body)}"
                        if response.status >= 500:
                            raise _RetryableError(error)
                        return Ack(node, "failed", attempts, sent_at, None, None, None, error)
                    answer = CapResponse.model_validate(body)
            except (TimeoutError, aiohttp.ClientError, ValueError, ValidationError) as exc:
                raise _RetryableError(_describe(exc)) from exc
            done_s = self._clock.monotonic() - start
            errors = gpu_errors(answer)
            return Ack(node, "acked", attempts, sent_at, self._clock.now(), done_s, answer, errors)

        try:
            backoff = command_backoff(self._retries)
            return await backoff.call(self._clock, put, on=(_RetryableError,))
        except _RetryableError as exc:
            return Ack(node, "failed", attempts, sent_at, None, None, None, str(exc))


class _RetryableError(Exception):
    """A command worth sending again: a timeout, a connection error, a 5xx answer."""


def _detail(body: Any) -> Any:
    return body.get("detail", body) if isinstance(body, dict) else body


def _describe(exc: Exception) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
