"""Building flexgate's images: the one for every service (Dockerfile), PostgreSQL's
(docker/postgres/) and the agent's alone (docker/agent.Dockerfile).

pip inside a build must trust PyPI's certificate. Behind a TLS-intercepting proxy, common in
data centres, only the proxy's CA makes that possible: the host's CA bundle (which trusts it)
is copied into docker/build-ca/, which only the build stages read. `FLEXGATE_BUILD_CA` names
the bundle; unset, the host's own is used where one of `HOST_CA_BUNDLES` exists; set empty,
none is. A build that cannot reach or verify PyPI fails with one line naming the variable
(`PypiUnreachableError`), not pages of pip's retries.

Errors: `ComposeError` (flexgate.lab.compose's, raised through `run`) and its subclass
`PypiUnreachableError`.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
IMAGE = "flexgate:latest"
POSTGRES_IMAGE = "flexgate-postgres:15"
AGENT_IMAGE = "flexgate-agent:latest"
AGENT_DOCKERFILE = ROOT / "docker" / "agent.Dockerfile"
#: Where the Dockerfiles' build stage looks for a TLS-intercepting network's CA bundle.
BUILD_CA = ROOT / "docker" / "build-ca" / "ca-certificates.crt"
#: The host's CA bundle, where distributions keep it: Debian and Ubuntu, Fedora and RHEL,
#: Alpine and macOS.
HOST_CA_BUNDLES = (
    Path("/etc/ssl/certs/ca-certificates.crt"),
    Path("/etc/pki/tls/certs/ca-bundle.crt"),
    Path("/etc/ssl/cert.pem"),
)
#: What pip prints when it cannot verify PyPI's certificate, and when it cannot reach it.
UNVERIFIED = ("CERTIFICATE_VERIFY_FAILED", "problem confirming the ssl certificate")
UNREACHED = (
    "Could not fetch URL",
    "Failed to establish a new connection",
    "Temporary failure in name resolution",
    "No matching distribution found",
)


class ComposeError(RuntimeError):
    """A docker or docker-compose command failed, or a service never became healthy."""


class PypiUnreachableError(ComposeError):
    """pip inside an image build could not reach or verify PyPI."""


def run(command: list[str], *, timeout_s: float, env: dict[str, str] | None = None) -> str:
    """Run a docker or docker-compose command; its stdout, or ComposeError with its stderr."""
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=timeout_s, env=env, check=False
        )
    except subprocess.TimeoutExpired as exc:
        raise ComposeError(f"`{' '.join(command)}` took over {timeout_s:g} s") from exc
    except FileNotFoundError as exc:
        raise ComposeError(f"{command[0]} is not installed") from exc
    if done.returncode != 0:
        raise ComposeError(
            f"`{' '.join(command)}` failed ({done.returncode}): {done.stderr.strip()[-2000:]}"
        )
    return done.stdout


def chosen_build_ca(environ: Mapping[str, str] = os.environ) -> Path | None:
    """The CA bundle the builds trust: FLEXGATE_BUILD_CA's, else the host's, else none."""
    named = environ.get("FLEXGATE_BUILD_CA")
    if named is not None:
        if not named:
            return None
        if not Path(named).is_file():
            raise ComposeError(f"FLEXGATE_BUILD_CA={named}: no such file")
        return Path(named)
    return next((bundle for bundle in HOST_CA_BUNDLES if bundle.is_file()), None)


def place_build_ca(source: Path | None) -> None:
    """Put the bundle where the build stages read it (or none there), rewriting only changes:
    an unchanged bundle keeps Docker's layer cache."""
    if source is None:
        BUILD_CA.unlink(missing_ok=True)
    elif not BUILD_CA.exists() or BUILD_CA.read_bytes() != source.read_bytes():
        shutil.copyfile(source, BUILD_CA)


def pypi_failure(output: str, bundle: Path | None) -> str | None:
    """One line naming FLEXGATE_BUILD_CA when pip's output says PyPI was not verified or not
    reached; None for any other failure."""
    trusted = f"it trusted {bundle}" if bundle else "it trusted no bundle"
    if any(mark in output for mark in UNVERIFIED):
        return (
            f"the image build cannot verify PyPI's certificate ({trusted}): set "
            "FLEXGATE_BUILD_CA to the CA bundle that trusts your network's TLS proxy"
        )
    if any(mark in output for mark in UNREACHED):
        return (
            f"the image build cannot reach PyPI ({trusted}): check the build's network, or set "
            "FLEXGATE_BUILD_CA to the CA bundle that trusts your network's TLS proxy"
        )
    return None


def build(tag: str, context: Path, dockerfile: Path | None = None) -> None:
    bundle = chosen_build_ca()
    place_build_ca(bundle)
    command = ["docker", "build", "--quiet", "--force-rm", "-t", tag]
    command += ["-f", str(dockerfile)] if dockerfile else []
    try:
        run([*command, str(context)], timeout_s=900)
    except ComposeError as exc:
        line = pypi_failure(str(exc), bundle)
        if line is None:
            raise
        raise PypiUnreachableError(line) from None


def build_images(*, postgres: bool = False) -> None:
    """Build flexgate's image (and PostgreSQL's). The bases (python:3.11-slim,
    debian:bookworm-slim) are pulled as usual, or made offline by
    scripts/local-base-image.sh beforehand."""
    build(IMAGE, ROOT)
    if postgres:
        build(POSTGRES_IMAGE, ROOT / "docker" / "postgres")


def build_agent_image() -> None:
    """The agent alone (`flexgate[agent]`), sharing its first layers with flexgate's image."""
    build(AGENT_IMAGE, ROOT, AGENT_DOCKERFILE)
