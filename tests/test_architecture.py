"""The one-way imports of docs/architecture.md, checked on the source (no import needed).

- flexmodel: numpy and scipy and the pure parts of the standard library; nothing of ours, no
  framework, no clock, no environment, no I/O.
- agents: may import flexmodel; never gateway.
- gateway: flexmodel, and of agents only agents.protocol (the wire schemas).
- inside gateway every module belongs to a named layer, and imports only its own layer and
  those below it: root (app, run) -> api -> grid protocol (openadr) -> services -> settings
  -> outside world (the agent client, the meter, the job source) -> store -> base (clock, retries,
  errors). Routes call services, never the store.
- in gateway, only the grid-protocol package imports openleadr and paho (MQTT), and only it
  and the outside-world parts (agent client, meter) import aiohttp; only the outside world
  imports the Kubernetes client and nats.
- flexgate (the CLI, the composition root) may import all three; nothing imports it.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

PACKAGES = ("flexmodel", "agents", "gateway", "flexgate")
#: Standard-library modules that read a clock, the environment or the outside world.
IMPURE_STDLIB = {
    "time",
    "datetime",
    "os",
    "sys",
    "io",
    "pathlib",
    "socket",
    "subprocess",
    "asyncio",
    "threading",
    "multiprocessing",
    "logging",
    "random",
    "urllib",
    "http",
    "shutil",
    "tempfile",
}
FLEXMODEL_THIRD_PARTY = {"numpy", "scipy"}
#: The gateway's layers, top first: a module may import its own layer and those after it.
GATEWAY_LAYERS = {
    "root": ("gateway.app", "gateway.run"),
    "api": ("gateway.api",),
    "grid protocol": ("gateway.openadr",),
    "services": ("gateway.services",),
    "settings": ("gateway.settings", "gateway.settingsfiles", "gateway.settingsgroups"),
    "outside world": ("gateway.agentclient", "gateway.meter", "gateway.jobsource"),
    "store": ("gateway.store",),
    "base": ("gateway.clock", "gateway.retries", "gateway.errors", "gateway.units", "gateway"),
}
LAYER_ORDER = list(GATEWAY_LAYERS)
#: Third-party packages only some gateway layers may import.
GATEWAY_ONLY_IN = {
    "openleadr": {"grid protocol"},
    "aiohttp": {"grid protocol", "outside world"},
    "kubernetes": {"outside world"},
    "paho": {"grid protocol"},
    "nats": {"outside world"},
}


def imports_of(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative import: resolve against the module's package
                package = path.relative_to(ROOT).parent.parts
                base = ".".join(package[: len(package) - node.level + 1])
                found.add(f"{base}.{node.module}" if node.module else base)
            elif node.module:
                found.add(node.module)
                found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def modules(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


def module_name(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts)


def violations() -> list[str]:
    found = []
    for package in PACKAGES:
        for path in modules(package):
            name = module_name(path)
            for imported in imports_of(path):
                top = imported.split(".")[0]
                problem = rule(package, name, imported, top)
                if problem:
                    found.append(f"{name} imports {imported}: {problem}")
    return found


def rule(package: str, name: str, imported: str, top: str) -> str | None:
    if top == "flexgate" and package != "flexgate":
        return "nothing imports the flexgate composition root"
    if package == "flexmodel":
        if top in IMPURE_STDLIB:
            return "flexmodel reads no clock, environment or outside world"
        if top not in sys.stdlib_module_names and top not in FLEXMODEL_THIRD_PARTY | {"flexmodel"}:
            return "flexmodel imports only numpy, scipy and the standard library"
    if package == "agents" and top == "gateway":
        return "agents never import gateway"
    if package == "gateway" and top == "agents" and not imported.startswith("agents.protocol"):
        return "gateway imports only agents.protocol of agents"
    if package == "gateway":
        return layer_rule(name, imported, top)
    return None


def layer_of(module: str) -> str | None:
    """The gateway layer a module belongs to (the longest matching prefix), or None."""
    best: tuple[int, str] | None = None
    for layer, prefixes in GATEWAY_LAYERS.items():
        for prefix in prefixes:
            inside = module == prefix or module.startswith(f"{prefix}.")
            if inside and (best is None or len(prefix) > best[0]):
                best = (len(prefix), layer)
    return None if best is None else best[1]


def layer_rule(name: str, imported: str, top: str) -> str | None:
    mine = layer_of(name)
    if mine is None or (mine == "base" and name not in GATEWAY_LAYERS["base"]):
        return f"{name} belongs to no gateway layer"
    if top in GATEWAY_ONLY_IN and mine not in GATEWAY_ONLY_IN[top]:
        return f"in gateway only the {' and '.join(sorted(GATEWAY_ONLY_IN[top]))} import {top}"
    if top != "gateway":
        return None
    theirs = layer_of(imported)
    if mine == "api" and theirs == "store":
        return "routes call services, never the store"
    if theirs is not None and LAYER_ORDER.index(theirs) < LAYER_ORDER.index(mine):
        return f"gateway layers go {' -> '.join(LAYER_ORDER)}, never back"
    return None


def test_imports_point_one_way():
    assert violations() == []


@pytest.mark.parametrize(
    ("package", "name", "imported", "expected"),
    [
        ("flexmodel", "flexmodel.x", "time", "no clock"),
        ("flexmodel", "flexmodel.x", "pydantic", "only numpy"),
        ("flexmodel", "flexmodel.x", "gateway.api", "only numpy"),
        ("agents", "agents.x", "gateway.store", "never import gateway"),
        ("gateway", "gateway.x", "agents.service", "only agents.protocol"),
        ("gateway", "gateway.store.db", "gateway.api.routes", "never back"),
        ("gateway", "gateway.api.routes.jobs", "gateway.store.repo", "never the store"),
        ("gateway", "gateway.services.events", "gateway.openadr.ven", "never back"),
        ("gateway", "gateway.services.fleet", "aiohttp", "only the"),
        ("gateway", "gateway.services.events", "openleadr", "only the grid protocol"),
        ("gateway", "gateway.agentclient.http", "aiohttp", None),
        ("gateway", "gateway.openadr.ven", "gateway.services.events", None),
        ("gateway", "gateway.dashboard", "fastapi", "belongs to no gateway layer"),
        ("gateway", "gateway.services.fleet", "agents.protocol", None),
        ("gateway", "gateway.jobsource.slurm", "gateway.services.jobbook", "never back"),
        ("gateway", "gateway.services.jobfeed", "gateway.jobsource", None),
        ("gateway", "gateway.services.jobfeed", "kubernetes", "only the outside world"),
        ("gateway", "gateway.jobsource.kubernetes", "kubernetes", None),
        ("flexmodel", "flexmodel.x", "numpy.typing", None),
        ("gateway", "gateway.x", "flexgate.cli", "nothing imports"),
        ("flexgate", "flexgate.cli", "agents.service", None),
    ],
)
def test_the_rules_catch_what_they_should(package, name, imported, expected):
    problem = rule(package, name, imported, imported.split(".")[0])
    assert (problem is None) if expected is None else (expected in problem)


def test_flexmodel_decodes_json_in_its_job_mix_reader_only():
    decoders = [module_name(p) for p in modules("flexmodel") if "json" in imports_of(p)]
    assert decoders == ["flexmodel.jobmix"]


def test_job_mix_text_goes_through_the_one_reader():
    """A decoder of its own would accept NaN and Infinity (Python's json does)."""
    own = [
        module_name(path)
        for package in (*PACKAGES, "bench")
        for path in modules(package)
        if "parse_job_mix(json." in path.read_text(encoding="utf-8")
    ]
    assert own == []
