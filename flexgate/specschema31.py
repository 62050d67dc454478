"""The OpenADR 3.1.0 specification's own schema, the schema of record: what a VEN sends is
checked against `openadr3.yaml` (the OpenAPI document of the grid-coordination/
openadr3-specification repository), not against flexgate's models (`gateway.openadr.oadr31`),
so the models cannot drift from the specification unnoticed.

The document is not copied into the project: it is read from `../shared/vendor/` beside the
clone (`FLEXGATE_SHARED_DIR` names another `shared` folder). `load()` is None where it, PyYAML
or openapi-schema-validator (test extras) is missing: the mock VTN then checks with the models
alone, and the tests that need the schema skip, saying why (`why_unavailable`).
"""

from __future__ import annotations

import functools
import importlib.util
import os
from pathlib import Path
from typing import Any

#: Names another `shared` folder than the one beside the clone (a git worktree has none).
SHARED_ENV = "FLEXGATE_SHARED_DIR"
SPEC = Path("vendor/openadr3-specification/3.1.0/openadr3.yaml")
REPO_ROOT = Path(__file__).resolve().parent.parent


def shared_dir() -> Path:
    """`../shared` beside the clone, or the folder FLEXGATE_SHARED_DIR names."""
    return Path(os.environ.get(SHARED_ENV) or REPO_ROOT.parent / "shared")


def spec_path() -> Path:
    return shared_dir() / SPEC


class SpecSchema:
    """The document's component schemas, each a validator (OpenAPI 3.0 dialect: `nullable`)."""

    def __init__(self, document: dict[str, Any]) -> None:
        from openapi_schema_validator import OAS30Validator, oas30_format_checker

        self.components = document["components"]
        self._validators = {
            name: OAS30Validator(
                {"$ref": f"#/components/schemas/{name}", "components": self.components},
                format_checker=oas30_format_checker,
            )
            for name in self.components["schemas"]
        }

    def problems(self, name: str, obj: Any) -> list[str]:
        """Why `obj` is not a `name` (components/schemas) of the specification: each error
        where it is, then what; empty when it is one."""
        validator = self._validators[name]
        found = sorted(validator.iter_errors(obj), key=lambda e: list(e.absolute_path))
        return [f"{'.'.join(str(p) for p in e.absolute_path) or name}: {e.message}" for e in found]

    def check(self, name: str, obj: Any) -> str | None:
        """The first reason `obj` is not a `name`, or None."""
        found = self.problems(name, obj)
        return found[0] if found else None


def why_unavailable() -> str | None:
    """Why the schema cannot be used here, or None."""
    if not spec_path().exists():
        return f"the OpenADR 3.1.0 specification is not at {spec_path()} (../shared absent)"
    for module in ("openapi_schema_validator", "yaml"):
        if importlib.util.find_spec(module) is None:
            return f"{module} is not installed (pip install -e '.[test]')"
    return None


@functools.cache
def load() -> SpecSchema | None:
    """The specification's schema, or None where it cannot be read (`why_unavailable`)."""
    if why_unavailable() is not None:
        return None
    import yaml  # type: ignore[import-untyped]

    return SpecSchema(yaml.safe_load(spec_path().read_text()))
