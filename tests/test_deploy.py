"""The deployment artefacts of deploy/ (docs/deploy.md), checked as far as this machine can:
the systemd units by `systemd-analyze verify`, the Kubernetes manifests against Kubernetes'
own schemas (`kubernetes-validate`, offline), and every setting they and the env-file templates
name loaded by the settings classes, which refuse what a site would get wrong."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import kubernetes_validate
import pytest
import yaml
from fastapi import FastAPI, Request

from agents.protocol import unknown_variables
from agents.settings import AgentSettings
from flexgate.cli.parser import build_parser
from flexgate.doctor.node import agent_settings
from flexgate.serve import ServerThread, free_port
from gateway.settings import GatewaySettings
from tests.conftest import ROOT, wait_for

DEPLOY = ROOT / "deploy"
UNITS = DEPLOY / "systemd"
MANIFESTS = DEPLOY / "kubernetes"
INSTALLED_FLEXGATE = "/opt/flexgate/bin/flexgate"
#: The flexgate of the interpreter running the tests: what verify finds at ExecStart.
HERE_FLEXGATE = str(Path(sys.executable).parent / "flexgate")
SECRET = "deploy-test-secret-0123456789abcdef"


def unit_folder(tmp_path: Path, *, flexgate: str = HERE_FLEXGATE) -> Path:
    """The units and the agent's non-root drop-in, their programs at `flexgate`."""
    folder = tmp_path / "units"
    (folder / "flexgate-agent.service.d").mkdir(parents=True)
    for unit in UNITS.glob("*.service"):
        text = unit.read_text(encoding="utf-8").replace(INSTALLED_FLEXGATE, flexgate)
        (folder / unit.name).write_text(text, encoding="utf-8")
    shutil.copy(UNITS / "flexgate-agent-nonroot.conf", folder / "flexgate-agent.service.d")
    return folder


