"""`/`: the operator's dashboard, a static page and its assets, served from
`gateway/dashboard/`. The page holds no data: it reads the JSON API like any client, with the
token the operator types (kept in the browser's session storage only), so it needs no token to
load and shows nothing without one when `FLEXGATE_READ_TOKEN` is set."""

from __future__ import annotations

from functools import cache
from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import Response

from gateway.errors import NotFoundError

ASSETS = Path(__file__).resolve().parents[2] / "dashboard"
#: Every file the page needs, by the name it is asked for, with its media type.
MEDIA_TYPES = {
    "index.html": "text/html; charset=utf-8",
    "dashboard.js": "text/javascript; charset=utf-8",
    "settlement.js": "text/javascript; charset=utf-8",
    "fast.js": "text/javascript; charset=utf-8",
    "dashboard.css": "text/css; charset=utf-8",
}
HEADERS = {
    # A browser asks again each load (a few kB), so an upgraded gateway serves its new page.
    "Cache-Control": "no-cache",
    "X-Content-Type-Options": "nosniff",
    # Only the gateway's own files and API: the browser itself refuses anything else.
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'",
}

router = APIRouter(include_in_schema=False)


@cache
def _read(name: str) -> bytes:
    return (ASSETS / name).read_bytes()


def _asset(name: str) -> Response:
    if name not in MEDIA_TYPES:
        raise NotFoundError(f"no dashboard asset '{name}'")
    return Response(_read(name), media_type=MEDIA_TYPES[name], headers=HEADERS)


@router.get("/")
async def page() -> Response:
    return _asset("index.html")


@router.get("/dashboard/{name}")
async def asset(name: str) -> Response:
    return _asset(name)
