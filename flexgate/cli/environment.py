"""The services' settings as the commands read them: unknown `FLEXGATE_*` names refused, a
refused setting said in one line (the agent, the gateway, the lab and the doctor share these)."""

from __future__ import annotations

from typing import Any

from flexgate.cli.readers import BadInputError


def refuse_unknown_environment() -> None:
    """Every `FLEXGATE_*` variable must be a setting of the gateway or the agent (they often
    share one environment), or listed as not a setting: each program alone knows only its own
    names, so a misspelt agent prefix (FLEXGATE_AGNET_BACKEND) is caught here. Where only the
    agent is installed (`flexgate[agent]`: a GPU node) the gateway's names cannot be read, so
    only the agent's own namespace is judged."""
    import os

    from agents.protocol import AGENT_NAMESPACE, unknown_variables
    from agents.settings import AgentSettings

    known = [*AgentSettings.model_fields]
    try:
        from gateway.settings import GatewaySettings
    except ImportError:  # the gateway's extra is not installed

        def foreign(name: str) -> bool:
            return not name.startswith(AGENT_NAMESPACE)

        problem = unknown_variables(os.environ, known, foreign=foreign)
    else:
        problem = unknown_variables(os.environ, [*GatewaySettings.model_fields, *known])
    if problem:
        raise BadInputError(problem)


def first_error(exc: Any) -> str:
    """A settings class's `ValidationError` as one line: its first error, where it is."""
    error = exc.errors()[0]
    where = ".".join(str(p) for p in error.get("loc", ()) if p != "__root__")
    message = str(error.get("msg", exc)).removeprefix("Value error, ")
    return f"{where}: {message}" if where else message
