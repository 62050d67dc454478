"""A real `nats-server` with JetStream for one test: a free loopback port, its own store, and
a token or user/password, so a test can restart it and start from a clean state.

Skips when the binary is missing; with FLEXGATE_REQUIRE_NATS=1 (.ci/run installs it) fails.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

from flexgate.serve import free_port

NATS_TOKEN = "nats-test-token-0123456789"


def nats_binary() -> str:
    found = shutil.which("nats-server") or next(
        (p for p in ("/usr/sbin/nats-server", "/usr/bin/nats-server") if Path(p).exists()), None
    )
    if found is None:
        if os.environ.get("FLEXGATE_REQUIRE_NATS") == "1":
            pytest.fail("FLEXGATE_REQUIRE_NATS=1 but no nats-server is installed")
        pytest.skip("no nats-server here (Debian package nats-server; CI installs it)")
    return found


class NatsServer:
    """`start()`, `stop()`, `restart()` on the same port and store (JetStream keeps its data)."""

    def __init__(
        self, directory: Path, *, token: str | None = NATS_TOKEN, users=None, tls=None
    ) -> None:
        """`tls`: (certificate, key) files: the server then speaks TLS only."""
        self.binary = nats_binary()
        self.port = free_port()
        self.url = f"{'tls' if tls else 'nats'}://127.0.0.1:{self.port}"
        self.directory = directory
        self.config = directory / "nats.conf"
        directory.mkdir(parents=True, exist_ok=True)
        auth = ""
        if users:
            entries = ", ".join(f'{{user: "{u}", password: "{p}"}}' for u, p in users.items())
            auth = f"authorization {{ users: [{entries}] }}"
        elif token:
            auth = f'authorization {{ token: "{token}" }}'
        if tls:
            auth += f'\ntls {{ cert_file: "{tls[0]}", key_file: "{tls[1]}" }}'
        self.config.write_text(
            f'listen: "127.0.0.1:{self.port}"\n'
            f'jetstream {{ store_dir: "{directory / "js"}" }}\n'
            f"max_payload: 1048576\n{auth}\n"
        )
        self.process: subprocess.Popen | None = None

    def start(self) -> NatsServer:
        with (self.directory / "nats.log").open("ab") as log:
            self.process = subprocess.Popen(
                [self.binary, "-c", str(self.config)], stdout=log, stderr=subprocess.STDOUT
            )
        deadline = time.monotonic() + 15
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return self
            except OSError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"nats-server did not start: {(self.directory / 'nats.log').read_text()}"
                    ) from None
                time.sleep(0.05)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(10)

    def restart(self) -> None:
        self.stop()
        self.start()
