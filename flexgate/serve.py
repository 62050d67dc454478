"""Serving an ASGI app from a thread on a free loopback port (tests, benchmarks, the lab)."""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

import uvicorn


def free_port() -> int:
    """A port free on loopback now (for servers that cannot be given port 0)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ServerThread:
    """`with ServerThread(app) as url:` runs a real uvicorn server until the block ends."""

    def __init__(self, app: Any, host: str = "127.0.0.1", port: int = 0, **options: Any) -> None:
        self.tls = "ssl_certfile" in options
        self.server = uvicorn.Server(
            uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="on", **options)
        )
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> str:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the server did not start")
            time.sleep(0.01)
        host, port = self.server.servers[0].sockets[0].getsockname()[:2]
        return f"{'https' if self.tls else 'http'}://{host}:{port}"

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
