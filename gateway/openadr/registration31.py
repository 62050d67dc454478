"""The 3.1 VEN's own objects on the VTN: its ven object and resources, and its subscription.

The VEN finds its ven object by name (`venName` = FLEXGATE_VEN_NAME) or creates it, then its
resources (FLEXGATE_VEN_RESOURCES). With FLEXGATE_VEN_CALLBACK_URL set it subscribes to event
and program notifications, carrying the webhook's bearer token (`webhook31`). A subscription
the VTN refuses is asked for again with backoff (`SUBSCRIBE_BACKOFF`), not at every poll;
before each, the VEN deletes its own left on the VTN (`GET /subscriptions`, matched on
clientName and callback URL): a VTN may store one and still answer an error, and one left by
a previous run carries a bearer token nobody holds any more.
"""

from __future__ import annotations

import logging
from typing import Any

from pydantic import ValidationError

from gateway.clock import Clock
from gateway.openadr.oadr31 import Resource, Subscription, Ven, first_error
from gateway.openadr.oauth import VtnAuthError
from gateway.openadr.vtn31 import VtnClient, VtnError, valid
from gateway.retries import SUBSCRIBE_BACKOFF
from gateway.settings import GatewaySettings

log = logging.getLogger("flexgate.ven31")


class Registration31:
    def __init__(
        self, settings: GatewaySettings, clock: Clock, vtn: VtnClient, bearer_token: str
    ) -> None:
        """`bearer_token`: what the VTN must present on the callback (the webhook's)."""
        self.settings, self.clock, self.vtn = settings, clock, vtn
        self.bearer_token = bearer_token
        self.ven: Ven | None = None
        self.resources: list[Resource] = []
        self.subscription_id: str | None = None
        self._subscribe_error: str | None = None
        self._subscribe_failures = 0
        self._subscribe_at = 0.0  #: no subscription attempt before this [s, monotonic]

    @property
    def name(self) -> str:
        return self.settings.ven_name

    async def register(self) -> None:
        """Find this VEN's ven object by name, or create it; then its resources."""
        found = await self.vtn.list("/vens", {"venName": self.name})
        mine = [v for v in found if isinstance(v, dict) and v.get("venName") == self.name]
        raw = (
            mine[0]
            if mine
            else await self.vtn.call(
                "POST",
                "/vens",
                json=Ven.model_validate(
                    {"objectType": "VEN_VEN_REQUEST", "venName": self.name}
                ).wire(),
            )
        )
        ven = _own_ven(raw)
        assert ven.id is not None
        have = [
            valid(Resource, r, "resource")
            for r in await self.vtn.list("/resources", {"venID": ven.id})
        ]
        for name in names(self.settings.ven_resources):
            if not any(r.resource_name == name for r in have):
                request = Resource.model_validate(
                    {"objectType": "VEN_RESOURCE_REQUEST", "resourceName": name, "venID": ven.id}
                )
                have.append(
                    valid(
                        Resource,
                        await self.vtn.call("POST", "/resources", json=request.wire()),
                        "resource",
                    )
                )
        self.ven, self.resources = ven, have
        log.info("registered with the VTN as ven %s (%s)", ven.id, self.name)

    async def try_subscribe(self) -> None:
        """Subscribe; a VTN that refuses is polled meanwhile, and asked again after a wait
        that grows (`SUBSCRIBE_BACKOFF`; the reason logged when it changes)."""
        if self.clock.monotonic() < self._subscribe_at:
            return
        try:
            await self._subscribe()
            self._subscribe_error, self._subscribe_failures = None, 0
        except (VtnError, VtnAuthError) as exc:
            self._subscribe_failures += 1
            wait_s = SUBSCRIBE_BACKOFF.wait_s(self._subscribe_failures)
            self._subscribe_at = self.clock.monotonic() + wait_s
            if str(exc) != self._subscribe_error:
                log.warning(
                    "no webhook subscription (%s): polling every %g s meanwhile; asking "
                    "again in %g s, then less often",
                    exc,
                    self.settings.vtn_poll_s,
                    wait_s,
                )
            self._subscribe_error = str(exc)

    async def unsubscribe(self) -> None:
        """The subscription deleted on the VTN, if there is one (going away either way)."""
        if self.subscription_id is None:
            return
        try:
            await self.vtn.call("DELETE", f"/subscriptions/{self.subscription_id}")
        except Exception as exc:
            log.info("subscription %s not deleted: %s", self.subscription_id, exc)

    async def _delete_own_subscriptions(self) -> None:
        """Delete this VEN's subscriptions to its callback URL that the VTN holds (left by a
        refused attempt or a previous run). A VTN that does not list them is not asked."""
        try:
            listed = await self.vtn.list("/subscriptions", {"clientName": self.name})
        except VtnError as exc:
            log.info("the VTN's subscriptions not listed (%s): none deleted", exc)
            return
        for raw in listed:
            if not isinstance(raw, dict) or raw.get("clientName") != self.name:
                continue
            urls = {
                op.get("callbackUrl")
                for op in raw.get("objectOperations") or []
                if isinstance(op, dict)
            }
            if self.settings.ven_callback_url in urls and raw.get("id"):
                await self.vtn.call("DELETE", f"/subscriptions/{raw['id']}")
                log.info("deleted subscription %s, left on the VTN before this one", raw["id"])

    async def _subscribe(self) -> None:
        await self._delete_own_subscriptions()
        body = {
            "clientName": self.name,
            "objectOperations": [
                {
                    "objects": ["EVENT", "PROGRAM"],
                    "operations": ["CREATE", "UPDATE", "DELETE"],
                    "callbackUrl": self.settings.ven_callback_url,
                    "bearerToken": self.bearer_token,
                }
            ],
        }
        created = await self.vtn.call(
            "POST", "/subscriptions", json=Subscription.model_validate(body).wire()
        )
        self.subscription_id = str(created["id"]) if isinstance(created, dict) else None
        log.info("subscribed to event notifications at %s", self.settings.ven_callback_url)


def names(text: str) -> list[str]:
    """The names of a comma-separated setting."""
    return [n.strip() for n in text.split(",") if n.strip()]


def _own_ven(raw: Any) -> Ven:
    """The VEN's own ven object. Malformed targets (the reference VTN turns them into a list
    of lists each time its VEN is read) are left out, said in the log: the VEN then answers
    events for its name, groups and resources only, and never loops on registration."""
    try:
        return Ven.model_validate(raw)
    except ValidationError as exc:
        if not isinstance(raw, dict) or any(e["loc"][:1] != ("targets",) for e in exc.errors()):
            raise VtnError(f"the VTN's ven is not an OpenADR 3.1 ven: {first_error(exc)}") from None
        log.warning(
            "the VTN's ven object has malformed targets (%s): read without them",
            first_error(exc),
        )
        ven: Ven = valid(Ven, {k: v for k, v in raw.items() if k != "targets"}, "ven")
        return ven
