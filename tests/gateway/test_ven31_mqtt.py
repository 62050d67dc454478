"""OpenADR 3.1 notifications over MQTT: the mock VTN (a real uvicorn server) offers its MQTT
notifier and publishes to the machine's Mosquitto broker (127.0.0.1:1883, shared: each VTN's
topics sit under a root of its own); the VEN of a real gateway reads `GET /notifiers`, follows
its program's event topics and reads each message as a webhook notification. Polls are an hour
apart in these tests, so only MQTT can bring an event after the first poll.

Without a broker these tests skip, with the reason; with FLEXGATE_REQUIRE_MQTT=1 (CI) they
fail."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading

import httpx
import paho.mqtt.client as paho
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from flexgate.lab.mockvtn31 import LAB_CLIENT_ID, LAB_CLIENT_SECRET
from flexgate.serve import free_port
from gateway.openadr.mqtt31 import broker_problem
from tests.conftest import ROOT, wait_for
from tests.gateway.test_ven31 import (
    capped,
    mock_vtn,
    simple_event,
    stored,
    uncapped,
    ven_site,
)
from tests.gateway.test_ven31_security import settings
from tests.test_cli import assert_bad_input, flexgate

BROKER = "mqtt://127.0.0.1:1883"
HOUR = 3600.0


def _broker_listens() -> bool:
    try:
        with socket.create_connection(("127.0.0.1", 1883), timeout=2):
            return True
    except OSError:
        return False


@pytest.fixture
def database_url(tmp_path):
    return f"sqlite:///{tmp_path / 'gateway.db'}"


@pytest.fixture
def broker():
    if not _broker_listens():
        why = "no MQTT broker listens on 127.0.0.1:1883 (Mosquitto)"
        if os.environ.get("FLEXGATE_REQUIRE_MQTT") == "1":
            pytest.fail(f"{why}, and FLEXGATE_REQUIRE_MQTT=1")
        pytest.skip(why)
    return BROKER


@pytest.fixture
def vtn(broker):
    with mock_vtn(mqtt_broker=broker) as vtn:
        yield vtn
        vtn.close()


@pytest.fixture
def logs(caplog):
    caplog.set_level(logging.INFO, logger="flexgate.ven31")
    return caplog


def event_topics(vtn):
    return vtn.topics(f"programs/{vtn.program['id']}/events")


@contextlib.contextmanager
def mqtt_site(tmp_path, database_url, vtn, logs, **changes):
    """A gateway whose VEN polls hourly and follows the program's event topics."""
    changes = {"webhook": False, "vtn_poll_s": HOUR, **changes}
    with ven_site(tmp_path, database_url, vtn, **changes) as site:
        wanted = f"MQTT: subscribed to {event_topics(vtn)['ALL']}"
        site.wait(lambda: wanted in logs.text, what="the VEN's MQTT subscription")
        yield site


@pytest.fixture
def site(tmp_path, database_url, vtn, logs):
    with mqtt_site(tmp_path, database_url, vtn, logs) as site:
        yield site


def publish(topic, payload: bytes, retain: bool = False) -> None:
    """One message on the broker, as a VTN (or anyone on it) would send it."""
    done = threading.Event()
    client = paho.Client(CallbackAPIVersion.VERSION2)
    client.on_connect = lambda *_args: done.set()
    client.connect("127.0.0.1", 1883)
    client.loop_start()
    try:
        assert done.wait(10), "the broker did not accept the test's connection"
        client.publish(topic, payload, qos=1, retain=retain).wait_for_publish(10)
    finally:
        client.disconnect()
        client.loop_stop()


def test_the_vtn_offers_mqtt_and_names_the_topics(vtn):
    [uri] = vtn.mqtt_uris
    assert uri == BROKER
    topics = event_topics(vtn)
    root = f"{vtn.topic_root}/events/programs/{vtn.program['id']}"
    assert topics == {
        "CREATE": f"{root}/create",
        "UPDATE": f"{root}/update",
        "DELETE": f"{root}/delete",
        "ALL": f"{root}/+",
    }
    assert "CREATE" not in vtn.topics(f"programs/{vtn.program['id']}")  # it exists already
    assert vtn.topics("nothing/here") is None


