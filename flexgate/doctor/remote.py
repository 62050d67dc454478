"""The gateway's reads of the outside world for the doctor: one meter reading, the VTN with
the VEN's credentials. Nothing is sent that changes anything: a meter is read, the VTN is asked
for a token and its programs (OpenADR 3.1) or only whether it answers (2.0b)."""

from __future__ import annotations

import math
import time
from datetime import UTC, datetime
from typing import Any

import httpx

from flexgate.doctor import Check, fail, ok, warn
from gateway.clock import SystemClock
from gateway.errors import MeterError
from gateway.meter.sources import open_meter
from gateway.openadr.oauth import TokenSource, VtnAuthError
from gateway.openadr.vtn31 import VtnClient, VtnError
from gateway.settings import GatewaySettings


async def meter_check(settings: GatewaySettings) -> Check:
    """One reading of the site's meter: its value, when, how long the read took, and whether
    the meter feed would believe it (finite, not negative, under FLEXGATE_METER_MAX_KW)."""
    name = "meter"
    meter = open_meter(
        settings.meter_url, json_key=settings.meter_json_key, timeout_s=settings.meter_timeout_s
    )
    if meter is None:
        return warn(name, "no FLEXGATE_METER_URL: the site's power is the agents' estimate")
    started = time.monotonic()
    try:
        power_kw = await meter.read_kw()
    except MeterError as exc:
        return fail(name, f"no reading: {exc}", source=meter.source)
    finally:
        await meter.aclose()
    figures: dict[str, Any] = {
        "source": meter.source,
        "power_kw": power_kw,
        "read_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "read_s": time.monotonic() - started,
    }
    said = f"{meter.source} reads {power_kw:g} kW (in {figures['read_s']:.2f} s)"
    problem = implausible(power_kw, settings.meter_max_kw)
    if problem is not None:
        return fail(name, f"{said}: {problem}", plausible=False, **figures)
    return ok(name, said, plausible=True, **figures)


def implausible(power_kw: float, max_kw: float | None) -> str | None:
    """Why the meter feed would refuse this reading, or None (its rules for one reading)."""
    if not math.isfinite(power_kw):
        return "not a finite number"
    if power_kw < 0:
        return "below zero"
    if max_kw is not None and power_kw > max_kw:
        return f"above the site's maximum (FLEXGATE_METER_MAX_KW={max_kw:g})"
    if power_kw == 0:
        return "zero: a site with running GPUs draws power (a dead or unwired meter?)"
    return None


async def vtn_check(settings: GatewaySettings) -> Check:
    name = "vtn"
    if not settings.vtn_url:
        return ok(name, "no FLEXGATE_VTN_URL: events come through the API only")
    if settings.openadr == "3.1":
        return await _vtn31(settings)
    return await _vtn20b(settings)


async def _vtn31(settings: GatewaySettings) -> Check:
    """A token with the VEN's client credentials, then the VTN's programs with it."""
    name, url = "vtn", settings.vtn_url.rstrip("/")
    async with httpx.AsyncClient(timeout=settings.dispatch_timeout_s) as http:
        tokens = TokenSource(
            http,
            SystemClock(),
            vtn_url=url,
            client_id=settings.vtn_client_id,
            client_secret=settings.vtn_client_secret,
            token_url=settings.vtn_token_url,
            allow_http=settings.lab or settings.vtn_allow_http,
            client_auth=settings.vtn_client_auth,
        )
        try:
            await tokens.token()
        except VtnAuthError as exc:
            return fail(
                name,
                f"OpenADR 3.1 VTN {url}: no token for client {settings.vtn_client_id!r}: {exc} "
                "(FLEXGATE_VTN_CLIENT_ID / _SECRET)",
            )
        try:
            programs = await VtnClient(http, tokens, url).call("GET", "/programs")
        except VtnError as exc:
            return fail(name, f"OpenADR 3.1 VTN {url}: the token works but {exc}")
    count = len(programs) if isinstance(programs, list) else 0
    return ok(
        name,
        f"OpenADR 3.1 VTN {url}: token for {settings.vtn_client_id!r}; {count} programs",
        programs=count,
    )


async def _vtn20b(settings: GatewaySettings) -> Check:
    """Whether the 2.0b VTN answers HTTP at all (its certificates and registration are judged
    by the VEN when it registers: a registration is not read-only)."""
    name, url = "vtn", settings.vtn_url
    cert = None
    if settings.ven_cert is not None and settings.ven_key is not None:
        cert = (str(settings.ven_cert), str(settings.ven_key))
    try:
        async with httpx.AsyncClient(timeout=settings.dispatch_timeout_s, cert=cert) as http:
            answer = await http.get(url)
    except httpx.HTTPError as exc:
        return fail(name, f"OpenADR 2.0b VTN {url} does not answer: {type(exc).__name__} {exc}")
    return ok(
        name,
        f"OpenADR 2.0b VTN {url} answers (HTTP {answer.status_code}); its credentials are "
        "judged when the VEN registers",
    )
