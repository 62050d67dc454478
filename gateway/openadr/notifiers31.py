"""The 3.1 VEN's MQTT notifications, wired to the VTN: read its notifiers once, connect to the
broker it offers when that may be used (else say why: webhook and polling go on), follow each
program's event topics, and read every message as a notification (`MqttNotifications` in
`mqtt31` holds the connection itself)."""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable

from pydantic import ValidationError

from gateway.openadr.mqtt31 import Credentials, MqttNotifications, broker_problem
from gateway.openadr.oadr31 import MqttBinding, Notification, Notifiers, Topics, first_error
from gateway.openadr.oauth import TokenSource, VtnAuthError
from gateway.openadr.vtn31 import VtnClient, VtnError
from gateway.settings import GatewaySettings

log = logging.getLogger("flexgate.ven31")

#: A notification handed on; False when its event could not be stored.
Notified = Callable[[Notification], Awaitable[bool]]


class MqttFollower:
    def __init__(
        self,
        settings: GatewaySettings,
        vtn: VtnClient,
        tokens: TokenSource,
        notified: Notified,
        resubscribed: Callable[[], None],
    ) -> None:
        self.settings, self.vtn, self.tokens = settings, vtn, tokens
        self.notified, self.resubscribed = notified, resubscribed
        self.mqtt: MqttNotifications | None = None
        self.asked = False  #: GET /notifiers answered (MQTT used, or why not logged)
        self._followed: set[str] = set()  #: programs whose event topics are followed

    async def connect(self) -> None:
        """Read the VTN's notifiers (until it answers once); connect to its MQTT broker when it
        offers one that may be used, else say why."""
        try:
            notifiers = Notifiers.model_validate(await self.vtn.call("GET", "/notifiers"))
        except ValidationError as exc:
            self.asked = True
            log.warning("the VTN's notifiers are not 3.1 notifiers (%s): no MQTT", first_error(exc))
            return
        except VtnError as exc:
            if exc.status is not None and 400 <= exc.status < 500:
                self.asked = True
                log.info("the VTN offers no notifiers (%s; a 3.0 VTN?): no MQTT", exc)
            else:  # the poll goes on either way
                log.warning("the VTN's notifiers not read (%s): asked again after a poll", exc)
            return
        self.asked = True
        binding = notifiers.mqtt
        if binding is None:
            log.info("the VTN offers no MQTT notifier: webhook and polling only")
            return
        problems = []
        for uri in binding.uris:
            problem = broker_problem(
                uri, allow_plain=self.settings.lab or self.settings.vtn_allow_http
            )
            if problem is None:
                break
            problems.append(problem)
        else:
            log.warning("MQTT not used: %s; webhook and polling only", "; ".join(problems))
            return
        refused = _unsupported(binding, bool(self.settings.vtn_mqtt_username))
        if refused:
            log.warning("MQTT not used: %s; webhook and polling only", refused)
            return
        self.mqtt = MqttNotifications(
            uri,
            credentials=lambda: self._credentials(binding),
            handler=self._message,
            resubscribed=self.resubscribed,
        )
        self.mqtt.start()

    async def _credentials(self, binding: MqttBinding) -> Credentials:
        """FLEXGATE_VTN_MQTT_USERNAME/_PASSWORD when set; else as the binding says."""
        if self.settings.vtn_mqtt_username:
            return (
                self.settings.vtn_mqtt_username,
                self.settings.vtn_mqtt_password.get_secret_value(),
            )
        auth = binding.authentication
        if auth.method == "OAUTH2_BEARER_TOKEN":
            username = auth.username or ""
            if username == "{clientID}":
                username = self.settings.vtn_client_id
            return username, await self.tokens.token()
        return None  # ANONYMOUS

    async def follow(self, program_ids: set[str]) -> None:
        """Follow the event topics of each program not followed yet; one the VTN cannot name
        now is asked for again after the next poll."""
        if self.mqtt is None:
            return
        for program_id in sorted(program_ids - self._followed):
            path = f"/notifiers/mqtt/topics/programs/{program_id}/events"
            try:
                topics = Topics.model_validate(await self.vtn.call("GET", path))
            except ValidationError as exc:
                log.warning("GET %s: not 3.1 topics (%s)", path, first_error(exc))
                continue
            except (VtnError, VtnAuthError) as exc:
                log.warning("MQTT: program %s's event topics not known yet: %s", program_id, exc)
                continue
            names = topics.topics
            chosen = [names["ALL"]] if "ALL" in names else list(names.values())
            self.mqtt.follow(chosen)
            self._followed.add(program_id)

    async def _message(self, topic: str, payload: bytes) -> None:
        """A message from the broker: a notification, read as the webhook reads one."""
        try:
            note = Notification.model_validate(json.loads(payload))
        except ValueError as exc:  # ValidationError and bad JSON (and bad UTF-8)
            why = first_error(exc) if isinstance(exc, ValidationError) else "not JSON"
            log.warning(
                "MQTT message on %s refused: not an OpenADR 3.1 notification: %s", topic, why
            )
            return
        if not await self.notified(note):
            log.warning(
                "MQTT message on %s: its event could not be stored; the poll reads it", topic
            )

    async def stop(self) -> None:
        if self.mqtt is not None:
            await self.mqtt.stop()


def _unsupported(binding: MqttBinding, configured: bool) -> str | None:
    """Why the binding's authentication cannot be used, or None."""
    if binding.authentication.method == "CERTIFICATE" and not configured:
        return (
            "the broker asks for a client certificate (CERTIFICATE), which flexgate does not "
            "use; set FLEXGATE_VTN_MQTT_USERNAME/_PASSWORD if it takes those too"
        )
    return None
