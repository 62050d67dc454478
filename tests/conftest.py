"""Shared fixtures: where ../shared is, and the example files."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared"
EXAMPLES = ROOT / "examples"


@pytest.fixture
def shared() -> Path:
    """The design folder beside the clone (CI always has it; a user's clone may not)."""
    if not (SHARED / "data" / "h200_pfi_table.csv").exists():
        pytest.skip(f"../shared is not beside this clone ({SHARED} missing)")
    return SHARED


class ServerThread:
    """A real uvicorn server for an ASGI app, in a thread, on a free loopback port."""

    def __init__(self, app) -> None:
        import threading

        import uvicorn

        self.server = uvicorn.Server(
            uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="on")
        )
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> str:
        import time

        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the server did not start")
            time.sleep(0.01)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
