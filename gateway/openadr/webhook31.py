"""The 3.1 VEN's webhook: the callback the VTN posts its notifications to
(FLEXGATE_VEN_CALLBACK_URL, served by the gateway at `CALLBACK_PATH`).

It answers the VTN's echo challenge (`GET <callbackUrl>?echo=` as the Definition has it,
`GET <callbackUrl>/echo?echo=` as the Alliance's reference VTN asks), and asks every
notification for the subscription's bearer token. A notification is answered as soon as it is
read and acted on after, in the order they came (`work`): a VTN that posts notifications
synchronously and serves one request at a time would otherwise wait for the VEN's own requests
(a refusal report) to time out. A malformed notification is refused with the reason (logged
once per reason), and the VEN polls at once.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import secrets
from collections.abc import Awaitable, Callable

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse
from pydantic import ValidationError

from gateway.openadr.oadr31 import Notification, first_error

log = logging.getLogger("flexgate.ven31")

#: The path the gateway serves the VTN's notifications on.
CALLBACK_PATH = "/openadr3/notifications"
#: Notifications read and waiting to be acted on; more are answered 503 (the poll reads them).
INBOX_MAX = 1000


class Webhook31:
    def __init__(
        self, notified: Callable[[Notification], Awaitable[bool]], poll_now: asyncio.Event
    ) -> None:
        """`notified` acts on a notification (False: its event could not be stored);
        `poll_now` is set when the VEN should poll at once."""
        #: The bearer token the VTN must present on the callback (the subscription's).
        self.token = secrets.token_urlsafe(32)
        self._notified, self._poll_now = notified, poll_now
        self._inbox: asyncio.Queue[Notification] = asyncio.Queue(INBOX_MAX)
        self._malformed_said: set[str] = set()  #: reasons for refused notifications logged

    def router(self) -> APIRouter:
        router = APIRouter()

        @router.get(CALLBACK_PATH, include_in_schema=False)
        @router.get(f"{CALLBACK_PATH}/echo", include_in_schema=False)
        async def echo(echo: str = "") -> PlainTextResponse:
            # Only the value comes back, so no token is asked.
            if not echo:
                return PlainTextResponse("no echo challenge given", status_code=400)
            return PlainTextResponse(echo)

        @router.post(CALLBACK_PATH, include_in_schema=False)
        async def notification(request: Request) -> JSONResponse:
            given = request.headers.get("authorization", "")
            if not hmac.compare_digest(given.encode(), f"Bearer {self.token}".encode()):
                return JSONResponse(
                    {"detail": "a notification needs the subscription's bearer token"},
                    status_code=401,
                    headers={"WWW-Authenticate": "Bearer"},
                )
            try:
                note = Notification.model_validate(await request.json())
            except ValueError as exc:  # ValidationError and bad JSON
                return self._malformed(f"not an OpenADR 3.1 notification: {_why_malformed(exc)}")
            try:
                self._inbox.put_nowait(note)
            except asyncio.QueueFull:
                return JSONResponse(
                    {"detail": "too many notifications waiting: the next poll reads it"},
                    status_code=503,
                    headers={"Retry-After": "5"},
                )
            return JSONResponse({"detail": "received"})

        return router

    def _malformed(self, why: str) -> JSONResponse:
        """Refused, and said once per reason: the VTN may send every notification so. A
        notification says something changed: polling reads it now."""
        if why not in self._malformed_said:
            self._malformed_said.add(why)
            log.warning("a notification refused (%s); polling reads what it was about", why)
        self._poll_now.set()
        return JSONResponse({"detail": why}, status_code=400)

    async def work(self) -> None:
        """Act on the notifications answered, in the order they came (until cancelled)."""
        while True:
            note = await self._inbox.get()
            try:
                if not await self._notified(note):
                    log.warning("a notified event could not be stored; the next poll reads it")
            except Exception:  # a bug must not end the inbox: say so, and go on
                log.exception("a notification could not be acted on")


def _why_malformed(exc: ValueError) -> str:
    """The reason, naming the reference VTN's double encoding (a JSON string of the JSON)."""
    if isinstance(exc, ValidationError):
        errors = exc.errors()
        if errors and not errors[0].get("loc") and isinstance(errors[0].get("input"), str):
            return "the body is a JSON string, not an object (JSON encoded twice?)"
        return first_error(exc)
    return "the body is not JSON"
