"""Facility meters: one small interface, one implementation per source, chosen by URL.

MeterError (gateway.errors) is the one exception a `Meter` raises: a timeout, a refused
connection, an answer of the wrong shape, a Modbus exception. Foreign errors (aiohttp, JSON,
pymodbus) are translated here with `raise ... from exc`, so the feed sees one kind of failure
and its message names the problem.

URL forms (docs/gateway.md, "Meter"):

- `http(s)://...`: a JSON document, the power [kW] at a dotted path (`json_key`);
- `prometheus://host:port?query=...`: the Prometheus HTTP API's instant query, one series [kW]
  (`prometheus+https://` for a Prometheus served over HTTPS);
- `modbus://host:port?unit=1&register=0&type=float32&scale=1&table=holding&word_order=big`:
  Modbus TCP holding (`table=holding`, function 3) or input (`table=input`, function 4)
  registers; `scale` turns the raw number into kW.
"""

from __future__ import annotations

import asyncio
import json
import math
from typing import Any, Literal, Protocol
from urllib.parse import SplitResult, parse_qs, urlsplit

import aiohttp
from pymodbus.client import AsyncModbusTcpClient
from pymodbus.exceptions import ModbusException

from gateway.errors import MeterError

DEFAULT_JSON_KEY = "facility_power_kw"
#: register count of each Modbus type (a 32-bit value spans two 16-bit registers)
MODBUS_TYPES = {"uint16": 1, "int16": 1, "uint32": 2, "int32": 2, "float32": 2}


class Meter(Protocol):
    source: str  #: the URL it reads, for /v1/site and the logs

    async def read_kw(self) -> float:
        """The facility's power now [kW]; raises MeterError naming the problem."""
        ...

    async def aclose(self) -> None:
        """Release connections (the feed calls it once, when it stops)."""
        ...


def open_meter(
    url: str, *, json_key: str = DEFAULT_JSON_KEY, timeout_s: float = 2.0
) -> Meter | None:
    """The meter a URL names, or None for an empty URL (the site then uses its estimate).

    Opens nothing yet (connections are made on the first read), so settings can call it to
    check a URL; a URL it cannot use raises ValueError saying why."""
    if not url.strip():
        return None
    if timeout_s <= 0:
        raise ValueError(f"the meter timeout must be positive, not {timeout_s} s")
    parts = urlsplit(url.strip())
    if parts.scheme in ("http", "https"):
        return HttpJsonMeter(parts.geturl(), json_key=json_key, timeout_s=timeout_s)
    if parts.scheme in ("prometheus", "prometheus+https"):
        return PrometheusMeter.from_url(parts, timeout_s=timeout_s)
    if parts.scheme == "modbus":
        return ModbusMeter.from_url(parts, timeout_s=timeout_s)
    raise ValueError(
        f"meter URL {redacted(parts)!r}: the scheme must be http, https, prometheus, "
        f"prometheus+https or modbus, not {parts.scheme or 'missing'}"
    )


def redacted(parts: SplitResult) -> str:
    """The URL as shown in /v1/site and in errors: a password in it becomes `***`."""
    if parts.password is None:
        return parts.geturl()
    host = parts.netloc.rpartition("@")[2]
    return parts._replace(netloc=f"{parts.username}:***@{host}").geturl()


