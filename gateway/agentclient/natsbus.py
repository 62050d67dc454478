"""The agents over NATS (docs/nats.md): one connection to the broker, not one per node.

- A command is a request on the node's own subject `flexgate.caps.<node>` (per-node subjects:
  the broker routes each node its part, and 10,000 subscriptions cost it nothing), carrying the
  agent token as an `Authorization` header; the reply is a `NatsAnswer`. A fan-out is one batch
  (`put_caps_many`): every command published with a reply subject on one inbox, the answers
  gathered there. Retried on timeouts, a missing responder and 5xx answers, with exponential
  backoff; a 4xx answer is final.
- With every command the node's desired state goes into the JetStream key-value bucket
  `flexgate_desired` (key: the node id), published just before the request. The
  bucket's entries expire one lease after their last write, so a node that reconnects catches
  up on what it missed, and never on the state of a gateway that died more than a lease ago.
- Telemetry is not asked for: agents publish summaries on `flexgate.telemetry.<node>`, this
  client keeps the last of each node, and `telemetry` answers from it (None once a node has
  been silent for three of its periods), the agent's clock stamp carried forward by the
  summary's age, so the phases align as over HTTP. A summary that does not parse is dropped
  and counted.

An agent's address over NATS is its node id. A fan-out's bookkeeping is in `natsfanout`,
the summaries kept in `natstelemetry`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nats
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import Error as NatsError
from nats.js.errors import BadRequestError
from nats.js.kv import KeyValue
from pydantic import ValidationError

from agents.protocol import (
    DESIRED_BUCKET,
    TELEMETRY_SUBJECTS,
    CapCommand,
    Health,
    NatsAnswer,
    TelemetryResponse,
    TelemetrySummary,
    caps_subject,
    health_subject,
)
from gateway.agentclient import Ack, AgentUnreachableError
from gateway.agentclient.natsfanout import FanOut, body_of, describe
from gateway.agentclient.natstelemetry import KeptSummary
from gateway.clock import Clock, SystemClock
from gateway.retries import command_backoff

log = logging.getLogger("flexgate.gateway")
HEALTH_TIMEOUT_S = 2.0
HEALTH_AT_ONCE = 500
CONNECT_TIMEOUT_S = 5.0
#: Commands published between two yields to the event loop.
PUBLISH_CHUNK = 200
#: A node's summary counts until it is this many of its own periods old.
SILENT_PERIODS = 3.0


class NatsConnectError(Exception):
    """The NATS server refused the connection (wrong credentials) or did not answer."""


@dataclass(frozen=True)
class NatsOptions:
    url: str
    token: str | None = None
    user: str | None = None
    password: str | None = None
    tls_ca: Path | None = None  #: trust this CA; TLS is on with it or with a tls:// URL


class NatsAgentClient:
    def __init__(
        self,
        options: NatsOptions,
        token: str | Callable[[str], str],
        *,
        timeout_s: float,
        retries: int,
        lease_s: float,
        clock: Clock | None = None,
    ) -> None:
        self.options, self._token = options, token
        #: node -> its command headers, made once (a derived token costs an HMAC)
        self._headers_of: dict[str, dict[str, str]] = {}
        self._timeout_s, self._retries, self._lease_s = timeout_s, retries, lease_s
        self._clock = clock or SystemClock()
        self._nc: Client | None = None
        self._bucket: KeyValue | None = None
        #: node -> its last summary, with when it came
        self.latest: dict[str, KeptSummary] = {}
        self.rejected_summaries = 0
        self.unremembered = 0  #: desired states that could not be written to the bucket
        self._asking = asyncio.Semaphore(HEALTH_AT_ONCE)

    async def connect(self, *, read_only: bool = False) -> None:
        """Connect, make (or fit) the bucket and listen to telemetry; NatsConnectError names
        why it could not (wrong credentials, no server, no JetStream). `read_only` (the doctor):
        connect only, to ask the agents' health; no bucket is made or changed."""
        options = self.options
        common = self.connect_options()
        try:
            # A connection that reconnects for ever also retries its first connect for ever,
            # even with wrong credentials: one attempt first, which fails at once with the reason.
            await probe(options.url, common)
            self._nc = await nats.connect(
                options.url,
                allow_reconnect=True,
                max_reconnect_attempts=-1,
                reconnect_time_wait=0.5,
                pending_size=64 * 1024 * 1024,  # a 10,000-node fan-out is buffered, not refused
                error_cb=self._error,
                **common,
            )
            if not read_only:
                self._bucket = await self._desired_bucket()
                await self._nc.subscribe(TELEMETRY_SUBJECTS, cb=self._on_telemetry)
        except (NatsError, OSError, TimeoutError) as exc:
            if self._nc is not None:
                await self._nc.close()
            raise NatsConnectError(f"cannot use NATS at {options.url}: {exc}") from exc

    def connect_options(self) -> dict[str, Any]:
        """nats-py's options for these credentials (TLS with a CA file or a tls:// URL)."""
        options = self.options
        tls = None
        if options.tls_ca is not None or options.url.startswith("tls://"):
            cafile = str(options.tls_ca) if options.tls_ca else None
            tls = ssl.create_default_context(cafile=cafile)
        return {
            "name": "flexgate-gateway",
            "token": options.token or None,
            "user": options.user or None,
            "password": options.password or None,
            "tls": tls,
            "connect_timeout": CONNECT_TIMEOUT_S,
        }

    async def _desired_bucket(self) -> KeyValue:
        assert self._nc is not None
        js = self._nc.jetstream()
        try:
            return await js.create_key_value(bucket=DESIRED_BUCKET, ttl=self._lease_s)
        except BadRequestError:  # there, made for another lease length: fit it to this one
            info = await js.stream_info(f"KV_{DESIRED_BUCKET}")
            config = info.config
            config.max_age = self._lease_s
            config.duplicate_window = min(config.duplicate_window or 120.0, self._lease_s)
            await js.update_stream(config)
            return await js.key_value(DESIRED_BUCKET)

    async def _error(self, exc: Exception) -> None:
        log.warning("NATS: %s", exc)

    async def close(self) -> None:
        if self._nc is not None and not self._nc.is_closed:
            await self._nc.drain()

    def _client(self) -> Client:
        if self._nc is None:
            raise AgentUnreachableError("not connected to NATS (connect() was not called)")
        return self._nc

    async def _request(self, subject: str, body: bytes, timeout_s: float, **kw: Any) -> NatsAnswer:
        try:
            msg = await self._client().request(subject, body, timeout=timeout_s, **kw)
            return NatsAnswer.model_validate_json(msg.data)
        except (NatsError, TimeoutError, ValidationError) as exc:
            raise AgentUnreachableError(describe(exc)) from exc

    async def health(self, address: str) -> Health:
        async with self._asking:  # discovery asks every node at once: not all in one burst
            answer = await self._request(health_subject(address), b"", HEALTH_TIMEOUT_S)
        if answer.health is None:
            raise AgentUnreachableError(f"status {answer.status} from {address}: {answer.detail}")
        return answer.health

    async def telemetry(self, address: str) -> TelemetryResponse | None:
        found = self.kept_telemetry([address])[0]
        if found is None:
            return None
        at, report = found
        if report.agent_time_s is None:
            return report
        # The agent's clock now, by its stamp and the summary's age here: the offset the fleet
        # estimates from it (services/clocks.py) is wrong by the summary's way through the
        # broker, not by its age.
        age_s = self._clock.monotonic() - at
        return report.model_copy(update={"agent_time_s": report.agent_time_s + age_s})

    def kept_telemetry(
        self, addresses: Sequence[str]
    ) -> list[tuple[float, TelemetryResponse] | None]:
        """Each node's last summary as telemetry, with when it arrived (this client's
        monotonic clock: the moment its `agent_time_s` stamp pairs with); None for a node
        silent for three of its periods. One read of what is kept, nothing copied."""
        now = self._clock.monotonic()
        out: list[tuple[float, TelemetryResponse] | None] = []
        for address in addresses:
            kept = self.latest.get(address)
            if kept is None or now - kept.arrived > SILENT_PERIODS * kept.summary.period_s:
                out.append(None)
            else:
                out.append((kept.arrived, kept.telemetry()))
        return out

    async def _on_telemetry(self, msg: Msg) -> None:
        node = msg.subject.rsplit(".", 1)[1]
        try:
            summary = TelemetrySummary.model_validate_json(msg.data)
        except ValidationError:
            self.rejected_summaries += 1
            return
        if summary.node_id != node:  # a node speaks for itself only
            self.rejected_summaries += 1
            return
        self.latest[node] = KeptSummary(self._clock.monotonic(), summary)

    def _headers(self, node: str) -> dict[str, str]:
        headers = self._headers_of.get(node)
        if headers is None:
            token = self._token if isinstance(self._token, str) else self._token(node)
            headers = self._headers_of[node] = {"Authorization": f"Bearer {token}"}
        return headers

    async def put_caps(self, node: str, address: str, command: CapCommand) -> Ack:
        return (await self.put_caps_many([(node, address, command)]))[0]

    async def put_caps_many(self, targets: Sequence[tuple[str, str, CapCommand]]) -> list[Ack]:
        """Every (node, address, command) at once, the acks in the same order (docs/nats.md,
        "Fan-out"): each node's desired state into the bucket and its command on its own
        subject, published back to back (a yield to the loop every `PUBLISH_CHUNK`, so the
        first go out while the rest are written), the answers gathered on one inbox of this
        fan-out; then the nodes that timed out, had no responder or answered 5xx again, with
        backoff. No task, future or timer per node: at 10,000 nodes those cost more than the
        messages."""
        nc = self._client()
        fan = FanOut(self._clock, [body_of(c) for _, _, c in targets])
        inbox = nc.new_inbox()
        subscription = await nc.subscribe(f"{inbox}.*", cb=fan.answered)
        try:
            pending = list(range(len(targets)))
            backoff = command_backoff(self._retries)
            for attempt in range(1, self._retries + 2):
                fan.waiting = set(pending)
                fan.done.clear()
                for k, i in enumerate(pending):
                    node, address, body = targets[i][0], targets[i][1], fan.bodies[i]
                    if attempt == 1:
                        fan.sent(i)
                        if self._bucket is not None:
                            await self._remember(address, body)
                    fan.attempts[i] = attempt
                    try:
                        await nc.publish(
                            caps_subject(address),
                            body,
                            reply=f"{inbox}.{i}",
                            headers=self._headers(node),
                        )
                    except NatsError as exc:
                        fan.settle(i, describe(exc), final=False)
                    if k % PUBLISH_CHUNK == PUBLISH_CHUNK - 1:
                        await asyncio.sleep(0)
                if fan.waiting:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(fan.done.wait(), self._timeout_s)
                for i in list(fan.waiting):
                    fan.settle(i, "TimeoutError", final=False)
                pending = [i for i in pending if fan.retry[i]]
                if not pending or attempt > self._retries:
                    break
                await self._clock.sleep(backoff.wait_s(attempt))
        finally:
            with contextlib.suppress(NatsError):
                await subscription.unsubscribe()
        return [fan.ack(i, node) for i, (node, _, _) in enumerate(targets)]

    async def _remember(self, address: str, body: bytes) -> None:
        """The node's desired state into the bucket (read by the node when it reconnects):
        published to the bucket's subject without waiting for JetStream's ack, which would
        double the messages of a fan-out; every renewal writes it again."""
        try:
            await self._client().publish(f"$KV.{DESIRED_BUCKET}.{address}", body)
        except (NatsError, AgentUnreachableError) as exc:
            self.unremembered += 1
            log.warning("desired state of %s not written to the bucket: %s", address, exc)


async def check(options: NatsOptions) -> None:
    """Fail now, with the server's reason, if these options cannot connect (before serving)."""
    client = NatsAgentClient(options, "", timeout_s=1.0, retries=0, lease_s=1.0)
    try:
        await probe(options.url, client.connect_options())
    except (NatsError, OSError, TimeoutError) as exc:
        raise NatsConnectError(f"cannot use NATS at {options.url}: {exc}") from exc


async def probe(url: str, options: dict[str, Any]) -> None:
    """One connection attempt, closed again: it raises the server's reason for refusing."""
    attempt = Client()
    try:
        # nats-py waits for ever on a TLS handshake the client refused: bounded here.
        await asyncio.wait_for(
            attempt.connect(url, allow_reconnect=False, error_cb=_raised_anyway, **options),
            2 * CONNECT_TIMEOUT_S,
        )
    finally:
        with contextlib.suppress(NatsError, OSError, TimeoutError):
            await asyncio.wait_for(attempt.close(), CONNECT_TIMEOUT_S)


async def _raised_anyway(exc: Exception) -> None:
    """The probe's errors are raised to its caller: nats-py need not log them too."""