def verify(folder: Path) -> subprocess.CompletedProcess[str]:
    systemd_analyze = shutil.which("systemd-analyze")
    if systemd_analyze is None:
        pytest.skip("systemd-analyze is not installed (Debian's systemd package has it)")
    units = sorted(p.name for p in folder.glob("*.service"))
    return subprocess.run(
        [systemd_analyze, "verify", "--man=no", *units],
        cwd=folder,
        env={**os.environ, "SYSTEMD_UNIT_PATH": f"{folder}:"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_the_systemd_units_pass_verification_without_a_warning(tmp_path):
    done = verify(unit_folder(tmp_path))
    # An unknown or misspelt key is only a warning (exit 0): none is allowed either.
    assert (done.returncode, done.stderr) == (0, "")


def test_verification_catches_a_unit_whose_program_is_missing(tmp_path):
    done = verify(unit_folder(tmp_path, flexgate="/nonexistent/flexgate"))
    assert done.returncode != 0
    assert "/nonexistent/flexgate" in done.stderr


def unit_commands(name: str) -> dict[str, list[str]]:
    text = (UNITS / name).read_text(encoding="utf-8")
    return {
        key: shlex.split(value)
        for key, value in re.findall(r"^(Exec\w+)=(.+)$", text, flags=re.MULTILINE)
    }


def test_the_agent_unit_restores_after_every_stop_and_keeps_its_state():
    commands = unit_commands("flexgate-agent.service")
    parser = build_parser()
    serve = parser.parse_args(commands["ExecStart"][1:])
    restore = parser.parse_args(commands["ExecStopPost"][1:])
    assert (serve.name, serve.backend, serve.restore) == ("agent", "nvml", False)
    assert (restore.name, restore.backend, restore.restore) == ("agent", "nvml", True)
    text = (UNITS / "flexgate-agent.service").read_text(encoding="utf-8")
    assert "StateDirectory=flexgate-agent" in text
    assert "Environment=FLEXGATE_AGENT_STATE_DIR=%S/flexgate-agent" in text
    assert "Restart=on-failure" in text
    nonroot = (UNITS / "flexgate-agent-nonroot.conf").read_text(encoding="utf-8")
    assert "AmbientCapabilities=CAP_SYS_ADMIN" in nonroot
    gateway = parser.parse_args(unit_commands("flexgate-gateway.service")["ExecStart"][1:])
    assert gateway.name == "gateway"


def manifests() -> list[tuple[str, dict]]:
    return [
        (f"{path.name}:{doc['kind']}/{doc['metadata']['name']}", doc)
        for path in sorted(MANIFESTS.glob("*.yaml"))
        for doc in yaml.safe_load_all(path.read_text(encoding="utf-8"))
        if doc
    ]


@pytest.mark.parametrize(("name", "doc"), manifests(), ids=[n for n, _ in manifests()])
def test_each_manifest_passes_kubernetes_schemas(name, doc):
    kubernetes_validate.validate(doc, kubernetes_validate.latest_version(), strict=True)


def test_a_misspelt_field_fails_the_schemas():
    (doc,) = [d for n, d in manifests() if n.endswith("DaemonSet/flexgate-agent")]
    pod = doc["spec"]["template"]["spec"]
    pod["nodeSelecter"] = pod.pop("nodeSelector")
    with pytest.raises(kubernetes_validate.ValidationError, match="nodeSelecter"):
        kubernetes_validate.validate(doc, kubernetes_validate.latest_version(), strict=True)


def one(kind: str, name: str) -> dict:
    (doc,) = [d for n, d in manifests() if n.endswith(f"{kind}/{name}")]
    return doc


def test_the_agent_runs_on_gpu_nodes_only_with_nvml_and_the_kubelets_socket_read_only():
    pod = one("DaemonSet", "flexgate-agent")["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert pod["runtimeClassName"] == "nvidia"
    (agent,) = pod["containers"]
    env = {e["name"]: e.get("value") for e in agent["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert "nvidia.com/gpu" not in str(agent["resources"])  # it takes no GPU from the jobs
    assert agent["securityContext"]["capabilities"]["add"] == ["SYS_ADMIN"]
    mounts = {m["name"]: m for m in agent["volumeMounts"]}
    hosts = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
    assert hosts["pod-resources"] == "/var/lib/kubelet/pod-resources"
    assert mounts["pod-resources"]["readOnly"] is True
    socket = Path(env["FLEXGATE_AGENT_PODRESOURCES_SOCKET"])
    assert socket.parent == Path(mounts["pod-resources"]["mountPath"])
    # The originals outlive the pod: a host folder, where the state directory is.
    assert hosts["state"] == env["FLEXGATE_AGENT_STATE_DIR"] == mounts["state"]["mountPath"]
    assert agent["readinessProbe"]["httpGet"]["path"] == "/health"


def test_the_daemonsets_settings_load_as_the_agents(monkeypatch, tmp_path):
    (agent,) = one("DaemonSet", "flexgate-agent")["spec"]["template"]["spec"]["containers"]
    values = {e["name"]: e.get("value") for e in agent["env"] if e["name"].startswith("FLEXGATE_")}
    values |= {"FLEXGATE_AGENT_NODE_ID": "gpu-node-01", "FLEXGATE_AGENT_TOKEN": SECRET}
    assert set(values) == {name for name in values if name.startswith("FLEXGATE_AGENT_")}
    for name, value in values.items():
        monkeypatch.setenv(name, value)
    loaded = AgentSettings(agent_backend=agent["args"][agent["args"].index("--backend") + 1])
    assert (loaded.agent_host, loaded.agent_port) == ("0.0.0.0", 9100)


def agent_environments() -> dict[str, dict[str, str]]:
    """The agent's environment as the DaemonSet and the node's env file give it."""
    (agent,) = one("DaemonSet", "flexgate-agent")["spec"]["template"]["spec"]["containers"]
    pod = {e["name"]: e["value"] for e in agent["env"] if "value" in e}
    node, _ = env_file(DEPLOY / "agent.env.example")
    return {"DaemonSet": pod, "agent.env.example": node}


@pytest.mark.parametrize("where", ["DaemonSet", "agent.env.example"])
def test_the_doctor_reads_the_backend_the_agent_runs_on(monkeypatch, where):
    """`flexgate doctor --node` reads the environment alone (the agent's --backend is not
    its): the page's commands must see nvml there, not fail the settings for no backend."""
    for name in [n for n in os.environ if n.startswith("FLEXGATE_")]:
        monkeypatch.delenv(name)
    for name, value in agent_environments()[where].items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("FLEXGATE_AGENT_TOKEN", SECRET)
    settings, check = agent_settings({})
    assert (check.status, settings.agent_backend) == ("ok", "nvml"), check.detail


def service_link_variables(service: dict) -> dict[str, str]:
    """The variables Kubernetes gives every pod of the namespace for `service` (its service
    links, on unless the pod says `enableServiceLinks: false`)."""
    prefix = service["metadata"]["name"].upper().replace("-", "_")
    address = "10.96.0.10"
    names = {f"{prefix}_SERVICE_HOST": address}
    for port in service["spec"]["ports"]:
        number, protocol = port["port"], port.get("protocol", "TCP")
        link = f"{prefix}_PORT_{number}_{protocol}"
        names |= {
            f"{prefix}_SERVICE_PORT": str(number),
            f"{prefix}_SERVICE_PORT_{port['name'].upper().replace('-', '_')}": str(number),
            f"{prefix}_PORT": f"{protocol.lower()}://{address}:{number}",
            link: f"{protocol.lower()}://{address}:{number}",
            f"{link}_PROTO": protocol.lower(),
            f"{link}_PORT": str(number),
            f"{link}_ADDR": address,
        }
    return names


@pytest.mark.parametrize("workload", ["Deployment/flexgate-gateway", "DaemonSet/flexgate-agent"])
def test_no_service_link_variable_reaches_a_program_that_refuses_unknown_settings(workload):
    """A Service named flexgate-* would hand every pod in the namespace FLEXGATE_*_SERVICE_HOST
    and kin, which flexgate refuses as unknown settings: the gateway would never start."""
    kind, name = workload.split("/")
    pod = one(kind, name)["spec"]["template"]["spec"]
    services = [doc for n, doc in manifests() if ":Service/" in n]
    assert services  # the gateway's
    injected: dict[str, str] = {}
    if pod.get("enableServiceLinks", True):
        for service in services:
            injected |= service_link_variables(service)
    known = [*GatewaySettings.model_fields, *AgentSettings.model_fields]
    assert unknown_variables(injected, known) is None


def test_service_links_would_be_refused():
    (service,) = [doc for n, doc in manifests() if ":Service/" in n]
    known = [*GatewaySettings.model_fields, *AgentSettings.model_fields]
    assert "FLEXGATE_GATEWAY_SERVICE_HOST" in unknown_variables(
        service_link_variables(service), known
    )


def secret_files(tmp_path: Path) -> Path:
    folder = tmp_path / "secrets"
    folder.mkdir()
    (folder / "db-password").write_text("db-password-from-a-secret\n")
    (folder / "db-ca.crt").write_text("-----BEGIN CERTIFICATE-----\n")
    (folder / "agents.txt").write_text(one("ConfigMap", "flexgate-agents")["data"]["agents.txt"])
    return folder


def test_the_gateways_manifests_load_as_its_settings(monkeypatch, tmp_path):
    files = secret_files(tmp_path)
    data = one("ConfigMap", "flexgate-gateway")["data"]
    deployment = one("Deployment", "flexgate-gateway")["spec"]["template"]["spec"]
    (gateway,) = deployment["containers"]
    mounts = {m["name"]: m["mountPath"] for m in gateway["volumeMounts"]}
    for name, value in data.items():
        for mount in (mounts["secrets"], mounts["agents"]):
            value = value.replace(f"{mount}/", f"{files}/")
        monkeypatch.setenv(name, value)
    for secret in gateway["env"]:
        monkeypatch.setenv(secret["name"], SECRET)
    loaded = GatewaySettings()
    assert loaded.agent_urls == ["http://gpu-node-01:9100", "http://gpu-node-02:9100"]
    assert ":db-password-from-a-secret@" in loaded.database_url
    assert (loaded.job_source, loaded.openadr) == ("kubernetes", "3.1")


def env_file(path: Path) -> tuple[dict[str, str], set[str]]:
    """The template's settings (name -> value) and the optional ones it names commented out."""
    text = path.read_text(encoding="utf-8")
    values = {
        name: value.removeprefix("'").removesuffix("'")
        for name, value in re.findall(r"^(FLEXGATE_\w+)=(.*)$", text, flags=re.MULTILINE)
    }
    optional = set(re.findall(r"^#(FLEXGATE_\w+)=", text, flags=re.MULTILINE))
    return values, optional


@pytest.mark.parametrize(
    ("template", "settings"),
    [("site.env.example", GatewaySettings), ("agent.env.example", AgentSettings)],
)
def test_every_name_in_the_env_templates_is_a_documented_setting(template, settings):
    values, optional = env_file(DEPLOY / template)
    documented = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    fields = {f"FLEXGATE_{name.upper()}" for name in settings.model_fields}
    names = set(values) | optional
    assert names - fields == set()
    assert [n for n in sorted(names) if f"`{n}`" not in documented] == []
    assert 1 <= len(values) <= 25  # the few a site needs, not all of them


@pytest.mark.parametrize("template", ["site.env.example", "agent.env.example"])
def test_a_shell_reads_the_env_templates_as_systemd_does(template):
    """`set -a; . FILE` (how the page runs the doctor) gives each setting the value systemd's
    EnvironmentFile= gives it: an unquoted `&` would send half a URL to the background."""
    values, _ = env_file(DEPLOY / template)
    shown = subprocess.run(
        ["sh", "-c", f"set -a; . '{DEPLOY / template}'; set +a; env"],
        env={"PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=True,
    )
    read = dict(line.split("=", 1) for line in shown.stdout.splitlines() if "=" in line)
    assert {name: read.get(name) for name in values} == values


def test_the_site_template_loads_once_its_blanks_are_filled(monkeypatch, tmp_path):
    values, _ = env_file(DEPLOY / "site.env.example")
    files = secret_files(tmp_path)
    monkeypatch.setenv("FLEXGATE_DATABASE_PASSWORD_FILE", str(files / "db-password"))
    for name, value in values.items():
        monkeypatch.setenv(name, value.replace("/etc/flexgate/", f"{files}/") or SECRET)
    loaded = GatewaySettings()
    assert loaded.meter_url.startswith("modbus://")
    assert loaded.agent_urls == ["http://gpu-node-01:9100", "http://gpu-node-02:9100"]
    monkeypatch.setenv("FLEXGATE_API_TOKEN", values["FLEXGATE_API_TOKEN"])
    with pytest.raises(ValueError, match="FLEXGATE_API_TOKEN"):  # a blank left as shipped
        GatewaySettings()


def nginx_config(tmp_path: Path, port: int, upstream: str) -> Path:
    """deploy/nginx-vtn-notifications.conf in a server of its own: on a loopback port, with a
    certificate made here, in front of `upstream`."""
    key, cert = tmp_path / "proxy.key", tmp_path / "proxy.crt"
    openssl = [
        "openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
        "-subj", "/CN=localhost", "-keyout", str(key), "-out", str(cert),
    ]  # fmt: skip
    subprocess.run(openssl, check=True, capture_output=True)
    site = (DEPLOY / "nginx-vtn-notifications.conf").read_text(encoding="utf-8")
    site = site.replace("listen 443 ssl;", f"listen 127.0.0.1:{port} ssl;")
    site = site.replace("listen [::]:443 ssl;", "")
    site = re.sub(r"ssl_certificate /\S+;", f"ssl_certificate {cert};", site)
    site = re.sub(r"ssl_certificate_key /\S+;", f"ssl_certificate_key {key};", site)
    site = site.replace("server 127.0.0.1:8000;", f"server {upstream};")
    temp = "".join(
        f"{kind}_temp_path {tmp_path / kind};" for kind in ("client_body", "proxy", "fastcgi")
    )
    main = tmp_path / "nginx.conf"
    main.write_text(
        f"daemon off; master_process off; pid {tmp_path / 'nginx.pid'};\n"
        f"error_log {tmp_path / 'error.log'};\nevents {{}}\n"
        f"http {{ access_log off; {temp} uwsgi_temp_path {tmp_path / 'u'}; "
        f"scgi_temp_path {tmp_path / 's'};\n{site}\n}}\n"
    )
    return main


def test_the_proxy_lets_in_the_vtns_notifications_and_nothing_else(tmp_path):
    nginx = shutil.which("nginx") or shutil.which("nginx", path="/usr/sbin")
    if nginx is None:
        pytest.skip("nginx is not installed (Debian's nginx-light)")
    seen: list[str] = []
    backend = FastAPI()

    @backend.api_route("/{path:path}", methods=["GET", "POST", "PUT", "DELETE"])
    async def anything(path: str, request: Request) -> dict:
        seen.append(f"{request.method} /{path} {request.headers.get('authorization')}")
        return {"echo": request.query_params.get("echo")}

    port = free_port()
    with ServerThread(backend) as url:
        config = nginx_config(tmp_path, port, url.removeprefix("http://"))
        checked = subprocess.run([nginx, "-t", "-c", str(config)], capture_output=True, text=True)
        assert checked.returncode == 0, checked.stderr
        proxy = subprocess.Popen([nginx, "-c", str(config)], stderr=subprocess.DEVNULL)
        client = httpx.Client(base_url=f"https://127.0.0.1:{port}", verify=False, timeout=5)
        try:

            def answers() -> bool:
                try:
                    return client.get("/").status_code == 404
                except httpx.HTTPError:
                    return False

            wait_for(answers, "nginx listening", seconds=15, every_s=0.1)
            bearer = {"Authorization": "Bearer subscription-token"}
            assert client.post("/openadr3/notifications", json={}, headers=bearer).is_success
            assert client.get("/openadr3/notifications", params={"echo": "a"}).json()["echo"] == "a"
            assert client.get("/openadr3/notifications/echo", params={"echo": "b"}).is_success
            for method, path in [
                ("GET", "/v1/events"),
                ("POST", "/v1/events"),
                ("GET", "/health"),
                ("GET", "/metrics"),
                ("GET", "/openadr3/notifications/../../v1/jobs"),
            ]:
                assert client.request(method, path).status_code == 404, (method, path)
            assert client.put("/openadr3/notifications").status_code == 403
        finally:
            client.close()
            proxy.terminate()
            proxy.wait(timeout=10)
    assert seen == [
        "POST /openadr3/notifications Bearer subscription-token",
        "GET /openadr3/notifications None",
        "GET /openadr3/notifications/echo None",
    ]
