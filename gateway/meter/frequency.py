"""Frequency feeds for the fast path's frequency trigger (docs/fast.md): one small interface,
chosen by URL. A feed raises MeterError (gateway.errors) naming the problem: the trigger
counts it a fault.

- `modbus://host:port?register=...&type=float32&scale=...`: a Modbus TCP register, read as
  the facility meter reads one (`ModbusMeter`, the same parameters), in Hz after `scale`;
- `tcp://host:port`: a stream of lines, one reading [Hz] each (a relay's or a PMU gateway's
  feed): the newest line that arrived within the timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Protocol
from urllib.parse import urlsplit

from gateway.errors import MeterError
from gateway.meter.sources import ModbusMeter, as_kw


class FrequencySource(Protocol):
    source: str  #: the URL it reads, for /v1/fast/frequency and the logs

    async def read_hz(self) -> float:
        """The grid's frequency now [Hz]; raises MeterError naming the problem."""
        ...

    async def aclose(self) -> None: ...


def open_frequency(url: str, *, timeout_s: float) -> FrequencySource | None:
    """The feed a URL names, or None for an empty URL (no frequency trigger). Opens nothing
    yet; a URL it cannot use raises ValueError saying why."""
    if not url.strip():
        return None
    parts = urlsplit(url.strip())
    if parts.scheme == "modbus":
        return ModbusFrequency(ModbusMeter.from_url(parts, timeout_s=timeout_s))
    if parts.scheme == "tcp" and parts.hostname and parts.port:
        return LineFrequency(parts.hostname, parts.port, timeout_s=timeout_s)
    raise ValueError(f"frequency URL {url!r}: modbus://host:port?register=... or tcp://host:port")


class ModbusFrequency:
    """A Modbus register read as the facility meter reads one: its number is in Hz."""

    def __init__(self, register: ModbusMeter) -> None:
        self.register, self.source = register, register.source

    async def read_hz(self) -> float:
        return await self.register.read_kw()

    async def aclose(self) -> None:
        await self.register.aclose()


class LineFrequency:
    """Lines of readings over TCP, read as they come; `read_hz` gives the newest, if it
    arrived within `timeout_s` (a stream that stopped is a fault). Reconnects when asked after
    the stream closed."""

    def __init__(self, host: str, port: int, *, timeout_s: float) -> None:
        self.host, self.port, self.timeout_s = host, port, timeout_s
        self.source = f"tcp://{host}:{port}"
        self._latest: tuple[float, float] | None = None  #: (reading [Hz], when: loop time)
        self._reader: asyncio.Task[None] | None = None
        self._error = "no reading yet"

    async def read_hz(self) -> float:
        loop = asyncio.get_running_loop()
        if self._reader is None or self._reader.done():
            self._reader = asyncio.create_task(self._read_lines())
        waited = 0.0
        while self._latest is None and waited < self.timeout_s:  # a new stream's first line
            await asyncio.sleep(0.01)
            waited += 0.01
        if self._latest is None or loop.time() - self._latest[1] > self.timeout_s:
            raise MeterError(f"{self.source}: no reading within {self.timeout_s} s ({self._error})")
        return self._latest[0]

    async def _read_lines(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(self.host, self.port), self.timeout_s
            )
        except (OSError, TimeoutError) as exc:
            self._error = f"no connection: {exc or 'timed out'}"
            return
        try:
            while line := await reader.readline():
                try:
                    self._latest = (
                        as_kw(line.decode(errors="replace").strip(), "a line"),
                        loop.time(),
                    )
                except MeterError as exc:
                    self._error, self._latest = str(exc), None
            self._error = "the stream closed"
        except (OSError, ValueError) as exc:  # ValueError: a line over the reader's limit
            self._error = f"the stream failed: {exc}"
        finally:
            writer.close()

    async def aclose(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
