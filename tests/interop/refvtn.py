"""The OpenADR Alliance's 3.1.0 reference VTN (`../shared/vendor/openadr3-reference-vtn`, see
`../shared/vendor/README.md`), run unchanged as a separate process for the interop tests.

Its folder is read-only: its venv is built outside it, from PyPI (`pip install -r
requirements.txt`), once per requirements file and Python version, under
`FLEXGATE_CACHE_DIR` (default `~/.cache/flexgate`), then reused; a file lock keeps two runs
from building it at once. Each VTN runs from a temporary working directory holding an
override `config.py` (`from config import` finds the working directory first): `IN_MEMORY`
store, loopback, a free port, the `WEBHOOK` binding, client secrets of our own.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from flexgate import specschema31
from flexgate.serve import free_port

BASE_PATH = "/openadr3/3.1.0"
#: The reference VTN runs on python3.11 (its pins predate 3.12).
PYTHON = "python3.11"
VEN_CLIENT, VEN_SECRET = "ven_client", "interop-ven-secret-4f1c9a"
BL_CLIENT, BL_SECRET = "bl_client", "interop-bl-secret-8d2e7b"
START_S = 60.0  #: how long the VTN may take to answer its first request
BUILD_S = 900.0  #: how long building its venv may take (pip from PyPI)

CONFIG = """\
# flexgate's interop tests: the reference VTN's settings, overriding its own config.py.
import logging, sys
SERVER_IP = '127.0.0.1'
SERVER_PORT = {port}
logging.basicConfig(stream=sys.stdout, level=logging.INFO)
OIDC_AUTH_ENABLED = False
OIDC_BASE_URL = ''
OIDC_KNOWN_ISSUER = ''
STORAGE_IMPLEMENTATION = 'IN_MEMORY'
STORAGE_FILE_PATH = './tmp/fileStorage.json'
CLEAN_START = True
AUTH_BASIC_VEN_CLIENT_ID = {ven_client!r}
AUTH_BASIC_VEN_SECRET = {ven_secret!r}
AUTH_BASIC_BL_CLIENT_ID = {bl_client!r}
AUTH_BASIC_BL_SECRET = {bl_secret!r}
NOTIFIER_BINDINGS = ['WEBHOOK']
MQTT_VTN_BROKER_IP = '127.0.0.1'
MQTT_VTN_BROKER_PORT = 1883
MQTT_CLIENT_BROKER_FQDN = '127.0.0.1'
MQTT_CLIENT_BROKER_PORT = 1883
MQTT_BROKER_CLIENT_ID = 'OpenADR3-VTN-RI'
MQTT_SERIALIZATION = 'JSON'
MQTT_BROKER_AUTH = 'ANONYMOUS'
MQTT_BROKER_CLIENT_CERTS = None
MQTT_TOPIC_BASE_PROGRAMS = 'programs'
MQTT_TOPIC_BASE_PROGRAM_EVENTS = 'events/programs'
MQTT_TOPIC_BASE_EVENTS = 'events'
MQTT_TOPIC_BASE_REPORTS = 'reports'
MQTT_TOPIC_BASE_RESOURCES = 'resources'
MQTT_TOPIC_BASE_SUBSCRIPTIONS = 'subscriptions'
MQTT_TOPIC_BASE_VENS = 'vens'
MQTT_TOPIC_BASE_VEN_RESOURCES = 'resources/vens'
MQTT_TOPIC_BASE_VEN_EVENTS = 'events/vens'
"""


def source_dir() -> Path:
    return specschema31.shared_dir() / "vendor" / "openadr3-reference-vtn"


def cache_dir() -> Path:
    return Path(os.environ.get("FLEXGATE_CACHE_DIR") or Path.home() / ".cache" / "flexgate")


def interpreter() -> str:
    found = shutil.which(PYTHON)
    if found:
        return found
    if sys.version_info[:2] == (3, 11):
        return sys.executable
    raise RuntimeError(f"the reference VTN needs {PYTHON}, which is not on PATH")


def venv() -> Path:
    """The reference VTN's venv, built from PyPI the first time (keyed on its requirements
    and the interpreter's version), reused after."""
    python = interpreter()
    version = subprocess.run(
        [python, "-c", "import sys; print(sys.version)"], capture_output=True, text=True, check=True
    ).stdout
    requirements = source_dir() / "requirements.txt"
    key = hashlib.sha256(requirements.read_bytes() + version.encode()).hexdigest()[:16]
    home = cache_dir()
    home.mkdir(parents=True, exist_ok=True)
    ready = home / f"refvtn-{key}"
    with open(home / f"refvtn-{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another run building it: wait for it
        if (ready / ".ready").exists():
            return ready
        building = home / f"refvtn-{key}.building"
        shutil.rmtree(building, ignore_errors=True)
        shutil.rmtree(ready, ignore_errors=True)
        subprocess.run([python, "-m", "venv", str(building)], check=True, timeout=BUILD_S)
        pip = [str(building / "bin" / "python"), "-m", "pip", "install", "-q"]
        done = subprocess.run(
            [*pip, "-r", str(requirements)], capture_output=True, text=True, timeout=BUILD_S
        )
        if done.returncode != 0:
            raise RuntimeError(f"the reference VTN's venv did not build:\n{done.stderr[-3000:]}")
        # Renamed once complete, so a run killed mid-build leaves nothing that looks ready;
        # its scripts name the old path, but only `python -m` is used.
        building.rename(ready)
        (ready / ".ready").write_text(key)
        return ready


class ReferenceVtn:
    """One running reference VTN; `bl` is an HTTP client of its business logic."""

    def __init__(self, url: str, process: subprocess.Popen[bytes], log: Path) -> None:
        self.url, self.process, self.log = url, process, log
        self.bl = httpx.Client(
            base_url=url, headers={"Authorization": f"Bearer {self._token()}"}, timeout=30
        )

    def _token(self) -> str:
        answer = httpx.post(
            f"{self.url}/auth/token",
            data={
                "grant_type": "client_credentials",
                "client_id": BL_CLIENT,
                "client_secret": BL_SECRET,
            },
        )
        answer.raise_for_status()
        token = answer.json()["access_token"]
        assert base64.b64decode(token).decode() == f"{BL_CLIENT}:{BL_SECRET}"  # its scheme
        return str(token)

    def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        answer = self.bl.post(path, json=body)
        assert answer.status_code in (200, 201), f"POST {path}: {answer.status_code} {answer.text}"
        return dict(answer.json())

    def put(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        answer = self.bl.put(path, json=body)
        assert answer.status_code == 200, f"PUT {path}: {answer.status_code} {answer.text}"
        return dict(answer.json())

    def delete(self, path: str) -> None:
        answer = self.bl.delete(path)
        assert answer.status_code == 200, f"DELETE {path}: {answer.status_code} {answer.text}"

    def get(self, path: str) -> Any:
        answer = self.bl.get(path)
        assert answer.status_code == 200, f"GET {path}: {answer.status_code} {answer.text}"
        return answer.json()

    def tail(self, chars: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-chars:] if self.log.exists() else ""


@contextlib.contextmanager
def running(workdir: Path) -> Iterator[ReferenceVtn]:
    """A reference VTN from `workdir` (its config.py written there), stopped at the end."""
    python = venv() / "bin" / "python"
    port = free_port()
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "config.py").write_text(
        CONFIG.format(
            port=port,
            ven_client=VEN_CLIENT,
            ven_secret=VEN_SECRET,
            bl_client=BL_CLIENT,
            bl_secret=BL_SECRET,
        )
    )
    log = workdir / "vtn.log"
    env = {
        **os.environ,
        "PYTHONPATH": str(source_dir()),  # its package; config.py from the working directory
        "PYTHONDONTWRITEBYTECODE": "1",  # its folder is read-only
    }
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [str(python), "-m", "swagger_server"], cwd=workdir, env=env, stdout=out, stderr=out
        )
    url = f"http://127.0.0.1:{port}{BASE_PATH}"
    try:
        _wait_until_up(url, process, log)
        vtn = ReferenceVtn(url, process, log)
        try:
            yield vtn
        finally:
            vtn.bl.close()
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


def _wait_until_up(url: str, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + START_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(
                f"the reference VTN exited ({process.returncode}):\n{log.read_text()}"
            )
        try:
            if httpx.get(f"{url}/auth/server", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"the reference VTN did not answer within {START_S:g} s:\n{log.read_text()}")
