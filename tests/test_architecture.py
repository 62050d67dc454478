"""The one-way imports of ARCHITECTURE.md, checked on the source (no import needed).

- flexmodel: numpy and scipy and the pure parts of the standard library; nothing of ours, no
  framework, no clock, no environment, no I/O.
- agents: may import flexmodel; never gateway.
- gateway: flexmodel, and of agents only agents.protocol (the wire schemas).
- inside gateway: api -> services -> store, never back.
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
GATEWAY_LAYERS = ("api", "services", "store")  # each may import only those after it


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
        return layer_rule(name, imported)
    return None


def layer_rule(name: str, imported: str) -> str | None:
    def layer(module: str) -> int | None:
        parts = module.split(".")
        if len(parts) > 1 and parts[0] == "gateway" and parts[1] in GATEWAY_LAYERS:
            return GATEWAY_LAYERS.index(parts[1])
        return None

    mine, theirs = layer(name), layer(imported)
    if mine is not None and theirs is not None and theirs < mine:
        return f"gateway layers go {' -> '.join(GATEWAY_LAYERS)}, never back"
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
        ("gateway", "gateway.x", "agents.protocol", None),
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