def test_an_event_by_mqtt_becomes_caps(site, vtn, logs):
    event = vtn.add_event(simple_event(vtn, start_s=0.5, interval_s=60, intervals=1))
    assert (event_topics(vtn)["CREATE"], "CREATE") in vtn.published
    got = site.wait(lambda: stored(site, event["id"]), what="the event over MQTT")
    assert got["opt"] == "in"
    site.wait(lambda: capped(site), what="caps")
    assert vtn.delivered == []  # no webhook: MQTT brought it
    assert vtn.refused == []


def test_a_retained_message_is_not_acted_on(tmp_path, database_url, vtn, logs):
    """The reference VTN retains: after a restart the broker replays an event created and
    deleted meanwhile. The state comes from the REST API, which no longer lists it."""
    gone = {**simple_event(vtn, start_s=0.5, interval_s=60, intervals=1), "id": "deleted-meanwhile"}
    note = {"objectType": "EVENT", "operation": "CREATE", "object": gone}
    topic = event_topics(vtn)["CREATE"]
    publish(topic, json.dumps(note).encode(), retain=True)
    try:
        with mqtt_site(tmp_path, database_url, vtn, logs) as site:
            site.wait(lambda: "retained message" in logs.text, what="the retained message seen")
            event = vtn.add_event(simple_event(vtn, start_s=30, interval_s=60, intervals=1))
            site.wait(lambda: stored(site, event["id"]), what="a live message after it")
            assert stored(site, "deleted-meanwhile") is None
            assert uncapped(site)
    finally:
        publish(topic, b"", retain=True)  # an empty retained message clears it


def test_an_event_deleted_at_the_vtn_is_cancelled_over_mqtt(site, vtn):
    event = vtn.add_event(simple_event(vtn, start_s=0.5, interval_s=60, intervals=1))
    site.wait(lambda: capped(site), what="caps")
    vtn.delete_event(event["id"])
    site.wait(lambda: stored(site, event["id"])["status"] == "cancelled", what="cancelled")
    site.wait(lambda: uncapped(site), what="the restore")


def test_a_modified_event_over_mqtt_is_read_again(site, vtn):
    event = vtn.add_event(simple_event(vtn, level=1, start_s=30, interval_s=30, intervals=1))
    site.wait(lambda: stored(site, event["id"]), what="the event")
    baseline = site.api.get("/v1/site").json()["baseline_facility_kw"]
    changed = [{"id": 0, "payloads": [{"type": "SIMPLE", "values": [3]}]}]
    vtn.update_event(event["id"], {"intervals": changed})
    site.wait(
        lambda: stored(site, event["id"])["reduction_kw"] == pytest.approx(0.40 * baseline, 1e-3),
        what="the new value",
    )


def test_a_malformed_mqtt_message_is_refused_with_the_reason_and_nothing_changes(site, vtn, logs):
    topic = event_topics(vtn)["CREATE"]
    forged = {**simple_event(vtn, start_s=0.5, interval_s=60, intervals=1), "id": "forged"}
    publish(topic, b"{not json")
    publish(topic, json.dumps({"objectType": "EVENT", "operation": 5, "object": forged}).encode())
    publish(topic, json.dumps({"objectType": "EVENT", "operation": "CREATE"}).encode())
    wrong = {**forged, "id": "wrong-types"}
    wrong["intervals"] = [{"id": 0, "payloads": [{"type": "SIMPLE", "values": ["two"]}]}]
    publish(topic, json.dumps({"objectType": "EVENT", "operation": "CREATE", "object": wrong}))
    other = vtn.add_event(  # published by the VTN: an event for another VEN
        simple_event(vtn, start_s=0.5, interval_s=60, intervals=1, targets=["VEN-99"])
    )
    # Messages are read one at a time, in order: once this one is read, so are those before.
    got = site.wait(lambda: stored(site, other["id"]), what="the last message read")
    assert got["status"] == "opted_out"
    assert "not targeted at this VEN (targets: VEN-99)" in got["reason"]
    assert f"MQTT message on {topic} refused: not an OpenADR 3.1 notification: not JSON" in (
        logs.text
    )
    assert "notification: operation: Input should be" in logs.text
    assert "notification: object: Field required" in logs.text
    assert stored(site, "forged") is None
    refused = stored(site, "wrong-types")  # read as the webhook reads it: stored as refused
    assert refused["status"] == "failed"
    assert "'two' is not a number" in refused["reason"]
    assert uncapped(site)
    assert [e for e in site.api.get("/v1/events").json()["events"] if e["status"] == "active"] == []


