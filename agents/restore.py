"""`flexgate agent --restore`: every GPU back to its saved original limit, once, then exit.

The agent restores on its own when it stops (SIGTERM) and when it starts again; this one-shot
is for a node whose agent was killed and is not coming back before anyone restarts it: a unit's
`ExecStopPost=` (deploy/systemd/flexgate-agent.service), which systemd runs after every stop,
whether the agent exited cleanly (the state file is then empty: nothing to do), crashed or was
killed, or an operator's hand. It reads the same state directory as the agent (the node id's
folder under `FLEXGATE_AGENT_STATE_DIR`) and changes nothing it did not save.

It refuses to run while an agent answers on the agent's port: two writers of one GPU's limit
would undo each other (ask the running agent instead: `DELETE /v1/caps`).
"""

from __future__ import annotations

import socket
from pathlib import Path

from agents.backend import GpuBackend
from agents.caps import CapController
from agents.errors import AgentError, InvalidSetupError
from agents.protocol import CapResult
from agents.settings import AgentSettings
from agents.simulated import SimulatedBackend
from agents.state import OriginalLimits

REASON = "restored by `flexgate agent --restore`"


class RestoreFailedError(AgentError):
    """A GPU could not be given its original limit back (lost, no permission): its entry
    stays in the state directory for the agent's next start."""


def restore_saved_limits(backend: GpuBackend, state_dir: Path, node_id: str) -> list[CapResult]:
    """Each GPU the state directory lists back to its original limit (restored ones are
    forgotten there; one that failed stays listed, for the agent's next start)."""
    controller = CapController(backend, OriginalLimits(state_dir), node_id=node_id)
    return controller.restore_all(reason=REASON)


def agent_listening(host: str, port: int) -> bool:
    """Whether something accepts connections on the agent's address (an agent is running)."""
    address = "127.0.0.1" if host in ("0.0.0.0", "") else "::1" if host == "::" else host
    try:
        with socket.create_connection((address, port), timeout=1.0):
            return True
    except OSError:
        return False


def run_restore(settings: AgentSettings, backend: GpuBackend | None = None) -> list[str]:
    """Restore this node's GPUs: one line for each GPU. `InvalidSetupError` when an agent is
    running (nothing changed), `RestoreFailedError` when a GPU's restore failed (the message
    has every GPU's line)."""
    if agent_listening(settings.agent_host, settings.agent_port):
        raise InvalidSetupError(
            f"--restore: an agent answers on {settings.agent_host}:{settings.agent_port}; it "
            "restores its GPUs itself when it stops (or now: DELETE /v1/caps); nothing changed"
        )
    if backend is None:
        backend = open_backend(settings)
    try:
        results = restore_saved_limits(
            backend, settings.agent_state_dir / settings.agent_node_id, settings.agent_node_id
        )
    finally:
        backend.close()
    lines = [describe(result) for result in results] or [
        f"{settings.agent_node_id}: nothing to restore (no GPU left capped)"
    ]
    if any(result.error for result in results):
        raise RestoreFailedError("; ".join(lines))
    return lines


def open_backend(settings: AgentSettings) -> GpuBackend:
    if settings.agent_backend == "nvml":
        from agents.run import open_nvml

        return open_nvml()
    return SimulatedBackend(settings.agent_gpus, node_id=settings.agent_node_id)


def describe(result: CapResult) -> str:
    if result.error:
        return f"GPU {result.gpu}: not restored ({result.error})"
    return f"GPU {result.gpu}: restored to {result.enforced_w:g} W"
