"""The rules the gateway's and the agent's settings share: what a bearer token must be, each
node's own token, and which `FLEXGATE_*` variables either program knows
(docs/configuration.md, "Unknown variables").

Part of the agent's protocol (`agents.protocol`, which the gateway reads them from), kept
apart for size: both programs read one environment, so each must know the other's namespace.
"""

from __future__ import annotations

import difflib
import hashlib
import hmac
from collections.abc import Callable, Iterable, Mapping

#: Bearer tokens: at least this long, and never a placeholder (outside the lab).
MIN_TOKEN_CHARS = 16
PLACEHOLDER_TOKENS = frozenset(
    {
        "",
        "changeme",
        "change-me",
        "changethis",
        "secret",
        "token",
        "password",
        "admin",
        "test",
        "lab",
        "placeholder",
        "flexgate",
    }
)
LAB_TOKEN = "lab-agent-token"


def node_token(site_secret: str, node_id: str) -> str:
    """A node's own agent token, derived from the site's secret (FLEXGATE_NODE_TOKEN_SECRET,
    on the gateway only) and its node id: a node's token opens that node and no other, so one
    node's disclosed token does not cap the site. `flexgate agent-token NODE` prints it."""
    message = f"flexgate-agent-token:{node_id}".encode()
    return hmac.new(site_secret.encode(), message, hashlib.sha256).hexdigest()


# --- the environment both programs read ---------------------------------------------------------

SETTINGS_PREFIX = "FLEXGATE_"
#: The agent's settings are `FLEXGATE_AGENT_*` (and FLEXGATE_LAB); every other name is the
#: gateway's. A gateway and its agents often share one environment (a compose file, one env
#: file): each program checks its own names exactly and leaves the other's namespace alone.
AGENT_NAMESPACE = "FLEXGATE_AGENT_"
#: Lists more `FLEXGATE_*` names, comma-separated, that are meant for another program.
IGNORE_VARIABLES = "FLEXGATE_IGNORE_VARIABLES"
#: `FLEXGATE_*` names that are not settings of either program: the test suite's switches, the
#: compose lab's and image build's inputs, the Slurm notify hook's configuration.
NOT_SETTINGS = frozenset(
    {
        IGNORE_VARIABLES,
        "FLEXGATE_BUILD_CA",  # the image build's CA bundle (flexgate lab --compose, .ci/run)
        "FLEXGATE_COMPOSE_PORT",  # docker-compose.yml's published port
        "FLEXGATE_RECOVERY_REPORT",  # `make reliability`: where the tests write their timings
        "FLEXGATE_URL",  # scripts/slurm/flexgate-notify
        "FLEXGATE_TOKEN_FILE",  # scripts/slurm/flexgate-notify
        "FLEXGATE_NOTIFY_CONF",  # scripts/slurm/flexgate-notify
        "FLEXGATE_NOTIFY_TIMEOUT_S",  # scripts/slurm/flexgate-notify
    }
)
#: Prefixes of the test suite's switches (FLEXGATE_REQUIRE_NATS=1, FLEXGATE_TEST_POSTGRES_URL).
NOT_SETTINGS_PREFIXES = ("FLEXGATE_REQUIRE_", "FLEXGATE_TEST_")


def unknown_variables(
    environ: Mapping[str, str],
    known: Iterable[str],
    *,
    foreign: Callable[[str], bool] = lambda name: False,
) -> str | None:
    """Why the environment is refused, in one line, or None: every `FLEXGATE_*` name must be
    `known` (setting names, any case), listed as not a setting, or `foreign` (another program's
    namespace, checked there). A misspelt setting is otherwise silently ignored and its default
    used: SQLite for PostgreSQL, the estimate for a meter."""
    names = {f"{SETTINGS_PREFIX}{k.upper()}" for k in known}
    ignored = {n.strip().upper() for n in environ.get(IGNORE_VARIABLES, "").split(",") if n.strip()}
    unknown = sorted(
        name
        for name in (n.upper() for n in environ)
        if name.startswith(SETTINGS_PREFIX)
        and name not in names | NOT_SETTINGS | ignored
        and not name.startswith(NOT_SETTINGS_PREFIXES)
        and not foreign(name)
    )
    if not unknown:
        return None
    described = []
    for name in unknown:
        near = difflib.get_close_matches(name, sorted(names), n=1, cutoff=0.8)
        described.append(f"{name} (did you mean {near[0]}?)" if near else name)
    return (
        f"unknown setting{'s' if len(unknown) > 1 else ''} {', '.join(described)}: a misspelt "
        f"setting would be ignored and its default used; list a variable meant for another "
        f"program in {IGNORE_VARIABLES}"
    )