def test_webhook_and_mqtt_together_act_once(tmp_path, database_url, vtn, logs):
    with mqtt_site(tmp_path, database_url, vtn, logs, webhook=True) as site:
        event = vtn.add_event(simple_event(vtn, start_s=0.5, interval_s=60, intervals=1))
        site.wait(lambda: capped(site), what="caps")
        assert vtn.delivered  # the webhook brought it too
        assert vtn.delivered[-1][1] == 200
        assert (event_topics(vtn)["CREATE"], "CREATE") in vtn.published
        got = stored(site, event["id"])
        assert got["status"] == "active"
        assert got["opt"] == "in"
        listed = site.api.get("/v1/events").json()["events"]
        ours = [e for e in listed if e["id"] == f"oadr3-{event['id']}"]
        assert len(ours) == 1
        assert vtn.reports == []  # no refusal: the second copy was read already


class Proxy:
    """A TCP relay on loopback to the broker that can drop every connection and refuse new
    ones (`down`), and take them again (`up`): a broker that goes away and comes back."""

    def __init__(self, port: int) -> None:
        self.target = port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"mqtt://127.0.0.1:{self.listener.getsockname()[1]}"
        self.accepting = True
        self.open: list[socket.socket] = []
        self.sent = bytearray()  #: every byte the clients sent (their CONNECT packets too)
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return  # closed
            if not self.accepting:
                client.close()
                continue
            upstream = socket.create_connection(("127.0.0.1", self.target))
            with self._lock:
                self.open += [client, upstream]
            for a, b, seen in ((client, upstream, self.sent), (upstream, client, None)):
                threading.Thread(target=self._pipe, args=(a, b, seen), daemon=True).start()

    @staticmethod
    def _pipe(source: socket.socket, sink: socket.socket, seen: bytearray | None) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                if seen is not None:
                    seen += data
                sink.sendall(data)
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_RDWR)

    def down(self) -> None:
        self.accepting = False
        with self._lock:
            dropped, self.open = self.open, []
        for sock in dropped:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def up(self) -> None:
        self.accepting = True

    def close(self) -> None:
        self.down()
        self.listener.close()


def test_a_broker_that_drops_is_reconnected_and_what_it_missed_is_polled(
    tmp_path, database_url, vtn, logs
):
    proxy = Proxy(1883)
    vtn.mqtt_uris = [proxy.url]  # the VEN goes through the relay; the VTN publishes directly
    try:
        with mqtt_site(tmp_path, database_url, vtn, logs) as site:
            proxy.down()
            site.wait(lambda: "MQTT: disconnected" in logs.text, what="the drop noticed")
            missed = vtn.add_event(simple_event(vtn, start_s=0.5, interval_s=60, intervals=1))
            assert stored(site, missed["id"]) is None  # published while the VEN was away
            proxy.up()  # reconnected with backoff (1 s, 2 s, ...), subscribed again, polled
            got = site.wait(lambda: stored(site, missed["id"]), seconds=45, what="the poll")
            assert got["opt"] == "in"
            assert "polling for what was missed" in logs.text
            # Polls are an hour apart: only the new subscription can bring this one.
            later = vtn.add_event(simple_event(vtn, level=1, start_s=30, interval_s=30))
            site.wait(lambda: stored(site, later["id"]), what="an event over MQTT again")
            assert logs.text.count("MQTT: connected to") >= 2
    finally:
        proxy.close()