def as_kw(value: Any, where: str) -> float:
    """A number from an answer (JSON numbers and Prometheus's decimal strings)."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise MeterError(f"{where} is {value!r}, not a number")
    try:
        return float(value)
    except ValueError as exc:
        raise MeterError(f"{where} is {value!r}, not a number") from exc


class _HttpMeter:
    """One aiohttp session per meter, made on the first read (it needs a running loop)."""

    def __init__(self, url: str, timeout_s: float) -> None:
        self.source = redacted(urlsplit(url))
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._session: aiohttp.ClientSession | None = None

    async def _get_json(self, url: str, params: dict[str, str] | None = None) -> tuple[Any, int]:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=self._timeout)
        try:
            async with self._session.get(url, params=params) as answer:
                body = await answer.read()
                status = answer.status
        except TimeoutError as exc:
            raise MeterError(
                f"{self.source} did not answer within {self._timeout.total} s"
            ) from exc
        except aiohttp.ClientError as exc:
            raise MeterError(f"{self.source} could not be read: {exc}") from exc
        try:
            doc = json.loads(body)  # bytes: a body that is not UTF-8 is a ValueError too
        except ValueError as exc:
            raise MeterError(f"{self.source} answered HTTP {status} with no JSON") from exc
        return doc, status

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


class HttpJsonMeter(_HttpMeter):
    """A JSON document over HTTP(S) with the power [kW] at a dotted path (`site.power_kw`)."""

    def __init__(self, url: str, *, json_key: str = DEFAULT_JSON_KEY, timeout_s: float) -> None:
        if not json_key or any(not part for part in json_key.split(".")):
            raise ValueError(f"the meter's JSON key {json_key!r} must be a dotted path of names")
        super().__init__(url, timeout_s)
        self.url, self.json_key = url, json_key

    async def read_kw(self) -> float:
        doc, status = await self._get_json(self.url)
        if status >= 400:
            raise MeterError(f"{self.source} answered HTTP {status}")
        value = doc
        for depth, name in enumerate(self.json_key.split(".")):
            if not isinstance(value, dict) or name not in value:
                found = ".".join(self.json_key.split(".")[:depth]) or "the document"
                raise MeterError(f"{self.source}: no {name!r} in {found} (key {self.json_key!r})")
            value = value[name]
        return as_kw(value, f"{self.source} {self.json_key}")


class PrometheusMeter(_HttpMeter):
    """An instant query (`/api/v1/query`) that selects exactly one series, in kW."""

    def __init__(self, url: str, base_url: str, query: str, *, timeout_s: float) -> None:
        super().__init__(url, timeout_s)
        self.url, self.query = f"{base_url}/api/v1/query", query

    @classmethod
    def from_url(cls, parts: SplitResult, *, timeout_s: float) -> PrometheusMeter:
        queries = parse_qs(parts.query).get("query", [])
        if len(queries) != 1 or not queries[0].strip():
            raise ValueError("a prometheus:// meter URL needs one query=... (a PromQL expression)")
        if not parts.hostname or parts.port is None:
            raise ValueError("a prometheus:// meter URL needs host:port")
        scheme = "https" if parts.scheme.endswith("+https") else "http"
        base_url = f"{scheme}://{parts.netloc}{parts.path.rstrip('/')}"
        return cls(parts.geturl(), base_url, queries[0], timeout_s=timeout_s)

    async def read_kw(self) -> float:
        doc, status = await self._get_json(self.url, params={"query": self.query})
        if not isinstance(doc, dict) or doc.get("status") != "success":
            detail = doc.get("error", "no error given") if isinstance(doc, dict) else doc
            kind = doc.get("errorType", f"HTTP {status}") if isinstance(doc, dict) else status
            raise MeterError(f"prometheus query {self.query!r} failed ({kind}): {detail}")
        data = doc.get("data") or {}
        kind, result = data.get("resultType"), data.get("result")
        if kind == "scalar" and isinstance(result, list) and len(result) == 2:
            return as_kw(result[1], f"prometheus query {self.query!r}")
        if kind != "vector" or not isinstance(result, list):
            raise MeterError(
                f"prometheus query {self.query!r} gave a {kind}, not an instant vector"
            )
        if not result:
            raise MeterError(f"prometheus query {self.query!r} matched no series")
        if len(result) > 1:
            raise MeterError(
                f"prometheus query {self.query!r} matched {len(result)} series; it must select "
                "one (sum them in the query if the site is metered in parts)"
            )
        sample = result[0].get("value") if isinstance(result[0], dict) else None
        if not isinstance(sample, list) or len(sample) != 2:
            raise MeterError(f"prometheus query {self.query!r}: a series without a value")
        return as_kw(sample[1], f"prometheus query {self.query!r}")


class ModbusMeter:
    """Modbus TCP registers read as one number, times `scale` [kW per raw unit].

    32-bit types span two registers; `word_order=big` (the default, as most meters send it)
    means the first register holds the high word, `little` the low word. Bytes within a
    register are always big-endian, as Modbus defines."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        unit: int = 1,
        register: int,
        type_: str = "float32",
        scale: float = 1.0,
        table: Literal["holding", "input"] = "holding",
        word_order: Literal["big", "little"] = "big",
        timeout_s: float,
    ) -> None:
        if type_ not in MODBUS_TYPES:
            raise ValueError(f"modbus type {type_!r} is not one of {', '.join(MODBUS_TYPES)}")
        if not 0 <= register <= 65535 or not 0 <= unit <= 255:
            raise ValueError(f"modbus register {register} or unit {unit} is out of range")
        if not math.isfinite(scale) or scale == 0:
            raise ValueError(f"modbus scale {scale} must be a finite, non-zero number")
        self.source = (
            f"modbus://{host}:{port}?unit={unit}&register={register}&type={type_}"
            f"&scale={scale:g}&table={table}&word_order={word_order}"
        )
        self.unit, self.register, self.type, self.scale = unit, register, type_, scale
        self.table, self.word_order, self.timeout_s = table, word_order, timeout_s
        self.host, self.port = host, port
        self._client: AsyncModbusTcpClient | None = None  #: made on the first read (needs a loop)

    @classmethod
    def from_url(cls, parts: SplitResult, *, timeout_s: float) -> ModbusMeter:
        query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        unknown = set(query) - {"unit", "register", "type", "scale", "table", "word_order"}
        if unknown:
            raise ValueError(f"modbus meter URL: unknown parameter(s) {', '.join(sorted(unknown))}")
        if not parts.hostname or "register" not in query:
            raise ValueError("a modbus:// meter URL needs host[:port] and register=...")
        table, word_order = query.get("table", "holding"), query.get("word_order", "big")
        if table not in ("holding", "input"):
            raise ValueError(f"modbus table={table!r}: holding or input")
        if word_order not in ("big", "little"):
            raise ValueError(f"modbus word_order={word_order!r}: big or little")
        try:
            unit, register = int(query.get("unit", "1")), int(query["register"])
            scale = float(query.get("scale", "1"))
            port = parts.port or 502
        except ValueError as exc:
            raise ValueError(f"modbus meter URL: {exc}") from exc
        return cls(
            parts.hostname,
            port,
            unit=unit,
            register=register,
            type_=query.get("type", "float32"),
            scale=scale,
            table=table,  # type: ignore[arg-type]
            word_order=word_order,  # type: ignore[arg-type]
            timeout_s=timeout_s,
        )

    async def read_kw(self) -> float:
        if self._client is None:
            # reconnect_delay=0: no background reconnection; read_kw reconnects when it must
            self._client = AsyncModbusTcpClient(
                self.host, port=self.port, timeout=self.timeout_s, retries=0, reconnect_delay=0
            )
        client, count = self._client, MODBUS_TYPES[self.type]
        holding = self.table == "holding"
        read = client.read_holding_registers if holding else client.read_input_registers
        try:
            if not client.connected and not await client.connect():
                raise MeterError(f"{self.source}: no connection")
            answer = await asyncio.wait_for(
                read(self.register, count=count, device_id=self.unit), self.timeout_s
            )
        except TimeoutError as exc:
            client.close()
            raise MeterError(f"{self.source} did not answer within {self.timeout_s} s") from exc
        except ModbusException as exc:
            client.close()
            raise MeterError(f"{self.source}: {exc}") from exc
        if answer.isError():
            raise MeterError(
                f"{self.source}: modbus exception code {answer.exception_code} "
                f"({_EXCEPTIONS.get(answer.exception_code, 'unknown')})"
            )
        data_type = getattr(client.DATATYPE, self.type.upper())
        raw = client.convert_from_registers(answer.registers, data_type, word_order=self.word_order)
        return float(raw) * self.scale  # type: ignore[arg-type]

    async def aclose(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None


_EXCEPTIONS = {
    1: "illegal function",
    2: "illegal data address",
    3: "illegal data value",
    4: "device failure",
    6: "device busy",
    10: "gateway path unavailable",
    11: "gateway target did not respond",
}
