"""The node's checks, with the agent's settings (`FLEXGATE_AGENT_*`): what `flexgate agent
--backend nvml` needs here before an event.

Only the agent's modules and the standard library are imported (a GPU node may have the
agent-only install, without httpx). NVML is
read, never written: whether the agent may set limits cannot be learnt from NVML without
changing one, so it is judged from the process's effective user and capabilities
(`CAP_SYS_ADMIN` in `/proc/self/status`), as the driver judges a set.
"""

from __future__ import annotations

import email.utils
import errno
import importlib
import json
import os
import socket
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from email.message import Message
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from agents.errors import AgentError
from agents.nvml import NvmlBackend
from agents.settings import AgentSettings
from agents.state import FILE_NAME as ORIGINALS_FILE
from flexgate.doctor import Check, fail, ok, warn

#: The capability NVML's setters ask for (Linux's numbering).
CAP_SYS_ADMIN = 21
#: A clock this far from the gateway's is reported [s]: HTTP dates have whole seconds.
CLOCK_WARN_S = 2.0
#: ... and this far fails: leases, event starts and phases are all on wall clocks [s].
CLOCK_FAIL_S = 10.0
HTTP_TIMEOUT_S = 3.0


def agent_settings(overrides: dict[str, Any]) -> tuple[AgentSettings, Check]:
    """The agent's settings as `flexgate agent` would read them, and their check; when they
    are refused, their defaults (with `overrides`) so the other checks still run."""
    try:
        settings = AgentSettings(**overrides)
    except ValidationError as exc:
        return AgentSettings.model_construct(**overrides), fail("agent settings", first_error(exc))
    return settings, ok(
        "agent settings",
        f"backend {settings.agent_backend}, node {settings.agent_node_id}, "
        f"{settings.agent_host}:{settings.agent_port}, transport {settings.agent_transport}",
    )


def first_error(exc: ValidationError) -> str:
    error = exc.errors()[0]
    where = ".".join(str(p) for p in error.get("loc", ()) if p != "__root__")
    message = str(error.get("msg", exc)).removeprefix("Value error, ")
    return f"{where}: {message}" if where else message


def node_checks(
    settings: AgentSettings,
    *,
    nvml: Any = None,
    gateway_url: str | None = None,
    euid: int | None = None,
    proc_status: str | None = None,
) -> list[Check]:
    """Every node check after the settings' own. `nvml` stands in for the pynvml module (tests
    pass the fake); `euid` and `proc_status` for the process's user and `/proc/self/status`."""
    if settings.agent_backend == "sim":  # simulated GPUs need neither NVML nor a permission
        checks = [warn("nvml", "backend sim: simulated GPUs, NVML not checked")]
    else:
        checks = gpu_checks(nvml)
        checks.append(permission_check(os.geteuid() if euid is None else euid, proc_status))
    if gateway_url:
        checks.append(clock_check(gateway_url))
    checks.append(state_dir_check(settings.agent_state_dir, settings.agent_node_id))
    checks.append(port_check(settings.agent_host, settings.agent_port))
    return checks


def gpu_checks(nvml: Any = None) -> list[Check]:
    """NVML loads (driver and NVML versions), then one line per GPU."""
    try:
        module = nvml if nvml is not None else importlib.import_module("pynvml")
        backend = NvmlBackend(nvml=module)
    except (ImportError, OSError, AgentError) as exc:
        return [fail("nvml", f"NVML does not load: {exc} (is this a GPU node with the driver?)")]
    except Exception as exc:  # pynvml's NVMLError_LibraryNotFound and kin, before translation
        return [fail("nvml", f"NVML does not load: {type(exc).__name__}: {exc}")]
    try:
        versions = _versions(module)
        if backend.count() == 0:
            return [fail("nvml", f"NVML loads ({versions}) but sees no GPU")]
        sensor = "instant field" if backend.averaging_s == 0.0 else "1 s average (no instant field)"
        checks = [
            ok(
                "nvml",
                f"{versions}; {backend.count()} GPUs; power sensor: {sensor}",
                **{
                    "gpus": backend.count(),
                    "sensor": "instant" if backend.averaging_s == 0.0 else "average",
                },
            )
        ]
        checks += [_gpu_check(backend, index) for index in range(backend.count())]
        return checks
    finally:
        backend.close()