@pytest.mark.parametrize(
    ("settings_given", "expected"),
    [
        ({}, "the client id and the VEN's OAuth2 token"),
        ({"vtn_mqtt_username": "operator-7", "vtn_mqtt_password": "op-secret-0123"}, "settings"),
    ],
)
def test_the_broker_gets_the_credentials_the_binding_names_or_the_settings(
    tmp_path, database_url, vtn, logs, settings_given, expected
):
    """The broker (Mosquitto here takes any) is seen through the relay: the CONNECT packet."""
    proxy = Proxy(1883)
    vtn.mqtt_uris = [proxy.url]
    vtn.mqtt_authentication = {"method": "OAUTH2_BEARER_TOKEN", "username": "{clientID}"}
    try:
        with mqtt_site(tmp_path, database_url, vtn, logs, **settings_given) as site:
            event = vtn.add_event(simple_event(vtn, start_s=0.5, interval_s=60, intervals=1))
            site.wait(lambda: stored(site, event["id"]), what="the event over MQTT")
            sent = bytes(proxy.sent)
            if settings_given:
                assert b"operator-7" in sent
                assert b"op-secret-0123" in sent
            else:
                assert LAB_CLIENT_ID.encode() in sent
                assert any(token.encode() in sent for token in vtn._tokens)
    finally:
        proxy.close()
    assert "op-secret-0123" not in logs.text
    assert not any(token in logs.text for token in vtn._tokens)


def test_a_plain_mqtt_broker_on_another_machine_is_refused_and_polling_goes_on(
    tmp_path, database_url, vtn, logs
):
    vtn.mqtt_uris = ["mqtt://192.0.2.10:1883"]  # TEST-NET: another machine
    with ven_site(tmp_path, database_url, vtn, webhook=False, vtn_poll_s=0.3) as site:
        site.wait(lambda: "MQTT not used" in logs.text, what="the refusal")
        assert "plain MQTT to another machine" in logs.text
        event = vtn.add_event(simple_event(vtn, start_s=0.5, interval_s=60, intervals=1))
        site.wait(lambda: capped(site), what="caps from a poll")
        assert stored(site, event["id"])["status"] == "active"
    assert "MQTT: connecting" not in logs.text


@pytest.mark.parametrize(
    ("uri", "allow", "reason"),
    [
        ("mqtt://broker.example:1883", True, "plain MQTT to another machine"),
        ("mqtt://10.0.0.5:1883", True, "plain MQTT to another machine"),
        ("mqtt://127.0.0.1:1883", False, "FLEXGATE_VTN_ALLOW_HTTP=true"),
        ("ws://broker.example/mqtt", True, "is not an mqtts://"),
        ("mqtts://broker.example:99999", True, "no valid port"),
    ],
)
def test_a_broker_uri_that_is_not_tls_is_refused_with_the_reason(uri, allow, reason):
    problem = broker_problem(uri, allow_plain=allow)
    assert problem is not None
    assert reason in problem


@pytest.mark.parametrize(
    ("uri", "allow"),
    [
        ("mqtts://broker.example:8883", False),
        ("mqtts://broker.example", False),
        ("mqtt://127.0.0.1:1883", True),
        ("mqtt://localhost", True),
    ],
)
def test_tls_anywhere_and_plain_on_loopback_when_allowed_are_accepted(uri, allow):
    assert broker_problem(uri, allow_plain=allow) is None


