"""`flexgate doctor --node` on the fake NVML, with and without the permission to set limits.

The agents it meets on its port are real uvicorn servers on loopback; nothing the doctor does
may change a limit (the fake records every set)."""

import json
import os
import socket
import sys

import httpx
import pytest

from agents.nvml import NvmlBackend
from agents.protocol import CapCommand, GpuCap
from agents.run import build_node
from agents.service import AgentNode, create_app
from agents.settings import AgentSettings
from agents.state import FILE_NAME
from flexgate.cli import main
from flexgate.doctor.node import (
    clock_check,
    gpu_checks,
    node_checks,
    permission_check,
    port_check,
    state_dir_check,
)
from flexgate.serve import ServerThread, free_port
from tests.agents.fake_nvml import FakeNvml

TOKEN = "doctor-node-token-0123456789"
#: /proc/self/status's effective capabilities: none, and CAP_SYS_ADMIN (bit 21) alone
NO_CAPS = "Name:\tpython\nCapEff:\t0000000000000000\n"
SYS_ADMIN = "Name:\tpython\nCapEff:\t0000000000200000\n"


def test_each_gpu_is_read_and_nothing_is_set():
    fake = FakeNvml(gpus=2, start_mw=700_000)
    checks = gpu_checks(fake)
    assert [c.check for c in checks] == ["nvml", "gpu 0", "gpu 1"]
    assert checks[0].status == "ok"
    assert "driver 570.124.06" in checks[0].detail
    assert "instant field" in checks[0].detail
    gpu = checks[1].doc()
    assert gpu | {"name": "NVIDIA H200", "min_limit_w": 200.0, "max_limit_w": 700.0} == gpu
    assert (gpu["default_limit_w"], gpu["current_limit_w"]) == (700.0, 700.0)
    assert gpu["persistence_mode"] is None  # the fake's GPUs do not say
    assert fake.calls == []  # no set, ever
    assert not fake.initialised  # NVML shut down again


def test_a_gpu_without_the_instant_field_is_said_to_average_and_a_low_limit_is_noted():
    checks = gpu_checks(FakeNvml(gpus=1, instant=False, start_mw=400_000))
    assert "1 s average" in checks[0].detail
    assert checks[1].status == "warn"
    assert "below its default" in checks[1].detail


def test_no_nvml_fails_naming_it():
    class NoDriver(FakeNvml):
        def nvmlInit(self):  # noqa: N802 (pynvml's name)
            raise self.NVMLError(9)

    (check,) = gpu_checks(NoDriver())
    assert (check.check, check.status) == ("nvml", "fail")
    assert "does not load" in check.detail


@pytest.mark.parametrize(
    ("euid", "status", "expected"),
    [(0, NO_CAPS, "ok"), (1000, SYS_ADMIN, "ok"), (1000, NO_CAPS, "fail"), (1000, "", "fail")],
)
def test_permission_is_judged_from_the_user_and_its_capabilities(euid, status, expected):
    check = permission_check(euid, status)
    assert check.status == expected
    if expected == "fail":
        assert "CAP_SYS_ADMIN" in check.detail
        assert "refuse" in check.detail


def test_the_state_dir(tmp_path):
    assert state_dir_check(tmp_path / "agent", "node-07").status == "ok"  # made at start
    assert "does not exist yet" in state_dir_check(tmp_path / "agent", "node-07").detail
    (tmp_path / "node-07").mkdir()
    (tmp_path / "node-07" / FILE_NAME).write_text('{"gpus": {}}')  # what a clean stop leaves
    assert state_dir_check(tmp_path, "node-07").status == "ok"
    a_file = tmp_path / "file"
    a_file.write_text("")
    assert state_dir_check(a_file / "agent", "node-07").status == "fail"


def test_the_state_dir_warns_of_caps_a_killed_agent_left_where_the_agent_keeps_them(tmp_path):
    """The agent keeps its originals in the node's folder of its state directory: a cap it
    set and did not restore (it was killed) is found there, with the agent's own settings."""
    settings = AgentSettings(
        agent_token=TOKEN, agent_backend="sim", agent_node_id="node-07", agent_state_dir=tmp_path
    )
    node = build_node(settings)  # as `flexgate agent` builds it; never stopped: killed
    node.apply(CapCommand(plan_id="p", generation=1, lease_s=60.0, caps=[GpuCap(gpu=0, cap_w=450)]))
    checks = {c.check: c for c in node_checks(settings)}
    assert checks["state dir"].status == "warn"
    assert "restores at start" in checks["state dir"].detail
    node.stop()  # restores, as SIGTERM does: nothing is left
    assert state_dir_check(tmp_path, "node-07").status == "ok"


def agent_on(tmp_path, fake):
    node = AgentNode("node-07", NvmlBackend(nvml=fake), tmp_path / "state", sample_hz=0)
    return ServerThread(create_app([node], TOKEN))


def cap_once(url):
    body = {"plan_id": "p", "generation": 1, "lease_s": 60.0, "caps": [{"gpu": 0, "cap_w": 450}]}
    httpx.put(f"{url}/v1/caps", json=body, headers={"Authorization": f"Bearer {TOKEN}"})