def _versions(nvml: Any) -> str:
    said = []
    for name, call in (
        ("driver", "nvmlSystemGetDriverVersion"),
        ("NVML", "nvmlSystemGetNVMLVersion"),
    ):
        function: Callable[[], Any] | None = getattr(nvml, call, None)
        if function is None:
            continue
        try:
            value = function()
        except Exception:  # an old driver without the call: the versions are only shown
            continue
        said.append(f"{name} {value.decode() if isinstance(value, bytes) else value}")
    return ", ".join(said) or "versions unknown"


def _gpu_check(backend: NvmlBackend, index: int) -> Check:
    name = f"gpu {index}"
    try:
        _, model = backend.identity(index)
        limits = backend.constraints(index)
        current_w = backend.enforced_limit_w(index)
        persistence = backend.persistence_mode(index)
    except AgentError as exc:
        return fail(name, f"NVML cannot read this GPU: {exc}")
    figures = {
        "name": model,
        "min_limit_w": limits.min_w,
        "max_limit_w": limits.max_w,
        "default_limit_w": limits.default_w,
        "current_limit_w": current_w,
        "persistence_mode": persistence,
    }
    said = (
        f"{model}, limits {limits.min_w:g}-{limits.max_w:g} W, default {limits.default_w:g} W, "
        f"now {current_w:g} W"
    )
    if limits.min_w >= limits.max_w:
        return fail(name, f"{said}: no range to cap in", **figures)
    if persistence is False:
        return warn(
            name, f"{said}; persistence mode off (a driver reload forgets limits)", **figures
        )
    if current_w < limits.default_w - 1.0:
        return warn(name, f"{said}: already below its default (another tool's cap?)", **figures)
    shown = "on" if persistence else "unknown"
    return ok(name, f"{said}; persistence mode {shown}", **figures)


def permission_check(euid: int, proc_status: str | None = None) -> Check:
    """Whether NVML is likely to accept the agent's sets: root, or `CAP_SYS_ADMIN` in the
    effective set (a container's or a unit's `AmbientCapabilities=`)."""
    if euid == 0:
        return ok("permission", "runs as root: NVML accepts limits", euid=euid)
    if proc_status is None:
        try:
            proc_status = Path("/proc/self/status").read_text(encoding="utf-8")
        except OSError:
            proc_status = ""
    effective = _cap_eff(proc_status)
    if effective is not None and effective >> CAP_SYS_ADMIN & 1:
        return ok("permission", f"uid {euid} with CAP_SYS_ADMIN: NVML accepts limits", euid=euid)
    return fail(
        "permission",
        f"uid {euid} without CAP_SYS_ADMIN: NVML will refuse every limit (run the agent as root "
        "or give it CAP_SYS_ADMIN)",
        euid=euid,
    )


def _cap_eff(proc_status: str) -> int | None:
    for line in proc_status.splitlines():
        key, _, value = line.partition(":")
        if key == "CapEff":
            try:
                return int(value.strip(), 16)
            except ValueError:
                return None
    return None


def clock_check(gateway_url: str) -> Check:
    """This machine's clock against the gateway's, from its HTTP `Date` header (the midpoint
    of the request; whole seconds, so under CLOCK_WARN_S is as good as it can tell)."""
    url = f"{gateway_url.rstrip('/')}/health"
    try:
        before = time.time()
        _, headers, _ = http_get(url)
        after = time.time()
    except OSError as exc:
        return fail("clock", f"the gateway at {gateway_url} does not answer: {exc}")
    date = headers.get("date")
    if not date:
        return warn("clock", f"{url} sent no Date header: the offset cannot be read")
    offset_s = email.utils.parsedate_to_datetime(date).timestamp() - (before + after) / 2
    said = f"{offset_s:+.1f} s from the gateway's (HTTP Date, whole seconds)"
    if abs(offset_s) >= CLOCK_FAIL_S:
        return fail("clock", f"{said}: synchronise both clocks (NTP)", offset_s=offset_s)
    if abs(offset_s) >= CLOCK_WARN_S:
        return warn("clock", f"{said}: check NTP on both", offset_s=offset_s)
    return ok("clock", said, offset_s=offset_s)


