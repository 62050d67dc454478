"""The image builds behind a TLS-intercepting proxy, without Docker or a network: the host's CA
bundle is the default, and pip's own failure to verify (or reach) PyPI becomes one line naming
FLEXGATE_BUILD_CA."""

from __future__ import annotations

import subprocess
import sys

import pytest

from flexgate import imagebuild
from flexgate.imagebuild import ComposeError, chosen_build_ca, place_build_ca, pypi_failure


def test_the_hosts_bundle_is_the_default_where_one_exists(tmp_path, monkeypatch):
    debian, rhel = tmp_path / "ca-certificates.crt", tmp_path / "ca-bundle.crt"
    monkeypatch.setattr(imagebuild, "HOST_CA_BUNDLES", (debian, rhel))
    assert chosen_build_ca({}) is None
    rhel.write_text("-----BEGIN CERTIFICATE-----\n")
    assert chosen_build_ca({}) == rhel
    debian.write_text("-----BEGIN CERTIFICATE-----\n")
    assert chosen_build_ca({}) == debian
    named = tmp_path / "proxy-ca.pem"
    named.write_text("-----BEGIN CERTIFICATE-----\n")
    assert chosen_build_ca({"FLEXGATE_BUILD_CA": str(named)}) == named
    assert chosen_build_ca({"FLEXGATE_BUILD_CA": ""}) is None  # set empty: no bundle
    with pytest.raises(ComposeError, match=r"FLEXGATE_BUILD_CA=/nonexistent/ca\.crt: no such"):
        chosen_build_ca({"FLEXGATE_BUILD_CA": "/nonexistent/ca.crt"})


def test_the_bundle_is_placed_for_the_build_stage_and_removed_when_none(tmp_path, monkeypatch):
    placed = tmp_path / "build-ca" / "ca-certificates.crt"
    placed.parent.mkdir()
    monkeypatch.setattr(imagebuild, "BUILD_CA", placed)
    bundle = tmp_path / "host.crt"
    bundle.write_text("host bundle\n")
    place_build_ca(bundle)
    assert placed.read_text() == "host bundle\n"
    place_build_ca(None)
    assert not placed.exists()


def test_pip_failing_to_verify_pypi_becomes_one_line_naming_the_variable(tmp_path):
    """pip itself, trusting a CA that signed nothing PyPI serves (as a build behind a proxy
    trusts the public CAs only); without a network it cannot reach PyPI instead: one line
    either way."""
    bogus = tmp_path / "bogus-ca.crt"
    openssl = [
        "openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
        "-subj", "/CN=not-the-proxy", "-keyout", str(tmp_path / "k"), "-out", str(bogus),
    ]  # fmt: skip
    subprocess.run(openssl, check=True, capture_output=True)
    download = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--dest", str(tmp_path),
        "--index-url", "https://pypi.org/simple", "--cert", str(bogus),
        "--retries", "0", "--timeout", "10", "--no-cache-dir", "flexgate-no-such-thing",
    ]  # fmt: skip
    pip = subprocess.run(
        download,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PIP_CONFIG_FILE": "/dev/null", "PATH": "/usr/bin:/bin"},
        check=False,
    )
    assert pip.returncode != 0
    line = pypi_failure(pip.stdout + pip.stderr, bogus)
    assert line is not None, pip.stderr
    assert "FLEXGATE_BUILD_CA" in line
    assert "\n" not in line
    assert str(bogus) in line


def test_any_other_build_failure_is_not_blamed_on_pypi():
    output = "COPY failed: file not found in build context: stat flexmodel: no such file"
    assert pypi_failure(output, None) is None
