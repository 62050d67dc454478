"""The 3.1 VEN's MQTT notifications: one broker connection, its topics, each message handed on.

A VTN that offers the MQTT notifier binding (`GET /notifiers`, the specification's notifier
document `doc/OpenADR3 Object Operation Notifications via Additional Protocols.md`) names its
broker's URIs and how it authenticates; the topic names come from its
`/notifiers/mqtt/topics/...` endpoints (`ven31` asks for them). This module only connects,
subscribes and hands every message, as it came, to the asyncio loop, in order:

- `broker_problem`: why a broker URI may not be used. TLS (`mqtts://`) always; plain `mqtt://`
  only to a loopback address and only when allowed (the lab, FLEXGATE_VTN_ALLOW_HTTP): the
  same rule as the VTN's HTTP.
- `MqttNotifications`: paho's network loop runs in its own thread (`loop_start`); it
  reconnects by itself with backoff (1 s doubling to 30 s) and subscribes every topic again
  at each connection. The credentials are asked for at each (re)connection (an OAuth2 token
  as the password is then a fresh one). Messages go to the loop with `call_soon_threadsafe`
  into a queue that one task reads, so they are handled one at a time, in arrival order.
  Once the topics are subscribed again after a reconnection, `resubscribed` is called on the
  loop: what was published meanwhile was missed, and the VEN polls at once (the notifier
  document's 16.2: the current state from the REST API, not from the broker).
- A retained message is dropped, and said once per topic: the broker replays it at each
  subscription however old it is (a VTN may retain, the notifier document's 16.1), so it can
  tell of an event since deleted; the state comes from the REST API (16.2), which the VEN
  polls.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import ssl
import threading
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any
from urllib.parse import urlsplit

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion

from gateway.settings import is_loopback

log = logging.getLogger("flexgate.ven31.mqtt")

RECONNECT_MIN_S, RECONNECT_MAX_S = 1, 30
KEEPALIVE_S = 30
#: How long the network thread waits for the loop to give it credentials [s].
CREDENTIALS_WAIT_S = 30.0
#: Messages held for the loop while it is busy; more are dropped (the next poll reads them).
QUEUE_MAX = 1000

Credentials = tuple[str, str] | None
#: A message as it came: its topic and its bytes.
Handler = Callable[[str, bytes], Awaitable[None]]


def broker_problem(uri: str, *, allow_plain: bool) -> str | None:
    """Why a broker URI may not be used, or None."""
    parts = urlsplit(uri)
    try:
        parts.port  # noqa: B018  (a bad port raises)
    except ValueError:
        return f"{uri!r} has no valid port"
    if parts.scheme == "mqtts" and parts.hostname:
        return None
    if parts.scheme != "mqtt" or not parts.hostname:
        return f"{uri!r} is not an mqtts:// (or, on loopback, mqtt://) broker URI"
    if not is_loopback(parts.hostname):
        return (
            f"{uri} is plain MQTT to another machine: notifications carry events (and the "
            "password), so the broker must be mqtts://"
        )
    if not allow_plain:
        return (
            f"{uri} is plain MQTT: use mqtts://, or for a broker on this machine set "
            "FLEXGATE_VTN_ALLOW_HTTP=true"
        )
    return None


class MqttNotifications:
    """One connection to the VTN's broker: `follow` topics, `start`, `stop`."""

    def __init__(
        self,
        uri: str,
        *,
        credentials: Callable[[], Coroutine[Any, Any, Credentials]],
        handler: Handler,
        resubscribed: Callable[[], None] = lambda: None,
    ) -> None:
        parts = urlsplit(uri)
        assert parts.hostname is not None, "checked by broker_problem"
        self.uri = uri
        self.host = parts.hostname
        self.tls = parts.scheme == "mqtts"
        self.port = parts.port or (8883 if self.tls else 1883)
        self._credentials, self._handler = credentials, handler
        self._resubscribed = resubscribed
        self.connections = 0  #: connections the broker accepted
        self.topics: set[str] = set()  #: every topic followed (subscribed at each connection)
        self.subscribed: set[str] = set()  #: those the broker has granted on this connection
        self.connected = False
        self._stopping = False
        self._pending: dict[int, list[str]] = {}  #: subscribe mid -> its topics
        self.retained_dropped = 0  #: retained messages not handed on
        self._retained_said: set[str] = set()  #: topics whose retained message was logged
        #: Held from a SUBSCRIBE's sending until its mid is noted: its SUBACK may come first.
        self._sending = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._queue: asyncio.Queue[tuple[str, bytes]] = asyncio.Queue(QUEUE_MAX)
        self._task: asyncio.Task[None] | None = None
        self._client = paho.Client(
            CallbackAPIVersion.VERSION2,
            client_id=f"flexgate-{secrets.token_hex(6)}",
            protocol=paho.MQTTv311,
        )
        self._client.reconnect_delay_set(RECONNECT_MIN_S, RECONNECT_MAX_S)
        if self.tls:
            self._client.tls_set_context(ssl.create_default_context())
        self._client.on_pre_connect = self._on_pre_connect
        self._client.on_connect = self._on_connect
        self._client.on_disconnect = self._on_disconnect
        self._client.on_subscribe = self._on_subscribe
        self._client.on_message = self._on_message

    # --- the loop's side -------------------------------------------------------------------

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._task = asyncio.create_task(self._deliver())
        self._client.connect_async(self.host, self.port, keepalive=KEEPALIVE_S)
        self._client.loop_start()
        log.info("MQTT: connecting to the VTN's broker %s", self.uri)

    async def stop(self) -> None:
        self._stopping = True
        if self._task is not None:
            self._task.cancel()
        self._client.disconnect()
        await asyncio.to_thread(self._client.loop_stop)

    def follow(self, topics: list[str]) -> None:
        """Subscribe to these topics too (now if connected, else at the connection)."""
        new = [t for t in topics if t not in self.topics]
        self.topics |= set(new)
        if new and self.connected:
            self._subscribe(new)

    async def _deliver(self) -> None:
        while True:
            topic, payload = await self._queue.get()
            try:
                await self._handler(topic, payload)
            except Exception:  # a bug must not end the delivery: say so, and go on
                log.exception("MQTT: a message on %s could not be handled", topic)

    # --- paho's network thread -------------------------------------------------------------

    def _on_pre_connect(self, client: paho.Client, _userdata: Any) -> None:
        """Before each (re)connection: the credentials as they are now."""
        assert self._loop is not None
        try:
            given: Credentials = asyncio.run_coroutine_threadsafe(
                self._credentials(), self._loop
            ).result(CREDENTIALS_WAIT_S)
        except Exception as exc:  # the connection is tried anyway, and refused if it must be
            log.warning("MQTT: no credentials for the broker (%s)", exc)
            return
        if given is not None:
            client.username_pw_set(*given)

    def _on_connect(
        self, _client: paho.Client, _userdata: Any, _flags: Any, reason: Any, _props: Any
    ) -> None:
        if reason.is_failure:
            log.warning("MQTT: the broker %s refused the connection: %s", self.uri, reason)
            return
        self.connected = True
        self.connections += 1
        self.subscribed = set()
        log.info("MQTT: connected to %s", self.uri)
        if self.topics:
            self._subscribe(sorted(self.topics))

    def _on_disconnect(
        self, _client: paho.Client, _userdata: Any, _flags: Any, reason: Any, _props: Any
    ) -> None:
        self.connected = False
        self.subscribed = set()
        if self._stopping:
            return
        log.warning(
            "MQTT: disconnected from %s (%s): reconnecting with backoff; polling meanwhile",
            self.uri,
            reason,
        )

    def _subscribe(self, topics: list[str]) -> None:
        with self._sending:
            result, mid = self._client.subscribe([(t, 1) for t in topics])
            if result == paho.MQTT_ERR_SUCCESS and mid is not None:
                self._pending[mid] = topics
                return
        log.warning("MQTT: could not subscribe to %s: %s", topics, paho.error_string(result))

    def _on_subscribe(
        self, _client: paho.Client, _userdata: Any, mid: int, reasons: list[Any], _props: Any
    ) -> None:
        with self._sending:
            topics = self._pending.pop(mid, [])
        granted = False
        for topic, reason in zip(topics, reasons, strict=False):
            if reason.is_failure:
                log.warning("MQTT: the broker refused the subscription to %s: %s", topic, reason)
            else:
                self.subscribed.add(topic)
                granted = True
                log.info("MQTT: subscribed to %s", topic)
        if granted and self.connections > 1:
            self._to_loop(self._resubscribed)

    def _on_message(self, _client: paho.Client, _userdata: Any, message: paho.MQTTMessage) -> None:
        if message.retain:
            self._to_loop(self._drop_retained, message.topic)
            return
        self._to_loop(self._put, message.topic, bytes(message.payload))

    def _drop_retained(self, topic: str) -> None:
        self.retained_dropped += 1
        if topic not in self._retained_said:
            self._retained_said.add(topic)
            log.info(
                "MQTT: a retained message on %s ignored (it may be stale); the poll reads the "
                "current state",
                topic,
            )

    def _to_loop(self, call: Callable[..., None], *args: Any) -> None:
        """Run `call` on the loop; nothing once the loop has closed (the gateway stopping)."""
        if self._loop is None:
            return
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(call, *args)

    def _put(self, topic: str, payload: bytes) -> None:
        try:
            self._queue.put_nowait((topic, payload))
        except asyncio.QueueFull:
            log.warning(
                "MQTT: a message on %s dropped (too many waiting): the poll reads it", topic
            )