def test_an_mqtt_password_without_a_username_is_refused():
    with pytest.raises(ValueError, match="FLEXGATE_VTN_MQTT_PASSWORD is set without"):
        settings(vtn_url="https://vtn.example", vtn_mqtt_password="p-0123456789")


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--mqtt-broker", BROKER], "is for the 3.1 mock VTN"),
        (["--openadr", "3.1", "--mqtt-broker", "ftp://127.0.0.1:1883"], "not an mqtt://"),
        (["--openadr", "3.1", "--mqtt-broker", "mqtt://127.0.0.1:9"], "--mqtt-broker"),
    ],
)
def test_mock_vtn_refuses_a_broker_it_cannot_use(args, fragment):
    assert_bad_input(flexgate("mock-vtn", "--port", str(free_port()), *args), fragment)


def test_mock_vtn_command_offers_mqtt_on_the_broker_given(broker, tmp_path):
    port = free_port()
    # faulthandler: SIGABRT prints every thread's stack, should it not stop on SIGINT
    command = [sys.executable, "-X", "faulthandler", "-m", "flexgate.cli", "mock-vtn"]
    command += ["--openadr", "3.1"]
    # Its stderr to a file: a pipe nobody reads can fill and block it.
    errors = tmp_path / "mock-vtn.err"
    with (
        errors.open("wb") as stderr,
        subprocess.Popen(
            [*command, "--mqtt-broker", broker, "--port", str(port)],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            # SIGINT as a terminal gives it: a suite started in the background (nohup, `&`)
            # passes SIGINT on ignored, and Python then never raises KeyboardInterrupt.
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        ) as server,
    ):
        try:
            url = f"http://127.0.0.1:{port}"

            def token():
                with contextlib.suppress(httpx.HTTPError):
                    answer = httpx.post(
                        f"{url}/auth/token",
                        data={"grant_type": "client_credentials"},
                        auth=(LAB_CLIENT_ID, LAB_CLIENT_SECRET),
                    )
                    return answer.json()["access_token"]
                return None

            bearer = wait_for(token, "the mock VTN serving", 30)
            offered = httpx.get(
                f"{url}/notifiers", headers={"Authorization": f"Bearer {bearer}"}
            ).json()
            assert offered["WEBHOOK"] is True
            assert offered["MQTT"]["URIS"] == [broker]
            assert offered["MQTT"]["authentication"] == {"method": "ANONYMOUS"}
        finally:
            server.send_signal(signal.SIGINT)
            stopped(server, errors)


def stopped(server: subprocess.Popen, errors) -> None:
    """Wait for a server sent SIGINT; one still running after 20 s fails the test with its
    threads' stacks (its stderr, the file `errors`) and is killed, not left to hang the test
    and warn in a later one."""
    try:
        server.wait(20)
        return
    except subprocess.TimeoutExpired:
        server.send_signal(signal.SIGABRT)
    try:
        server.wait(20)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait()
    stacks = errors.read_text(errors="replace")[-6000:]
    pytest.fail(f"the server did not stop within 20 s of SIGINT; its threads:\n{stacks}")


def test_a_vtn_without_an_mqtt_notifier_is_used_by_webhook_and_polling(
    tmp_path, database_url, logs
):
    with mock_vtn() as plain, ven_site(tmp_path, database_url, plain) as site:
        site.wait(lambda: "offers no MQTT notifier" in logs.text, what="the notifiers read")
        event = plain.add_event(simple_event(plain, start_s=0.5, interval_s=60, intervals=1))
        site.wait(lambda: capped(site), what="caps by webhook")
        assert stored(site, event["id"])["status"] == "active"
    assert "MQTT: connecting" not in logs.text


def test_mqtt_off_in_the_settings_leaves_the_notifier_unused(tmp_path, database_url, vtn, logs):
    with ven_site(
        tmp_path, database_url, vtn, webhook=False, vtn_poll_s=0.3, vtn_mqtt=False
    ) as site:
        event = vtn.add_event(simple_event(vtn, start_s=0.5, interval_s=60, intervals=1))
        site.wait(lambda: capped(site), what="caps from a poll")
        assert stored(site, event["id"])["status"] == "active"
    assert "MQTT" not in logs.text