def state_dir_check(state_dir: Path, node_id: str) -> Check:
    """The folder where originals are saved can be written (or made), and what the node's
    folder in it holds (the agent keeps them in `state_dir/node_id`, as `agents.run` does)."""
    name = "state dir"
    existing = state_dir
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        return fail(name, f"{state_dir}: {existing} is not a folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        return fail(name, f"{state_dir}: {existing} cannot be written by uid {os.geteuid()}")
    if existing != state_dir:
        return ok(name, f"{state_dir} does not exist yet; the agent makes it in {existing}")
    if _saved_originals(state_dir / node_id / ORIGINALS_FILE):
        return warn(
            name,
            f"{state_dir} is writable and holds saved original limits: the last run left caps, "
            "which the agent restores at start",
        )
    return ok(name, f"{state_dir} is writable")


def _saved_originals(path: Path) -> int:
    """How many GPUs' original limits the file holds (a clean stop leaves none)."""
    try:
        return len(json.loads(path.read_text(encoding="utf-8")).get("gpus", {}))
    except (OSError, ValueError, AttributeError):
        return 0


def port_check(host: str, port: int) -> Check:
    """The agent's port is free, or held by a running agent (which then says if it can cap)."""
    name = "port"
    probe = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    # As uvicorn binds: a stopped agent's connections in TIME_WAIT do not keep it off the port
    # (a listening socket still does).
    probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        probe.bind((host, port))
    except OSError as exc:
        if exc.errno != errno.EADDRINUSE:
            return fail(name, f"{host}:{port} cannot be bound: {exc.strerror}")
    else:
        return ok(name, f"{host}:{port} is free")
    finally:
        probe.close()
    return _running_agent(host, port)


def _running_agent(host: str, port: int) -> Check:
    name = "port"
    shown = f"[{host}]" if ":" in host else host
    target = "127.0.0.1" if host in ("0.0.0.0", "") else ("::1" if host == "::" else shown)
    health: dict[str, Any] | None = None
    for scheme in ("http", "https"):
        try:
            status, _, body = http_get(f"{scheme}://{target}:{port}/health", verify=False)
            health = json.loads(body) if status == 200 else None
            break
        except (OSError, ValueError):
            continue
    if not isinstance(health, dict) or "node_id" not in health:
        return fail(name, f"{host}:{port} is taken by something that is not an agent")
    said = f"{host}:{port} is held by a running agent (node {health['node_id']})"
    can_cap = health.get("can_cap")
    if can_cap is False:
        why = health.get("can_cap_reason") or "NVML refused a limit"
        return fail(name, f"{said}, which may not set limits: {why}", can_cap=False)
    if can_cap is None:
        return ok(name, f"{said}; whether it may set limits shows at its first cap", can_cap=None)
    return ok(name, f"{said}, which has set limits", can_cap=True)


def http_get(url: str, *, verify: bool = True) -> tuple[int, Message, bytes]:
    """GET `url`: its status, headers and body, whatever the status (an HTTP error is an
    answer); OSError when nothing answers. `verify=False` for the agent on this machine: only
    its /health is read, to tell an agent from another program on its port."""
    context = ssl.create_default_context()
    if not verify:
        context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    try:
        with urllib.request.urlopen(url, timeout=HTTP_TIMEOUT_S, context=context) as answer:
            return answer.status, answer.headers, answer.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers, exc.read()