def test_the_port_held_by_an_agent_that_may_not_cap_fails_with_nvmls_reason(tmp_path):
    fake = FakeNvml(gpus=2, root=False)
    with agent_on(tmp_path, fake) as url:
        port = int(url.rsplit(":", 1)[1])
        before = port_check("127.0.0.1", port)
        assert before.status == "ok"
        assert "node-07" in before.detail
        assert "first cap" in before.detail  # unknown until a set says
        cap_once(url)
        after = port_check("127.0.0.1", port)
    assert after.status == "fail"
    assert "may not set limits" in after.detail
    assert "no permission" in after.detail


def test_the_port_held_by_an_agent_that_has_capped_is_ok(tmp_path):
    with agent_on(tmp_path, FakeNvml(gpus=2)) as url:
        cap_once(url)
        check = port_check("127.0.0.1", int(url.rsplit(":", 1)[1]))
    assert check.status == "ok"
    assert check.figures["can_cap"] is True


def test_a_port_a_stopped_agent_left_in_time_wait_is_free():
    """An agent that stopped a moment ago leaves its connections in TIME_WAIT; it binds its
    port again at once (SO_REUSEADDR, as uvicorn does), so the doctor must not call it taken."""
    with socket.socket() as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn's
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port)) as client:
            served, _ = listener.accept()
            served.close()  # the server closes first: its side of the port waits in TIME_WAIT
            client.recv(1)
    check = port_check("127.0.0.1", port)
    assert (check.status, check.detail) == ("ok", f"127.0.0.1:{port} is free")


def test_a_port_taken_by_something_else_fails():
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        check = port_check("127.0.0.1", other.getsockname()[1])
    assert check.status == "fail"
    assert "not an agent" in check.detail
    assert port_check("127.0.0.1", free_port()).status == "ok"


def test_the_clock_against_a_server_on_this_machine_agrees(tmp_path):
    with agent_on(tmp_path, FakeNvml(gpus=1)) as url:
        check = clock_check(url)
    assert check.status == "ok"
    assert abs(check.figures["offset_s"]) < 2.0
    assert clock_check(f"http://127.0.0.1:{free_port()}").status == "fail"


def run_doctor(monkeypatch, capsys, fake, tmp_path, port):
    """`flexgate doctor --node --json` with the fake as the pynvml module."""
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.setenv("FLEXGATE_AGENT_TOKEN", TOKEN)
    monkeypatch.setenv("FLEXGATE_AGENT_BACKEND", "nvml")
    argv = ["doctor", "--json", "--port", str(port), "--state-dir", str(tmp_path / "doc")]
    code = main(argv)
    return code, {c["check"]: c for c in json.loads(capsys.readouterr().out)}


def test_the_command_with_permission(monkeypatch, capsys, tmp_path):
    """The node's checks without a flag (FLEXGATE_AGENT_BACKEND says an agent runs here); exit
    0 unless this process itself lacks the permission (the check reads the real one)."""
    fake = FakeNvml(gpus=2)
    code, checks = run_doctor(monkeypatch, capsys, fake, tmp_path, free_port())
    assert list(checks) == [
        "agent settings",
        "nvml",
        "gpu 0",
        "gpu 1",
        "permission",
        "state dir",
        "port",
    ]
    allowed = permission_check(os.geteuid()).status == "ok"
    assert code == (0 if allowed else 1)
    assert {c["status"] for n, c in checks.items() if n != "permission"} == {"ok"}
    assert fake.calls == []


def test_the_command_fails_where_the_agent_may_not_cap(monkeypatch, capsys, tmp_path):
    fake = FakeNvml(gpus=2, root=False)
    with agent_on(tmp_path, fake) as url:
        cap_once(url)
        code, checks = run_doctor(monkeypatch, capsys, fake, tmp_path, int(url.rsplit(":", 1)[1]))
        assert fake.calls == ["set 0 450000"]  # the agent's one refused set; none of the doctor's
    assert code == 1
    assert checks["port"]["status"] == "fail"
    assert checks["port"]["can_cap"] is False


def test_text_output_has_one_line_per_check(monkeypatch, capsys, tmp_path):
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml(gpus=1))
    monkeypatch.delenv("FLEXGATE_AGENT_TOKEN", raising=False)
    main(["doctor", "--node", "--port", str(free_port()), "--state-dir", str(tmp_path)])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("FAIL  agent settings")
    assert "FLEXGATE_AGENT_TOKEN" in lines[0]
    assert [line.split()[0] for line in lines[1:3]] == ["ok", "ok"]
    assert len(lines) == 6


def test_an_agent_on_simulated_gpus_needs_no_nvml(monkeypatch, capsys, tmp_path):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # not even importable
    monkeypatch.setenv("FLEXGATE_AGENT_TOKEN", TOKEN)
    monkeypatch.setenv("FLEXGATE_AGENT_BACKEND", "sim")
    code = main(["doctor", "--json", "--port", str(free_port()), "--state-dir", str(tmp_path)])
    checks = {c["check"]: c for c in json.loads(capsys.readouterr().out)}
    assert code == 0
    assert checks["nvml"]["status"] == "warn"
    assert "permission" not in checks
