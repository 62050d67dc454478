"""The settings' checks that others use too: URLs, time zones, settlement intervals, dates,
fallback limits (re-exported by gateway.settings)."""

from __future__ import annotations

import ipaddress
from datetime import date, datetime
from urllib.parse import urlsplit
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from flexmodel.localdays import INTERVAL_MINUTES


def insecure_url(url: str, *, allow_http: bool) -> str | None:
    """Why an OpenADR 3 URL may not be used, or None: HTTPS always, plain HTTP only to a
    loopback address and only when allowed (the lab, FLEXGATE_VTN_ALLOW_HTTP)."""
    if not url:
        return None
    parts = urlsplit(url)
    if parts.scheme == "https" and parts.hostname:
        return None
    if parts.scheme != "http" or not parts.hostname:
        return f"{url!r} is not an https:// URL"
    if not is_loopback(parts.hostname):
        return (
            f"{url} is plain HTTP to another machine: OpenADR 3 carries bearer tokens and "
            "events, so it must be https://"
        )
    if not allow_http:
        return (
            f"{url} is plain HTTP: use https://, or for a VTN on this machine set "
            "FLEXGATE_VTN_ALLOW_HTTP=true"
        )
    return None


def is_loopback(host: str) -> bool:
    """`localhost` or a loopback address."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def interval_problem(interval_min: int) -> str | None:
    """Why a settlement interval length [min] cannot be used, or None."""
    if interval_min not in INTERVAL_MINUTES:
        return f"{interval_min} is not one of {', '.join(map(str, INTERVAL_MINUTES))} minutes"
    return None


def zone_problem(name: str, interval_min: int) -> str | None:
    """Why a time zone cannot carry a site's clock intervals of `interval_min`, or None:
    unknown, or an offset from UTC off the intervals' grid (India's +5:30 on hours), since
    the meter history's intervals are aligned on UTC."""
    try:
        zone = ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        return f"{name!r} is not a time zone of the IANA database (Europe/London, America/New_York)"
    for month in (1, 7):
        offset = zone.utcoffset(datetime(2026, month, 1))
        if offset is not None and offset.total_seconds() % (60 * interval_min):
            return (
                f"{name}'s offset from UTC ({offset}) is not a whole number of "
                f"{interval_min}-minute intervals: choose a shorter settlement interval"
            )
    return None


def parse_dates(text: str) -> frozenset[date]:
    """`2026-11-26,2026-12-25` -> the dates; ValueError naming the one that is not a date."""
    out = set()
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        try:
            out.add(date.fromisoformat(item))
        except ValueError:
            raise ValueError(f"{item!r} is not an ISO date (2026-11-26)") from None
    return frozenset(out)


def parse_fallback_limits(text: str) -> dict[str, float]:
    """`name=kW,name=kW` -> {program name: limit [kW]}; ValueError naming what is wrong."""
    limits: dict[str, float] = {}
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        name, sep, value = item.rpartition("=")
        try:
            limit_kw = float(value)
        except ValueError:
            limit_kw = -1.0
        if not sep or not name.strip() or not limit_kw >= 0:
            raise ValueError(f"{item!r} is not programName=kW (a limit of 0 kW or more)")
        limits[name.strip()] = limit_kw
    return limits
